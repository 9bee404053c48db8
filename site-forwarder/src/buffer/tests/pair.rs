//! The buffer's side of a site pair: the role record, a standby's copy, the feed it copies
//! from, and both ends of a hand-over.

use super::{all_rows, notification};
use crate::buffer::handover::Adopted;
use crate::buffer::pending_clears::AdoptedClears;
use crate::buffer::{Buffer, PairRecord, ReplicaChanges, RetainedSpan};
use crate::domain::{BufferedNotification, PendingClear, Role, Seq};

fn open(dir: &tempfile::TempDir, name: &str) -> Buffer {
    Buffer::open(&dir.path().join(name)).unwrap()
}

/// A node's buffer (`standby.db`) that has recorded itself the standby of the pair's first term.
async fn open_standby(dir: &tempfile::TempDir) -> Buffer {
    let standby = open(dir, "standby.db");
    standby
        .roles()
        .save_role(Role::Standby, 1, false, true)
        .await
        .unwrap();
    standby
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
    let standby = open_standby(&dir).await;
    let mut seqs = Vec::new();
    for i in 0..5 {
        seqs.push(
            active
                .intake()
                .enqueue(notification(&format!("n{i}")))
                .await
                .unwrap(),
        );
    }
    let page = all_rows(&active).await;
    standby
        .replica()
        .apply_replica(ReplicaChanges {
            adds: page.rows.clone(),
            ..ReplicaChanges::default()
        })
        .await
        .unwrap();
    assert_eq!(all_rows(&standby).await.rows, page.rows);
    let record = standby.roles().pair_record().await.unwrap().unwrap();
    assert_eq!(record.replicated_through, seqs[4]);

    // Rows 1 and 3 leave the active while the standby is away; on resume it keeps the rest.
    active
        .forwarding()
        .remove(vec![seqs[1], seqs[3]])
        .await
        .unwrap();
    let span = active
        .replication()
        .retained_span(Seq::START, seqs[4], 1000)
        .await
        .unwrap();
    assert_eq!(
        span.kept,
        vec![(seqs[0], seqs[0]), (seqs[2], seqs[2]), (seqs[4], seqs[4])]
    );
    standby
        .replica()
        .apply_replica(ReplicaChanges {
            retained: vec![span],
            ..ReplicaChanges::default()
        })
        .await
        .unwrap();
    let left: Vec<Seq> = all_rows(&standby)
        .await
        .rows
        .iter()
        .map(|(s, _)| *s)
        .collect();
    assert_eq!(left, vec![seqs[0], seqs[2], seqs[4]]);

    // Promoted, it hands out seqs above every copied one.
    let own = standby.intake().enqueue(notification("own")).await.unwrap();
    assert!(own > seqs[4]);
}

#[tokio::test]
async fn a_copied_row_replaces_what_held_its_seq_or_its_notification() {
    let dir = tempfile::tempdir().unwrap();
    let standby = open_standby(&dir).await;
    let (old, moved) = (notification("old"), notification("moved"));
    standby
        .replica()
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
        .replica()
        .apply_replica(ReplicaChanges {
            adds: vec![(Seq(1), new.clone()), (Seq(3), moved.clone())],
            ..ReplicaChanges::default()
        })
        .await
        .unwrap();
    let rows = all_rows(&standby).await.rows;
    assert_eq!(rows, vec![(Seq(1), new), (Seq(3), moved)]);
    assert!(!standby.status().contains(old.id).await.unwrap());
}

