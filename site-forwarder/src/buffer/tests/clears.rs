//! The buffer's side of ClearCondition: marks, pending clears, what a standby and a hand-over
//! take of them.

use chrono::{DateTime, Utc};
use rusqlite::{Connection, params};

use super::{all_rows, damage, notification, select_one};
use crate::buffer::pending_clears::AdoptedClears;
use crate::buffer::pending_clears::{APPLIED_CLEARS_KEPT, remember_applied};
use crate::buffer::schema::{SCHEMA_V1, SCHEMA_V2, SCHEMA_V3, SCHEMA_VERSION};
use crate::buffer::{Buffer, BufferError, RowChange};
use crate::domain::{
    BufferedNotification, ConditionKey, LocalStatus, PendingClear, Seq, SiteId, to_buffer_precision,
};

fn open(dir: &tempfile::TempDir) -> Buffer {
    Buffer::open(&dir.path().join("buffer.db")).unwrap()
}

fn key(text: &str) -> ConditionKey {
    ConditionKey::parse(text.into(), "condition_key").unwrap()
}

fn site() -> SiteId {
    SiteId::parse("site-a".into()).unwrap()
}

/// A notification about `condition`.
fn about(subject: &str, condition: &str) -> BufferedNotification {
    BufferedNotification {
        condition_key: Some(key(condition)),
        ..notification(subject)
    }
}

fn marks(buffer_rows: &[(Seq, BufferedNotification)]) -> Vec<Option<DateTime<Utc>>> {
    buffer_rows.iter().map(|(_, n)| n.cleared_at_site).collect()
}

#[tokio::test]
async fn a_clear_marks_only_this_sites_unmarked_rows_of_the_key_and_records_the_head() {
    let dir = tempfile::tempdir().unwrap();
    let buffer = open(&dir);
    buffer.intake().enqueue(about("a", "k1")).await.unwrap();
    buffer.intake().enqueue(about("b", "k1")).await.unwrap();
    buffer.intake().enqueue(about("c", "k2")).await.unwrap();
    buffer.intake().enqueue(notification("d")).await.unwrap();
    let mut elsewhere = about("e", "k1");
    elsewhere.provenance.source_site_id = SiteId::parse("site-b".into()).unwrap();
    let head = buffer.intake().enqueue(elsewhere).await.unwrap();

    let at = to_buffer_precision(Utc::now());
    let cleared = buffer
        .intake()
        .clear_condition(&site(), key("k1"), at)
        .await
        .unwrap();
    assert_eq!(cleared.marked, 2);
    assert_eq!(
        cleared.pending,
        PendingClear {
            condition_key: key("k1"),
            up_to: head,
            cleared_at: at,
        }
    );
    let rows = all_rows(&buffer).await.rows;
    assert_eq!(marks(&rows), vec![Some(at), Some(at), None, None, None]);
    let Ok(LocalStatus::Buffered(status)) = buffer.status().local_status(rows[0].1.id).await else {
        panic!("still buffered");
    };
    assert_eq!(status.cleared_at, Some(at));
    assert_eq!(status.condition_key.as_deref(), Some("k1"));

    // Cleared again: the marked rows keep their time, a row sent since is marked, and the
    // key's one pending clear moves to the new head.
    let later = buffer.intake().enqueue(about("f", "k1")).await.unwrap();
    let again = at + chrono::Duration::seconds(5);
    let cleared = buffer
        .intake()
        .clear_condition(&site(), key("k1"), again)
        .await
        .unwrap();
    assert_eq!(cleared.marked, 1);
    assert_eq!(cleared.pending.up_to, later);
    let rows = all_rows(&buffer).await.rows;
    assert_eq!(
        marks(&rows),
        vec![Some(at), Some(at), None, None, None, Some(again)]
    );
    assert_eq!(buffer.clears().pending_clears_now().len(), 1);
    assert_eq!(buffer.status().stats().await.unwrap().pending_clears, 1);
}

/// A clear of a key nothing is buffered for still records its central half.
#[tokio::test]
async fn a_clear_with_nothing_buffered_is_still_pending_for_central() {
    let dir = tempfile::tempdir().unwrap();
    let buffer = open(&dir);
    let cleared = buffer
        .intake()
        .clear_condition(&site(), key("k1"), Utc::now())
        .await
        .unwrap();
    assert_eq!(cleared.marked, 0);
    assert_eq!(cleared.pending.up_to, Seq::START);
    assert_eq!(
        buffer.clears().pending_clears_now().due(None).count(),
        1,
        "due at once"
    );
}

