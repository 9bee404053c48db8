//! The buffer's side of a site pair: the node's persisted role, and the operations replication
//! needs (a standby applying the active's batches, the active adopting a former active's rows,
//! the spans of seqs a resuming standby may keep).
//!
//! Invariants:
//! - `pair_state` has at most one row. It is written in the same transaction as the buffer
//!   change it describes (a batch and its `replicated_through`, a hand-over and the end of
//!   `holds_own_rows`), so a crash never leaves the two disagreeing.
//! - `holds_own_rows` is set whenever the node may hold rows its peer lacks: from the moment it
//!   is active (it accepts Sends) until it has handed every row to the active. While it is set,
//!   the node's rows are never deleted by replication.
//! - A standby stores the active's rows at the active's seqs; AUTOINCREMENT then starts any
//!   seq it hands out once promoted above all of them. A row the active marked cleared comes
//!   again at the same seq and replaces the copy.
//! - A standby's pending clears are the active's, as the active last listed them, at the
//!   active's seqs like its rows; a node that hands its buffer over gives its pending clears to
//!   the active too (after its rows), and the end of the hand-over deletes them with the rows.
//!   How each is recorded: [`super::clears`].

use rusqlite::{Connection, OptionalExtension, params};

use super::{AdoptedClears, Buffer, BufferError, Insert, Result, clears, insert_row};
use crate::domain::Role;
use crate::domain::{BufferedNotification, PendingClear, Seq};
use std::sync::Arc;

/// Version 2: the node's place in its pair.
pub(super) const SCHEMA_V2: &str = "
CREATE TABLE pair_state (
    id                 INTEGER PRIMARY KEY CHECK (id = 1),
    role               TEXT NOT NULL,
    term               INTEGER NOT NULL,
    holds_own_rows     INTEGER NOT NULL,
    replicated_through INTEGER NOT NULL
);
";

/// The node's persisted place in its pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PairRecord {
    pub role: Role,
    /// The highest term this node has been active in or followed an active in.
    pub term: u64,
    /// The buffer may hold rows the peer lacks (see the module invariants).
    pub holds_own_rows: bool,
    /// The highest seq copied from the active being followed; 0 = nothing copied yet.
    pub replicated_through: Seq,
}

/// One or more replication batches as a standby applies them, in one transaction: the spans,
/// then the adds, then the removes, then the pending clears.
#[derive(Debug, Default)]
pub struct ReplicaChanges {
    /// Spans in which the standby keeps only the listed seqs.
    pub retained: Vec<RetainedSpan>,
    /// Rows to copy at the active's seqs, in seq order.
    pub adds: Vec<(Seq, BufferedNotification)>,
    /// Seqs the active no longer holds.
    pub removes: Vec<Seq>,
    /// The active's pending clears, all of them (the latest list of the batches), when a batch
    /// carried them: they replace the standby's.
    pub pending_clears: Option<Vec<PendingClear>>,
}

/// Of the seqs `from..=through`, only those in `kept` (sorted, disjoint, inclusive ranges) are
/// still buffered on the active.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetainedSpan {
    pub from: Seq,
    pub through: Seq,
    pub kept: Vec<(Seq, Seq)>,
}

impl RetainedSpan {
    /// The ranges of the span that are not kept: what a standby deletes.
    pub fn gaps(&self) -> Vec<(Seq, Seq)> {
        let mut gaps = Vec::new();
        let mut next = self.from.0;
        for &(first, last) in &self.kept {
            let first = first.0.max(self.from.0);
            let last = last.0.min(self.through.0);
            if first > last {
                continue;
            }
            if first > next {
                gaps.push((Seq(next), Seq(first - 1)));
            }
            next = next.max(last.saturating_add(1));
        }
        if next <= self.through.0 {
            gaps.push((Seq(next), self.through));
        }
        gaps
    }
}

/// What [`Buffer::finish_handover`] did.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct HandoverFinished {
    /// Rows deleted (the active holds them now).
    pub deleted: usize,
    /// Keys of the pending clears deleted (handed over before, unless the hand-over says
    /// otherwise).
    pub deleted_clears: Vec<String>,
}

