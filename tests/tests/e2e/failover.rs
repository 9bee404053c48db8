//! A second way out (issue 35, point 4): an email channel with a fallback relay. The first relay
//! refusing connections moves the channel to the fallback, which delivers; once the first
//! answers again, a probe finds it and the channel goes back. A relay that refuses mail for good
//! (550) is answering: the channel stays on it. Each attempt's history names the relay it went
//! to, and `/metrics` shows which relay the channel is on and every move.
//!
//! The same for a webhook list with a fallback URL: its endpoint answering 503 moves the list to
//! the fallback, which receives the deliveries; GetKpis (and so the console) names the list as
//! on its fallback; once the endpoint answers again, a probe (a HEAD) finds it and the list goes
//! back. An endpoint refusing the notification for good (400) is answering: the list stays.

use std::net::SocketAddr;
use std::time::Duration;

use central_outbox::config::{
    BackoffKind, Config as CentralConfig, ListConfig, WebhookConfig, WebhookFormatKind,
};
use outbox_proto::v1;
use outbox_tests::smtp_sink::{Behaviour, SmtpSink};
use outbox_tests::webhook_server::{Reply, WebhookServer};
use tokio::net::TcpListener;

use crate::console::{Browser, tile};
use crate::harness::{
    Central, DEADLINE, central_config, eventually, free_addr, ingest_one as ingest, ingest_submit,
    smtp_sink, submit, wait_for_status, with_console,
};

/// `host:port`, as attempts name their relay.
fn relay_name(addr: SocketAddr) -> String {
    format!("{}:{}", addr.ip(), addr.port())
}

/// The delivery attempts of `id`: each one's outcome and the relay it went to.
async fn attempts(central: &Central, id: &str) -> Vec<(v1::AttemptOutcome, String)> {
    central
        .outbox()
        .await
        .get_notification_detail(v1::GetNotificationDetailRequest {
            notification_id: id.into(),
        })
        .await
        .unwrap()
        .into_inner()
        .history
        .iter()
        .filter(|e| e.kind() == v1::HistoryEntryKind::DeliveryAttempt)
        .map(|e| (e.outcome(), e.provider.clone()))
        .collect()
}

/// The sample `series` on central's `/metrics`, once it can be read.
async fn sample(metrics: SocketAddr, series: &str) -> Option<f64> {
    let scrape = metrics_endpoint::get(metrics, "/metrics").await.ok()?;
    metrics_endpoint::sample(&scrape.body, series)
}

const PROVIDER: &str = "outbox_channel_provider{channel=\"Email\"}";

