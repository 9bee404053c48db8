//! Central ingest: idempotency, conflicts and bad input, over real gRPC into a real SQLite file.

use outbox_proto::v1;
use tokio_stream::StreamExt;
use tonic::Code;

use crate::harness::{Central, Db, central_config, submit};

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

    // A message over the 1 MiB wire limit is refused before it is decoded.
    let huge = submit("Tank 4 high level", &"x".repeat(2 * 1024 * 1024));
    let status = ingest.submit_notification(huge).await.unwrap_err();
    assert_ne!(status.code(), Code::Ok);

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