/// What [`Buffer::adopt`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Adopted {
    pub adopted: usize,
    pub already_held: usize,
    pub clears: AdoptedClears,
}

impl Buffer {
    /// The node's persisted place in its pair; `None` before it was ever part of one.
    pub async fn pair_record(&self) -> Result<Option<PairRecord>> {
        self.db.read(select_pair_record).await
    }

    /// Persists a role change; `replicated_through` is kept as stored unless `reset_copy`.
    pub async fn save_role(
        &self,
        role: Role,
        term: u64,
        holds_own_rows: bool,
        reset_copy: bool,
    ) -> Result<()> {
        self.db
            .write(move |conn| {
                let mut stmt = conn.prepare_cached(
                    "INSERT INTO pair_state (id, role, term, holds_own_rows, replicated_through)
                     VALUES (1, ?1, ?2, ?3, 0)
                     ON CONFLICT (id) DO UPDATE SET role = ?1, term = ?2, holds_own_rows = ?3,
                         replicated_through = CASE WHEN ?4 THEN 0 ELSE replicated_through END",
                )?;
                stmt.execute(params![
                    role.as_str(),
                    i64::try_from(term).unwrap_or(i64::MAX),
                    holds_own_rows,
                    reset_copy
                ])?;
                Ok(())
            })
            .await
    }

    /// Applies replication batches in one transaction and records how far the copy reaches.
    pub async fn apply_replica(&self, changes: ReplicaChanges) -> Result<()> {
        let through = changes.adds.iter().map(|(seq, _)| *seq).max();
        let announce = Arc::clone(&self.announce);
        self.db
            .write_then(
                move |conn| {
                    // Spans first: they describe the active before any of these adds were read,
                    // and a row added now may fall in one of their gaps.
                    let mut delete_span =
                        conn.prepare_cached("DELETE FROM buffered WHERE seq BETWEEN ?1 AND ?2")?;
                    for span in &changes.retained {
                        for (first, last) in span.gaps() {
                            delete_span.execute([first.0, last.0])?;
                        }
                    }
                    for (seq, row) in &changes.adds {
                        // Nearly always a seq and a notification this node does not hold yet: the
                        // plain insert, which (unlike a REPLACE) needs no statement journal. A
                        // full copy over an older one replaces what it finds.
                        if insert_row(conn, Insert::ReplicaUnlessHeld(*seq), row)? == 0 {
                            insert_row(conn, Insert::Replica(*seq), row)?;
                        }
                    }
                    let mut delete = conn.prepare_cached("DELETE FROM buffered WHERE seq = ?1")?;
                    for seq in &changes.removes {
                        delete.execute([seq.0])?;
                    }
                    if let Some(through) = through {
                        conn.prepare_cached(
                        "UPDATE pair_state SET replicated_through = max(replicated_through, ?1)",
                    )?
                    .execute([through.0])?;
                    }
                    let clears = match &changes.pending_clears {
                        Some(list) => {
                            let head = clears::replace_pending(conn, list)?;
                            let stored = clears::select_pending(conn, clears::Invalid::Report)?;
                            Some((head, stored))
                        }
                        None => None,
                    };
                    Ok::<_, BufferError>(clears)
                },
                // The head only moves forward: what a promotion starts the replication stream from.
                move |clears| {
                    let head = clears.as_ref().map(|(head, _)| *head);
                    announce.other_change(through.max(head));
                    if let Some((_, stored)) = clears {
                        announce.pending_clears(stored.clone());
                    }
                },
            )
            .await?;
        Ok(())
    }

