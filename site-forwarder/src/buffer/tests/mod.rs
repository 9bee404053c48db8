//! Tests of the buffer as its users see it, through the capabilities: a row's way in, out and
//! aside, its status, the schema's upgrades. The fixtures here serve every buffer test.

mod clears;
mod pair;

use std::sync::Arc;

use chrono::Utc;
use rusqlite::{Connection, params};
use uuid::Uuid;

use super::schema::{SCHEMA_V1, SCHEMA_V2, SCHEMA_VERSION};
use super::{Buffer, BufferError};
use crate::domain::{
    Body, BufferedNotification, BufferedStatus, ListName, LocalStatus, NotificationContent,
    NotificationId, NotificationType, Priority, ScriptOrigin, Seq, SiteId, Subject, TypeData,
};

/// A valid notification with `subject`, for buffer tests.
pub(crate) fn notification(subject: &str) -> BufferedNotification {
    crate::domain::accepted_send(
        NotificationContent {
            kind: NotificationType::Email,
            list_name: ListName::parse("ops".into()).unwrap(),
            subject: Subject::parse(subject.into()).unwrap(),
            body: Body::parse("Level 97%".into()).unwrap(),
            type_data: TypeData::empty(),
        },
        ScriptOrigin::parse(
            "node-1".into(),
            "tank.py".into(),
            Some(&Uuid::new_v4().to_string()),
            None,
        )
        .unwrap(),
        SiteId::parse("site-a".into()).unwrap(),
        Utc::now(),
        Priority::Normal,
        None,
        None,
    )
}

/// Like [`notification`], with `priority`.
pub(crate) fn with_priority(subject: &str, priority: Priority) -> BufferedNotification {
    BufferedNotification {
        priority,
        ..notification(subject)
    }
}

fn open(dir: &tempfile::TempDir) -> Buffer {
    Buffer::open(&dir.path().join("buffer.db")).unwrap()
}

/// Every row the buffer holds (the tests hold fewer than ten), oldest first, as a standby's
/// copy reads them: the readable ones and those that break a rule.
async fn all_rows(buffer: &Buffer) -> super::Page {
    buffer
        .replication()
        .next_after(Seq::START, 10)
        .await
        .unwrap()
}

/// The one value `sql` selects from the buffer's database.
async fn select_one<T: rusqlite::types::FromSql + Send + 'static>(
    buffer: &Buffer,
    sql: &'static str,
) -> T {
    buffer
        .db()
        .read(move |c| {
            c.query_row(sql, [], |r| r.get(0))
                .map_err(BufferError::from)
        })
        .await
        .unwrap()
}

/// Runs `sql` (`?1` is the row's seq) on the buffer's database behind its rules' back, as a
/// damaged or hand-edited file would hold it.
async fn damage(buffer: &Buffer, sql: &'static str, seq: Seq) {
    buffer
        .db()
        .write(move |c| c.execute(sql, [seq.0]).map_err(BufferError::from))
        .await
        .unwrap();
}

#[tokio::test]
async fn enqueued_rows_read_back_oldest_first_and_identical() {
    let dir = tempfile::tempdir().unwrap();
    let buffer = open(&dir);
    let first = notification("first");
    let second = notification("second");
    let s1 = buffer.intake().enqueue(first.clone()).await.unwrap();
    let s2 = buffer.intake().enqueue(second.clone()).await.unwrap();
    assert!(s1 < s2);

    let page = buffer
        .replication()
        .next_after(Seq::START, 10)
        .await
        .unwrap();
    assert_eq!(page.rows, vec![(s1, first.clone()), (s2, second.clone())]);
    assert!(page.unreadable.is_empty());
    assert_eq!(page.last_seq(), Some(s2));

    let page = buffer.replication().next_after(s1, 10).await.unwrap();
    assert_eq!(page.rows, vec![(s2, second)]);
    let page = buffer
        .replication()
        .next_after(Seq::START, 1)
        .await
        .unwrap();
    assert_eq!(page.rows, vec![(s1, first)]);
    assert!(
        buffer
            .replication()
            .next_after(s2, 10)
            .await
            .unwrap()
            .is_empty()
    );
}

#[tokio::test]
async fn remove_deletes_only_the_acked_rows_and_tolerates_repeats() {
    let dir = tempfile::tempdir().unwrap();
    let buffer = open(&dir);
    let a = notification("a");
    let b = notification("b");
    let sa = buffer.intake().enqueue(a.clone()).await.unwrap();
    let sb = buffer.intake().enqueue(b.clone()).await.unwrap();
    assert_eq!(buffer.forwarding().remove(vec![sa]).await.unwrap(), 1);
    assert_eq!(
        buffer.forwarding().remove(vec![sa]).await.unwrap(),
        0,
        "second ack is a no-op"
    );
    assert!(!buffer.status().contains(a.id).await.unwrap());
    assert!(buffer.status().contains(b.id).await.unwrap());
    assert_eq!(buffer.status().stats().await.unwrap().depth, 1);
    let _ = sb;
}

