//! Central ingest: idempotency, conflicts and bad input, over real gRPC into a real SQLite file;
//! and how both entry points (central's ingest, the site's `Send`) answer a request too large.

use outbox_domain::limits::MAX_BODY_BYTES;
use outbox_proto::limits::MAX_GRPC_MESSAGE_BYTES;
use outbox_proto::v1;
use tokio_stream::StreamExt;
use tonic::{Code, Status};

use crate::harness::{Central, Db, Site, central_config, free_addr, send_request, submit};

#[tokio::test]
async fn resubmit_is_duplicate_and_changed_content_is_rejected() {
    let dir = tempfile::tempdir().unwrap();
    // No SMTP: rows park at delivery, which leaves the content columns as submitted.
    let central = Central::start(central_config(dir.path(), None)).await;
    let mut ingest = central.ingest().await;

    let original = submit("Tank 4 high level", "Level 97%");
    let id = original.notification_id.clone();
    let first = ingest
        .submit_notification(original.clone())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(first.outcome(), v1::SubmitOutcome::Accepted);
    let second = ingest
        .submit_notification(original.clone())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(second.outcome(), v1::SubmitOutcome::Duplicate);
    assert_eq!(second.notification_id, id);

    let mut changed = original.clone();
    changed.body = "Level 12%".into();
    let third = ingest
        .submit_notification(changed)
        .await
        .unwrap()
        .into_inner();
    assert_eq!(third.outcome(), v1::SubmitOutcome::Rejected);
    assert!(
        third.reason.contains("different content"),
        "{}",
        third.reason
    );

    let db = Db::open(&central.db);
    assert_eq!(db.count("SELECT COUNT(*) FROM Notifications"), 1);
    assert_eq!(
        db.strings("SELECT Body FROM Notifications"),
        vec!["Level 97%".to_string()],
        "the stored row is unchanged by the conflicting submit"
    );
    central.stop().await;
}

#[tokio::test]
async fn stream_acks_each_submit_once_and_rejects_bad_ones_in_band() {
    let dir = tempfile::tempdir().unwrap();
    let central = Central::start(central_config(dir.path(), None)).await;
    let mut ingest = central.ingest().await;

    let good: Vec<_> = (0..300)
        .map(|i| submit(&format!("alarm {i}"), "body"))
        .collect();
    let mut bad = submit("bad\r\nBcc: someone@evil.test", "body");
    bad.notification_id = "bad-one".into();
    let mut outgoing = good.clone();
    outgoing.push(bad);
    // The first good one again: a duplicate inside the same stream.
    outgoing.push(good[0].clone());

    let acks: Vec<v1::NotificationSubmitAck> = ingest
        .submit_notifications(tokio_stream::iter(outgoing))
        .await
        .unwrap()
        .into_inner()
        .collect::<Result<_, _>>()
        .await
        .unwrap();

    assert_eq!(acks.len(), 302, "one ack per submit");
    let accepted = acks
        .iter()
        .filter(|a| a.outcome() == v1::SubmitOutcome::Accepted)
        .count();
    let duplicate = acks
        .iter()
        .filter(|a| a.outcome() == v1::SubmitOutcome::Duplicate)
        .count();
    assert_eq!((accepted, duplicate), (300, 1));
    let rejected: Vec<_> = acks
        .iter()
        .filter(|a| a.outcome() == v1::SubmitOutcome::Rejected)
        .collect();
    assert_eq!(rejected.len(), 1);
    assert_eq!(rejected[0].notification_id, "bad-one");
    assert!(
        rejected[0].reason.starts_with("notification_id:"),
        "{}",
        rejected[0].reason
    );

    let db = Db::open(&central.db);
    assert_eq!(db.count("SELECT COUNT(*) FROM Notifications"), 300);
    central.stop().await;
}

