//! What a node serves besides `Send`: health and reflection, the listeners it is handed at
//! start-up, and its health reports to central.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_and_reflection_are_served() {
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};
    use tonic_reflection::pb::v1::ServerReflectionRequest;
    use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
    use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;

    let central = Reserved::new();
    let site = start_site(central.addr).await;
    let channel = Channel::from_shared(format!("http://{}", site.addr))
        .unwrap()
        .connect()
        .await
        .unwrap();

    let mut health = HealthClient::new(channel.clone());
    for service in ["", "outbox.v1.SiteNotify"] {
        let answer = health
            .check(HealthCheckRequest {
                service: service.into(),
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(
            answer.status,
            i32::from(ServingStatus::Serving),
            "{service:?}"
        );
    }

    let mut reflection = ServerReflectionClient::new(channel);
    let request = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut answers = reflection
        .server_reflection_info(tokio_stream::once(request))
        .await
        .unwrap()
        .into_inner();
    let Some(MessageResponse::ListServicesResponse(list)) =
        answers.next().await.unwrap().unwrap().message_response
    else {
        panic!("expected a service list");
    };
    let names: Vec<_> = list.service.into_iter().map(|s| s.name).collect();
    for expected in ["outbox.v1.SiteNotify", "grpc.health.v1.Health"] {
        assert!(names.iter().any(|n| n == expected), "{names:?}");
    }
    site.shut_down().await;
}

/// A listener handed to `run_with` stands for a configured address: one bound elsewhere, or
/// for an address that is not configured, stops start-up naming the key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listener_given_must_be_bound_to_the_configured_address() {
    let central = Reserved::new();
    let other = Reserved::new();
    for (metrics_listen, expected) in [
        (Some(other.addr), "metrics_listen: 127.0.0.1:"),
        (None, "metrics_listen: not set"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let mut config = Config::new("site-a");
        config.buffer_path = dir.path().join("buffer.db");
        config.central_url = format!("http://{}", central.addr);
        config.metrics_listen = metrics_listen;
        let listeners = crate::Listeners {
            pair: None,
            metrics: Some(TcpListener::bind("127.0.0.1:0").await.unwrap()),
        };
        let site = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let stop = CancellationToken::new();
        let err = crate::run_with(config, site, listeners, stop)
            .await
            .unwrap_err();
        assert!(
            matches!(&err, crate::RunError::Config(problem) if problem.starts_with(expected)),
            "{err}"
        );
    }
}

/// The node reports its health to central every `health_report_interval`, whether the stream is
/// busy or not: its buffer depth (here rows central holds unacked), oldest buffered age, name,
/// role and version; once central acks, the empty buffer and when it last forwarded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_node_reports_its_health_to_central_every_interval() {
    let central = FakeCentral::default();
    central.acks_held.send_replace(true);
    let (central_addr, central_stop) = serve_central(central.clone()).await;
    let mut site = start_site_with(central_addr, |config| {
        config.health_report_interval = Duration::from_millis(50);
    })
    .await;

    central
        .wait_for("a first report, at start", |c| c.latest_report().is_some())
        .await;
    for subject in ["one", "two", "three"] {
        site.send(subject).await;
    }
    central
        .wait_for("a report of the three unacked rows", |c| {
            c.latest_report().is_some_and(|r| r.buffer_depth == 3)
        })
        .await;
    let busy = central.latest_report().unwrap();
    assert_eq!(busy.site_id, "site-a");
    assert_eq!(
        busy.node_name, "site-a",
        "a single node is named by its site"
    );
    assert_eq!(busy.role(), v1::NodeRole::Active);
    assert_eq!(busy.version, crate::health_report::VERSION);
    assert!(busy.oldest_buffered_age_seconds >= 0.0);
    assert_eq!(busy.last_forward_at, None, "nothing acked yet");
    assert_eq!((busy.standby_lag_rows, busy.rejected), (0, 0));

    central.acks_held.send_replace(false);
    central
        .wait_for("a report of the drained buffer", |c| {
            c.latest_report()
                .is_some_and(|r| r.buffer_depth == 0 && r.last_forward_at.is_some())
        })
        .await;
    let idle = central.latest_report().unwrap();
    assert_eq!(idle.oldest_buffered_age_seconds, 0.0);
    assert!(idle.central_reachable);
    // Idle, it goes on reporting.
    let reports = central.health_reports.lock().unwrap().len();
    central
        .wait_for("more reports while idle", |c| {
            c.health_reports.lock().unwrap().len() >= reports + 3
        })
        .await;
    site.shut_down().await;
    central_stop.cancel();
}