#[tokio::test]
async fn seqs_are_never_reused_after_the_buffer_drains() {
    let dir = tempfile::tempdir().unwrap();
    let buffer = open(&dir);
    let s1 = buffer.intake().enqueue(notification("a")).await.unwrap();
    buffer.forwarding().remove(vec![s1]).await.unwrap();
    let s2 = buffer.intake().enqueue(notification("b")).await.unwrap();
    assert!(s2 > s1, "a cursor at {s1:?} must still see the new row");
    assert_eq!(
        buffer
            .replication()
            .next_after(s1, 10)
            .await
            .unwrap()
            .rows
            .len(),
        1
    );
}

#[tokio::test]
async fn reject_moves_the_row_with_its_reason() {
    let dir = tempfile::tempdir().unwrap();
    let buffer = open(&dir);
    let n = notification("bad");
    let seq = buffer.intake().enqueue(n.clone()).await.unwrap();
    assert!(
        buffer
            .forwarding()
            .reject(seq, "conflict".into())
            .await
            .unwrap()
    );
    assert!(
        !buffer
            .forwarding()
            .reject(seq, "again".into())
            .await
            .unwrap()
    );
    assert_eq!(
        buffer.status().local_status(n.id).await.unwrap(),
        LocalStatus::Rejected {
            reason: "conflict".into()
        }
    );
    let stats = buffer.status().stats().await.unwrap();
    assert_eq!((stats.depth, stats.rejected), (0, 1));
    assert_eq!(stats.oldest_enqueued_at, None);
    assert!(all_rows(&buffer).await.is_empty());
}