/// The recent rows a replication stream takes are exactly the Sends committed since it
/// attached; any other change to the table sends it back to reading the table.
#[tokio::test]
async fn recent_rows_are_the_sends_and_other_changes_forget_them() {
    let dir = tempfile::tempdir().unwrap();
    let active = open(&dir, "active.db");
    let before = active
        .intake()
        .enqueue(notification("before"))
        .await
        .unwrap();
    let reader = active.replication().recent_rows();
    assert!(reader.after(before, 10).is_none(), "nothing kept yet");
    let mut seqs = Vec::new();
    for i in 0..3 {
        seqs.push(
            active
                .intake()
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
    let table = active
        .replication()
        .next_after(before, 10)
        .await
        .unwrap()
        .rows;
    let taken: Vec<_> = page.rows.iter().map(|(s, n)| (*s, (**n).clone())).collect();
    assert_eq!(taken, table, "the same rows as the table holds");
    assert_eq!(page.through, seqs[2]);

    // A removal is skipped, and passed.
    let mut more = Vec::new();
    for i in 3..6 {
        more.push(
            active
                .intake()
                .enqueue(notification(&format!("n{i}")))
                .await
                .unwrap(),
        );
    }
    active
        .forwarding()
        .remove(vec![more[1], more[2]])
        .await
        .unwrap();
    let page = reader.after(seqs[2], 10).unwrap();
    let left: Vec<Seq> = page.rows.iter().map(|(s, _)| *s).collect();
    assert_eq!(left, vec![more[0]]);
    assert_eq!(page.through, more[2]);
    let seqs = more;

    // An adoption hands out seqs the recent rows never saw.
    active
        .adoption()
        .adopt(vec![notification("adopted")], Vec::new(), Vec::new())
        .await
        .unwrap();
    assert!(reader.after(seqs[2], 10).is_none());
    let after_adoption = active.intake().enqueue(notification("next")).await.unwrap();
    assert!(reader.after(seqs[2], 10).is_none(), "the adopted row");
    let page = reader.after(Seq(after_adoption.0 - 1), 10).unwrap();
    assert_eq!(page.rows.len(), 1);

    // So do a standby's batch and the end of a hand-over.
    active
        .replica()
        .apply_replica(ReplicaChanges {
            adds: vec![(Seq(after_adoption.0 + 1), notification("copied"))],
            ..ReplicaChanges::default()
        })
        .await
        .unwrap();
    assert!(reader.after(Seq(after_adoption.0 - 1), 10).is_none());
    let next = active
        .intake()
        .enqueue(notification("again"))
        .await
        .unwrap();
    assert!(reader.after(Seq(next.0 - 1), 10).is_some());
    active.handover().finish_handover(next, 2).await.unwrap();
    assert!(reader.after(Seq(next.0 - 1), 10).is_none());
}

#[tokio::test]
async fn a_span_of_a_big_buffer_is_cut_at_the_row_limit() {
    let dir = tempfile::tempdir().unwrap();
    let buffer = open(&dir, "b.db");
    for i in 0..5 {
        buffer
            .intake()
            .enqueue(notification(&format!("n{i}")))
            .await
            .unwrap();
    }
    let first = buffer
        .replication()
        .retained_span(Seq::START, Seq(5), 2)
        .await
        .unwrap();
    assert_eq!((first.from, first.through), (Seq(1), Seq(2)));
    let rest = buffer
        .replication()
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
    old.roles()
        .save_role(Role::Active, 1, true, true)
        .await
        .unwrap();
    let shared = notification("shared");
    active.intake().enqueue(shared.clone()).await.unwrap();
    let head = active.replication().head();
    old.intake().enqueue(shared.clone()).await.unwrap();
    let through = old
        .intake()
        .enqueue(notification("only on the old active"))
        .await
        .unwrap();

    let rows: Vec<_> = all_rows(&old)
        .await
        .rows
        .into_iter()
        .map(|(_, n)| n)
        .collect();
    let adopted = active
        .adoption()
        .adopt(rows, Vec::new(), Vec::new())
        .await
        .unwrap();
    assert_eq!(
        adopted,
        Adopted {
            adopted: 1,
            already_held: 1,
            clears: AdoptedClears::default(),
            acks: 0,
        }
    );
    assert_eq!(active.status().stats().await.unwrap().depth, 2);
    assert!(
        head.has_changed().unwrap(),
        "adoption wakes the replication stream"
    );

    assert_eq!(
        old.handover()
            .finish_handover(through, 2)
            .await
            .unwrap()
            .deleted,
        2
    );
    assert_eq!(old.status().stats().await.unwrap().depth, 0);
    assert_eq!(
        old.roles().pair_record().await.unwrap(),
        Some(PairRecord {
            role: Role::Standby,
            term: 2,
            holds_own_rows: false,
            replicated_through: Seq::START,
            statuses_through: crate::domain::StatusSeq::default(),
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
    old.roles()
        .save_role(Role::Active, 1, true, true)
        .await
        .unwrap();
    let key = ConditionKey::parse("k1".into(), "condition_key").unwrap();
    let about = |subject: &str| BufferedNotification {
        condition_key: Some(key.clone()),
        ..notification(subject)
    };
    let (held, new) = (about("held by both"), about("only on the old active"));
    let held_seq = active.intake().enqueue(held.clone()).await.unwrap();
    old.intake().enqueue(held.clone()).await.unwrap();
    old.intake().enqueue(new.clone()).await.unwrap();
    let site = SiteId::parse("site-a".into()).unwrap();
    let cleared = old
        .intake()
        .clear_condition(&site, key.clone(), chrono::Utc::now())
        .await
        .unwrap();
    assert_eq!(cleared.marked, 2);
    let after = about("sent to the old active after the clear");
    let through = old.intake().enqueue(after.clone()).await.unwrap();
    let own = about("sent to the active");
    active.intake().enqueue(own.clone()).await.unwrap();

    let mut changes = active.clears().row_changes();
    let rows: Vec<_> = all_rows(&old)
        .await
        .rows
        .into_iter()
        .map(|(_, n)| n)
        .collect();
    assert_eq!(
        rows.iter().filter(|n| n.cleared_at_site.is_some()).count(),
        2
    );
    let adopted = active
        .adoption()
        .adopt(rows, Vec::new(), Vec::new())
        .await
        .unwrap();
    assert_eq!((adopted.adopted, adopted.already_held), (2, 1));
    match changes.try_recv().unwrap() {
        crate::buffer::RowChange::Marked(seqs) => assert_eq!(&*seqs, &[held_seq]),
        other => panic!("{other:?}"),
    }
    let handed: Vec<PendingClear> = old
        .handover()
        .read_pending_clears()
        .await
        .unwrap()
        .iter()
        .cloned()
        .collect();
    assert_eq!(handed, vec![cleared.pending.clone()]);
    let published = active.clears().pending_clears();
    let adopted = active
        .adoption()
        .adopt(Vec::new(), handed, Vec::new())
        .await
        .unwrap();
    assert_eq!(adopted.clears.recorded, 1);
    assert!(published.has_changed().unwrap());
    let clears = active.clears().pending_clears_now();
    let recorded: Vec<_> = clears.iter().cloned().collect();
    assert_eq!(
        recorded,
        vec![PendingClear {
            up_to: Seq::START,
            ..cleared.pending.clone()
        }]
    );
    let oldest = active.clears().oldest_seq().await.unwrap();
    assert_eq!(clears.due(oldest).count(), 1, "due at once");
    let copies = all_rows(&active).await.rows;
    let waiting: Vec<_> = copies
        .iter()
        .filter(|(seq, row)| clears.holds(*seq, row))
        .map(|(_, row)| row.id)
        .collect();
    assert_eq!(waiting, vec![own.id, after.id]);

    let finished = old.handover().finish_handover(through, 2).await.unwrap();
    assert_eq!(finished.deleted_clears, vec!["k1".to_owned()]);
    assert!(old.clears().pending_clears_now().is_empty());
    assert_eq!(old.status().stats().await.unwrap().pending_clears, 0);
}

/// The active's list replaces the standby's whole (an empty one deletes them all), raises
/// its head to the watermarks, and a batch without a list leaves them.
#[tokio::test]
async fn a_standby_takes_the_actives_pending_clears_as_a_whole() {
    use crate::domain::ConditionKey;
    let dir = tempfile::tempdir().unwrap();
    let standby = open_standby(&dir).await;
    let at = crate::domain::to_buffer_precision(chrono::Utc::now());
    let clear = |key: &str, up_to: i64| PendingClear {
        condition_key: ConditionKey::parse(key.into(), "condition_key").unwrap(),
        up_to: Seq(up_to),
        cleared_at: at,
    };
    let listed = |buffer: &Buffer| -> Vec<PendingClear> {
        buffer
            .clears()
            .pending_clears_now()
            .iter()
            .cloned()
            .collect()
    };
    let mut published = standby.clears().pending_clears();
    // The rows up to the watermarks have not all arrived yet.
    standby
        .replica()
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
    assert_eq!(standby.replication().head_now(), Seq(7));
    assert_eq!(standby.status().stats().await.unwrap().pending_clears, 2);

    standby
        .replica()
        .apply_replica(ReplicaChanges {
            removes: vec![Seq(1)],
            ..ReplicaChanges::default()
        })
        .await
        .unwrap();
    assert!(!published.has_changed().unwrap());
    assert_eq!(listed(&standby).len(), 2, "no list, no change");

    standby
        .replica()
        .apply_replica(ReplicaChanges {
            pending_clears: Some(vec![clear("k1", 9)]),
            ..ReplicaChanges::default()
        })
        .await
        .unwrap();
    assert_eq!(listed(&standby), vec![clear("k1", 9)], "k2 was applied");
    standby
        .replica()
        .apply_replica(ReplicaChanges {
            pending_clears: Some(Vec::new()),
            ..ReplicaChanges::default()
        })
        .await
        .unwrap();
    assert!(listed(&standby).is_empty());
    assert_eq!(standby.status().stats().await.unwrap().pending_clears, 0);
    drop(standby);

    // Promoted (reopened), its first Send is above every watermark it was given.
    let standby = open(&dir, "standby.db");
    assert_eq!(standby.replication().head_now(), Seq(9));
    let own = standby.intake().enqueue(notification("own")).await.unwrap();
    assert_eq!(own, Seq(10));
}
