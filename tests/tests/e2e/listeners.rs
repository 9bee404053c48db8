//! What central's listeners hold for their clients, and no more: submit streams up to
//! `server.max_ingest_streams` (one more is refused with RESOURCE_EXHAUSTED naming the key, and
//! counted), the per-connection stream limit announced to every gRPC client, bounded rejected
//! acks; and on the console's and `/metrics`' HTTP ports a header read timeout and a connection
//! cap whose refusals are counted. All over real sockets against central running in-process.

use std::net::SocketAddr;

use central_outbox::testing::CONSOLE_LIMITS;
use metrics_endpoint::METRICS_LIMITS;
use outbox_proto::v1;
use outbox_proto::v1::notification_ingest_client::NotificationIngestClient;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Code, Status, Streaming};

use crate::harness::{
    Central, DEADLINE, central_config, channel, eventually, free_addr, submit, with_console,
};

/// A submit stream held open by the test, as a site node holds its own.
struct OpenStream {
    submits: mpsc::Sender<v1::NotificationSubmit>,
    acks: Streaming<v1::NotificationSubmitAck>,
}

impl OpenStream {
    /// Opens a stream on a connection of its own; central's refusal if it refuses it.
    async fn open(central: SocketAddr) -> Result<Self, Status> {
        let mut ingest = NotificationIngestClient::new(channel(central).await);
        let (submits, outgoing) = mpsc::channel(16);
        let acks = ingest
            .submit_notifications(ReceiverStream::new(outgoing))
            .await?
            .into_inner();
        Ok(Self { submits, acks })
    }

    /// Sends `msg` and waits for its ack.
    async fn ack(&mut self, msg: v1::NotificationSubmit) -> v1::NotificationSubmitAck {
        self.submits.send(msg).await.unwrap();
        tokio::time::timeout(DEADLINE, self.acks.message())
            .await
            .expect("an ack within the deadline")
            .unwrap()
            .expect("the stream is still open")
    }

    /// Sends a fresh notification and checks that central accepted it.
    async fn accepted(&mut self, subject: &str) {
        let ack = self.ack(submit(subject, "listener test")).await;
        assert_eq!(ack.outcome(), v1::SubmitOutcome::Accepted, "{ack:?}");
    }
}

/// The value of `series` on central's `/metrics` at `addr`, once it answers.
async fn scrape(addr: SocketAddr, series: &str) -> f64 {
    eventually(&format!("{series} on /metrics"), || async move {
        let reply = metrics_endpoint::get(addr, "/metrics").await.ok()?;
        metrics_endpoint::sample(&reply.body, series)
    })
    .await
}

#[tokio::test]
async fn submit_streams_past_the_cap_are_refused_naming_the_limit_while_open_ones_go_on() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = central_config(dir.path(), None);
    config.server.max_ingest_streams = 2;
    let metrics = free_addr().await;
    config.metrics_listen = Some(metrics);
    let central = Central::start(config).await;

    let mut first = OpenStream::open(central.addr).await.unwrap();
    first.accepted("first stream, 1").await;
    let mut second = OpenStream::open(central.addr).await.unwrap();
    second.accepted("second stream, 1").await;

    let refused = match OpenStream::open(central.addr).await {
        Ok(_) => panic!("a third stream was opened past server.max_ingest_streams = 2"),
        Err(status) => status,
    };
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    assert!(
        refused.message().contains("server.max_ingest_streams") && refused.message().contains("2"),
        "the refusal names the limit: {:?}",
        refused.message()
    );
    assert_eq!(
        scrape(metrics, "outbox_ingest_streams_refused_total").await,
        1.0
    );
    assert_eq!(scrape(metrics, "outbox_ingest_streams_open").await, 2.0);

    // The open ones are not disturbed.
    first.accepted("first stream, 2").await;
    second.accepted("second stream, 2").await;

    // Once one ends, a new stream gets its place.
    drop(first);
    let mut third = eventually("a new stream opens once one ended", || async {
        OpenStream::open(central.addr).await.ok()
    })
    .await;
    third.accepted("third stream").await;
    second.accepted("second stream, 3").await;
    drop((second, third));
    central.stop().await;
}

/// The settings central announces in its first HTTP/2 SETTINGS frame, as (id, value) pairs.
async fn announced_settings(addr: SocketAddr) -> Vec<(u16, u32)> {
    let mut tcp = TcpStream::connect(addr).await.unwrap();
    // The client connection preface, then an empty SETTINGS frame (RFC 9113, 3.4 and 6.5).
    tcp.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
        .await
        .unwrap();
    tcp.write_all(&[0, 0, 0, 0x4, 0, 0, 0, 0, 0]).await.unwrap();
    let read = async {
        loop {
            let mut header = [0u8; 9];
            tcp.read_exact(&mut header).await.unwrap();
            let length =
                usize::from(header[0]) << 16 | usize::from(header[1]) << 8 | usize::from(header[2]);
            let (kind, flags) = (header[3], header[4]);
            let mut payload = vec![0u8; length];
            tcp.read_exact(&mut payload).await.unwrap();
            // SETTINGS without the ACK flag: the server's own.
            if kind == 0x4 && flags & 0x1 == 0 {
                return payload
                    .chunks_exact(6)
                    .map(|entry| {
                        (
                            u16::from_be_bytes([entry[0], entry[1]]),
                            u32::from_be_bytes([entry[2], entry[3], entry[4], entry[5]]),
                        )
                    })
                    .collect();
            }
        }
    };
    tokio::time::timeout(DEADLINE, read)
        .await
        .expect("central sends its SETTINGS")
}