#[tokio::test]
async fn status_and_stats_describe_buffered_rows() {
    let dir = tempfile::tempdir().unwrap();
    let buffer = open(&dir);
    let n = notification("s");
    let mut scheduled = notification("t");
    scheduled.deliver_after =
        Some(scheduled.provenance.site_enqueued_at + chrono::Duration::hours(8));
    buffer.intake().enqueue(n.clone()).await.unwrap();
    buffer.intake().enqueue(scheduled.clone()).await.unwrap();
    let view = BufferedStatus {
        kind: NotificationType::Email,
        list_name: "ops".into(),
        enqueued_at: n.provenance.site_enqueued_at,
        priority: Priority::Normal,
        condition_key: None,
        cleared_at: None,
        deliver_after: None,
    };
    assert_eq!(
        buffer.status().local_status(n.id).await.unwrap(),
        LocalStatus::Buffered(view.clone())
    );
    assert_eq!(
        buffer.status().local_status(scheduled.id).await.unwrap(),
        LocalStatus::Buffered(BufferedStatus {
            enqueued_at: scheduled.provenance.site_enqueued_at,
            deliver_after: scheduled.deliver_after,
            ..view
        })
    );
    // Read back for forwarding, the row is the one buffered, its time included.
    let page = all_rows(&buffer).await;
    assert!(
        page.rows.iter().any(|(_, row)| *row == scheduled),
        "{:?}",
        page.rows
    );
    assert_eq!(
        buffer
            .status()
            .local_status(NotificationId::generate())
            .await
            .unwrap(),
        LocalStatus::NotHere
    );
    let stats = buffer.status().stats().await.unwrap();
    assert_eq!(stats.depth, 2);
    assert_eq!(
        stats.oldest_enqueued_at,
        Some(n.provenance.site_enqueued_at)
    );
    assert_eq!(stats.rejected, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_enqueues_are_all_committed_and_survive_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let buffer = open(&dir);
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..300 {
        let buffer = buffer.clone();
        tasks.spawn(async move {
            buffer
                .intake()
                .enqueue(notification(&format!("n{i}")))
                .await
        });
    }
    let mut seqs = Vec::new();
    while let Some(done) = tasks.join_next().await {
        seqs.push(done.unwrap().unwrap());
    }
    seqs.sort();
    seqs.dedup();
    assert_eq!(seqs.len(), 300);
    drop(buffer);

    let reopened = open(&dir);
    assert_eq!(reopened.status().stats().await.unwrap().depth, 300);
    let page = reopened
        .replication()
        .next_after(Seq::START, 1000)
        .await
        .unwrap();
    let read: Vec<Seq> = page.rows.iter().map(|(s, _)| *s).collect();
    assert_eq!(read, seqs, "oldest first, nothing missing");
}

#[tokio::test]
async fn enqueue_wakes_a_waiting_forwarder() {
    let dir = tempfile::tempdir().unwrap();
    let buffer = open(&dir);
    let wake = Arc::clone(buffer.forwarding().enqueued());
    buffer.intake().enqueue(notification("x")).await.unwrap();
    // The permit was stored although nobody was waiting yet.
    wake.notified().await;
}

/// A row that breaks a content rule (an empty subject, a priority rank no version wrote) is
/// reported with the column it broke, beside the good rows, and the page still ends at it.
#[tokio::test]
async fn rows_breaking_the_rules_are_reported_not_fatal() {
    for (damage_sql, column) in [
        (
            "UPDATE buffered SET subject = '' WHERE seq = ?1",
            "subject:",
        ),
        (
            "UPDATE buffered SET priority = 7 WHERE seq = ?1",
            "priority:",
        ),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let buffer = open(&dir);
        let good = buffer.intake().enqueue(notification("good")).await.unwrap();
        let bad = buffer.intake().enqueue(notification("bad")).await.unwrap();
        damage(&buffer, damage_sql, bad).await;
        let page = all_rows(&buffer).await;
        assert_eq!(page.rows.len(), 1);
        assert_eq!(page.rows[0].0, good);
        assert_eq!(page.unreadable.len(), 1);
        assert_eq!(page.unreadable[0].0, bad);
        assert!(
            page.unreadable[0].2.starts_with(column),
            "{:?}",
            page.unreadable
        );
        assert_eq!(page.last_seq(), Some(bad));
    }
}

#[tokio::test]
async fn each_priority_round_trips_through_the_buffer_and_into_rejected() {
    let dir = tempfile::tempdir().unwrap();
    let buffer = open(&dir);
    let mut sent = Vec::new();
    for priority in Priority::ALL {
        let n = with_priority(priority.as_str(), priority);
        sent.push((buffer.intake().enqueue(n.clone()).await.unwrap(), n));
    }
    assert_eq!(all_rows(&buffer).await.rows, sent);
    let (critical_seq, critical) = &sent[0];
    let Ok(LocalStatus::Buffered(status)) = buffer.status().local_status(critical.id).await else {
        panic!("still buffered");
    };
    assert_eq!(status.priority, Priority::Critical);

    // A rejected row keeps its priority beside the reason.
    assert!(
        buffer
            .forwarding()
            .reject(*critical_seq, "no".into())
            .await
            .unwrap()
    );
    let rank: i64 = select_one(&buffer, "SELECT priority FROM rejected").await;
    assert_eq!(rank, i64::from(Priority::Critical.rank()));
}

/// A buffer the previous binary wrote (schema v2, no priority column) opens, and its rows,
/// waiting or rejected, read back as normal.
#[tokio::test]
async fn a_version_2_buffer_is_upgraded_and_its_rows_read_as_normal() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("buffer.db");
    let n = notification("written by the old binary");
    {
        let conn = Connection::open(&path).unwrap();
        conn.execute_batch(SCHEMA_V1).unwrap();
        conn.execute_batch(SCHEMA_V2).unwrap();
        conn.pragma_update(None, "user_version", 2).unwrap();
        let p = &n.provenance;
        conn.execute(
            "INSERT INTO buffered (notification_id, type, list_name, subject, body, \
             type_data, source_site_id, source_instance_id, source_script, \
             origin_execution_id, origin_parent_execution_id, enqueued_at) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)",
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
        conn.execute(
            "INSERT INTO rejected (seq, notification_id, type, list_name, subject, body, \
             type_data, source_site_id, source_instance_id, source_script, enqueued_at, \
             reason, rejected_at) \
             VALUES (99, ?1, 'email', 'ops', 's', 'b', '', 'site-a', 'node-1', 'x.py', 0, \
             'no such list', 0)",
            [NotificationId::generate().to_string()],
        )
        .unwrap();
    }

    let buffer = Buffer::open(&path).unwrap();
    let page = all_rows(&buffer).await;
    assert_eq!(page.rows.len(), 1);
    assert_eq!(page.rows[0].1, n, "the same row, read as normal");
    assert_eq!(page.rows[0].1.priority, Priority::Normal);
    let ranks: Vec<i64> = buffer
        .db()
        .read(|c| {
            c.prepare("SELECT priority FROM rejected")?
                .query_map([], |r| r.get(0))?
                .collect::<rusqlite::Result<_>>()
                .map_err(BufferError::from)
        })
        .await
        .unwrap();
    assert_eq!(ranks, vec![i64::from(Priority::Normal.rank())]);
    let version: i64 = select_one(&buffer, "PRAGMA user_version").await;
    assert_eq!(version, SCHEMA_VERSION);

    // New rows take their own priority beside the old one.
    let high = with_priority("new", Priority::High);
    buffer.intake().enqueue(high.clone()).await.unwrap();
    let rows = all_rows(&buffer).await.rows;
    assert_eq!(rows.last().map(|(_, r)| r), Some(&high));
}