    /// The buffered seqs after `after` up to `through`, as a span of at most `max_rows` rows:
    /// the span ends at `through` when the rest fits, else at the last row read.
    pub async fn retained_span(
        &self,
        after: Seq,
        through: Seq,
        max_rows: usize,
    ) -> Result<RetainedSpan> {
        let limit = i64::try_from(max_rows).unwrap_or(i64::MAX);
        self.db
            .read(move |conn| {
                let mut stmt = conn.prepare_cached(
                    "SELECT seq FROM buffered WHERE seq > ?1 AND seq <= ?2 ORDER BY seq LIMIT ?3",
                )?;
                let seqs = stmt
                    .query_map(params![after.0, through.0, limit], |r| r.get::<_, i64>(0))?
                    .collect::<rusqlite::Result<Vec<i64>>>()?;
                let full = seqs.len() as i64 == limit;
                let end = match seqs.last() {
                    Some(last) if full => Seq(*last),
                    _ => through,
                };
                let mut kept: Vec<(Seq, Seq)> = Vec::new();
                for seq in seqs {
                    match kept.last_mut() {
                        Some((_, last)) if last.0 + 1 == seq => *last = Seq(seq),
                        _ => kept.push((Seq(seq), Seq(seq))),
                    }
                }
                Ok(RetainedSpan {
                    from: Seq(after.0 + 1),
                    through: end,
                    kept,
                })
            })
            .await
    }

    /// Stores rows handed over by a node that stopped being active, each under a new seq here,
    /// skipping notifications already buffered; a held copy of a row the node marked cleared is
    /// marked here too. Then records the node's pending clears (after the rows: see
    /// [`super::clears`] for how). Answered once they are committed.
    pub async fn adopt(
        &self,
        rows: Vec<BufferedNotification>,
        pending_clears: Vec<PendingClear>,
    ) -> Result<Adopted> {
        let announce = Arc::clone(&self.announce);
        let (adopted, _, _, _) = self
            .db
            .write_then(
                move |conn| {
                    let mut adopted = Adopted::default();
                    let mut marked = Vec::new();
                    for row in &rows {
                        match insert_row(conn, Insert::NewUnlessHeld, row)? {
                            0 => {
                                adopted.already_held += 1;
                                marked.extend(clears::mark_held_copy(conn, row)?);
                            }
                            _ => adopted.adopted += 1,
                        }
                    }
                    let head = Seq(conn.last_insert_rowid());
                    adopted.clears = clears::adopt_clears(conn, &pending_clears)?;
                    let stored = if adopted.clears.recorded > 0 {
                        Some(clears::select_pending(conn, clears::Invalid::Report)?)
                    } else {
                        None
                    };
                    Ok::<_, BufferError>((adopted, head, marked, stored))
                },
                move |(adopted, head, marked, stored)| {
                    if adopted.adopted > 0 {
                        announce.other_change(Some(*head));
                    }
                    if let Some(stored) = stored {
                        announce.pending_clears(stored.clone());
                    }
                    announce.marked(marked.clone());
                },
            )
            .await?;
        Ok(adopted)
    }

    /// Ends a hand-over: every row up to `through` is now held by the active, so they are
    /// deleted here, and the node becomes an empty standby that copies the active from scratch.
    /// Its pending clears go too (handed over before; see the module invariants).
    pub async fn finish_handover(&self, through: Seq, term: u64) -> Result<HandoverFinished> {
        let announce = Arc::clone(&self.announce);
        let finished = self
            .db
            .write_then(
                move |conn| {
                    let deleted = conn
                        .prepare_cached("DELETE FROM buffered WHERE seq <= ?1")?
                        .execute([through.0])?;
                    let deleted_clears = clears::drop_pending(conn)?;
                    conn.prepare_cached(
                        "UPDATE pair_state SET role = ?1, term = ?2, holds_own_rows = 0,
                         replicated_through = 0",
                    )?
                    .execute(params![
                        Role::Standby.as_str(),
                        i64::try_from(term).unwrap_or(i64::MAX)
                    ])?;
                    Ok::<_, BufferError>(HandoverFinished {
                        deleted,
                        deleted_clears,
                    })
                },
                move |finished| {
                    announce.other_change(None);
                    if !finished.deleted_clears.is_empty() {
                        announce.pending_clears(crate::domain::PendingClears::default());
                    }
                },
            )
            .await?;
        Ok(finished)
    }
}