fn failovers(reason: &str) -> String {
    format!("outbox_channel_failovers_total{{channel=\"Email\",reason=\"{reason}\"}}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_refusing_connections_hands_the_mail_to_the_fallback_until_it_answers_again() {
    let dir = tempfile::tempdir().unwrap();
    // The first relay: a port nobody listens on (every connection refused) until the test
    // starts a sink there.
    let first = free_addr().await;
    let fallback = smtp_sink().await;
    let mut config = central_config(dir.path(), Some(first));
    let smtp = config.smtp.as_mut().unwrap();
    smtp.fallback_relays = vec![format!("{} none", relay_name(fallback.addr()))];
    // Probed every second instead of every 30 s, so the way back takes seconds.
    config.dispatcher.failover_probe_interval = Duration::from_secs(1);
    let metrics = free_addr().await;
    config.metrics_listen = Some(metrics);
    let central = Central::start(config).await;
    assert_eq!(sample(metrics, PROVIDER).await, Some(0.0));

    let mut ids = Vec::new();
    for i in 0..5 {
        ids.push(ingest(&central, &format!("Pump {i} tripped")).await);
    }
    for id in &ids {
        wait_for_status(&central.db, id, "Delivered").await;
    }
    assert_eq!(fallback.wait_for_messages(5, DEADLINE).await.len(), 5);
    // Every row went out through the fallback, after its attempts at the first were refused;
    // and each attempt's history names the relay it went to.
    let mut refused = 0;
    for id in &ids {
        let attempts = attempts(&central, id).await;
        let (last, earlier) = attempts.split_last().unwrap();
        assert_eq!(
            last,
            &(v1::AttemptOutcome::Delivered, relay_name(fallback.addr())),
            "{id}: {attempts:?}"
        );
        for attempt in earlier {
            assert_eq!(
                attempt,
                &(v1::AttemptOutcome::TransientFailure, relay_name(first)),
                "{id}: {attempts:?}"
            );
        }
        refused += earlier.len();
    }
    assert!(refused >= 3, "three refusals move the channel: {refused}");
    assert_eq!(sample(metrics, PROVIDER).await, Some(1.0));
    assert_eq!(sample(metrics, &failovers("failures")).await, Some(1.0));

    // The first relay answers again: a probe finds it, and the channel goes back to it.
    let first_sink = SmtpSink::serve(TcpListener::bind(first).await.unwrap());
    eventually(
        "a probe takes the channel back to its first relay",
        || async { (sample(metrics, PROVIDER).await == Some(0.0)).then_some(()) },
    )
    .await;
    assert_eq!(
        sample(metrics, &failovers("first_is_back")).await,
        Some(1.0)
    );
    let back = ingest(&central, "Pump 0 running").await;
    wait_for_status(&central.db, &back, "Delivered").await;
    assert_eq!(first_sink.wait_for_messages(1, DEADLINE).await.len(), 1);
    assert_eq!(
        attempts(&central, &back).await,
        [(v1::AttemptOutcome::Delivered, relay_name(first))]
    );
    // The probe sent no mail: the fallback has the five it delivered, the first relay one.
    assert_eq!(fallback.accepted_count(), 5);
    assert_eq!(first_sink.accepted_count(), 1);
    central.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_refusing_the_mail_for_good_keeps_the_channel_and_nothing_goes_to_the_fallback() {
    let dir = tempfile::tempdir().unwrap();
    let first = smtp_sink().await;
    first.set_behaviour(Behaviour::RejectRcpt {
        code: 550,
        text: "5.1.1 mailbox unavailable".into(),
    });
    let fallback = smtp_sink().await;
    let mut config = central_config(dir.path(), Some(first.addr()));
    let smtp = config.smtp.as_mut().unwrap();
    smtp.fallback_relays = vec![format!("{} none", relay_name(fallback.addr()))];
    let metrics = free_addr().await;
    config.metrics_listen = Some(metrics);
    let central = Central::start(config).await;

    let mut ids = Vec::new();
    for i in 0..4 {
        ids.push(ingest(&central, &format!("Valve {i} stuck")).await);
    }
    for id in &ids {
        let (_, _, error) = wait_for_status(&central.db, id, "Parked").await;
        assert!(error.unwrap_or_default().contains("550"), "{id}");
        assert_eq!(
            attempts(&central, id).await,
            [(
                v1::AttemptOutcome::PermanentFailure,
                relay_name(first.addr())
            )]
        );
    }
    // Four refusals in a row, and the channel never left the relay that gave them.
    assert_eq!(sample(metrics, PROVIDER).await, Some(0.0));
    assert_eq!(sample(metrics, &failovers("failures")).await, None);
    assert_eq!(fallback.accepted_count(), 0);
    central.stop().await;
}

// ---- Webhook lists --------------------------------------------------------------------------

const HOOKS: &str = "hooks";

/// `scheme://host:port`, as attempts name a webhook endpoint (never its path).
fn endpoint_name(server: &WebhookServer) -> String {
    format!("http://{}", server.addr())
}

const LIST_PROVIDER: &str = "outbox_list_provider{list=\"hooks\"}";

fn list_failovers(reason: &str) -> String {
    format!("outbox_list_failovers_total{{list=\"hooks\",reason=\"{reason}\"}}")
}

/// Central with webhook list `hooks` posting to `primary`, with `fallback` as its fallback URL,
/// quick fixed retries, and its first endpoint probed every second; and its `/metrics` address.
async fn hooks_central(
    dir: &std::path::Path,
    primary: &WebhookServer,
    fallback: &WebhookServer,
) -> (CentralConfig, SocketAddr) {
    let mut config = central_config(dir, None);
    config.webhook = Some(WebhookConfig {
        timeout: Duration::from_millis(500),
        max_retries: 10,
        retry_delay: Duration::from_millis(200),
        backoff: BackoffKind::Fixed,
        ..WebhookConfig::default()
    });
    config.lists.push(ListConfig {
        fallback_urls: vec![fallback.url("/backup?token=t0ps3cret")],
        ..ListConfig::webhook(
            HOOKS,
            vec![primary.url("/hook")],
            WebhookFormatKind::Generic,
        )
    });
    config.dispatcher.failover_probe_interval = Duration::from_secs(1);
    let metrics = free_addr().await;
    config.metrics_listen = Some(metrics);
    (config, metrics)
}

/// Ingests a webhook notification to `hooks`; returns its id.
async fn ingest_hook(central: &Central, subject: &str) -> String {
    ingest_submit(
        central,
        v1::NotificationSubmit {
            r#type: v1::NotificationType::Webhook.into(),
            list_name: HOOKS.into(),
            ..submit(subject, "body")
        },
    )
    .await
}

/// What GetKpis says this node delivers through fallbacks.
async fn failover_state(central: &Central) -> v1::FailoverState {
    central
        .outbox()
        .await
        .get_kpis(v1::GetKpisRequest { max_age: None })
        .await
        .unwrap()
        .into_inner()
        .failover
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_webhook_endpoint_answering_503_hands_the_list_to_its_fallback_until_it_answers_again() {
    let dir = tempfile::tempdir().unwrap();
    let primary = WebhookServer::start().await.unwrap();
    primary.set_default_reply(Reply::status(503));
    let fallback = WebhookServer::start().await.unwrap();
    let (mut config, metrics) = hooks_central(dir.path(), &primary, &fallback).await;
    with_console(&mut config).await;
    let central = Central::start(config).await;

    let mut ids = Vec::new();
    for i in 0..5 {
        ids.push(ingest_hook(&central, &format!("Pump {i} tripped")).await);
    }
    for id in &ids {
        wait_for_status(&central.db, id, "Delivered").await;
    }
    let received = fallback.wait_for_requests(5, DEADLINE).await;
    assert_eq!(received.len(), 5);
    assert!(received.iter().all(|r| r.path == "/backup"), "{received:?}");
    // Every row went out through the fallback after its attempts at the endpoint failed, and
    // each attempt names the endpoint it went to, by scheme, host and port only.
    let mut failed = 0;
    for id in &ids {
        let attempts = attempts(&central, id).await;
        let (last, earlier) = attempts.split_last().unwrap();
        assert_eq!(
            last,
            &(v1::AttemptOutcome::Delivered, endpoint_name(&fallback)),
            "{id}: {attempts:?}"
        );
        for attempt in earlier {
            assert_eq!(
                attempt,
                &(
                    v1::AttemptOutcome::TransientFailure,
                    endpoint_name(&primary)
                ),
                "{id}: {attempts:?}"
            );
        }
        failed += earlier.len();
    }
    assert!(failed >= 3, "three failures move the list: {failed}");
    assert_eq!(sample(metrics, LIST_PROVIDER).await, Some(1.0));
    assert_eq!(
        sample(metrics, &list_failovers("failures")).await,
        Some(1.0)
    );
    // The email channel never moved: the list's endpoints are its own providers.
    assert_eq!(sample(metrics, PROVIDER).await, Some(0.0));
    let state = failover_state(&central).await;
    assert!(state.dispatching);
    assert_eq!(state.on_fallback.len(), 1, "{state:?}");
    let on = &state.on_fallback[0];
    assert_eq!(on.channel(), v1::NotificationType::Webhook);
    assert_eq!(
        (on.list.as_str(), on.provider, on.provider_name.as_str()),
        (HOOKS, 1, endpoint_name(&fallback).as_str())
    );
    assert_eq!(on.first_provider, endpoint_name(&primary));
    assert!(!format!("{state:?}").contains("t0ps3cret"), "{state:?}");
    // The console's dashboard shows it: the tile counts it, the table names list and URLs.
    let mut browser = Browser::new(&central);
    let dashboard = browser.get("/").await;
    assert_eq!(dashboard.status, 200, "{}", dashboard.body);
    assert_eq!(tile(&dashboard.body, "on_fallback"), "1");
    assert!(
        dashboard
            .body
            .contains(&format!("{} (fallback 1)", endpoint_name(&fallback))),
        "{}",
        dashboard.body
    );
    assert!(dashboard.body.contains(r#"data-list="hooks""#));
    assert!(!dashboard.body.contains("t0ps3cret"));

    // The endpoint answers again: a probe finds it, and the list goes back to it.
    primary.set_default_reply(Reply::ok());
    eventually("a probe takes the list back to its endpoint", || async {
        (sample(metrics, LIST_PROVIDER).await == Some(0.0)).then_some(())
    })
    .await;
    assert_eq!(
        sample(metrics, &list_failovers("first_is_back")).await,
        Some(1.0)
    );
    assert!(primary.head_count() >= 1, "the way back is a probe");
    assert!(failover_state(&central).await.on_fallback.is_empty());
    assert_eq!(tile(&browser.get("/").await.body, "on_fallback"), "0");
    let posted_before = primary.requests().len();
    let back = ingest_hook(&central, "Pump 0 running").await;
    wait_for_status(&central.db, &back, "Delivered").await;
    assert_eq!(
        attempts(&central, &back).await,
        [(v1::AttemptOutcome::Delivered, endpoint_name(&primary))]
    );
    // The probes posted nothing: the endpoint got one POST more, the fallback none.
    assert_eq!(primary.requests().len(), posted_before + 1);
    assert_eq!(fallback.requests().len(), 5);
    central.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_webhook_endpoint_refusing_for_good_keeps_the_list_and_nothing_goes_to_the_fallback() {
    let dir = tempfile::tempdir().unwrap();
    let primary = WebhookServer::start().await.unwrap();
    primary.set_default_reply(Reply::status(400));
    let fallback = WebhookServer::start().await.unwrap();
    let (config, metrics) = hooks_central(dir.path(), &primary, &fallback).await;
    let central = Central::start(config).await;

    let mut ids = Vec::new();
    for i in 0..4 {
        ids.push(ingest_hook(&central, &format!("Valve {i} stuck")).await);
    }
    for id in &ids {
        let (_, _, error) = wait_for_status(&central.db, id, "Parked").await;
        assert!(error.unwrap_or_default().contains("HTTP 400"), "{id}");
        assert_eq!(
            attempts(&central, id).await,
            [(
                v1::AttemptOutcome::PermanentFailure,
                endpoint_name(&primary)
            )]
        );
    }
    // Four refusals in a row, and the list never left the endpoint that gave them.
    assert_eq!(sample(metrics, LIST_PROVIDER).await, Some(0.0));
    assert_eq!(sample(metrics, &list_failovers("failures")).await, None);
    assert!(failover_state(&central).await.on_fallback.is_empty());
    assert_eq!(fallback.requests().len(), 0);
    assert_eq!(primary.head_count(), 0, "nothing to probe");
    central.stop().await;
}
