//! Status callbacks: a list names an IT system's endpoint, which hears every final status of
//! the list's notifications as a signed POST, once per change; a failing endpoint is retried and
//! given up, and none of it touches delivery. The notifications come from a site-forwarder
//! process; the endpoint is the test webhook server, which records what it received.

use std::time::Duration;

use outbox_proto::v1;
use outbox_proto::v1::notification_outbox_client::NotificationOutboxClient;
use outbox_proto::v1::site_notify_client::SiteNotifyClient;
use outbox_tests::smtp_sink::Behaviour;
use outbox_tests::webhook_server::{ReceivedRequest, Reply, WebhookServer};
use tonic::transport::Channel;

use crate::harness::{
    Central, LIST, RECIPIENTS, central_config, channel, eventually, send_request, smtp_sink,
    spawn_site,
};

/// The key central signs the calls with, and the IT system checks them with.
const KEY: &str = "it-system-shared-key-0001";

async fn detail(
    outbox: &mut NotificationOutboxClient<Channel>,
    id: &str,
) -> v1::NotificationDetail {
    outbox
        .get_notification_detail(v1::GetNotificationDetailRequest {
            notification_id: id.to_owned(),
        })
        .await
        .unwrap()
        .into_inner()
}

/// The notification's status callback entries, oldest first.
fn calls(detail: &v1::NotificationDetail) -> Vec<v1::HistoryEntry> {
    detail
        .history
        .iter()
        .filter(|h| h.kind == i32::from(v1::HistoryEntryKind::StatusCallback))
        .cloned()
        .collect()
}

fn is(entry: &v1::HistoryEntry, outcome: v1::StatusCallbackOutcome) -> bool {
    entry.callback_outcome == i32::from(outcome)
}

/// Waits until `id`'s history holds a call with `outcome` for `status`, and returns the detail.
async fn until_called(
    outbox: &mut NotificationOutboxClient<Channel>,
    id: &str,
    outcome: v1::StatusCallbackOutcome,
    status: v1::NotificationStatus,
) -> v1::NotificationDetail {
    eventually(
        &format!("{id} called back {outcome:?} for {status:?}"),
        || {
            let mut outbox = outbox.clone();
            async move {
                // Not known to central until the site has forwarded it.
                let detail = outbox
                    .get_notification_detail(v1::GetNotificationDetailRequest {
                        notification_id: id.to_owned(),
                    })
                    .await
                    .ok()?
                    .into_inner();
                calls(&detail)
                    .iter()
                    .any(|c| is(c, outcome) && c.callback_status == i32::from(status))
                    .then_some(detail)
            }
        },
    )
    .await
}

fn for_id<'a>(requests: &'a [ReceivedRequest], id: &str) -> Vec<&'a ReceivedRequest> {
    requests
        .iter()
        .filter(|r| r.json().is_some_and(|j| j["notification_id"] == id))
        .collect()
}

/// A site forwarding to central, whose list `LIST` calls `it_system` at `path` back; `tune`
/// adjusts central's config before it starts.
struct Running {
    _dir: tempfile::TempDir,
    sink: outbox_tests::smtp_sink::SmtpSink,
    it_system: WebhookServer,
    central: Central,
    site: crate::harness::Process,
    client: SiteNotifyClient<Channel>,
    outbox: NotificationOutboxClient<Channel>,
}

async fn start(
    it_system: WebhookServer,
    path: &str,
    tune: impl FnOnce(&mut central_outbox::config::Config),
) -> Running {
    let dir = tempfile::tempdir().unwrap();
    let sink = smtp_sink().await;
    let mut config = central_config(dir.path(), Some(sink.addr()));
    config.status_callbacks.key = Some(KEY.into());
    config.lists[0].status_callback_url = Some(it_system.url(path));
    tune(&mut config);
    let central = Central::start(config).await;
    let (site, addr) = spawn_site(dir.path(), "site-a", central.addr).await;
    let client = SiteNotifyClient::new(channel(addr).await);
    let outbox = central.outbox().await;
    Running {
        _dir: dir,
        sink,
        it_system,
        central,
        site,
        client,
        outbox,
    }
}

