//! `/metrics` as an operator scrapes it: the buffer's gauges while central is away, and what
//! central acked.

use super::*;

fn forwarded(text: &str, outcome: &str) -> Option<f64> {
    let series = format!("outbox_site_forwarded_total{{outcome=\"{outcome}\"}}");
    metrics_endpoint::sample(text, &series)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_mirror_the_buffer_while_central_is_away() {
    let central = Reserved::new();
    let (mut site, metrics_addr) = start_site_with_metrics(central.addr).await;

    for subject in ["one", "two", "three"] {
        site.send(subject).await;
    }
    let stats = site.stats().await;
    assert_eq!(stats.depth, 3);
    let text = scrape(metrics_addr).await;
    let sample = |series: &str| metrics_endpoint::sample(&text, series);
    assert_eq!(sample("outbox_site_buffer_depth"), Some(stats.depth as f64));
    assert_eq!(sample("outbox_site_central_reachable"), Some(0.0));
    assert_eq!(sample("outbox_site_in_flight"), Some(0.0));
    assert_eq!(sample("outbox_site_sends_accepted_total"), Some(3.0));
    assert_eq!(sample("outbox_site_buffer_rejected"), Some(0.0));
    assert_eq!(
        sample("outbox_site_last_forward_timestamp_seconds"),
        Some(0.0)
    );
    assert!(sample("outbox_site_buffer_oldest_age_seconds").is_some());
    assert_eq!(forwarded(&text, "accepted"), Some(0.0));
    // The endpoint's own connections: the scrape itself is open, nothing was refused.
    assert_eq!(
        sample("outbox_http_connections_refused_total{listener=\"metrics\"}"),
        Some(0.0)
    );
    assert_eq!(
        sample("outbox_http_connections_open{listener=\"metrics\"}"),
        Some(1.0)
    );

    let other = metrics_endpoint::get(metrics_addr, "/").await.unwrap();
    assert_eq!(other.status, 404);
    site.shut_down().await;
    // Held, so that nothing else answers there now.
    let _metrics_port = Reserved::again(metrics_addr);
    assert!(
        metrics_endpoint::get(metrics_addr, "/metrics")
            .await
            .is_err(),
        "the endpoint stops with the service"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_what_central_acked() {
    let central = FakeCentral::default();
    let (central_addr, central_stop) = serve_central(central.clone()).await;
    let (mut site, metrics_addr) = start_site_with_metrics(central_addr).await;

    for subject in ["first", "second", "please reject"] {
        site.send(subject).await;
    }
    // Each notification central took is counted once, when the buffer deletes it: as accepted,
    // or as duplicate when the stream broke before its ack and central answered the resubmit
    // DUPLICATE. Which of the two depends on timing, so they are counted together; a
    // duplicate is only counted for a submit central received more than once.
    let delivered =
        |text: &str| forwarded(text, "accepted").unwrap() + forwarded(text, "duplicate").unwrap();
    // Counters move last (after the buffer commit and the forward stamp), and a scrape reads the
    // buffer before it renders them, so the scrape that first shows an ack counted may still
    // show its row buffered: wait for the counters, then scrape again for the rest.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let text = scrape(metrics_addr).await;
        if delivered(&text) == 2.0 && forwarded(&text, "rejected") == Some(1.0) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for the acks to be counted:\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let text = scrape(metrics_addr).await;
    let sample = |series: &str| metrics_endpoint::sample(&text, series);
    assert_eq!(delivered(&text), 2.0, "{text}");
    assert_eq!(forwarded(&text, "rejected"), Some(1.0));
    let resubmits = central.submits_seen.lock().unwrap().len() - 3;
    assert!(
        forwarded(&text, "duplicate").unwrap() <= resubmits as f64,
        "duplicates counted beyond the {resubmits} resubmits central received:\n{text}"
    );
    assert_eq!(sample("outbox_site_buffer_depth"), Some(0.0));
    assert_eq!(sample("outbox_site_buffer_rejected"), Some(1.0));
    assert_eq!(sample("outbox_site_buffer_oldest_age_seconds"), Some(0.0));
    assert_eq!(sample("outbox_site_central_reachable"), Some(1.0));
    assert_eq!(sample("outbox_site_sends_accepted_total"), Some(3.0));
    let last = sample("outbox_site_last_forward_timestamp_seconds").unwrap();
    let stats = site.stats().await;
    let last_forward_at = stats.last_forward_at.unwrap();
    assert_eq!(
        (last * 1000.0).round() as i64,
        last_forward_at.seconds * 1000 + i64::from(last_forward_at.nanos / 1_000_000),
        "the same instant GetBufferStats reports"
    );

    site.shut_down().await;
    central_stop.cancel();
}
