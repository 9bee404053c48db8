//! Central's disk fills while deliveries are under way (issue 25, item 5): central's SQLite
//! database lives on a small tmpfs, four mails are claimed and held mid-conversation by the
//! relay, the filesystem is filled, and only then does the relay accept them. Central cannot
//! write the outcomes; it keeps them and tries again, so once space is freed (well within the
//! claim timeout) every row is Delivered with one attempt and each mail arrived exactly once.
//!
//! Mounting needs root (see `disk_full::Tmpfs`); on MS SQL there is no SQLite file to fill, so
//! the test says it is skipped.

use std::io::Write;
use std::net::SocketAddr;
use std::time::Duration;

use outbox_proto::v1;

use crate::backend::{Db, on_mssql};
use crate::disk_full::Tmpfs;
use crate::harness::{Central, central_config, eventually, free_addr, smtp_sink, submit};

/// Mails in flight when the disk fills: one per pooled SMTP connection.
const IN_FLIGHT: usize = 4;

async fn metric(addr: SocketAddr, series: &str) -> f64 {
    let scrape = metrics_endpoint::get(addr, "/metrics").await.unwrap();
    metrics_endpoint::sample(&scrape.body, series).unwrap_or(0.0)
}

/// Writes zeros into `path` until the filesystem refuses more.
fn fill(path: &std::path::Path) {
    let mut file = std::fs::File::create(path).unwrap();
    let block = vec![0u8; 64 * 1024];
    loop {
        if let Err(e) = file.write_all(&block).and_then(|()| file.sync_data()) {
            assert_eq!(
                e.raw_os_error(),
                Some(28),
                "filling the tmpfs ended with {e}, not ENOSPC"
            );
            return;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outcomes_written_while_central_s_disk_is_full_are_kept_and_recorded_once_it_has_room() {
    if on_mssql() {
        eprintln!("SKIPPED central_disk_full: central's database is not a SQLite file here");
        return;
    }
    let Some(tmpfs) = Tmpfs::mount("16m") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let sink = smtp_sink().await;
    sink.pause_replies();
    let metrics_addr = free_addr().await;
    let mut config = central_config(tmpfs.path(), Some(sink.addr()));
    config.metrics_listen = Some(metrics_addr);
    let central = Central::start(config).await;

    let mut ingest = central.ingest().await;
    let mut ids = Vec::new();
    for i in 0..IN_FLIGHT {
        let submit = submit(&format!("disk full at central {i}"), "level 97%");
        ids.push(submit.notification_id.clone());
        let ack = ingest
            .submit_notification(submit)
            .await
            .unwrap()
            .into_inner();
        assert_eq!(ack.outcome(), v1::SubmitOutcome::Accepted);
    }
    // Every mail is claimed (its InFlight attempt committed) and waits for the relay's answer.
    assert!(
        sink.wait_for_held_replies(IN_FLIGHT, Duration::from_secs(30))
            .await,
        "{IN_FLIGHT} deliveries never reached the relay"
    );
    let db = Db::open(&central.db);
    let in_flight =
        db.count("SELECT COUNT(*) FROM NotificationAttempts WHERE Outcome = 'InFlight'");
    assert_eq!(in_flight, IN_FLIGHT as i64);

    // The disk fills; then the relay accepts every mail.
    let filler = tmpfs.path().join("filler");
    fill(&filler);
    sink.resume_replies();
    assert_eq!(
        sink.wait_for_count(IN_FLIGHT, Duration::from_secs(30))
            .await,
        IN_FLIGHT
    );
    // Central tries to record the outcomes and cannot: nothing is Delivered yet.
    eventually("an outcome write refused for lack of space", || async {
        (metric(
            metrics_addr,
            "outbox_dispatcher_outcome_write_failures_total",
        )
        .await
            >= 1.0)
            .then_some(())
    })
    .await;
    for id in &ids {
        let (status, _, _) = db.row(id).unwrap();
        assert_ne!(status, "Delivered", "{id} recorded on a full disk?");
    }

    // Room again: the kept outcomes are recorded, and nothing is sent a second time.
    std::fs::remove_file(&filler).unwrap();
    eventually("every outcome recorded once the disk has room", || async {
        ids.iter()
            .all(|id| {
                db.row(id)
                    .is_some_and(|(status, _, _)| status == "Delivered")
            })
            .then_some(())
    })
    .await;
    for id in &ids {
        let attempts = db.attempts(id);
        assert_eq!(attempts.len(), 1, "{id}: {attempts:?}");
        assert_eq!(attempts[0].1, "Delivered", "{id}: {attempts:?}");
    }
    assert_eq!(
        metric(metrics_addr, "outbox_dispatcher_outcomes_unrecorded_total").await,
        0.0
    );
    // Long enough for a lost outcome to have become due again and been sent twice would be a
    // claim timeout; instead the proof is structural: every row is terminal, so nothing is due.
    let due = db.count(
        "SELECT COUNT(*) FROM Notifications WHERE Status IN ('Pending', 'Retrying', 'Held')",
    );
    assert_eq!(due, 0);
    assert_eq!(sink.accepted_count(), IN_FLIGHT, "a mail was sent twice");
    central.stop().await;
    drop(dir);
}
