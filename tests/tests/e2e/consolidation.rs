//! Flood consolidation end to end: a site script floods a list that consolidates (more than 3
//! in a 5-second window go out together); the people on the list get the first three of each
//! window on their own and the rest as one digest per window, a critical notification is never
//! held, and every notification still reaches Delivered on its own row, its attempt naming the
//! digest whose mail carried it.
//!
//! The Sends go through a real site-forwarder process; windows are aligned to the clock, so a
//! flood may straddle two of them. The test does not depend on where the boundary falls: it
//! checks every digest against the rows that name it, and that no window got two digests.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use outbox_proto::time::{from_timestamp, to_duration};
use outbox_proto::v1;
use outbox_proto::v1::site_notify_client::SiteNotifyClient;

use crate::harness::{
    Central, RECIPIENTS, binary, central_config, eventually, send_request, smtp_sink, spawn_site,
};

const FLOOD: &str = "flood";
const THRESHOLD: u32 = 3;
const WINDOW_SECS: i64 = 5;

fn consolidating_list() -> v1::NotificationList {
    v1::NotificationList {
        name: FLOOD.into(),
        r#type: v1::NotificationType::Email.into(),
        recipients: RECIPIENTS.iter().map(|r| r.to_string()).collect(),
        consolidation: Some(v1::ListConsolidation {
            threshold: THRESHOLD,
            window: Some(to_duration(Duration::from_secs(WINDOW_SECS as u64))),
            max_per_digest: 50,
        }),
        ..Default::default()
    }
}