#[tokio::test]
async fn pending_clears_are_published_survive_a_reopen_and_go_only_at_their_watermark() {
    let dir = tempfile::tempdir().unwrap();
    let buffer = open(&dir);
    let mut published = buffer.clears().pending_clears();
    buffer.intake().enqueue(about("a", "k1")).await.unwrap();
    let first = buffer
        .intake()
        .clear_condition(&site(), key("k1"), Utc::now())
        .await
        .unwrap()
        .pending;
    assert!(published.has_changed().unwrap());
    assert_eq!(
        published.borrow_and_update().iter().collect::<Vec<_>>(),
        vec![&first]
    );
    drop(buffer);

    let buffer = open(&dir);
    assert_eq!(
        buffer
            .clears()
            .pending_clears_now()
            .iter()
            .collect::<Vec<_>>(),
        vec![&first]
    );
    // Cleared again after another Send while central was applying the first: forgetting
    // the first leaves the moved one.
    buffer.intake().enqueue(about("b", "k1")).await.unwrap();
    let second = buffer
        .intake()
        .clear_condition(&site(), key("k1"), Utc::now())
        .await
        .unwrap()
        .pending;
    assert!(second.up_to > first.up_to);
    assert!(!buffer.clears().forget_clear(first).await.unwrap());
    assert_eq!(buffer.clears().pending_clears_now().len(), 1);
    let published = buffer.clears().pending_clears();
    assert!(buffer.clears().forget_clear(second).await.unwrap());
    assert!(published.has_changed().unwrap());
    assert!(published.borrow().is_empty());
    assert_eq!(buffer.status().stats().await.unwrap().pending_clears, 0);
    drop(buffer);
    assert!(open(&dir).clears().pending_clears_now().is_empty());
}

/// Replication learns of the marks, and the recent rows (which hold the rows unmarked) are
/// forgotten, so a stream reads the marked rows from the table.
#[tokio::test]
async fn marks_are_announced_and_the_recent_rows_forgotten() {
    let dir = tempfile::tempdir().unwrap();
    let buffer = open(&dir);
    let mut changes = buffer.clears().row_changes();
    let reader = buffer.replication().recent_rows();
    let a = buffer.intake().enqueue(about("a", "k1")).await.unwrap();
    let b = buffer.intake().enqueue(about("b", "k2")).await.unwrap();
    assert!(reader.after(Seq::START, 10).is_some());
    buffer
        .intake()
        .clear_condition(&site(), key("k1"), Utc::now())
        .await
        .unwrap();
    assert!(reader.after(Seq::START, 10).is_none(), "read the table");
    match changes.try_recv().unwrap() {
        RowChange::Marked(seqs) => assert_eq!(&*seqs, &[a]),
        other => panic!("{other:?}"),
    }
    // Nothing marked, nothing announced.
    buffer
        .intake()
        .clear_condition(&site(), key("k1"), Utc::now())
        .await
        .unwrap();
    assert!(changes.try_recv().is_err());

    assert_eq!(buffer.replication().marked_seqs(b).await.unwrap(), vec![a]);
    assert_eq!(
        buffer.replication().marked_seqs(Seq::START).await.unwrap(),
        vec![]
    );
    let page = buffer
        .replication()
        .rows_at(vec![b, Seq(99), a])
        .await
        .unwrap();
    let seqs: Vec<Seq> = page.rows.iter().map(|(s, _)| *s).collect();
    assert_eq!(seqs, vec![b, a], "in the order asked, gone ones left out");
    assert!(page.rows[1].1.cleared_at_site.is_some());
    assert_eq!(buffer.clears().oldest_seq().await.unwrap(), Some(a));
    buffer.forwarding().remove(vec![a, b]).await.unwrap();
    assert_eq!(buffer.clears().oldest_seq().await.unwrap(), None);
}

