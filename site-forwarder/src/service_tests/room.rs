//! Keeping room to drain, end to end: a full buffer refuses Sends and says so (the error,
//! health, `GetBufferStats`, `/metrics`) until central drains it.

use super::*;

/// A buffer at `max_buffer_bytes` refuses Sends with RESOURCE_EXHAUSTED naming the setting and
/// its limit, and says so everywhere an operator or a load balancer looks (health of
/// SiteNotify, GetBufferStats, /metrics) without calling central unreachable for it; once
/// central is back and has drained the buffer, Sends are taken again with nothing done by hand.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_buffer_refuses_sends_and_says_so_until_central_drains_it() {
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};

    const LIMIT: u64 = 1 << 20;
    let central = Reserved::new();
    let metrics = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let metrics_addr = metrics.local_addr().unwrap();
    let listeners = crate::Listeners {
        pair: None,
        metrics: Some(metrics),
    };
    let mut site = start_node(central.addr, listeners, |config| {
        config.metrics_listen = Some(metrics_addr);
        config.max_buffer_bytes = Some(LIMIT);
    })
    .await;
    let large = |i: usize| SendRequest {
        body: "x".repeat(16 * 1024),
        ..send_request(&format!("fill {i}"))
    };

    let mut accepted = Vec::new();
    let refusal = loop {
        match site.client.send(large(accepted.len())).await {
            Ok(response) => accepted.push(response.into_inner().notification_id),
            Err(status) => break status,
        }
        assert!(accepted.len() < 1000, "a 1 MiB buffer never refused");
    };
    assert_eq!(refusal.code(), Code::ResourceExhausted, "{refusal:?}");
    assert!(
        refusal
            .message()
            .contains("max_buffer_bytes: the buffer would hold"),
        "{refusal:?}"
    );
    assert!(
        refusal.message().contains("the limit is 1048576"),
        "{refusal:?}"
    );
    assert!(!accepted.is_empty());

    // Small Sends may still fit for a while; fill until a page does not, so the buffer as a
    // whole refuses.
    loop {
        match site.client.send(send_request("small")).await {
            Ok(response) => accepted.push(response.into_inner().notification_id),
            Err(status) => {
                assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
                break;
            }
        }
    }
    let stats = site
        .wait_for("the refusal in the stats", |s| s.sends_refused)
        .await;
    assert!(
        stats.sends_refused_reason.starts_with("max_buffer_bytes: "),
        "{stats:?}"
    );
    assert!(!stats.central_reachable, "central is away, not the disk");
    assert_eq!(
        stats.depth,
        accepted.len() as u64,
        "nothing refused was stored"
    );
    // Each Send is checked against an estimate of its size: the file may pass the limit by
    // the estimate's error (a few pages), never by more.
    assert!(
        stats.buffer_bytes > LIMIT / 2 && stats.buffer_bytes < LIMIT + LIMIT / 16,
        "{stats:?}"
    );

    let channel = Channel::from_shared(format!("http://{}", site.addr))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut health = HealthClient::new(channel);
    let mut health_of = async |service: &str| {
        health
            .check(HealthCheckRequest {
                service: service.into(),
            })
            .await
            .unwrap()
            .into_inner()
            .status()
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while health_of("outbox.v1.SiteNotify").await != ServingStatus::NotServing {
        assert!(
            tokio::time::Instant::now() < deadline,
            "SiteNotify still SERVING"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        health_of("").await,
        ServingStatus::Serving,
        "the process serves; only Sends are refused"
    );
    let text = scrape(metrics_addr).await;
    assert_eq!(
        metrics_endpoint::sample(&text, "outbox_site_sends_refused"),
        Some(1.0)
    );
    assert_eq!(
        metrics_endpoint::sample(&text, "outbox_site_central_reachable"),
        Some(0.0)
    );

    // Central comes back: everything is forwarded and deleted, and Sends work again by
    // themselves.
    let fake = FakeCentral::default();
    let central_stop = serve_central_at(central, fake.clone()).await;
    let stats = site
        .wait_for("the buffer drained and taking Sends", |s| {
            s.depth == 0 && !s.sends_refused
        })
        .await;
    assert!(stats.sends_refused_reason.is_empty(), "{stats:?}");
    let stored = fake.stored.lock().unwrap().len();
    assert_eq!(stored, accepted.len());
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while health_of("outbox.v1.SiteNotify").await != ServingStatus::Serving {
        assert!(
            tokio::time::Instant::now() < deadline,
            "SiteNotify still NOT_SERVING"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    site.client.send(large(0)).await.unwrap();
    let text = scrape(metrics_addr).await;
    assert_eq!(
        metrics_endpoint::sample(&text, "outbox_site_sends_refused"),
        Some(0.0)
    );
    assert!(
        metrics_endpoint::sample(&text, "outbox_site_buffer_bytes").is_some_and(|b| b > 0.0),
        "{text}"
    );
    site.shut_down().await;
    central_stop.cancel();
}
