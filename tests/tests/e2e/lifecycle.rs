//! Random traffic end to end, against the running dispatcher: a seeded generator submits
//! notifications over the ingest API (two sites, a plain and a flood-consolidating list, condition
//! keys, every priority, Unicode subjects at the size limit, some older by the site's clock than
//! what central already has), clears conditions, and changes how the relay answers (accept, 451,
//! 550, a dropped connection in DATA, slow replies) while the dispatcher works. Then the relay
//! heals, an operator retries what parked, and the test checks, from the admin API and the mail
//! the relay received, what users rely on:
//! - every notification ends Delivered, Superseded or Cleared: none is left waiting;
//! - each delivered one has exactly one Delivered attempt, and its mail (its own, or the digest
//!   its attempt names) reached the relay exactly once; a superseded or cleared one never did;
//! - nothing went out stale: a delivered keyed notification's attempt started before any newer
//!   state of its condition (by the site's time) reached central, and before any clear of its
//!   key that came after it;
//! - each Superseded one names a newer notification of its condition.
//!
//! `OUTBOX_E2E_LIFECYCLE_SEED=<n>` replays a seed; the store-level model
//! (`central-outbox/tests/conformance/lifecycle_model.rs`) covers claim expiry and leader changes
//! step by step, which this test, with one dispatcher, does not.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use chrono::{DateTime, Utc};
use outbox_proto::time::{from_timestamp, to_duration, to_timestamp};
use outbox_proto::v1;
use outbox_tests::smtp_sink::Behaviour;

use crate::harness::{Central, RECIPIENTS, central_config, eventually, smtp_sink, submit};

const SITES: [&str; 2] = ["site-a", "site-b"];
const KEYS: [&str; 3] = ["tank4.level", "pump7.trip", "door.open"];
const FLOOD: &str = "flood";
const STEPS: usize = 150;

fn flood_list() -> v1::NotificationList {
    v1::NotificationList {
        name: FLOOD.into(),
        r#type: v1::NotificationType::Email.into(),
        recipients: RECIPIENTS.iter().map(|r| r.to_string()).collect(),
        consolidation: Some(v1::ListConsolidation {
            threshold: 3,
            window: Some(to_duration(Duration::from_secs(1))),
            max_per_digest: 5,
        }),
        ..Default::default()
    }
}

/// A subject of up to 500 characters from many scripts, emoji and combining marks.
fn subject(rng: &mut fastrand::Rng, n: usize) -> String {
    const ALPHABET: &[char] = &[
        'a', 'Z', '7', ' ', 'é', 'ß', 'Ω', 'ж', 'א', 'ع', '漢', 'ひ', '한', '🚨', '🔥', '\u{0301}',
        '𝄞', '€', '"', '<', '&',
    ];
    let len = if rng.bool() { 500 } else { rng.usize(1..=40) };
    format!("n{n} ")
        .chars()
        .chain((0..len).map(|_| ALPHABET[rng.usize(0..ALPHABET.len())]))
        .take(500)
        .collect()
}

