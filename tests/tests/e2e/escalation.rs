//! Reach a person (issue 35): an alarm of a list with an escalation policy, sent to a real
//! central with a real SMTP sink, pages the next lists while nobody acknowledges it, repeats the
//! callout, and stops the moment somebody does (through the admin API here); a clear stops it
//! too, and a page whose delivery parks escalates at once. Every page's timing is read from the
//! incident's own history, as an operator would. An acknowledged alarm whose condition stays
//! uncleared is reminded (pages again from step 1) until the site clears it.

use std::time::Duration;

use central_outbox::config::{EscalationConfig, EscalationStepConfig, ListConfig};
use outbox_proto::v1;
use outbox_tests::smtp_sink::{Behaviour, SmtpSink};

use crate::harness::{
    Central, DEADLINE, LIST, central_config, eventually, ingest_submit, smtp_sink, submit,
};

const SUPERVISORS: &str = "supervisors";
const SUPERVISOR: &str = "sam@plant.example.test";

/// Central with the `ops` list escalating by `escalation` to a `supervisors` list.
async fn central_escalating(
    dir: &std::path::Path,
    sink: &SmtpSink,
    escalation: EscalationConfig,
) -> Central {
    let mut config = central_config(dir, Some(sink.addr()));
    config.lists[0].escalation = Some(escalation);
    config
        .lists
        .push(ListConfig::email(SUPERVISORS, vec![SUPERVISOR.into()]));
    Central::start(config).await
}

fn escalation(first_wait: u64, step_wait: u64, repeat: u32) -> EscalationConfig {
    EscalationConfig {
        priorities: Vec::new(),
        acknowledge_within: Duration::from_secs(first_wait),
        steps: vec![EscalationStepConfig {
            notify: vec![SUPERVISORS.into()],
            wait: Duration::from_secs(step_wait),
        }],
        repeat,
        repeat_from_step: None,
        escalate_on_park: None,
        acknowledgement_reminder: None,
        notify_acknowledgement: None,
    }
}

/// Sends a critical alarm to `ops` straight to central's ingest; returns its id.
async fn alarm(central: &Central, subject: &str, key: &str) -> String {
    let mut msg = submit(subject, "level above the high setpoint");
    msg.priority = v1::NotificationPriority::Critical.into();
    msg.condition_key = key.into();
    ingest_submit(central, msg).await
}