#[tokio::test]
async fn every_connection_is_told_how_many_calls_it_may_have_open() {
    const SETTINGS_MAX_CONCURRENT_STREAMS: u16 = 0x3;
    let dir = tempfile::tempdir().unwrap();
    let mut config = central_config(dir.path(), None);
    config.server.max_concurrent_streams = 7;
    let central = Central::start(config).await;
    let settings = announced_settings(central.addr).await;
    assert!(
        settings.contains(&(SETTINGS_MAX_CONCURRENT_STREAMS, 7)),
        "SETTINGS_MAX_CONCURRENT_STREAMS = 7 among {settings:?}"
    );

    // And the default when nothing is configured.
    let other = tempfile::tempdir().unwrap();
    let defaults = Central::start(central_config(other.path(), None)).await;
    let settings = announced_settings(defaults.addr).await;
    assert!(
        settings.contains(&(SETTINGS_MAX_CONCURRENT_STREAMS, 100)),
        "SETTINGS_MAX_CONCURRENT_STREAMS = 100 among {settings:?}"
    );
    central.stop().await;
    defaults.stop().await;
}

#[tokio::test]
async fn a_rejected_ack_echoes_a_bounded_part_of_a_huge_notification_id() {
    let dir = tempfile::tempdir().unwrap();
    let central = Central::start(central_config(dir.path(), None)).await;
    let mut stream = OpenStream::open(central.addr).await.unwrap();

    let mut huge = submit("Tank 4 high level", "Level 97%");
    huge.notification_id = "x".repeat(1024 * 1024);
    let ack = stream.ack(huge).await;
    assert_eq!(ack.outcome(), v1::SubmitOutcome::Rejected);
    assert!(ack.reason.starts_with("notification_id:"), "{}", ack.reason);
    assert!(
        ack.notification_id.len() <= 64 && ack.notification_id.chars().all(|c| c == 'x'),
        "a prefix of the id, not {} bytes of it",
        ack.notification_id.len()
    );
    // The stream goes on.
    stream.accepted("after the huge id").await;
    drop(stream);
    central.stop().await;
}

/// What arrived on `stream` until central closed it. Panics if it stays open for [`DEADLINE`].
async fn read_until_closed(stream: &mut TcpStream) -> Vec<u8> {
    metrics_endpoint::read_until_closed(stream, DEADLINE)
        .await
        .unwrap_or_else(|| panic!("central kept the connection open for {DEADLINE:?}"))
}

#[tokio::test]
async fn the_console_and_metrics_close_a_connection_whose_request_header_does_not_arrive() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = central_config(dir.path(), None);
    with_console(&mut config).await;
    let metrics = free_addr().await;
    config.metrics_listen = Some(metrics);
    let central = Central::start(config).await;
    let console = central.console.unwrap();

    // Half a header on each, sent at once; each is closed, unanswered, after the header read
    // timeout (10 s), instead of being held for as long as the client likes.
    let mut halves = Vec::new();
    for addr in [console, metrics] {
        let mut half = TcpStream::connect(addr).await.unwrap();
        half.write_all(b"GET /metrics HTTP/1.1\r\nHost: central\r\n")
            .await
            .unwrap();
        halves.push(half);
    }
    for half in &mut halves {
        assert_eq!(read_until_closed(half).await, b"", "closed unanswered");
    }
    central.stop().await;
}

/// Fills `addr`'s connection cap (`max_open` connections that send nothing), then makes one
/// more with a whole request; whether that one went unanswered. The held connections are let go
/// after. (They are closed by the header read timeout 10 s after they were made, so on a machine
/// stalled for that long the extra one may be served: callers try again.)
async fn refused_past_the_cap(addr: SocketAddr, max_open: usize) -> bool {
    let mut held = Vec::with_capacity(max_open);
    for _ in 0..max_open {
        held.push(TcpStream::connect(addr).await.unwrap());
    }
    let refused = metrics_endpoint::get(addr, "/metrics").await.is_err();
    drop(held);
    refused
}

#[tokio::test]
async fn the_console_and_metrics_refuse_connections_past_their_cap_and_count_them() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = central_config(dir.path(), None);
    with_console(&mut config).await;
    let metrics = free_addr().await;
    config.metrics_listen = Some(metrics);
    let central = Central::start(config).await;
    let console = central.console.unwrap();
    let refused_series = |listener: &str| {
        format!("outbox_http_connections_refused_total{{listener=\"{listener}\"}}")
    };
    assert_eq!(scrape(metrics, &refused_series("console")).await, 0.0);
    assert_eq!(scrape(metrics, &refused_series("metrics")).await, 0.0);

    eventually("the console refuses a connection past its cap", || async {
        refused_past_the_cap(console, CONSOLE_LIMITS.max_open)
            .await
            .then_some(())
    })
    .await;
    assert!(scrape(metrics, &refused_series("console")).await >= 1.0);

    eventually("/metrics refuses a connection past its cap", || async {
        refused_past_the_cap(metrics, METRICS_LIMITS.max_open)
            .await
            .then_some(())
    })
    .await;
    // Served again once the held connections are gone, and the refusal is counted.
    let refused = scrape(metrics, &refused_series("metrics")).await;
    assert!(refused >= 1.0, "{refused}");
    // The console answers again too.
    eventually("the console answers again", || async {
        metrics_endpoint::get(console, "/").await.ok()
    })
    .await;
    central.stop().await;
}