/// What the test knows of one submitted notification.
struct Sent {
    site: &'static str,
    list: String,
    key: Option<&'static str>,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_traffic_ends_every_notification_and_mails_nothing_stale() {
    let seed = std::env::var("OUTBOX_E2E_LIFECYCLE_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20_261_128);
    eprintln!("lifecycle: seed {seed} (replay: OUTBOX_E2E_LIFECYCLE_SEED={seed})");
    let mut rng = fastrand::Rng::with_seed(seed);

    let dir = tempfile::tempdir().unwrap();
    let sink = smtp_sink().await;
    let mut config = central_config(dir.path(), Some(sink.addr()));
    let smtp = config.smtp.as_mut().unwrap();
    smtp.max_concurrent_connections = 2;
    smtp.max_retries = 3;
    smtp.retry_delay = Duration::from_millis(100);
    let central = Central::start(config).await;
    let mut outbox = central.outbox().await;
    outbox
        .upsert_notification_list(v1::UpsertNotificationListRequest {
            list: Some(flood_list()),
        })
        .await
        .unwrap();
    let mut ingest = central.ingest().await;

    let mut sent: HashMap<String, Sent> = HashMap::new();
    // Each clear: its site and key, and a time after central had applied it.
    let mut clears: Vec<(&'static str, &'static str, DateTime<Utc>)> = Vec::new();
    for step in 0..STEPS {
        match rng.u32(0..100) {
            0..=59 => {
                let site = SITES[rng.usize(0..2)];
                let list = if rng.u32(0..4) == 0 {
                    FLOOD.to_owned()
                } else {
                    crate::harness::LIST.to_owned()
                };
                let key = (rng.u32(0..10) < 7).then(|| KEYS[rng.usize(0..KEYS.len())]);
                let mut msg = submit(&subject(&mut rng, step), "level 97%");
                msg.source_site_id = site.into();
                msg.list_name = list.clone();
                msg.condition_key = key.unwrap_or_default().into();
                msg.priority = rng.i32(0..=4);
                // Up to 3 s older at the site than now: some arrive after a newer state.
                let age = chrono::Duration::milliseconds(rng.i64(0..3000));
                msg.site_enqueued_at = Some(to_timestamp(Utc::now() - age));
                let ack = ingest.submit_notification(msg.clone()).await.unwrap();
                assert_eq!(
                    ack.into_inner().outcome(),
                    v1::SubmitOutcome::Accepted,
                    "seed {seed}"
                );
                sent.insert(msg.notification_id, Sent { site, list, key });
            }
            60..=69 => {
                let site = SITES[rng.usize(0..2)];
                let key = KEYS[rng.usize(0..KEYS.len())];
                ingest
                    .clear_condition(v1::ClearConditionRequest {
                        condition_key: key.into(),
                        source_site_id: site.into(),
                    })
                    .await
                    .unwrap();
                clears.push((site, key, Utc::now()));
            }
            70..=84 => {
                let transactions = rng.usize(1..=4);
                let behaviour = match rng.u32(0..4) {
                    0 => Behaviour::RejectData {
                        code: 451,
                        text: "4.3.0 try again later".into(),
                    },
                    1 => Behaviour::RejectMail {
                        code: 550,
                        text: "5.7.1 refused".into(),
                    },
                    2 => Behaviour::DropMidData,
                    _ => Behaviour::Accept,
                };
                sink.set_behaviour_for(transactions, behaviour);
            }
            85..=89 => {
                // A slow relay for a while.
                let delay = if rng.bool() { rng.u64(5..60) } else { 0 };
                sink.set_reply_delay(Duration::from_millis(delay));
            }
            _ => {
                // Traffic comes in bursts and pauses, so the dispatcher interleaves with it: a
                // pause lasts until the relay takes the next message, or at most a drawn while.
                let most = Duration::from_millis(rng.u64(0..40));
                sink.wait_for_count(sink.accepted_count() + 1, most).await;
            }
        }
    }

    // The relay heals; what parked is retried by an operator until nothing is left waiting.
    sink.set_behaviour(Behaviour::Accept);
    sink.set_reply_delay(Duration::ZERO);
    let ids: Vec<String> = sent.keys().cloned().collect();
    let views = eventually("every notification is final", || {
        let mut outbox = outbox.clone();
        let ids = ids.clone();
        async move {
            let mut views = BTreeMap::new();
            let mut parked = Vec::new();
            for id in &ids {
                let detail = outbox
                    .get_notification_detail(v1::GetNotificationDetailRequest {
                        notification_id: id.clone(),
                    })
                    .await
                    .ok()?
                    .into_inner();
                match detail.notification.as_ref()?.status() {
                    v1::NotificationStatus::Delivered
                    | v1::NotificationStatus::Superseded
                    | v1::NotificationStatus::Cleared => {}
                    v1::NotificationStatus::Parked => parked.push(id.clone()),
                    _ => return None,
                }
                views.insert(id.clone(), detail);
            }
            if !parked.is_empty() {
                outbox
                    .retry_notifications(v1::BulkActionRequest {
                        selector: Some(v1::bulk_action_request::Selector::Ids(
                            v1::NotificationIds {
                                notification_ids: parked,
                            },
                        )),
                        ..Default::default()
                    })
                    .await
                    .ok()?;
                return None;
            }
            Some(views)
        }
    })
    .await;

    // The mail the relay received, by the id in its Message-ID (a notification's or a digest's).
    let mut received: HashMap<String, usize> = HashMap::new();
    for mail in sink.messages() {
        let message_id = mail.message_id().expect("every mail has a Message-ID");
        let id = message_id
            .trim_start_matches('<')
            .split('@')
            .next()
            .unwrap()
            .to_owned();
        *received.entry(id).or_default() += 1;
    }

    let at = |ts: &Option<prost_types::Timestamp>| ts.as_ref().and_then(from_timestamp).unwrap();
    let mut endings: BTreeMap<&str, usize> = BTreeMap::new();
    for (id, detail) in &views {
        let view = detail.notification.as_ref().unwrap();
        let what = &sent[id];
        let delivered: Vec<&v1::HistoryEntry> = detail
            .history
            .iter()
            .filter(|e| e.outcome() == v1::AttemptOutcome::Delivered)
            .collect();
        *endings.entry(view.status().as_str_name()).or_default() += 1;
        match view.status() {
            v1::NotificationStatus::Delivered => {
                assert_eq!(
                    delivered.len(),
                    1,
                    "{id}: one Delivered attempt (seed {seed})"
                );
                let mail = if delivered[0].digest_id.is_empty() {
                    id
                } else {
                    &delivered[0].digest_id
                };
                assert_eq!(
                    received.get(mail),
                    Some(&1),
                    "{id}: its mail {mail} reached the relay once (seed {seed})"
                );
                let Some(key) = what.key else { continue };
                let started = at(&delivered[0].at);
                // No newer state of its condition had reached central when its attempt started.
                for (other_id, other) in &views {
                    let o = &sent[other_id];
                    if other_id == id
                        || o.site != what.site
                        || o.list != what.list
                        || o.key != what.key
                    {
                        continue;
                    }
                    let other_view = other.notification.as_ref().unwrap();
                    let (mine, theirs) =
                        (at(&view.site_enqueued_at), at(&other_view.site_enqueued_at));
                    let (my_arrival, their_arrival) =
                        (at(&view.created_at), at(&other_view.created_at));
                    let newer = theirs > mine || (theirs == mine && their_arrival > my_arrival);
                    assert!(
                        !newer || started <= their_arrival,
                        "{id} was mailed at {started} after {other_id}, newer, arrived at \
                         {their_arrival} (seed {seed}):\n{detail:#?}\n{other:#?}"
                    );
                }
                // No clear of its key after it arrived came before its attempt.
                for (site, cleared_key, cleared_at) in &clears {
                    if *site == what.site
                        && *cleared_key == key
                        && *cleared_at > at(&view.created_at)
                    {
                        assert!(
                            started <= *cleared_at,
                            "{id} was mailed at {started}, after its key was cleared at \
                             {cleared_at} (seed {seed})"
                        );
                    }
                }
            }
            status => {
                assert!(
                    delivered.is_empty(),
                    "{id} is {status:?} but was delivered (seed {seed})"
                );
                assert_eq!(
                    received.get(id),
                    None,
                    "{id} reached the relay (seed {seed})"
                );
                if status == v1::NotificationStatus::Superseded {
                    let last = detail.history.last().unwrap();
                    let by = &sent[&last.superseded_by];
                    assert!(
                        by.site == what.site && by.list == what.list && by.key == what.key,
                        "{id} superseded by {} of another condition (seed {seed})",
                        last.superseded_by
                    );
                }
            }
        }
    }
    eprintln!("lifecycle: {} notifications ended {endings:?}", views.len());
    central.stop().await;
}