#[tokio::test]
async fn bad_input_is_invalid_argument_naming_the_field_and_stores_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let central = Central::start(central_config(dir.path(), None)).await;
    let mut ingest = central.ingest().await;

    type Breaker = fn(&mut v1::NotificationSubmit);
    let cases: &[(&str, Breaker)] = &[
        ("list_name", |m| m.list_name.clear()),
        ("list_name", |m| m.list_name = "l".repeat(129)),
        ("subject", |m| m.subject.clear()),
        ("subject", |m| m.subject = "s".repeat(501)),
        ("subject", |m| m.subject = "two\nlines".into()),
        ("subject", |m| m.subject = "carriage\rreturn".into()),
        ("body", |m| m.body.clear()),
        ("body", |m| m.body = "b".repeat(256 * 1024 + 1)),
        ("notification_id", |m| m.notification_id = "12345".into()),
        ("notification_id", |m| m.notification_id.clear()),
        ("type", |m| m.r#type = 42),
        ("type", |m| m.r#type = 0),
        ("source_site_id", |m| m.source_site_id.clear()),
        ("type_data", |m| m.type_data = "not json".into()),
        ("origin_execution_id", |m| {
            m.origin_execution_id = Some("x".into())
        }),
    ];
    for (field, break_it) in cases {
        let mut msg = submit("Tank 4 high level", "Level 97%");
        break_it(&mut msg);
        let status = ingest.submit_notification(msg).await.unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument, "{field}: {status:?}");
        assert!(
            status.message().starts_with(&format!("{field}:")),
            "{field}: message {:?} names the field",
            status.message()
        );
    }

    // A body far over its limit is refused as content, like any other bad value.
    let huge = submit("Tank 4 high level", &"x".repeat(2 * 1024 * 1024));
    let status = ingest.submit_notification(huge).await.unwrap_err();
    assert_body_over_its_limit(&status);

    let db = Db::open(&central.db);
    assert_eq!(db.count("SELECT COUNT(*) FROM Notifications"), 0);

    // Status of an unknown or malformed id.
    let mut outbox = central.outbox().await;
    let unknown = outbox
        .get_notification_status(v1::GetNotificationStatusRequest {
            notification_id: uuid::Uuid::new_v4().to_string(),
        })
        .await
        .unwrap_err();
    assert_eq!(unknown.code(), Code::NotFound);
    let malformed = outbox
        .get_notification_status(v1::GetNotificationStatusRequest {
            notification_id: "nope".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(malformed.code(), Code::InvalidArgument);
    central.stop().await;
}

/// What a script sees for a 2 MiB body: INVALID_ARGUMENT naming the field and its limit, not the
/// transport's OUT_OF_RANGE "decoded message length too large".
fn assert_body_over_its_limit(status: &Status) {
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert!(
        status.message().starts_with("body:")
            && status
                .message()
                .contains(&format!("the limit is {MAX_BODY_BYTES} bytes")),
        "{:?}",
        status.message()
    );
}

#[tokio::test]
async fn a_2_mib_body_is_refused_naming_body_and_its_limit_at_the_site_and_on_the_stream() {
    let dir = tempfile::tempdir().unwrap();
    let two_mib = "x".repeat(2 * 1024 * 1024);

    // The site's Send (central need not be up: nothing gets that far).
    let site = Site::start(dir.path(), free_addr().await).await;
    let status = site
        .client()
        .await
        .send(send_request("Tank 4 high level", &two_mib))
        .await
        .unwrap_err();
    assert_body_over_its_limit(&status);
    assert_eq!(site.depth().await, 0);
    site.stop().await;

    // Central's stream: a REJECTED ack with the same reason, and the stream carries on.
    let central = Central::start(central_config(dir.path(), None)).await;
    let before = submit("before", "Level 97%");
    let oversized = submit("oversized", &two_mib);
    let oversized_id = oversized.notification_id.clone();
    let after = submit("after", "Level 98%");
    let acks: Vec<v1::NotificationSubmitAck> = central
        .ingest()
        .await
        .submit_notifications(tokio_stream::iter([before, oversized, after]))
        .await
        .unwrap()
        .into_inner()
        .collect::<Result<_, _>>()
        .await
        .unwrap();
    assert_eq!(acks.len(), 3);
    let rejected: Vec<_> = acks
        .iter()
        .filter(|a| a.outcome() == v1::SubmitOutcome::Rejected)
        .collect();
    assert_eq!(rejected.len(), 1);
    assert_eq!(rejected[0].notification_id, oversized_id);
    assert!(
        rejected[0].reason.starts_with("body:")
            && rejected[0]
                .reason
                .contains(&format!("the limit is {MAX_BODY_BYTES} bytes")),
        "{}",
        rejected[0].reason
    );
    assert_eq!(
        Db::open(&central.db).count("SELECT COUNT(*) FROM Notifications"),
        2
    );
    central.stop().await;
}

#[tokio::test]
async fn a_request_over_the_transport_limit_gets_out_of_range_naming_it_and_ends_a_stream() {
    let dir = tempfile::tempdir().unwrap();
    let central = Central::start(central_config(dir.path(), None)).await;
    let beyond = "x".repeat(MAX_GRPC_MESSAGE_BYTES + 1);
    let names_the_limit = |status: &Status| {
        assert_eq!(status.code(), Code::OutOfRange, "{status:?}");
        assert!(
            status
                .message()
                .contains(&format!("the limit is: {MAX_GRPC_MESSAGE_BYTES} bytes")),
            "{:?}",
            status.message()
        );
    };

    let status = central
        .ingest()
        .await
        .submit_notification(submit("Tank 4 high level", &beyond))
        .await
        .unwrap_err();
    names_the_limit(&status);

    // On a stream, the submit before it is still acked; then the stream ends with the status
    // instead of cleanly, so the client knows why the last submit got no ack.
    let first = submit("first", "Level 97%");
    let first_id = first.notification_id.clone();
    let mut acks = central
        .ingest()
        .await
        .submit_notifications(tokio_stream::iter([
            first,
            submit("Tank 4 high level", &beyond),
        ]))
        .await
        .unwrap()
        .into_inner();
    let ack = acks.next().await.unwrap().unwrap();
    assert_eq!(
        (ack.notification_id.as_str(), ack.outcome()),
        (first_id.as_str(), v1::SubmitOutcome::Accepted)
    );
    let status = acks.next().await.unwrap().unwrap_err();
    names_the_limit(&status);
    central.stop().await;
}

/// `outbox_ingest_total{outcome="accepted"}` counts what was committed, not what was acked: a
/// site whose stream breaks before it reads its acks resends the same rows on a new stream, and
/// whatever the first stream committed comes back DUPLICATE there. However the work split
/// between the two streams, every row is counted ACCEPTED exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn accepted_rows_are_counted_once_even_when_their_acks_are_lost() {
    const ROWS: usize = 600;
    let dir = tempfile::tempdir().unwrap();
    let mut config = central_config(dir.path(), None);
    let metrics_addr = free_addr().await;
    config.metrics_listen = Some(metrics_addr);
    let central = Central::start(config).await;
    let rows: Vec<v1::NotificationSubmit> = (0..ROWS)
        .map(|i| submit(&format!("alarm {i}"), "level 97%"))
        .collect();

    // The first stream sends everything and goes away without reading a single ack.
    let mut ingest = central.ingest().await;
    let (tx, rx) = tokio::sync::mpsc::channel(ROWS);
    for row in &rows {
        tx.send(row.clone()).await.unwrap();
    }
    let acks = ingest
        .submit_notifications(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .unwrap();
    drop(acks);
    drop(tx);

    // The site reconnects and resends: every row is acked, ACCEPTED or DUPLICATE.
    let mut ingest = central.ingest().await;
    let acks: Vec<v1::NotificationSubmitAck> = ingest
        .submit_notifications(tokio_stream::iter(rows.clone()))
        .await
        .unwrap()
        .into_inner()
        .map(|ack| ack.unwrap())
        .collect()
        .await;
    assert_eq!(acks.len(), ROWS);
    assert!(acks.iter().all(|a| matches!(
        a.outcome(),
        v1::SubmitOutcome::Accepted | v1::SubmitOutcome::Duplicate
    )));
    let stored: usize = Db::open(&central.db)
        .strings("SELECT NotificationId FROM Notifications")
        .len();
    assert_eq!(stored, ROWS);

    crate::harness::eventually("every committed row is counted once", || async move {
        let scrape = metrics_endpoint::get(metrics_addr, "/metrics").await.ok()?;
        let accepted =
            metrics_endpoint::sample(&scrape.body, "outbox_ingest_total{outcome=\"accepted\"}")?;
        (accepted == ROWS as f64).then_some(())
    })
    .await;
    central.stop().await;
}

/// Times at the edges of what a protobuf timestamp (and MS SQL's datetime2) holds: a submit
/// whose site time is past year 9999 used to fail the whole MS SQL batch it was in, blocking its
/// site's stream. Now it is REJECTED on its own, naming the field, and the rest of the stream is
/// stored; year 9999 itself is still a time like any other. A filter with a NUL in it answered
/// "store unavailable" on MS SQL; now every store refuses it naming the field.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn times_past_year_9999_and_filters_with_control_characters_are_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let central = Central::start(central_config(dir.path(), None)).await;
    let mut ingest = central.ingest().await;
    let mut late = submit("Tank 4 high level", "Level 97%");
    let at = |seconds, nanos| {
        let instant = chrono::DateTime::from_timestamp(seconds, nanos).unwrap();
        Some(outbox_proto::time::to_timestamp(instant))
    };
    // 10000-01-01T00:00:00Z, then the last instant of year 9999.
    late.site_enqueued_at = at(253_402_300_800, 0);
    let mut last = submit("Tank 5 high level", "Level 97%");
    last.site_enqueued_at = at(253_402_300_799, 999_999_000);
    let good = submit("Tank 6 high level", "Level 97%");
    let acks: Vec<v1::NotificationSubmitAck> = ingest
        .submit_notifications(tokio_stream::iter(vec![late.clone(), last, good]))
        .await
        .unwrap()
        .into_inner()
        .collect::<Result<_, _>>()
        .await
        .unwrap();
    assert_eq!(acks.len(), 3);
    for ack in &acks {
        if ack.notification_id == late.notification_id {
            assert_eq!(ack.outcome(), v1::SubmitOutcome::Rejected);
            assert!(
                ack.reason.starts_with("site_enqueued_at:"),
                "{}",
                ack.reason
            );
        } else {
            assert_eq!(ack.outcome(), v1::SubmitOutcome::Accepted, "{ack:?}");
        }
    }
    let db = Db::open(&central.db);
    assert_eq!(db.count("SELECT COUNT(*) FROM Notifications"), 2);

    let refused = central
        .outbox()
        .await
        .query_notifications(v1::QueryNotificationsRequest {
            filter: Some(v1::NotificationFilter {
                source_site_id: "\0\u{ff}".into(),
                ..Default::default()
            }),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::InvalidArgument);
    assert!(
        refused.message().starts_with("filter.source_site_id:"),
        "{}",
        refused.message()
    );
    central.stop().await;
}
