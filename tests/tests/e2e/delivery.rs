//! Central delivery against a real SMTP server: success, parking and retrying, and the attempt
//! rows that record each.

use std::time::Duration;

use outbox_proto::v1;
use outbox_tests::smtp_sink::Behaviour;

use crate::harness::{
    Central, DEADLINE, Db, LIST, RECIPIENTS, central_config, free_addr, smtp_sink, submit,
    wait_for_status,
};

#[tokio::test]
async fn delivers_one_mail_to_the_list_in_bcc_with_a_stable_message_id() {
    let dir = tempfile::tempdir().unwrap();
    let sink = smtp_sink().await;
    let central = Central::start(central_config(dir.path(), Some(sink.addr()))).await;
    let mut ingest = central.ingest().await;

    let msg = submit(
        "Tank 4 high level",
        "Level 97% at 10:42.\nCheck valve V-12.",
    );
    let id = msg.notification_id.clone();
    ingest.submit_notification(msg).await.unwrap();
    let (status, retries, _) = wait_for_status(&central.db, &id, "Delivered").await;
    assert_eq!((status.as_str(), retries), ("Delivered", 0));

    let mails = sink.wait_for_messages(1, DEADLINE).await;
    assert_eq!(mails.len(), 1);
    let mail = &mails[0];
    let mut rcpt = mail.rcpt_to.clone();
    rcpt.sort();
    assert_eq!(rcpt, RECIPIENTS);
    assert_eq!(mail.subject().as_deref(), Some("Tank 4 high level"));
    assert_eq!(mail.body_text(), "Level 97% at 10:42.\nCheck valve V-12.");
    assert!(mail.message_id().unwrap().contains(&id));
    assert_eq!(
        mail.header("Bcc"),
        None,
        "recipients must not see each other"
    );
    assert_eq!(mail.mail_from, "outbox@plant.example.test");

    let db = Db::open(&central.db);
    assert_eq!(db.attempts(&id), vec![(1, "Delivered".to_string(), None)]);

    // The status RPC tells the same story.
    let view = central
        .outbox()
        .await
        .get_notification_status(v1::GetNotificationStatusRequest {
            notification_id: id.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(view.status(), v1::NotificationStatus::Delivered);
    assert!(view.delivered_at.is_some());
    assert_eq!(view.list_name, LIST);
    central.stop().await;
}

#[tokio::test]
async fn unknown_list_parks_with_a_clear_last_error() {
    let dir = tempfile::tempdir().unwrap();
    let sink = smtp_sink().await;
    let central = Central::start(central_config(dir.path(), Some(sink.addr()))).await;
    let mut msg = submit("Tank 4 high level", "Level 97%");
    msg.list_name = "nobody-configured-this".into();
    let id = msg.notification_id.clone();
    central
        .ingest()
        .await
        .submit_notification(msg)
        .await
        .unwrap();

    let (_, _, error) = wait_for_status(&central.db, &id, "Parked").await;
    assert_eq!(
        error.as_deref(),
        Some("unknown notification list \"nobody-configured-this\"")
    );
    assert!(sink.messages().is_empty());
    let attempts = Db::open(&central.db).attempts(&id);
    assert_eq!(attempts.len(), 1);
    assert_eq!(attempts[0].1, "PermanentFailure");
    central.stop().await;
}

#[tokio::test]
async fn smtp_5xx_parks_with_the_reply_in_last_error() {
    let dir = tempfile::tempdir().unwrap();
    let sink = smtp_sink().await;
    sink.set_behaviour(Behaviour::RejectRcpt {
        code: 550,
        text: "5.1.1 mailbox unavailable".into(),
    });
    let central = Central::start(central_config(dir.path(), Some(sink.addr()))).await;
    let msg = submit("Tank 4 high level", "Level 97%");
    let id = msg.notification_id.clone();
    central
        .ingest()
        .await
        .submit_notification(msg)
        .await
        .unwrap();

    let (_, retries, error) = wait_for_status(&central.db, &id, "Parked").await;
    assert_eq!(retries, 0, "a permanent failure is not retried");
    let error = error.unwrap();
    assert!(
        error.contains("550") && error.contains("mailbox unavailable"),
        "{error}"
    );
    assert!(sink.messages().is_empty());
    central.stop().await;
}

#[tokio::test]
async fn smtp_4xx_retries_and_delivers_once_the_server_recovers() {
    let dir = tempfile::tempdir().unwrap();
    let sink = smtp_sink().await;
    sink.set_behaviour(Behaviour::RejectMail {
        code: 451,
        text: "4.3.0 try again later".into(),
    });
    let central = Central::start(central_config(dir.path(), Some(sink.addr()))).await;
    let msg = submit("Tank 4 high level", "Level 97%");
    let id = msg.notification_id.clone();
    central
        .ingest()
        .await
        .submit_notification(msg)
        .await
        .unwrap();

    let (_, retries, error) = wait_for_status(&central.db, &id, "Retrying").await;
    assert!(retries >= 1);
    assert!(error.unwrap().contains("451"));

    sink.set_behaviour(Behaviour::Accept);
    wait_for_status(&central.db, &id, "Delivered").await;
    assert_eq!(sink.wait_for_messages(1, DEADLINE).await.len(), 1);
    let attempts = Db::open(&central.db).attempts(&id);
    let outcomes: Vec<&str> = attempts.iter().map(|a| a.1.as_str()).collect();
    assert_eq!(outcomes.last(), Some(&"Delivered"));
    assert!(
        outcomes[..outcomes.len() - 1]
            .iter()
            .all(|o| *o == "TransientFailure")
    );
    central.stop().await;
}

#[tokio::test]
async fn connection_refused_is_transient_and_exhausting_retries_parks() {
    let dir = tempfile::tempdir().unwrap();
    // Nothing listens here: every connect is refused.
    let closed = free_addr().await;
    let mut config = central_config(dir.path(), Some(closed));
    if let Some(smtp) = config.smtp.as_mut() {
        smtp.max_retries = 3;
        smtp.retry_delay = Duration::from_millis(100);
    }
    let central = Central::start(config).await;
    let msg = submit("Tank 4 high level", "Level 97%");
    let id = msg.notification_id.clone();
    central
        .ingest()
        .await
        .submit_notification(msg)
        .await
        .unwrap();

    let (_, retries, error) = wait_for_status(&central.db, &id, "Retrying").await;
    assert!(retries >= 1);
    assert!(!error.unwrap().is_empty());
    let (_, retries, error) = wait_for_status(&central.db, &id, "Parked").await;
    assert_eq!(retries, 3);
    assert!(
        error
            .unwrap()
            .starts_with("retries exhausted (3 retries, 4 attempts)")
    );
    let attempts = Db::open(&central.db).attempts(&id);
    // max_retries = 3: the first attempt and three retries.
    assert_eq!(attempts.len(), 4);
    assert!(attempts.iter().all(|a| a.1 == "TransientFailure"));
    central.stop().await;
}

#[tokio::test]
async fn connection_dropped_mid_data_is_retried() {
    let dir = tempfile::tempdir().unwrap();
    let sink = smtp_sink().await;
    sink.set_behaviour(Behaviour::DropMidData);
    let central = Central::start(central_config(dir.path(), Some(sink.addr()))).await;
    let msg = submit("Tank 4 high level", "Level 97%");
    let id = msg.notification_id.clone();
    central
        .ingest()
        .await
        .submit_notification(msg)
        .await
        .unwrap();

    wait_for_status(&central.db, &id, "Retrying").await;
    sink.set_behaviour(Behaviour::Accept);
    wait_for_status(&central.db, &id, "Delivered").await;
    central.stop().await;
}

#[tokio::test]
async fn a_claim_batch_on_one_connection_delivers_every_row_once_one_at_a_time() {
    // Claims of a fixed batch, queued and delivered one at a time over one connection: every
    // row is delivered once and nothing is left InFlight.
    let dir = tempfile::tempdir().unwrap();
    let sink = smtp_sink().await;
    let mut config = central_config(dir.path(), Some(sink.addr()));
    config.dispatcher.claim_batch = Some(4);
    if let Some(smtp) = config.smtp.as_mut() {
        smtp.max_concurrent_connections = 1;
    }
    let central = Central::start(config).await;
    let mut ingest = central.ingest().await;
    let mut ids = Vec::new();
    for i in 0..10 {
        let msg = submit(&format!("Batch {i}"), "body");
        ids.push(msg.notification_id.clone());
        ingest.submit_notification(msg).await.unwrap();
    }
    for id in &ids {
        wait_for_status(&central.db, id, "Delivered").await;
    }
    let mails = sink.wait_for_messages(10, DEADLINE).await;
    assert_eq!(mails.len(), 10, "each row delivered exactly once");
    assert_eq!(sink.max_concurrent_sessions(), 1, "one delivery at a time");
    let db = Db::open(&central.db);
    assert_eq!(
        db.count("SELECT COUNT(*) FROM NotificationAttempts WHERE Outcome = 'InFlight'"),
        0
    );
    central.stop().await;
}