/// Sends one notification through the site; its id.
async fn send(client: &mut SiteNotifyClient<Channel>, subject: &str, body: &str) -> String {
    client
        .send(send_request(subject, body))
        .await
        .unwrap()
        .into_inner()
        .notification_id
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_it_system_hears_each_final_status_once_signed_and_in_order() {
    let Running {
        _dir,
        sink,
        it_system,
        central,
        site,
        mut client,
        mut outbox,
    } = start(
        WebhookServer::start().await.unwrap(),
        "/outbox/status?token=t0k3n",
        |_| {},
    )
    .await;

    let delivered = send(&mut client, "tank 4 high", "level 97%").await;
    let shown = until_called(
        &mut outbox,
        &delivered,
        v1::StatusCallbackOutcome::Answered,
        v1::NotificationStatus::Delivered,
    )
    .await;
    // The call is an entry after the delivery, naming the endpoint without its path or query.
    let call = calls(&shown).remove(0);
    assert_eq!(
        call.provider,
        format!("http://{}", it_system.addr()),
        "{call:?}"
    );
    assert!(call.duration_ms.is_some(), "{call:?}");
    assert_eq!(
        shown.history.last().map(|h| h.sequence),
        Some(u32::try_from(shown.history.len()).unwrap()),
        "numbered 1..n: {:?}",
        shown.history
    );

    // One the relay refuses parks; an operator then discards it: two changes, in order.
    sink.set_behaviour(Behaviour::RejectRcpt {
        code: 550,
        text: "5.1.1 no such mailbox".into(),
    });
    let parked = send(&mut client, "pump 7 tripped", "motor overload").await;
    until_called(
        &mut outbox,
        &parked,
        v1::StatusCallbackOutcome::Answered,
        v1::NotificationStatus::Parked,
    )
    .await;
    outbox
        .discard_notification(v1::DiscardNotificationRequest {
            notification_id: parked.clone(),
        })
        .await
        .unwrap();
    until_called(
        &mut outbox,
        &parked,
        v1::StatusCallbackOutcome::Answered,
        v1::NotificationStatus::Discarded,
    )
    .await;

    // Every call was answered, so each change was told once: three requests in all.
    let requests = it_system.requests();
    assert_eq!(requests.len(), 3, "{requests:?}");
    let now = outbox_tests::webhook_server::unix_now();
    let mut keys = Vec::new();
    for request in &requests {
        assert_eq!(request.path, "/outbox/status");
        assert!(
            request.verify_signature(KEY.as_bytes(), now).is_ok(),
            "signed with the key: {request:?}"
        );
        assert!(
            request
                .verify_signature(b"another-key-entirely", now)
                .is_err(),
            "and only with it"
        );
        assert_eq!(
            request.header("x-outbox-event"),
            Some("notification.status")
        );
        keys.push(request.idempotency_key().unwrap().to_owned());
    }
    keys.sort();
    keys.dedup();
    assert_eq!(keys.len(), 3, "one key per change: {keys:?}");

    let told = for_id(&requests, &delivered);
    assert_eq!(told.len(), 1);
    let body = told[0].json().unwrap();
    assert_eq!(body["event"], "notification.status");
    assert_eq!(body["status"], "Delivered");
    assert_eq!(body["list"], LIST);
    assert_eq!(body["site_id"], "site-a");
    assert_eq!(body["subject"], "tank 4 high");
    assert!(body["decided_at"].is_string(), "{body}");
    for recipient in RECIPIENTS {
        assert!(
            body["delivered_to"].as_str().unwrap().contains(recipient),
            "{body}"
        );
    }

    let told = for_id(&requests, &parked);
    let statuses: Vec<_> = told
        .iter()
        .map(|r| r.json().unwrap()["status"].clone())
        .collect();
    assert_eq!(statuses, ["Parked", "Discarded"], "in the order decided");
    let reason = told[0].json().unwrap()["reason"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(reason.contains("550"), "{reason}");
    let (first, second) = (told[0].json().unwrap(), told[1].json().unwrap());
    assert!(
        first["change"].as_i64().unwrap() < second["change"].as_i64().unwrap(),
        "{first} {second}"
    );

    site.kill9().await;
    central.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_endpoint_is_retried_then_given_up_and_delivery_stands() {
    let it_system = WebhookServer::start().await.unwrap();
    it_system.set_default_reply(Reply::status(503));
    let Running {
        _dir,
        sink,
        it_system,
        central,
        site,
        mut client,
        mut outbox,
    } = start(it_system, "/status", |config| {
        // Retried at 1 s, then 2 s later, then given up at 3 s.
        config.status_callbacks.give_up_after = Duration::from_secs(3);
    })
    .await;

    let id = send(&mut client, "tank 4 high", "level 97%").await;
    let shown = until_called(
        &mut outbox,
        &id,
        v1::StatusCallbackOutcome::GivenUp,
        v1::NotificationStatus::Delivered,
    )
    .await;
    let entries = calls(&shown);
    let (given_up, failed) = entries.split_last().unwrap();
    assert!(!failed.is_empty(), "retried before giving up: {entries:?}");
    assert!(
        failed
            .iter()
            .all(|c| is(c, v1::StatusCallbackOutcome::Failed) && c.error.contains("HTTP 503")),
        "{entries:?}"
    );
    assert!(
        given_up.error.contains("HTTP 503") && given_up.error.contains("given up"),
        "{given_up:?}"
    );
    // Each entry is one call the endpoint received.
    let requests = it_system.requests();
    assert_eq!(requests.len(), entries.len(), "{requests:?}");
    assert!(requests.iter().all(|r| r.answered == 503));
    // Delivery is untouched: still Delivered, its mail received, no attempt added.
    let state = shown.notification.as_ref().unwrap();
    assert_eq!(state.status, i32::from(v1::NotificationStatus::Delivered));
    let attempts = shown
        .history
        .iter()
        .filter(|h| h.kind == i32::from(v1::HistoryEntryKind::DeliveryAttempt))
        .count();
    assert_eq!(attempts, 1, "{:?}", shown.history);
    assert_eq!(sink.messages().len(), 1);

    // Nothing more is called once given up: a later detail shows the same calls.
    let again = detail(&mut outbox, &id).await;
    assert_eq!(calls(&again).len(), entries.len());

    site.kill9().await;
    central.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_status_callback_needs_a_key_and_a_sound_url() {
    let dir = tempfile::tempdir().unwrap();
    let central = Central::start(central_config(dir.path(), None)).await;
    let mut outbox = central.outbox().await;
    let upsert = |url: &str| v1::UpsertNotificationListRequest {
        list: Some(v1::NotificationList {
            name: "erp".into(),
            recipients: vec!["erp@plant.example.test".into()],
            status_callback_url: url.into(),
            ..Default::default()
        }),
    };
    let refused = outbox
        .upsert_notification_list(upsert("ftp://erp.plant.example.test/status"))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::InvalidArgument);
    assert!(
        refused.message().starts_with("list.status_callback_url"),
        "{}",
        refused.message()
    );
    let refused = outbox
        .upsert_notification_list(upsert("https://erp.plant.example.test/status"))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::FailedPrecondition);
    assert!(
        refused.message().contains("status_callbacks.key"),
        "{}",
        refused.message()
    );
    // Neither was stored.
    let missing = outbox
        .get_notification_list(v1::GetNotificationListRequest { name: "erp".into() })
        .await
        .unwrap_err();
    assert_eq!(missing.code(), tonic::Code::NotFound);
    central.stop().await;
}