/// A rejected row keeps its key and its mark beside the reason.
#[tokio::test]
async fn a_rejected_row_keeps_its_key_and_mark() {
    let dir = tempfile::tempdir().unwrap();
    let buffer = open(&dir);
    let seq = buffer.intake().enqueue(about("a", "k1")).await.unwrap();
    let at = to_buffer_precision(Utc::now());
    buffer
        .intake()
        .clear_condition(&site(), key("k1"), at)
        .await
        .unwrap();
    assert!(
        buffer
            .forwarding()
            .reject(seq, "no such list".into())
            .await
            .unwrap()
    );
    let (condition_key, cleared_ms): (String, i64) = buffer
        .db()
        .read(|c| {
            c.query_row("SELECT condition_key, cleared_at FROM rejected", [], |r| {
                Ok((r.get(0)?, r.get(1)?))
            })
            .map_err(BufferError::from)
        })
        .await
        .unwrap();
    assert_eq!(
        (condition_key.as_str(), cleared_ms),
        ("k1", at.timestamp_millis())
    );
}

/// A buffer the previous binary wrote (schema v3) opens; its rows, waiting or rejected,
/// read back with no key, and can be cleared by none.
#[tokio::test]
async fn a_version_3_buffer_is_upgraded_and_its_rows_have_no_key() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("buffer.db");
    let n = notification("written by the old binary");
    {
        let conn = Connection::open(&path).unwrap();
        conn.execute_batch(SCHEMA_V1).unwrap();
        conn.execute_batch(SCHEMA_V2).unwrap();
        conn.execute_batch(SCHEMA_V3).unwrap();
        conn.pragma_update(None, "user_version", 3).unwrap();
        let p = &n.provenance;
        conn.execute(
            "INSERT INTO buffered (notification_id, type, list_name, subject, body, \
             type_data, source_site_id, source_instance_id, source_script, \
             origin_execution_id, origin_parent_execution_id, enqueued_at, priority) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, 1)",
            params![
                n.id.to_string(),
                n.content.kind.as_str(),
                n.content.list_name.as_str(),
                n.content.subject.as_str(),
                n.content.body.as_str(),
                n.content.type_data.as_str(),
                p.source_site_id.as_str(),
                p.source_instance_id.as_str(),
                p.source_script.as_str(),
                p.origin_execution_id.map(|u| u.to_string()),
                p.origin_parent_execution_id.map(|u| u.to_string()),
                p.site_enqueued_at.timestamp_millis(),
            ],
        )
        .unwrap();
    }

    let buffer = Buffer::open(&path).unwrap();
    let rows = all_rows(&buffer).await.rows;
    let expected = BufferedNotification {
        priority: crate::domain::Priority::High,
        ..n
    };
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].1, expected, "the same row, with no key and no mark");
    let version: i64 = select_one(&buffer, "PRAGMA user_version").await;
    assert_eq!(version, SCHEMA_VERSION);
    assert!(buffer.clears().pending_clears_now().is_empty());
    let cleared = buffer
        .intake()
        .clear_condition(&site(), key("k1"), Utc::now())
        .await
        .unwrap();
    assert_eq!(cleared.marked, 0);
    let keyed = about("new", "k1");
    buffer.intake().enqueue(keyed.clone()).await.unwrap();
    let rows = all_rows(&buffer).await.rows;
    assert_eq!(rows.last().map(|(_, r)| r), Some(&keyed));
}