/// The only incident central has, in detail.
async fn the_incident(central: &Central) -> v1::IncidentDetail {
    let mut outbox = central.outbox().await;
    let list = outbox
        .list_incidents(v1::ListIncidentsRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(list.incidents.len(), 1, "{list:?}");
    outbox
        .get_incident(v1::GetIncidentRequest {
            id: list.incidents[0].id,
        })
        .await
        .unwrap()
        .into_inner()
}

fn at(t: &Option<prost_types::Timestamp>) -> chrono::DateTime<chrono::Utc> {
    outbox_proto::time::from_timestamp(t.as_ref().unwrap()).unwrap()
}

/// Mails the sink received for `address`.
fn mails_to(sink: &SmtpSink, address: &str) -> usize {
    sink.messages()
        .iter()
        .filter(|m| m.rcpt_to.iter().any(|r| r == address))
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unanswered_alarm_pages_each_step_and_repeats_until_the_api_acknowledges_it() {
    let dir = tempfile::tempdir().unwrap();
    let sink = smtp_sink().await;
    // The alarm waits 2 s, the supervisors' page 2 s; then the callout runs once more from the
    // alarm's own list.
    let central = central_escalating(dir.path(), &sink, escalation(2, 2, 1)).await;
    let id = alarm(&central, "Tank 4 level high", "tank4.level").await;

    // The alarm, the supervisors, the alarm's list again, the supervisors again: four pages.
    let detail = eventually("four pages fired", || async {
        let detail = the_incident(&central).await;
        (detail.pages.len() == 4).then_some(detail)
    })
    .await;
    let incident = detail.incident.as_ref().unwrap();
    assert_eq!(incident.alarm_notification_id, id);
    let places: Vec<(u32, u32)> = detail
        .pages
        .iter()
        .map(|p| {
            let place = p.place.as_ref().unwrap();
            (place.round, place.step)
        })
        .collect();
    assert_eq!(places, [(1, 1), (1, 2), (2, 1), (2, 2)]);
    // Timed from the history: each page due one wait after the one before, and fired within
    // two seconds of it.
    for pair in detail.pages.windows(2) {
        assert_eq!(
            at(&pair[1].due_at) - at(&pair[0].due_at),
            chrono::Duration::seconds(2)
        );
        let error = at(&pair[1].fired_at) - at(&pair[1].due_at);
        assert!(error < chrono::Duration::seconds(2), "fired {error} late");
        assert!(pair[1].late_by.is_none());
    }
    // Every page reached the relay: the ops recipients twice (alarm, repeat), the supervisor
    // twice.
    eventually("the four pages mailed", || async {
        (mails_to(&sink, SUPERVISOR) == 2 && mails_to(&sink, crate::harness::RECIPIENTS[0]) == 2)
            .then_some(())
    })
    .await;

    let mut outbox = central.outbox().await;
    let mut request = tonic::Request::new(v1::AcknowledgeIncidentRequest { id: incident.id });
    request
        .metadata_mut()
        .insert("x-outbox-actor", "night-shift".parse().unwrap());
    let answer = outbox
        .acknowledge_incident(request)
        .await
        .unwrap()
        .into_inner();
    assert_eq!(answer.outcome(), v1::AcknowledgeOutcome::Acknowledged);
    let acked = answer.incident.unwrap();
    assert_eq!(acked.status(), v1::IncidentStatus::Acknowledged);
    assert_eq!(acked.acknowledged_by, "night-shift");
    assert_eq!(acked.acknowledged_via, "api");
    // The second acknowledgement says who was first.
    let again = outbox
        .acknowledge_incident(v1::AcknowledgeIncidentRequest { id: incident.id })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(again.outcome(), v1::AcknowledgeOutcome::AlreadyAcknowledged);
    assert_eq!(again.incident.unwrap().acknowledged_by, "night-shift");
    let after = the_incident(&central).await;
    let kinds: Vec<&str> = after.history.iter().map(|h| h.kind.as_str()).collect();
    assert_eq!(
        kinds,
        [
            "Opened",
            "Paged",
            "Paged",
            "Paged",
            "Acknowledged",
            "AcknowledgedAgain"
        ]
    );
    // Nothing is due any more; every page notification was delivered before the
    // acknowledgement (none was left to stop).
    assert!(after.incident.as_ref().unwrap().next_due_at.is_none());
    assert_eq!(answer.stopped, 0);
    assert_eq!(after.notifications.len(), 4);
}

/// An edit of a list's policy applies to the incidents opened after it: an incident open when
/// the admin API replaces the policy keeps the one it opened under (its page goes to the
/// supervisors, as that policy said), and an alarm after the edit pages the managers the new
/// policy names. Read from the mail each list received and the incidents' own policies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_edit_of_the_policy_leaves_the_open_incident_alone() {
    const MANAGERS: &str = "managers";
    const MANAGER: &str = "mo@plant.example.test";
    let dir = tempfile::tempdir().unwrap();
    let sink = smtp_sink().await;
    let mut config = central_config(dir.path(), Some(sink.addr()));
    // The alarm waits 3 s, then the supervisors are paged and wait ten minutes.
    config.lists[0].escalation = Some(escalation(3, 600, 0));
    config
        .lists
        .push(ListConfig::email(SUPERVISORS, vec![SUPERVISOR.into()]));
    config
        .lists
        .push(ListConfig::email(MANAGERS, vec![MANAGER.into()]));
    let central = Central::start(config).await;
    let mut outbox = central.outbox().await;
    let before = alarm(&central, "Tank 4 level high", "tank4.level").await;

    // The edit, while the tank's incident waits for its page: step 2 pages the managers.
    let mut list = outbox
        .get_notification_list(v1::GetNotificationListRequest { name: LIST.into() })
        .await
        .unwrap()
        .into_inner();
    let policy = list.escalation.as_mut().unwrap();
    policy.steps[0].notify = vec![MANAGERS.into()];
    outbox
        .upsert_notification_list(v1::UpsertNotificationListRequest { list: Some(list) })
        .await
        .unwrap();
    let after = alarm(&central, "Pump 2 tripped", "pump2.trip").await;

    // Both pages fire: the tank's to the supervisors, the pump's to the managers.
    eventually("both second pages mailed", || async {
        (mails_to(&sink, SUPERVISOR) == 1 && mails_to(&sink, MANAGER) == 1).then_some(())
    })
    .await;
    assert_eq!(mails_of(&sink, "Tank 4 level high", SUPERVISOR), 1);
    assert_eq!(mails_of(&sink, "Pump 2 tripped", MANAGER), 1);

    // Each incident shows the policy it runs under.
    let incidents = outbox
        .list_incidents(v1::ListIncidentsRequest::default())
        .await
        .unwrap()
        .into_inner()
        .incidents;
    assert_eq!(incidents.len(), 2, "{incidents:?}");
    for incident in &incidents {
        let detail = outbox
            .get_incident(v1::GetIncidentRequest { id: incident.id })
            .await
            .unwrap()
            .into_inner();
        let shown = detail.incident.unwrap();
        let step = &shown.policy.as_ref().unwrap().steps[0].notify;
        if shown.alarm_notification_id == before {
            assert_eq!(step, &[SUPERVISORS.to_owned()]);
        } else {
            assert_eq!(shown.alarm_notification_id, after);
            assert_eq!(step, &[MANAGERS.to_owned()]);
        }
        assert_eq!(detail.pages.len(), 2);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clear_ends_the_incident_and_stops_its_pages() {
    let dir = tempfile::tempdir().unwrap();
    let sink = smtp_sink().await;
    let central = central_escalating(dir.path(), &sink, escalation(1, 600, 0)).await;
    alarm(&central, "Tank 4 level high", "tank4.level").await;
    eventually("the supervisors paged", || async {
        (mails_to(&sink, SUPERVISOR) == 1).then_some(())
    })
    .await;
    central
        .ingest()
        .await
        .clear_condition(v1::ClearConditionRequest {
            source_site_id: "site-a".into(),
            condition_key: "tank4.level".into(),
        })
        .await
        .unwrap();
    let detail = the_incident(&central).await;
    let incident = detail.incident.unwrap();
    assert_eq!(incident.status(), v1::IncidentStatus::Cleared);
    assert!(incident.next_due_at.is_none());
    assert!(incident.ended_at.is_some());
    assert_eq!(detail.history.last().unwrap().kind, "Cleared");
    assert_eq!(detail.history.last().unwrap().actor, "site site-a");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_page_refused_for_good_escalates_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let sink = smtp_sink().await;
    // The alarm's own list would wait ten minutes; its recipients are refused for good (550),
    // so the alarm parks and the supervisors are paged at once.
    let mut config = central_config(dir.path(), Some(sink.addr()));
    config.lists[0].recipients = vec![crate::harness::RECIPIENTS[0].into()];
    config.lists[0].escalation = Some(escalation(600, 600, 0));
    config
        .lists
        .push(ListConfig::email(SUPERVISORS, vec![SUPERVISOR.into()]));
    let central = Central::start(config).await;
    sink.set_behaviour(Behaviour::RejectRcptTo {
        address: crate::harness::RECIPIENTS[0].into(),
        code: 550,
        text: "5.1.1 no such user".into(),
    });
    let id = alarm(&central, "Feeder 7 lost", "feeder7").await;
    crate::harness::wait_for_status(&central.db, &id, "Parked").await;
    let mail = eventually("the supervisors paged early", || async {
        (mails_to(&sink, SUPERVISOR) == 1).then_some(())
    });
    tokio::time::timeout(DEADLINE, mail).await.unwrap();
    let detail = the_incident(&central).await;
    let kinds: Vec<&str> = detail.history.iter().map(|h| h.kind.as_str()).collect();
    assert_eq!(kinds[..3], ["Opened", "Escalated", "Paged"]);
    // Paged within seconds of the park, not after the ten-minute wait.
    let opened = at(&detail.incident.as_ref().unwrap().opened_at);
    let paged = at(&detail.pages[1].fired_at);
    assert!(
        paged - opened < chrono::Duration::seconds(60),
        "{paged} vs {opened}"
    );
    assert_eq!(LIST, detail.incident.unwrap().list_name);
}

/// An incident whose stored row breaks a rule (here a priority no release writes, as a hand
/// edit or a bad restore leaves it) cannot stop the escalation clock: it is exhausted with the
/// reason in its history and counted, and the other incidents go on paging.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_incident_is_set_aside_and_the_others_still_page() {
    let dir = tempfile::tempdir().unwrap();
    let sink = smtp_sink().await;
    // Ten seconds before the next page: the damage is done well before it falls due, even on
    // a loaded machine with a slow database server.
    let central = central_escalating(dir.path(), &sink, escalation(10, 600, 0)).await;
    alarm(&central, "Tank 4 level high", "tank4.level").await;
    alarm(&central, "Tank 5 level high", "tank5.level").await;
    let db = crate::harness::Db::open(&central.db);
    eventually("both incidents open", || {
        let n = db.count("SELECT COUNT(*) FROM Incidents WHERE Status = 'Open'");
        async move { (n == 2).then_some(()) }
    })
    .await;
    db.execute(
        "UPDATE Incidents SET Priority = 9 WHERE ConditionKey = 'tank4.level'",
        &[],
    );
    // Tank 5's page reaches the supervisor; tank 4's incident is exhausted, saying why.
    eventually("the undamaged incident paged", || async {
        (mails_to(&sink, SUPERVISOR) == 1).then_some(())
    })
    .await;
    let (status, detail): (String, String) = eventually("the damaged incident set aside", || {
        let rows: Vec<(String, String)> = db.rows(
            "SELECT i.Status, h.Detail FROM Incidents i JOIN IncidentHistory h \
             ON h.IncidentId = i.Id WHERE i.ConditionKey = 'tank4.level' AND h.Kind = 'Exhausted'",
            |r| Ok((r.get(0)?, r.get(1)?)),
        );
        async move { rows.into_iter().next() }
    })
    .await;
    assert_eq!(status, "Exhausted");
    assert!(detail.contains("cannot be fired"), "{detail}");
    // Set aside before it paged anyone: the one supervisor mail is tank 5's.
    let to_supervisor: Vec<String> = sink
        .messages()
        .iter()
        .filter(|m| m.rcpt_to.iter().any(|r| r == SUPERVISOR))
        .filter_map(|m| m.subject())
        .collect();
    assert_eq!(to_supervisor, ["Tank 5 level high"]);
}

/// The console's Incidents page: an open incident is listed and shown with its policy and
/// pages; ticked and acknowledged there, the API records the console's operator, the means and
/// the browser's address; a list saved from the console's form keeps its escalation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_lists_an_incident_and_acknowledges_it() {
    let dir = tempfile::tempdir().unwrap();
    let sink = smtp_sink().await;
    let mut config = central_config(dir.path(), Some(sink.addr()));
    config.lists[0].escalation = Some(escalation(600, 600, 0));
    config
        .lists
        .push(ListConfig::email(SUPERVISORS, vec![SUPERVISOR.into()]));
    crate::harness::with_console(&mut config).await;
    let central = Central::start(config).await;
    alarm(&central, "Tank 4 level high", "tank4.level").await;
    let id = the_incident(&central).await.incident.unwrap().id;

    let mut browser = crate::console::Browser::new(&central);
    let page = browser.get("/incidents").await;
    assert_eq!(page.status, 200, "{}", page.body);
    assert!(
        page.body.contains(&format!(r#"data-incident-id="{id}""#)),
        "{}",
        page.body
    );
    let detail = browser.get(&format!("/incidents/{id}")).await;
    assert_eq!(detail.status, 200, "{}", detail.body);
    assert!(
        detail.body.contains("Step 2: supervisors, then wait 10m"),
        "{}",
        detail.body
    );
    assert!(detail.body.contains(r#"id="acknowledge""#));
    let csrf = crate::console::csrf(&page.body);
    let id_text = id.to_string();
    let acked = browser
        .post(
            "/incidents/acknowledge",
            &[("csrf", &csrf), ("id", &id_text)],
        )
        .await;
    assert_eq!(acked.status, 303, "{}", acked.body);
    let incident = the_incident(&central).await.incident.unwrap();
    assert_eq!(incident.status(), v1::IncidentStatus::Acknowledged);
    assert_eq!(incident.acknowledged_by, "console");
    assert_eq!(incident.acknowledged_via, "console");
    let history = the_incident(&central).await.history;
    let ack = history.iter().find(|h| h.kind == "Acknowledged").unwrap();
    assert!(ack.from_address.starts_with("127.0.0.1:"), "{ack:?}");
    let listed = browser.get("/incidents?view=acknowledged").await;
    assert!(listed.body.contains(&format!(r#"data-incident-id="{id}""#)));

    // The list's form shows the policy, and saving it as shown keeps it.
    let form = browser.get(&format!("/lists/{LIST}")).await;
    assert!(
        form.body.contains(r#"name="escalate_after" value="10m""#),
        "{}",
        form.body
    );
    let csrf = crate::console::csrf(&form.body);
    let recipients = crate::harness::RECIPIENTS.join("\n");
    let saved = browser
        .post(
            &format!("/lists/{LIST}"),
            &[
                ("csrf", &csrf),
                ("type", "EMAIL"),
                ("recipients", &recipients),
                ("escalate_after", "10m"),
                ("escalation_steps", "supervisors: 10m"),
                ("escalation_repeat", "0"),
                ("escalation_repeat_from", "1"),
                ("escalate_on_park", "on"),
            ],
        )
        .await;
    assert_eq!(saved.status, 303, "{}", saved.body);
    let list = central
        .outbox()
        .await
        .get_notification_list(v1::GetNotificationListRequest { name: LIST.into() })
        .await
        .unwrap()
        .into_inner();
    let escalation = list.escalation.unwrap();
    assert_eq!(escalation.steps[0].notify, [SUPERVISORS]);
    assert_eq!(escalation.escalate_on_park, Some(true));
}

/// The `[secrets]` key `harness::central_config` gives central, as bytes.
const SECRETS_KEY: &[u8; 32] = b"outbox-test-secrets-key-32-bytes";

/// Central with `ops` escalating slowly (nobody is paged during the test), the console on, and
/// acknowledgement links pointing at it (with `pin`, if given).
async fn central_with_links(dir: &std::path::Path, sink: &SmtpSink, pin: Option<&str>) -> Central {
    let mut config = central_config(dir, Some(sink.addr()));
    config.lists[0].escalation = Some(escalation(600, 600, 0));
    config
        .lists
        .push(ListConfig::email(SUPERVISORS, vec![SUPERVISOR.into()]));
    crate::harness::with_console(&mut config).await;
    let console = config.console.listen.unwrap();
    config.acknowledgement.link_base_url = Some(format!("http://{console}/"));
    config.acknowledgement.pin = pin.map(str::to_owned);
    Central::start(config).await
}

/// The acknowledgement link in `mail`'s body, as the path below the console's address.
fn link_path(mail: &outbox_tests::smtp_sink::ReceivedMail, console: &str) -> String {
    let body = mail.body_text();
    let line = body
        .lines()
        .find(|l| l.contains("/ack/"))
        .unwrap_or_else(|| panic!("no acknowledgement link in:\n{body}"));
    line.trim()
        .strip_prefix(console)
        .unwrap_or_else(|| panic!("{line:?} does not point at {console}"))
        .to_owned()
}

/// A link signed as central signs them (the format `ack_link` documents): the test's own
/// reading of it, so a link made here and accepted there proves the format, and an expired one
/// can be made without waiting a day.
fn signed_link(incident: i64, page: u32, expires: i64, recipient: &str) -> String {
    use base64::Engine;
    use base64::engine::general_purpose::URL_SAFE_NO_PAD;
    use hmac::{Hmac, Mac};
    let mac = |key: &[u8], data: &[u8]| {
        let mut mac = Hmac::<sha2::Sha256>::new_from_slice(key).unwrap();
        mac.update(data);
        mac.finalize().into_bytes().to_vec()
    };
    let key = mac(SECRETS_KEY, b"notification-outbox acknowledgement link v1");
    let signature = mac(
        &key,
        format!("ack-link\0{incident}\0{page}\0{expires}\0{recipient}").as_bytes(),
    );
    format!(
        "/ack/{incident}/{page}.{expires}.{}.{}",
        URL_SAFE_NO_PAD.encode(recipient),
        URL_SAFE_NO_PAD.encode(signature)
    )
}

/// Each recipient's mail carries a link of their own; opening it (what a mail scanner does)
/// shows the incident and acknowledges nothing; an expired, edited or other-incident link is
/// refused; the POST acknowledges as that recipient, from the client's address, and a second
/// POST is told who was first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acknowledgement_link_acknowledges_on_post_only_and_as_its_recipient() {
    let dir = tempfile::tempdir().unwrap();
    let sink = smtp_sink().await;
    let central = central_with_links(dir.path(), &sink, None).await;
    let console = central.console_url();
    alarm(&central, "Tank 4 level high", "tank4.level").await;
    let mails = sink.wait_for_messages(2, DEADLINE).await;
    let id = the_incident(&central).await.incident.unwrap().id;
    let [alice, bob] = crate::harness::RECIPIENTS;
    let mut paths = Vec::new();
    for recipient in [alice, bob] {
        let mail = mails
            .iter()
            .find(|m| m.rcpt_to == [recipient])
            .unwrap_or_else(|| panic!("no mail to {recipient} alone: {mails:?}"));
        let path = link_path(mail, &console);
        assert!(path.starts_with(&format!("/ack/{id}/1.")), "{path}");
        paths.push(path);
    }
    assert_ne!(paths[0], paths[1], "each recipient's link is their own");

    let mut browser = crate::console::Browser::new(&central);
    let page = browser.get(&paths[0]).await;
    assert_eq!(page.status, 200, "{}", page.body);
    assert!(page.body.contains("Tank 4 level high"), "{}", page.body);
    assert!(
        page.body.contains(&format!("Acknowledge as {alice}")),
        "{}",
        page.body
    );
    assert_eq!(page.header("cache-control"), Some("no-store"));
    assert_eq!(page.header("referrer-policy"), Some("no-referrer"));
    let incident = the_incident(&central).await.incident.unwrap();
    assert_eq!(
        incident.status(),
        v1::IncidentStatus::Open,
        "a GET acknowledges nothing"
    );

    let now = chrono::Utc::now().timestamp();
    let expired = signed_link(id, 1, now - 1, alice);
    let reply = browser.post(&expired, &[]).await;
    assert_eq!(reply.status, 410, "{}", reply.body);
    assert!(reply.body.contains("stopped working"), "{}", reply.body);
    // The format is the documented one: a link made here with the right key works (checked by
    // its GET, which changes nothing).
    let made_here = browser.get(&signed_link(id, 1, now + 600, alice)).await;
    assert_eq!(made_here.status, 200, "{}", made_here.body);
    let other_incident = paths[0].replacen(&format!("/ack/{id}/"), &format!("/ack/{}/", id + 1), 1);
    let mut edited = paths[0].clone();
    let last = edited.pop().unwrap();
    edited.push(if last == 'A' { 'B' } else { 'A' });
    for forged in [other_incident, edited, format!("/ack/{id}/not-a-token")] {
        let reply = browser.post(&forged, &[]).await;
        assert_eq!(reply.status, 403, "{forged}: {}", reply.body);
        assert!(reply.body.contains("not valid"), "{}", reply.body);
    }
    assert_eq!(
        the_incident(&central).await.incident.unwrap().status(),
        v1::IncidentStatus::Open,
        "no refused link acknowledged anything"
    );

    let acked = browser.post(&paths[0], &[]).await;
    assert_eq!(acked.status, 200, "{}", acked.body);
    assert!(acked.body.contains("You acknowledged"), "{}", acked.body);
    let detail = the_incident(&central).await;
    let incident = detail.incident.unwrap();
    assert_eq!(incident.status(), v1::IncidentStatus::Acknowledged);
    assert_eq!(incident.acknowledged_by, alice);
    assert_eq!(incident.acknowledged_via, "link");
    let ack = detail
        .history
        .iter()
        .find(|h| h.kind == "Acknowledged")
        .unwrap();
    assert!(ack.from_address.starts_with("127.0.0.1:"), "{ack:?}");

    let second = browser.post(&paths[1], &[]).await;
    assert_eq!(second.status, 200, "{}", second.body);
    assert!(
        second
            .body
            .contains(&format!("already acknowledged by {alice}")),
        "{}",
        second.body
    );
}

/// With a PIN configured, the page asks for it and a POST without it (or with a wrong one)
/// acknowledges nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acknowledgement_link_needs_the_pin_when_one_is_set() {
    let dir = tempfile::tempdir().unwrap();
    let sink = smtp_sink().await;
    let central = central_with_links(dir.path(), &sink, Some("2468")).await;
    let console = central.console_url();
    alarm(&central, "Pump 2 tripped", "pump2.trip").await;
    let mails = sink.wait_for_messages(2, DEADLINE).await;
    let path = link_path(&mails[0], &console);
    let mut browser = crate::console::Browser::new(&central);
    let page = browser.get(&path).await;
    assert!(page.body.contains(r#"name="pin""#), "{}", page.body);
    for wrong in [None, Some("1357")] {
        let fields: Vec<(&str, &str)> = wrong.map(|pin| ("pin", pin)).into_iter().collect();
        let reply = browser.post(&path, &fields).await;
        assert_eq!(reply.status, 403, "{}", reply.body);
        assert!(reply.body.contains("PIN"), "{}", reply.body);
    }
    assert_eq!(
        the_incident(&central).await.incident.unwrap().status(),
        v1::IncidentStatus::Open
    );
    let reply = browser.post(&path, &[("pin", "2468")]).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    assert_eq!(
        the_incident(&central).await.incident.unwrap().status(),
        v1::IncidentStatus::Acknowledged
    );
}

/// The plant's HMI acknowledges through the site: an alarm sent through a real site-forwarder
/// opens an incident at central, `site-forwarder acknowledge` (what a script behind the HMI's
/// button runs) reaches central through the site's link, and the incident is acknowledged by
/// the site and its operator, by the site's means; its pages stop.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_site_acknowledges_an_alarm_from_its_hmi() {
    let dir = tempfile::tempdir().unwrap();
    let sink = smtp_sink().await;
    let central_addr = crate::harness::free_addr().await;
    let mut config = central_config(dir.path(), Some(sink.addr()));
    config.lists[0].escalation = Some(escalation(600, 600, 0));
    config
        .lists
        .push(ListConfig::email(SUPERVISORS, vec![SUPERVISOR.into()]));
    let central = Central::start_on(
        config,
        tokio::net::TcpListener::bind(central_addr).await.unwrap(),
    )
    .await;
    let (_site, site_addr) = crate::harness::spawn_site(dir.path(), "site-a", central_addr).await;
    let mut client = outbox_proto::v1::site_notify_client::SiteNotifyClient::new(
        crate::harness::channel(site_addr).await,
    );
    let mut alarm = crate::harness::send_request("Tank 4 level high", "level 97%");
    alarm.priority = v1::NotificationPriority::Critical.into();
    alarm.condition_key = "tank4.level.high".into();
    client.send(alarm).await.unwrap();
    let opened = eventually("the alarm to open its incident", || async {
        let list = central
            .outbox()
            .await
            .list_incidents(v1::ListIncidentsRequest::default())
            .await
            .unwrap()
            .into_inner();
        list.incidents.first().map(|i| i.id)
    })
    .await;

    let output = tokio::process::Command::new(crate::harness::binary("site-forwarder"))
        .args([
            "acknowledge",
            "--key",
            "tank4.level.high",
            "--actor",
            "Jo at HMI 2",
        ])
        .arg("--addr")
        .arg(format!("http://{site_addr}"))
        .output()
        .await
        .unwrap();
    assert!(output.status.success(), "{output:?}");
    let incident = eventually("the site's acknowledgement to reach central", || async {
        let incident = the_incident(&central).await.incident.unwrap();
        (incident.status() == v1::IncidentStatus::Acknowledged).then_some(incident)
    })
    .await;
    assert_eq!(incident.id, opened);
    assert_eq!(incident.acknowledged_by, "site site-a: Jo at HMI 2");
    assert_eq!(incident.acknowledged_via, "site");
    assert!(incident.next_due_at.is_none(), "{incident:?}");
}

/// Held alarms go out as one digest, each with its own incident: the digest's mail carries one
/// link that covers every incident it holds, and one POST acknowledges them all, as its
/// recipient.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_acknowledgement_of_a_digest_covers_every_incident_in_it() {
    const ALARMS: usize = 6;
    let dir = tempfile::tempdir().unwrap();
    let sink = smtp_sink().await;
    let mut config = central_config(dir.path(), Some(sink.addr()));
    config.lists[0].escalation = Some(escalation(600, 600, 0));
    // The first alarm of a window goes alone, the rest wait for its end as one digest.
    config.lists[0].consolidation = Some(central_outbox::config::ConsolidationConfig {
        threshold: 1,
        window: Duration::from_secs(5),
        max_per_digest: 50,
    });
    config
        .lists
        .push(ListConfig::email(SUPERVISORS, vec![SUPERVISOR.into()]));
    crate::harness::with_console(&mut config).await;
    let console = config.console.listen.unwrap();
    config.acknowledgement.link_base_url = Some(format!("http://{console}"));
    let central = Central::start(config).await;
    let mut ids = Vec::new();
    for i in 0..ALARMS {
        let mut msg = submit(&format!("Compressor {i} tripped"), "motor overload");
        msg.priority = v1::NotificationPriority::High.into();
        ids.push(ingest_submit(&central, msg).await);
    }
    for id in &ids {
        crate::harness::wait_for_status(&central.db, id, "Delivered").await;
    }
    // Six alarms in at most two windows: some digest holds at least three; take the largest.
    let [alice, _] = crate::harness::RECIPIENTS;
    let digest = sink
        .messages()
        .into_iter()
        .filter(|m| m.rcpt_to == [alice] && m.body_text().contains("This digest holds"))
        .max_by_key(|m| m.body_text().matches(", ").count())
        .expect("a digest went to alice");
    let path = link_path(&digest, &central.console_url());
    let mut browser = crate::console::Browser::new(&central);
    let page = browser.get(&path).await;
    assert_eq!(page.status, 200, "{}", page.body);
    let covered = page.body.matches("data-incident-id=").count();
    assert!(covered >= 2, "{}", page.body);

    let acked = browser.post(&path, &[]).await;
    assert_eq!(acked.status, 200, "{}", acked.body);
    assert_eq!(
        acked.body.matches("You acknowledged incident").count(),
        covered
    );
    let incidents = central
        .outbox()
        .await
        .list_incidents(v1::ListIncidentsRequest::default())
        .await
        .unwrap()
        .into_inner()
        .incidents;
    assert_eq!(incidents.len(), ALARMS);
    let acknowledged: Vec<_> = incidents
        .iter()
        .filter(|i| i.status() == v1::IncidentStatus::Acknowledged)
        .collect();
    assert_eq!(acknowledged.len(), covered, "{incidents:?}");
    for incident in acknowledged {
        assert_eq!(incident.acknowledged_by, alice);
        assert_eq!(incident.acknowledged_via, "link");
    }
}

/// The incident of condition `key` (on `ops`, from site-a), in detail.
async fn incident_of(central: &Central, key: &str) -> v1::IncidentDetail {
    let mut outbox = central.outbox().await;
    let list = outbox
        .list_incidents(v1::ListIncidentsRequest::default())
        .await
        .unwrap()
        .into_inner();
    let id = list
        .incidents
        .iter()
        .find(|i| i.condition_key == key)
        .unwrap_or_else(|| panic!("no incident of {key}: {list:?}"))
        .id;
    outbox
        .get_incident(v1::GetIncidentRequest { id })
        .await
        .unwrap()
        .into_inner()
}

/// Acknowledges the incident of condition `key` through the admin API, as `night-shift`.
async fn acknowledge(central: &Central, key: &str) -> v1::Incident {
    let id = incident_of(central, key).await.incident.unwrap().id;
    let mut request = tonic::Request::new(v1::AcknowledgeIncidentRequest { id });
    request
        .metadata_mut()
        .insert("x-outbox-actor", "night-shift".parse().unwrap());
    let answer = central
        .outbox()
        .await
        .acknowledge_incident(request)
        .await
        .unwrap()
        .into_inner();
    assert_eq!(answer.outcome(), v1::AcknowledgeOutcome::Acknowledged);
    answer.incident.unwrap()
}

/// Site-a's `ClearCondition` of `key`, as its forwarder sends it.
async fn clear(central: &Central, key: &str) {
    central
        .ingest()
        .await
        .clear_condition(v1::ClearConditionRequest {
            source_site_id: "site-a".into(),
            condition_key: key.into(),
        })
        .await
        .unwrap();
}

/// Mails with `subject` the sink received for `address`.
fn mails_of(sink: &SmtpSink, subject: &str, address: &str) -> usize {
    sink.messages()
        .iter()
        .filter(|m| m.subject().as_deref() == Some(subject))
        .filter(|m| m.rcpt_to.iter().any(|r| r == address))
        .count()
}

/// Moves every due time of every incident `by` earlier, as if the store's clock had jumped
/// ahead for all of them at once; returns how many incidents had something due.
fn clock_ahead(db: &crate::harness::Db, by: Duration) -> u64 {
    let ms = by.as_millis();
    let sql = match db {
        crate::harness::Db::Sqlite(_) => {
            format!("UPDATE Incidents SET NextDueAt = NextDueAt - {ms} WHERE NextDueAt IS NOT NULL")
        }
        crate::harness::Db::MsSql(_) => format!(
            "UPDATE dbo.Incidents SET NextDueAt = DATEADD(millisecond, -{ms}, NextDueAt) \
             WHERE NextDueAt IS NOT NULL"
        ),
    };
    db.execute(&sql, &[])
}

/// The acknowledgement reminder: an acknowledged alarm whose condition stays uncleared pages
/// its list again from step 1 after the reminder, and is open again; the site's clear then ends
/// it, and nobody more is paged for it. An alarm acknowledged and cleared before its reminder
/// is never reminded.
///
/// The reminder is at least a minute (`limits::MIN_REMINDER`: a shorter one would nag whoever
/// just took the alarm), longer than the suite waits for anything, and the bound stays. So the
/// test does not wait it out: it checks the reminder is due a minute after the acknowledgement,
/// then moves every incident's due time a minute earlier in the database (the clock jumping
/// ahead for all of them alike, as `Db::expire_lease` ends a lease behind its holder's back),
/// and the escalation clock fires what that made due. A third alarm nobody answers is the
/// witness that time passed for everyone: its next page falls due with the one the cleared
/// alarm would have had.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acknowledged_alarm_is_reminded_until_its_condition_clears() {
    const REMINDER: Duration = central_outbox::domain::escalation::limits::MIN_REMINDER;
    const TANK: (&str, &str) = ("Tank 4 level high", "tank4.level");
    const PUMP: (&str, &str) = ("Pump 2 tripped", "pump2.trip");
    const FEEDER: (&str, &str) = ("Feeder 7 lost", "feeder7");
    let dir = tempfile::tempdir().unwrap();
    let sink = smtp_sink().await;
    // Every page waits ten minutes, so only the reminder (and the clock moved ahead) pages.
    let mut policy = escalation(600, 600, 0);
    policy.acknowledgement_reminder = Some(REMINDER);
    let central = central_escalating(dir.path(), &sink, policy).await;
    let db = crate::harness::Db::open(&central.db);
    let [alice, bob] = crate::harness::RECIPIENTS;
    for (subject, key) in [TANK, PUMP, FEEDER] {
        alarm(&central, subject, key).await;
    }
    eventually("the three alarms mailed", || async {
        [TANK, PUMP, FEEDER]
            .iter()
            .all(|(s, _)| mails_of(&sink, s, alice) == 1 && mails_of(&sink, s, bob) == 1)
            .then_some(())
    })
    .await;

    // The tank is acknowledged and stays high: its reminder is due a minute later.
    let tank = acknowledge(&central, TANK.1).await;
    assert_eq!(tank.status(), v1::IncidentStatus::Acknowledged);
    assert_eq!(
        at(&tank.next_due_at) - at(&tank.acknowledged_at),
        chrono::Duration::from_std(REMINDER).unwrap()
    );
    let history = incident_of(&central, TANK.1).await.history;
    let acked = history.iter().find(|h| h.kind == "Acknowledged").unwrap();
    assert!(acked.detail.contains("unless cleared"), "{acked:?}");
    // The pump is acknowledged and clears before its reminder: nothing is due for it.
    let pump = acknowledge(&central, PUMP.1).await;
    assert!(pump.next_due_at.is_some(), "{pump:?}");
    clear(&central, PUMP.1).await;
    let pump = incident_of(&central, PUMP.1).await.incident.unwrap();
    assert_eq!(pump.status(), v1::IncidentStatus::Cleared);
    assert!(pump.next_due_at.is_none(), "{pump:?}");

    // A minute passes: the tank's reminder falls due; the feeder's page, ten minutes after its
    // alarm, does not; the cleared pump has nothing due.
    assert_eq!(clock_ahead(&db, REMINDER), 2, "the tank and the feeder");
    let reminded = eventually("the tank's reminder", || async {
        let detail = incident_of(&central, TANK.1).await;
        detail
            .history
            .iter()
            .any(|h| h.kind == "Reminded")
            .then_some(detail)
    })
    .await;
    let kinds: Vec<&str> = reminded.history.iter().map(|h| h.kind.as_str()).collect();
    assert_eq!(kinds, ["Opened", "Acknowledged", "Reminded", "Paged"]);
    let reminder = &reminded.history[2];
    assert!(
        reminder.detail.contains("acknowledged by night-shift"),
        "{reminder:?}"
    );
    // Open again, paged from step 1 in the reminder's cycle, the supervisors next.
    let incident = reminded.incident.as_ref().unwrap();
    assert_eq!(incident.status(), v1::IncidentStatus::Open);
    assert!(incident.next_due_at.is_some(), "{incident:?}");
    let page = reminded.pages.last().unwrap();
    assert_eq!((reminded.pages.len(), page.cycle), (2, 1));
    let place = page.place.as_ref().unwrap();
    assert_eq!((place.round, place.step), (1, 1));
    // The alarm's list receives the page again; the pump's list nothing more.
    eventually("the reminder mailed", || async {
        (mails_of(&sink, TANK.0, alice) == 2 && mails_of(&sink, TANK.0, bob) == 2).then_some(())
    })
    .await;
    let pump = incident_of(&central, PUMP.1).await;
    let kinds: Vec<&str> = pump.history.iter().map(|h| h.kind.as_str()).collect();
    assert_eq!(kinds, ["Opened", "Acknowledged", "Cleared"]);
    assert_eq!(pump.pages.len(), 1);
    assert_eq!(mails_of(&sink, PUMP.0, alice), 1);

    // The tank clears at the site: the incident ends, and nothing is due for it.
    clear(&central, TANK.1).await;
    let cleared = incident_of(&central, TANK.1).await;
    let incident = cleared.incident.as_ref().unwrap();
    assert_eq!(incident.status(), v1::IncidentStatus::Cleared);
    assert!(incident.next_due_at.is_none(), "{incident:?}");
    let last = cleared.history.last().unwrap();
    assert_eq!(
        (last.kind.as_str(), last.actor.as_str()),
        ("Cleared", "site site-a")
    );

    // Ten minutes pass: the feeder's supervisors are paged, and the tank's, which would have
    // fallen due with it, are not.
    assert_eq!(
        clock_ahead(&db, Duration::from_secs(600)),
        1,
        "the feeder only"
    );
    eventually("the feeder's supervisors paged", || async {
        (mails_of(&sink, FEEDER.0, SUPERVISOR) == 1).then_some(())
    })
    .await;
    let tank = incident_of(&central, TANK.1).await;
    assert_eq!(tank.pages.len(), 2, "{:?}", tank.pages);
    assert_eq!(
        tank.history.len(),
        cleared.history.len(),
        "{:?}",
        tank.history
    );
    assert_eq!(mails_of(&sink, TANK.0, SUPERVISOR), 0);
    assert_eq!(mails_of(&sink, TANK.0, alice), 2);
    assert_eq!(mails_of(&sink, PUMP.0, SUPERVISOR), 0);
}