fn select_pair_record(conn: &Connection) -> Result<Option<PairRecord>> {
    let row = conn
        .prepare_cached(
            "SELECT role, term, holds_own_rows, replicated_through FROM pair_state WHERE id = 1",
        )?
        .query_row([], |r| {
            Ok((
                r.get::<_, String>(0)?,
                r.get::<_, i64>(1)?,
                r.get::<_, bool>(2)?,
                r.get::<_, i64>(3)?,
            ))
        })
        .optional()?;
    let Some((role, term, holds_own_rows, through)) = row else {
        return Ok(None);
    };
    let role = Role::from_db(&role)
        .ok_or_else(|| BufferError::Corrupt(format!("pair_state.role {role:?} is not a role")))?;
    Ok(Some(PairRecord {
        role,
        term: u64::try_from(term).unwrap_or(0),
        holds_own_rows,
        replicated_through: Seq(through),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::buffer::tests::notification;

    fn open(dir: &tempfile::TempDir, name: &str) -> Buffer {
        Buffer::open(&dir.path().join(name)).unwrap()
    }

    fn span(from: i64, through: i64, kept: &[(i64, i64)]) -> RetainedSpan {
        RetainedSpan {
            from: Seq(from),
            through: Seq(through),
            kept: kept.iter().map(|(a, b)| (Seq(*a), Seq(*b))).collect(),
        }
    }

    #[test]
    fn gaps_are_the_span_minus_the_kept_ranges() {
        let seqs = |gaps: Vec<(Seq, Seq)>| gaps.iter().map(|(a, b)| (a.0, b.0)).collect::<Vec<_>>();
        assert_eq!(seqs(span(1, 10, &[]).gaps()), vec![(1, 10)]);
        assert_eq!(seqs(span(1, 10, &[(1, 10)]).gaps()), vec![]);
        assert_eq!(
            seqs(span(1, 10, &[(2, 3), (6, 6)]).gaps()),
            vec![(1, 1), (4, 5), (7, 10)]
        );
        assert_eq!(seqs(span(5, 8, &[(1, 6)]).gaps()), vec![(7, 8)]);
        assert_eq!(seqs(span(5, 4, &[]).gaps()), vec![], "an empty span");
    }

    #[tokio::test]
    async fn a_standby_copies_rows_at_the_actives_seqs_and_a_resume_drops_what_left() {
        let dir = tempfile::tempdir().unwrap();
        let active = open(&dir, "active.db");
        let standby = open(&dir, "standby.db");
        standby
            .save_role(Role::Standby, 1, false, true)
            .await
            .unwrap();
        let mut seqs = Vec::new();
        for i in 0..5 {
            seqs.push(
                active
                    .enqueue(notification(&format!("n{i}")))
                    .await
                    .unwrap(),
            );
        }
        let page = active.next_after(Seq::START, 10).await.unwrap();
        standby
            .apply_replica(ReplicaChanges {
                adds: page.rows.clone(),
                ..ReplicaChanges::default()
            })
            .await
            .unwrap();
        assert_eq!(
            standby.next_after(Seq::START, 10).await.unwrap().rows,
            page.rows
        );
        let record = standby.pair_record().await.unwrap().unwrap();
        assert_eq!(record.replicated_through, seqs[4]);

        // Rows 1 and 3 leave the active while the standby is away; on resume it keeps the rest.
        active.remove(vec![seqs[1], seqs[3]]).await.unwrap();
        let span = active
            .retained_span(Seq::START, seqs[4], 1000)
            .await
            .unwrap();
        assert_eq!(
            span.kept,
            vec![(seqs[0], seqs[0]), (seqs[2], seqs[2]), (seqs[4], seqs[4])]
        );
        standby
            .apply_replica(ReplicaChanges {
                retained: vec![span],
                ..ReplicaChanges::default()
            })
            .await
            .unwrap();
        let left: Vec<Seq> = standby
            .next_after(Seq::START, 10)
            .await
            .unwrap()
            .rows
            .iter()
            .map(|(s, _)| *s)
            .collect();
        assert_eq!(left, vec![seqs[0], seqs[2], seqs[4]]);

        // Promoted, it hands out seqs above every copied one.
        let own = standby.enqueue(notification("own")).await.unwrap();
        assert!(own > seqs[4]);
    }

    #[tokio::test]
    async fn a_copied_row_replaces_what_held_its_seq_or_its_notification() {
        let dir = tempfile::tempdir().unwrap();
        let standby = open(&dir, "standby.db");
        standby
            .save_role(Role::Standby, 1, false, true)
            .await
            .unwrap();
        let (old, moved) = (notification("old"), notification("moved"));
        standby
            .apply_replica(ReplicaChanges {
                adds: vec![(Seq(1), old.clone()), (Seq(2), moved.clone())],
                ..ReplicaChanges::default()
            })
            .await
            .unwrap();
        // Another history (a full copy in a later term): seq 1 is another row now, and the
        // notification at seq 2 sits at seq 3.
        let new = notification("new");
        standby
            .apply_replica(ReplicaChanges {
                adds: vec![(Seq(1), new.clone()), (Seq(3), moved.clone())],
                ..ReplicaChanges::default()
            })
            .await
            .unwrap();
        let rows = standby.next_after(Seq::START, 10).await.unwrap().rows;
        assert_eq!(rows, vec![(Seq(1), new), (Seq(3), moved)]);
        assert!(!standby.contains(old.id).await.unwrap());
    }

    /// The recent rows a replication stream takes are exactly the Sends committed since it
    /// attached; any other change to the table sends it back to reading the table.
    #[tokio::test]
    async fn recent_rows_are_the_sends_and_other_changes_forget_them() {
        let dir = tempfile::tempdir().unwrap();
        let active = open(&dir, "active.db");
        let before = active.enqueue(notification("before")).await.unwrap();
        let reader = active.recent_rows();
        assert!(reader.after(before, 10).is_none(), "nothing kept yet");
        let mut seqs = Vec::new();
        for i in 0..3 {
            seqs.push(
                active
                    .enqueue(notification(&format!("n{i}")))
                    .await
                    .unwrap(),
            );
        }
        assert!(
            reader.after(Seq::START, 10).is_none(),
            "the row sent before attaching is read from the table"
        );
        let page = reader.after(before, 10).unwrap();
        let table = active.next_after(before, 10).await.unwrap().rows;
        let taken: Vec<_> = page.rows.iter().map(|(s, n)| (*s, (**n).clone())).collect();
        assert_eq!(taken, table, "the same rows as the table holds");
        assert_eq!(page.through, seqs[2]);

        // A removal is skipped, and passed.
        let mut more = Vec::new();
        for i in 3..6 {
            more.push(
                active
                    .enqueue(notification(&format!("n{i}")))
                    .await
                    .unwrap(),
            );
        }
        active.remove(vec![more[1], more[2]]).await.unwrap();
        let page = reader.after(seqs[2], 10).unwrap();
        let left: Vec<Seq> = page.rows.iter().map(|(s, _)| *s).collect();
        assert_eq!(left, vec![more[0]]);
        assert_eq!(page.through, more[2]);
        let seqs = more;

        // An adoption hands out seqs the recent rows never saw.
        active
            .adopt(vec![notification("adopted")], Vec::new())
            .await
            .unwrap();
        assert!(reader.after(seqs[2], 10).is_none());
        let after_adoption = active.enqueue(notification("next")).await.unwrap();
        assert!(reader.after(seqs[2], 10).is_none(), "the adopted row");
        let page = reader.after(Seq(after_adoption.0 - 1), 10).unwrap();
        assert_eq!(page.rows.len(), 1);

        // So do a standby's batch and the end of a hand-over.
        active
            .apply_replica(ReplicaChanges {
                adds: vec![(Seq(after_adoption.0 + 1), notification("copied"))],
                ..ReplicaChanges::default()
            })
            .await
            .unwrap();
        assert!(reader.after(Seq(after_adoption.0 - 1), 10).is_none());
        let next = active.enqueue(notification("again")).await.unwrap();
        assert!(reader.after(Seq(next.0 - 1), 10).is_some());
        active.finish_handover(next, 2).await.unwrap();
        assert!(reader.after(Seq(next.0 - 1), 10).is_none());
    }

    #[tokio::test]
    async fn a_span_of_a_big_buffer_is_cut_at_the_row_limit() {
        let dir = tempfile::tempdir().unwrap();
        let buffer = open(&dir, "b.db");
        for i in 0..5 {
            buffer
                .enqueue(notification(&format!("n{i}")))
                .await
                .unwrap();
        }
        let first = buffer.retained_span(Seq::START, Seq(5), 2).await.unwrap();
        assert_eq!((first.from, first.through), (Seq(1), Seq(2)));
        let rest = buffer
            .retained_span(first.through, Seq(5), 10)
            .await
            .unwrap();
        assert_eq!((rest.from, rest.through), (Seq(3), Seq(5)));
        assert_eq!(rest.kept, vec![(Seq(3), Seq(5))]);
    }

    #[tokio::test]
    async fn adoption_skips_held_rows_and_a_finished_handover_empties_the_node() {
        let dir = tempfile::tempdir().unwrap();
        let active = open(&dir, "active.db");
        let old = open(&dir, "old.db");
        old.save_role(Role::Active, 1, true, true).await.unwrap();
        let shared = notification("shared");
        active.enqueue(shared.clone()).await.unwrap();
        let head = active.head();
        old.enqueue(shared.clone()).await.unwrap();
        let through = old
            .enqueue(notification("only on the old active"))
            .await
            .unwrap();

        let rows: Vec<_> = old
            .next_after(Seq::START, 10)
            .await
            .unwrap()
            .rows
            .into_iter()
            .map(|(_, n)| n)
            .collect();
        let adopted = active.adopt(rows, Vec::new()).await.unwrap();
        assert_eq!(
            adopted,
            Adopted {
                adopted: 1,
                already_held: 1,
                clears: AdoptedClears::default(),
            }
        );
        assert_eq!(active.stats().await.unwrap().depth, 2);
        assert!(
            head.has_changed().unwrap(),
            "adoption wakes the replication stream"
        );

        assert_eq!(old.finish_handover(through, 2).await.unwrap().deleted, 2);
        assert_eq!(old.stats().await.unwrap().depth, 0);
        assert_eq!(
            old.pair_record().await.unwrap(),
            Some(PairRecord {
                role: Role::Standby,
                term: 2,
                holds_own_rows: false,
                replicated_through: Seq::START,
            })
        );
    }

    /// A row the old active marked cleared is handed over marked, and marks the copy the
    /// active already held; then its pending clear is handed over: due at once on the active,
    /// holding the rows of the key it did not mark (the old active's row sent after the clear,
    /// and the active's own) until central applied it. The end of the hand-over deletes it on
    /// the old active.
    #[tokio::test]
    async fn a_handover_carries_the_marks_and_the_pending_clears() {
        use crate::domain::{ConditionKey, SiteId};
        let dir = tempfile::tempdir().unwrap();
        let active = open(&dir, "active.db");
        let old = open(&dir, "old.db");
        old.save_role(Role::Active, 1, true, true).await.unwrap();
        let key = ConditionKey::parse("k1".into(), "condition_key").unwrap();
        let about = |subject: &str| BufferedNotification {
            condition_key: Some(key.clone()),
            ..notification(subject)
        };
        let (held, new) = (about("held by both"), about("only on the old active"));
        let held_seq = active.enqueue(held.clone()).await.unwrap();
        old.enqueue(held.clone()).await.unwrap();
        old.enqueue(new.clone()).await.unwrap();
        let site = SiteId::parse("site-a".into()).unwrap();
        let cleared = old
            .clear_condition(&site, key.clone(), chrono::Utc::now())
            .await
            .unwrap();
        assert_eq!(cleared.marked, 2);
        let after = about("sent to the old active after the clear");
        let through = old.enqueue(after.clone()).await.unwrap();
        let own = about("sent to the active");
        active.enqueue(own.clone()).await.unwrap();

        let mut changes = active.row_changes();
        let rows: Vec<_> = old
            .next_after(Seq::START, 10)
            .await
            .unwrap()
            .rows
            .into_iter()
            .map(|(_, n)| n)
            .collect();
        assert_eq!(
            rows.iter().filter(|n| n.cleared_at_site.is_some()).count(),
            2
        );
        let adopted = active.adopt(rows, Vec::new()).await.unwrap();
        assert_eq!((adopted.adopted, adopted.already_held), (2, 1));
        match changes.try_recv().unwrap() {
            crate::buffer::RowChange::Marked(seqs) => assert_eq!(&*seqs, &[held_seq]),
            other => panic!("{other:?}"),
        }
        let handed: Vec<PendingClear> = old
            .read_pending_clears()
            .await
            .unwrap()
            .iter()
            .cloned()
            .collect();
        assert_eq!(handed, vec![cleared.pending.clone()]);
        let published = active.pending_clears();
        let adopted = active.adopt(Vec::new(), handed).await.unwrap();
        assert_eq!(adopted.clears.recorded, 1);
        assert!(published.has_changed().unwrap());
        let clears = active.pending_clears_now();
        let recorded: Vec<_> = clears.iter().cloned().collect();
        assert_eq!(
            recorded,
            vec![PendingClear {
                up_to: Seq::START,
                ..cleared.pending.clone()
            }]
        );
        let oldest = active.oldest_seq().await.unwrap();
        assert_eq!(clears.due(oldest).count(), 1, "due at once");
        let copies = active.next_after(Seq::START, 10).await.unwrap().rows;
        let waiting: Vec<_> = copies
            .iter()
            .filter(|(seq, row)| clears.holds(*seq, row))
            .map(|(_, row)| row.id)
            .collect();
        assert_eq!(waiting, vec![own.id, after.id]);

        let finished = old.finish_handover(through, 2).await.unwrap();
        assert_eq!(finished.deleted_clears, vec!["k1".to_owned()]);
        assert!(old.pending_clears_now().is_empty());
        assert_eq!(old.stats().await.unwrap().pending_clears, 0);
    }

    /// The active's list replaces the standby's whole (an empty one deletes them all), raises
    /// its head to the watermarks, and a batch without a list leaves them.
    #[tokio::test]
    async fn a_standby_takes_the_actives_pending_clears_as_a_whole() {
        use crate::domain::ConditionKey;
        let dir = tempfile::tempdir().unwrap();
        let standby = open(&dir, "standby.db");
        standby
            .save_role(Role::Standby, 1, false, true)
            .await
            .unwrap();
        let at = crate::domain::to_buffer_precision(chrono::Utc::now());
        let clear = |key: &str, up_to: i64| PendingClear {
            condition_key: ConditionKey::parse(key.into(), "condition_key").unwrap(),
            up_to: Seq(up_to),
            cleared_at: at,
        };
        let listed = |buffer: &Buffer| -> Vec<PendingClear> {
            buffer.pending_clears_now().iter().cloned().collect()
        };
        let mut published = standby.pending_clears();
        // The rows up to the watermarks have not all arrived yet.
        standby
            .apply_replica(ReplicaChanges {
                adds: vec![(Seq(1), notification("copied"))],
                pending_clears: Some(vec![clear("k1", 7), clear("k2", 3)]),
                ..ReplicaChanges::default()
            })
            .await
            .unwrap();
        assert!(published.has_changed().unwrap());
        published.mark_unchanged();
        assert_eq!(listed(&standby), vec![clear("k2", 3), clear("k1", 7)]);
        assert_eq!(standby.head_now(), Seq(7));
        assert_eq!(standby.stats().await.unwrap().pending_clears, 2);

        standby
            .apply_replica(ReplicaChanges {
                removes: vec![Seq(1)],
                ..ReplicaChanges::default()
            })
            .await
            .unwrap();
        assert!(!published.has_changed().unwrap());
        assert_eq!(listed(&standby).len(), 2, "no list, no change");

        standby
            .apply_replica(ReplicaChanges {
                pending_clears: Some(vec![clear("k1", 9)]),
                ..ReplicaChanges::default()
            })
            .await
            .unwrap();
        assert_eq!(listed(&standby), vec![clear("k1", 9)], "k2 was applied");
        standby
            .apply_replica(ReplicaChanges {
                pending_clears: Some(Vec::new()),
                ..ReplicaChanges::default()
            })
            .await
            .unwrap();
        assert!(listed(&standby).is_empty());
        assert_eq!(standby.stats().await.unwrap().pending_clears, 0);
        drop(standby);

        // Promoted (reopened), its first Send is above every watermark it was given.
        let standby = open(&dir, "standby.db");
        assert_eq!(standby.head_now(), Seq(9));
        let own = standby.enqueue(notification("own")).await.unwrap();
        assert_eq!(own, Seq(10));
    }
}
