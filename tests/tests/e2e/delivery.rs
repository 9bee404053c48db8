//! Central delivery against a real SMTP server: success, parking and retrying, and the attempt
//! rows that record each.

use std::path::Path;
use std::time::Duration;

use central_outbox::config::ListConfig;
use outbox_proto::v1;
use outbox_tests::smtp_sink::{Behaviour, END_OF_PREVIOUS_MESSAGE, ReceivedMail, SmtpSink};

use crate::harness::{
    Central, DEADLINE, Db, LIST, RECIPIENTS, central_config, eventually, free_addr, smtp_sink,
    submit, wait_for_attempts_under_way, wait_for_status,
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

// ---- Round trips: pipelining and pooled connections ------------------------------------------

/// What a transaction on a pooled connection looks like at a relay that advertises PIPELINING:
/// MAIL, every RCPT and DATA in one batch, then the message. The first also shows the session's
/// EHLO.
const PIPELINED: [&[&str]; 2] = [&["MAIL", "RCPT", "RCPT", "DATA"], &["<message>"]];

/// The wire of a received mail, as `&str`s for comparing.
fn wire(mail: &ReceivedMail) -> Vec<Vec<&str>> {
    mail.wire
        .iter()
        .map(|batch| batch.iter().map(String::as_str).collect())
        .collect()
}

/// Ingests one notification to the default list and waits until it is Delivered; its id.
async fn deliver_one(central: &Central, subject: &str) -> String {
    let msg = submit(subject, "Level 97%");
    let id = msg.notification_id.clone();
    central
        .ingest()
        .await
        .submit_notification(msg)
        .await
        .unwrap();
    wait_for_status(&central.db, &id, "Delivered").await;
    id
}

#[tokio::test]
async fn a_pipelining_relay_gets_each_envelope_in_one_batch_and_nothing_between_messages() {
    let dir = tempfile::tempdir().unwrap();
    let sink = smtp_sink().await;
    let central = Central::start(central_config(dir.path(), Some(sink.addr()))).await;
    for i in 0..3 {
        deliver_one(&central, &format!("Tank {i} high level")).await;
    }
    let mails = sink.wait_for_messages(3, DEADLINE).await;
    assert_eq!(mails.len(), 3);
    let mut first = vec![vec!["EHLO"]];
    first.extend(PIPELINED.map(<[&str]>::to_vec));
    assert_eq!(wire(&mails[0]), first);
    // The later ones reuse the session with nothing in between: no NOOP, no RSET.
    for mail in &mails[1..] {
        assert_eq!(
            mail.session, mails[0].session,
            "the pooled session is reused"
        );
        assert_eq!(wire(mail), PIPELINED.map(<[&str]>::to_vec));
    }
    central.stop().await;
}

#[tokio::test]
async fn a_relay_without_pipelining_gets_one_command_at_a_time() {
    let dir = tempfile::tempdir().unwrap();
    let sink = smtp_sink().await;
    sink.advertise_pipelining(false);
    let central = Central::start(central_config(dir.path(), Some(sink.addr()))).await;
    for i in 0..2 {
        deliver_one(&central, &format!("Tank {i} high level")).await;
    }
    let mails = sink.wait_for_messages(2, DEADLINE).await;
    let one_by_one = [["MAIL"], ["RCPT"], ["RCPT"], ["DATA"], ["<message>"]].map(|b| b.to_vec());
    let mut first = vec![vec!["EHLO"]];
    first.extend(one_by_one.clone());
    assert_eq!(wire(&mails[0]), first);
    assert_eq!(mails[1].session, mails[0].session);
    assert_eq!(wire(&mails[1]), one_by_one);
    central.stop().await;
}

/// Three notifications under way on one connection: the relay holds its greeting until all
/// three attempts have started, so the connection finds the second waiting when it writes the
/// first message, and the third when it writes the second. Returns central and the ids in the
/// order they were sent.
async fn three_waiting_on_one_connection(dir: &Path, sink: &SmtpSink) -> (Central, Vec<String>) {
    let mut config = central_config(dir, Some(sink.addr()));
    if let Some(smtp) = config.smtp.as_mut() {
        smtp.max_concurrent_connections = 1;
        // The first attempt waits on the held replies until all three are under way, which on
        // a slow store (Babelfish on two cores) outlasts the suite's 5 s attempt deadline; the
        // deadline is not what these tests are about.
        smtp.timeout = DEADLINE;
        smtp.overall_timeout = DEADLINE;
    }
    sink.pause_replies();
    let central = Central::start(config).await;
    let mut ingest = central.ingest().await;
    let mut ids = Vec::new();
    for i in 1..=3 {
        let msg = submit(&format!("Tank {i} high level"), "Level 97%");
        ids.push(msg.notification_id.clone());
        ingest.submit_notification(msg).await.unwrap();
    }
    assert!(sink.wait_for_held_replies(1, DEADLINE).await);
    wait_for_attempts_under_way(&central.db, 3).await;
    sink.resume_replies();
    (central, ids)
}

/// With transactions waiting, each next envelope goes out in the same write as the previous
/// message's end of data (RFC 2920 lets message content start a group): one round trip per
/// message, and still nothing else between messages.
#[tokio::test]
async fn a_waiting_envelope_rides_behind_the_previous_message() {
    let dir = tempfile::tempdir().unwrap();
    let sink = smtp_sink().await;
    let (central, ids) = three_waiting_on_one_connection(dir.path(), &sink).await;
    for id in &ids {
        wait_for_status(&central.db, id, "Delivered").await;
    }
    let mails = sink.wait_for_messages(3, DEADLINE).await;
    assert_eq!(mails.len(), 3, "each delivered once");
    assert!(
        mails.iter().all(|m| m.session == 1),
        "on the one connection"
    );
    // Each once; the three attempts are tasks of their own, so which reached the connection
    // first is not fixed.
    for i in 1..=3 {
        let subject = format!("Tank {i} high level");
        assert_eq!(mails.iter().filter(|m| m.raw.contains(&subject)).count(), 1);
    }
    let riding = vec![
        vec![END_OF_PREVIOUS_MESSAGE, "MAIL", "RCPT", "RCPT", "DATA"],
        vec!["<message>"],
    ];
    assert_eq!(
        wire(&mails[0]),
        [
            vec!["EHLO"],
            vec!["MAIL", "RCPT", "RCPT", "DATA"],
            vec!["<message>"]
        ]
    );
    assert_eq!(wire(&mails[1]), riding);
    assert_eq!(wire(&mails[2]), riding);
    central.stop().await;
}

/// Waits until every one of `ids` has reached Delivered or Parked; their attempts' outcomes,
/// in the order of `ids`.
async fn settled_outcomes(central: &Central, ids: &[String]) -> Vec<Vec<String>> {
    let db = Db::open(&central.db);
    eventually("every notification settled", || {
        let settled = ids
            .iter()
            .filter(|id| {
                db.row(id)
                    .is_some_and(|(status, _, _)| status == "Delivered" || status == "Parked")
            })
            .count();
        async move { (settled == ids.len()).then_some(()) }
    })
    .await;
    ids.iter()
        .map(|id| db.attempts(id).into_iter().map(|a| a.1).collect())
        .collect()
}

/// The relay refuses a message whose end of data carried the next envelope: that message parks
/// with the relay's reply, and the next one, whose envelope went with it, is sent again on a new
/// connection and delivered once, with no failure of its own.
#[tokio::test]
async fn a_refused_message_does_not_take_the_envelope_behind_it_down() {
    let dir = tempfile::tempdir().unwrap();
    let sink = smtp_sink().await;
    sink.set_behaviour_for(
        1,
        Behaviour::RejectData {
            code: 554,
            text: "5.6.0 content rejected".into(),
        },
    );
    let (central, ids) = three_waiting_on_one_connection(dir.path(), &sink).await;
    let mut outcomes = settled_outcomes(&central, &ids).await;
    // Which of the three went first is not fixed (see above); the first is the refused one.
    outcomes.sort();
    assert_eq!(
        outcomes,
        [
            vec!["Delivered"],
            vec!["Delivered"],
            vec!["PermanentFailure"]
        ]
    );
    let parked: Vec<_> = ids
        .iter()
        .filter_map(|id| Db::open(&central.db).row(id))
        .filter(|(status, _, _)| status == "Parked")
        .collect();
    assert_eq!(parked.len(), 1);
    assert!(parked[0].2.as_deref().unwrap_or_default().contains("554"));
    let mails = sink.wait_for_messages(2, DEADLINE).await;
    assert_eq!(
        mails.len(),
        2,
        "the refused one is not there; the others once each"
    );
    assert!(
        mails.iter().all(|m| m.session == 2),
        "the one behind it went again, on a new connection"
    );
    central.stop().await;
}

/// The connection drops while a message goes out with the next envelope behind it: the message
/// may or may not have been taken, so its attempt is transient and it is retried; the next one
/// had nothing accepted yet, so it goes again on a new connection with no failure recorded.
#[tokio::test]
async fn a_connection_dropped_under_a_message_and_the_envelope_behind_it() {
    let dir = tempfile::tempdir().unwrap();
    let sink = smtp_sink().await;
    sink.set_behaviour_for(1, Behaviour::DropMidData);
    let (central, ids) = three_waiting_on_one_connection(dir.path(), &sink).await;
    let mut outcomes = settled_outcomes(&central, &ids).await;
    outcomes.sort();
    assert_eq!(
        outcomes,
        [
            vec!["Delivered"],
            vec!["Delivered"],
            vec!["TransientFailure", "Delivered"]
        ]
    );
    assert_eq!(sink.refused_count(), 1, "the relay dropped once");
    let mails = sink.wait_for_messages(3, DEADLINE).await;
    assert_eq!(mails.len(), 3, "each delivered once");
    assert!(
        mails.iter().all(|m| m.session >= 2),
        "all on later connections"
    );
    central.stop().await;
}

/// A list of three where the relay refuses the middle recipient inside the pipelined group: the
/// outcome is what it was with one command at a time (the refusal decides, nobody gets the
/// mail); a 4xx for that one recipient retries and then reaches all three.
#[tokio::test]
async fn one_recipient_of_three_refused_in_a_pipelined_group_is_classified_as_before() {
    const THREE: [&str; 3] = [
        "alice@plant.example.test",
        "bob@plant.example.test",
        "carol@plant.example.test",
    ];
    for (code, text, want) in [
        (550, "5.1.1 bob: mailbox unavailable", "Parked"),
        (452, "4.2.2 bob: mailbox full", "Delivered"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let sink = smtp_sink().await;
        sink.set_behaviour_for(
            1,
            Behaviour::RejectRcptTo {
                address: THREE[1].into(),
                code,
                text: text.into(),
            },
        );
        let mut config = central_config(dir.path(), Some(sink.addr()));
        config.lists = vec![ListConfig::email(
            LIST,
            THREE.iter().map(|r| r.to_string()).collect(),
        )];
        let central = Central::start(config).await;
        let msg = submit("Tank 4 high level", "Level 97%");
        let id = msg.notification_id.clone();
        central
            .ingest()
            .await
            .submit_notification(msg)
            .await
            .unwrap();

        let (_, retries, error) = wait_for_status(&central.db, &id, want).await;
        let error = error.unwrap();
        assert!(
            error.contains(&code.to_string()) && error.contains(text),
            "{code}: {error}"
        );
        let outcomes: Vec<String> = Db::open(&central.db)
            .attempts(&id)
            .into_iter()
            .map(|a| a.1)
            .collect();
        assert_eq!(sink.refused_count(), 1, "{code}");
        if code >= 500 {
            assert_eq!(retries, 0);
            assert_eq!(outcomes, ["PermanentFailure"]);
            assert!(
                sink.messages().is_empty(),
                "a refused envelope goes to nobody"
            );
        } else {
            assert_eq!(retries, 1);
            assert_eq!(outcomes, ["TransientFailure", "Delivered"]);
            let mails = sink.wait_for_messages(1, DEADLINE).await;
            assert_eq!(mails.len(), 1);
            assert_eq!(mails[0].rcpt_to, THREE);
            // The refused group reached the relay as one batch too.
            assert!(
                mails[0].wire.contains(
                    &["MAIL", "RCPT", "RCPT", "RCPT", "DATA"]
                        .map(String::from)
                        .to_vec()
                ),
                "{:?}",
                mails[0].wire
            );
        }
        central.stop().await;
    }
}

/// The relay hangs up right after the pipelined group (MAIL and RCPT answered, DATA never) on a
/// new connection: nothing was accepted, so the attempt is transient, and the retry delivers
/// the mail once.
#[tokio::test]
async fn a_connection_dropped_after_the_pipelined_group_is_transient_and_delivered_once() {
    let dir = tempfile::tempdir().unwrap();
    let sink = smtp_sink().await;
    sink.set_behaviour_for(1, Behaviour::DropAtData);
    let central = Central::start(central_config(dir.path(), Some(sink.addr()))).await;
    let id = deliver_one(&central, "Tank 4 high level").await;
    let outcomes: Vec<String> = Db::open(&central.db)
        .attempts(&id)
        .into_iter()
        .map(|a| a.1)
        .collect();
    assert_eq!(outcomes, ["TransientFailure", "Delivered"]);
    assert_eq!(sink.refused_count(), 1);
    // Delivered rows are never sent again, so this is the mail's only copy.
    assert_eq!(sink.wait_for_messages(1, DEADLINE).await.len(), 1);
    assert_eq!(sink.accepted_count(), 1);
    central.stop().await;
}

/// A pooled connection the relay closed while it sat idle costs nothing: whether the close (with
/// Postfix's 421 or without a word) has arrived when the next mail goes out, or the relay hangs
/// up only once that mail's group is on the wire, the mail is delivered on a new connection in
/// the same attempt, once, and no failure is recorded.
#[tokio::test]
async fn a_pooled_connection_the_relay_closed_while_idle_costs_no_failure() {
    let dir = tempfile::tempdir().unwrap();
    let sink = smtp_sink().await;
    let central = Central::start(central_config(dir.path(), Some(sink.addr()))).await;
    deliver_one(&central, "Tank 1 high level").await;

    let mut expected_session = 1;
    for say_421 in [true, false] {
        sink.close_idle_sessions(say_421);
        eventually("the idle session is closed", || {
            let open = sink.active_sessions();
            async move { (open == 0).then_some(()) }
        })
        .await;
        let id = deliver_one(&central, "Tank 2 high level").await;
        expected_session += 1;
        assert_eq!(Db::open(&central.db).attempts(&id).len(), 1, "{say_421}");
        let mails = sink.messages();
        assert_eq!(mails.last().unwrap().session, expected_session);
    }

    // Closed by the relay only as the next group arrives: the reused session fails before any
    // reply it needed, and the transaction goes again on a new one.
    sink.set_behaviour_for(1, Behaviour::DropAtData);
    let id = deliver_one(&central, "Tank 3 high level").await;
    let attempts = Db::open(&central.db).attempts(&id);
    assert_eq!(attempts.len(), 1);
    assert_eq!(attempts[0].1, "Delivered");
    assert_eq!(sink.refused_count(), 1, "the relay did hang up once");
    let mails = sink.messages();
    assert_eq!(mails.len(), 4, "every mail arrived once");
    assert_eq!(mails[3].session, expected_session + 1);
    central.stop().await;
}