/// A clear handed over by a former active: recorded due at once where the node has none of
/// the key; merged into the node's own pending clear (its watermark kept, the later time
/// taken, so the clear is sent again if central was applying the older one); not recorded
/// again once central applied a clear of the key at least as recent. The end of a
/// hand-over forgets what was applied.
#[tokio::test]
async fn handed_over_clears_are_merged_per_key_and_never_applied_twice() {
    let dir = tempfile::tempdir().unwrap();
    let buffer = open(&dir);
    let at = |seconds: i64| {
        to_buffer_precision(DateTime::from_timestamp(1_700_000_000 + seconds, 0).unwrap())
    };
    let handed = |condition: &str, seconds: i64| PendingClear {
        condition_key: key(condition),
        // The former active's seq: means nothing here.
        up_to: Seq(999),
        cleared_at: at(seconds),
    };
    let stored = |buffer: &Buffer| -> Vec<(String, i64, DateTime<Utc>)> {
        buffer
            .clears()
            .pending_clears_now()
            .iter()
            .map(|c| (c.condition_key.to_string(), c.up_to.0, c.cleared_at))
            .collect()
    };
    buffer.intake().enqueue(about("a", "k1")).await.unwrap();
    let own = buffer
        .intake()
        .clear_condition(&site(), key("k1"), at(10))
        .await
        .unwrap()
        .pending;
    assert_eq!(own.up_to, Seq(1));

    let adopted = buffer
        .adoption()
        .adopt(
            Vec::new(),
            vec![handed("k1", 20), handed("k2", 5)],
            Vec::new(),
        )
        .await
        .unwrap();
    assert_eq!(
        adopted.clears,
        AdoptedClears {
            recorded: 2,
            already_applied: 0
        }
    );
    assert_eq!(
        stored(&buffer),
        vec![("k2".into(), 0, at(5)), ("k1".into(), 1, at(20))]
    );
    // Central applied the older k1 meanwhile: the merged one stays, to be sent again.
    assert!(!buffer.clears().forget_clear(own).await.unwrap());
    let merged = buffer
        .clears()
        .pending_clears_now()
        .iter()
        .nth(1)
        .cloned()
        .unwrap();
    let k2 = buffer
        .clears()
        .pending_clears_now()
        .iter()
        .next()
        .cloned()
        .unwrap();
    assert!(buffer.clears().forget_clear(merged).await.unwrap());
    assert!(buffer.clears().forget_clear(k2).await.unwrap());
    assert!(stored(&buffer).is_empty());

    // Handed over again (a repeated hand-over): as recent as applied, nothing to do; a
    // later clear of the key is new.
    let adopted = buffer
        .adoption()
        .adopt(
            Vec::new(),
            vec![handed("k1", 20), handed("k2", 4), handed("k2", 6)],
            Vec::new(),
        )
        .await
        .unwrap();
    assert_eq!(
        adopted.clears,
        AdoptedClears {
            recorded: 1,
            already_applied: 2
        }
    );
    assert_eq!(stored(&buffer), vec![("k2".into(), 0, at(6))]);

    // After a hand-over of its own the node remembers nothing applied.
    let head = buffer.replication().head_now();
    let finished = buffer.handover().finish_handover(head, 2).await.unwrap();
    assert_eq!(finished.deleted_clears, vec!["k2".to_owned()]);
    let applied: i64 = select_one(&buffer, "SELECT COUNT(*) FROM applied_clears").await;
    assert_eq!(applied, 0);
}

/// Only the most recently cleared keys are remembered as applied.
#[tokio::test]
async fn applied_clears_keep_the_most_recent_keys() {
    let dir = tempfile::tempdir().unwrap();
    let buffer = open(&dir);
    let kept = buffer
        .db()
        .write(|conn| {
            for i in 0..=APPLIED_CLEARS_KEPT {
                remember_applied(conn, &format!("k{i}"), 1_000 + i)?;
            }
            // Applied again, later: kept, and no other key goes.
            remember_applied(conn, "k5", 1_000_000)?;
            let kept: Vec<String> = conn
                .prepare("SELECT condition_key FROM applied_clears ORDER BY cleared_at LIMIT 2")?
                .query_map([], |r| r.get(0))?
                .collect::<rusqlite::Result<_>>()?;
            let count: i64 =
                conn.query_row("SELECT COUNT(*) FROM applied_clears", [], |r| r.get(0))?;
            Ok::<_, BufferError>((kept, count))
        })
        .await
        .unwrap();
    assert_eq!(kept.1, APPLIED_CLEARS_KEPT);
    assert_eq!(kept.0, vec!["k1".to_owned(), "k2".to_owned()], "k0 went");
}

/// A stored key that breaks the rules (edited by hand) is reported and left out: the buffer
/// still opens and forwards.
#[tokio::test]
async fn an_invalid_stored_key_is_a_bad_row_and_an_invalid_pending_clear_is_skipped() {
    let dir = tempfile::tempdir().unwrap();
    let buffer = open(&dir);
    let bad = buffer.intake().enqueue(about("a", "k1")).await.unwrap();
    let key = "UPDATE buffered SET condition_key = 'tank 4' WHERE seq = ?1";
    damage(&buffer, key, bad).await;
    let clear = "INSERT INTO pending_clears SELECT 'tank 4', ?1, 0";
    damage(&buffer, clear, Seq(1)).await;
    let page = all_rows(&buffer).await;
    assert!(page.rows.is_empty());
    assert!(
        page.unreadable[0].2.starts_with("condition_key:"),
        "{:?}",
        page.unreadable
    );
    drop(buffer);
    assert!(open(&dir).clears().pending_clears_now().is_empty());
}