/// The epoch-aligned window a time at central falls in.
fn window_of(at: &outbox_proto::v1::NotificationStatusView) -> i64 {
    let created = at.created_at.as_ref().and_then(from_timestamp).unwrap();
    created.timestamp().div_euclid(WINDOW_SECS)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_goes_out_as_one_digest_per_window_and_every_row_is_delivered() {
    let _ = binary("site-forwarder");
    let dir = tempfile::tempdir().unwrap();
    let sink = smtp_sink().await;
    let central = Central::start(central_config(dir.path(), Some(sink.addr()))).await;
    let mut outbox = central.outbox().await;
    let stored = outbox
        .upsert_notification_list(v1::UpsertNotificationListRequest {
            list: Some(consolidating_list()),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(stored.consolidation, consolidating_list().consolidation);

    let (_site, site_addr) = spawn_site(dir.path(), "site-a", central.addr).await;
    let mut site = SiteNotifyClient::connect(format!("http://{site_addr}"))
        .await
        .unwrap();
    let mut ids = Vec::new();
    for i in 1..=12 {
        let mut send = send_request(&format!("tank {i} high level"), "level 97%");
        send.list_name = FLOOD.into();
        ids.push(site.send(send).await.unwrap().into_inner().notification_id);
    }
    let mut critical = send_request("reactor 2 pressure critical", "pressure 9.8 bar");
    critical.list_name = FLOOD.into();
    critical.priority = v1::NotificationPriority::Critical.into();
    let critical = site
        .send(critical)
        .await
        .unwrap()
        .into_inner()
        .notification_id;
    ids.push(critical.clone());

    // Every notification is delivered on its own row.
    let mut details = BTreeMap::new();
    for id in &ids {
        let detail = eventually(&format!("{id} is delivered"), || {
            let mut outbox = outbox.clone();
            let id = id.clone();
            async move {
                let detail = outbox
                    .get_notification_detail(v1::GetNotificationDetailRequest {
                        notification_id: id,
                    })
                    .await
                    .ok()?
                    .into_inner();
                let status = detail.notification.as_ref()?.status;
                (status == i32::from(v1::NotificationStatus::Delivered)).then_some(detail)
            }
        })
        .await;
        details.insert(id.clone(), detail);
    }

    // Group the rows by the digest their delivering attempt names (none: mailed on its own),
    // and the lone non-critical ones by the window they arrived in.
    let mut by_digest: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut alone = BTreeSet::new();
    let mut alone_per_window: BTreeMap<i64, usize> = BTreeMap::new();
    let mut windows_of_digest: BTreeMap<String, BTreeSet<i64>> = BTreeMap::new();
    for (id, detail) in &details {
        let delivered = detail
            .history
            .iter()
            .rev()
            .find(|e| e.outcome == i32::from(v1::AttemptOutcome::Delivered))
            .expect("a delivered attempt");
        let view = detail.notification.as_ref().unwrap();
        if delivered.digest_id.is_empty() {
            alone.insert(id.clone());
            if *id != critical {
                *alone_per_window.entry(window_of(view)).or_default() += 1;
            }
        } else {
            by_digest
                .entry(delivered.digest_id.clone())
                .or_default()
                .push(id.clone());
            windows_of_digest
                .entry(delivered.digest_id.clone())
                .or_default()
                .insert(window_of(view));
        }
    }
    assert!(
        alone.contains(&critical),
        "a critical notification is never held"
    );
    // Only the first three of each window go alone (a slow central may spread the flood over
    // more windows than a quick one: the rule holds per window).
    for (window, count) in &alone_per_window {
        assert!(
            *count <= THRESHOLD as usize,
            "{count} mailed alone in window {window}"
        );
    }
    assert!(
        !by_digest.is_empty(),
        "13 arrivals in a few {WINDOW_SECS}-second windows over a threshold of 3"
    );
    // One digest per window: each digest's rows arrived in one window, and no window has two.
    let mut windows = BTreeSet::new();
    for (digest, windows_of) in &windows_of_digest {
        assert_eq!(windows_of.len(), 1, "digest {digest} spans windows");
        assert!(
            windows.insert(*windows_of.first().unwrap()),
            "two digests in one window"
        );
    }

    // What the people on the list received: each lone row once, and each digest once, as one
    // mail whose subject says how many and whose body lists each row's id.
    let mails = eventually("every mail is received", || {
        let mails = sink.messages();
        let expected = alone.len() + by_digest.len();
        async move { (mails.len() >= expected).then_some(mails) }
    })
    .await;
    assert_eq!(
        mails.len(),
        alone.len() + by_digest.len(),
        "no duplicate mail"
    );
    let by_message_id: BTreeMap<String, _> = mails
        .iter()
        .map(|m| (m.message_id().unwrap_or_default(), m))
        .collect();
    for id in &alone {
        let mail = by_message_id
            .get(&format!("<{id}@plant.example.test>"))
            .unwrap_or_else(|| panic!("no mail of its own for {id}"));
        assert!(!mail.subject().unwrap().contains("notifications for"));
    }
    for (digest, rows) in &by_digest {
        let mail = by_message_id
            .get(&format!("<{digest}@plant.example.test>"))
            .unwrap_or_else(|| panic!("no mail for digest {digest}"));
        assert_eq!(
            mail.subject().unwrap(),
            format!("{} notifications for {FLOOD} from site-a", rows.len())
        );
        let body = mail.body_text();
        for row in rows {
            assert!(body.contains(row.as_str()), "digest {digest} lists {row}");
            let subject = &details[row].notification.as_ref().unwrap().subject;
            assert!(
                body.contains(subject.as_str()),
                "digest {digest} quotes {subject:?}"
            );
        }
        assert_eq!(
            body.lines().filter(|l| l.contains("  site-a  ")).count(),
            rows.len(),
            "one line per notification:\n{body}"
        );
    }
}

/// Issue 33's second scenario: a list consolidating more than 10 per 30 s into digests of at
/// most 400; one site sends 420 notifications whose subjects are 200 emoji each. The body of a
/// 400-row digest came to 350,097 bytes, over the 256 KiB body limit, so the digest could never
/// be composed and its rows stayed Held for good, claimed and failing after every claim expiry,
/// counted nowhere. Now each digest line is bounded in bytes: every row is Delivered, in
/// several digests, each body under the limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_emoji_flood_goes_out_in_digests_under_the_body_limit() {
    const N: usize = 420;
    let dir = tempfile::tempdir().unwrap();
    let sink = smtp_sink().await;
    let central = Central::start(central_config(dir.path(), Some(sink.addr()))).await;
    let mut outbox = central.outbox().await;
    let list = v1::NotificationList {
        consolidation: Some(v1::ListConsolidation {
            threshold: 10,
            window: Some(to_duration(Duration::from_secs(30))),
            max_per_digest: 400,
        }),
        ..consolidating_list()
    };
    outbox
        .upsert_notification_list(v1::UpsertNotificationListRequest { list: Some(list) })
        .await
        .unwrap();
    let mut ingest = central.ingest().await;
    let subject = "\u{1F525}".repeat(200);
    for i in 0..N {
        let mut msg = crate::harness::submit(&subject, &format!("reading {i}"));
        msg.list_name = FLOOD.into();
        ingest.submit_notification(msg).await.unwrap();
    }
    let db = crate::harness::Db::open(&central.db);
    eventually("every flooded row is delivered", || {
        let delivered = db.count(&format!(
            "SELECT COUNT(*) FROM Notifications WHERE ListName = '{FLOOD}' AND Status = 'Delivered'"
        ));
        async move { (delivered == N as i64).then_some(()) }
    })
    .await;
    let digests = db.strings(
        "SELECT DISTINCT DigestId FROM NotificationAttempts \
         WHERE DigestId IS NOT NULL AND Outcome = 'Delivered'",
    );
    assert!(digests.len() >= 2, "several digests: {digests:?}");
    let mails = sink.messages();
    assert_eq!(
        mails.len(),
        N - db.count(
            "SELECT COUNT(*) FROM NotificationAttempts \
             WHERE DigestId IS NOT NULL AND Outcome = 'Delivered'"
        ) as usize
            + digests.len(),
        "each lone row once and each digest once"
    );
    central.stop().await;
}
