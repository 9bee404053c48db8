//! The health service's answers (`grpc.health.v1`): SERVING while the store answers,
//! NOT_SERVING while it does not and from the start of shutdown on. Load balancers and the
//! site-forwarders' health checks then steer away from a replica whose database is gone instead
//! of feeding it requests that would fail.
//!
//! The store is probed every `interval` through its write path (an empty transaction), so a
//! wedged writer or a lost connection shows, not only an unreadable file.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Mutex;
use tokio_util::sync::CancellationToken;
use tonic_health::ServingStatus;
use tonic_health::server::HealthReporter;

use crate::store::IngestStore;

/// Reports one status for the overall "" entry and every named service.
#[derive(Clone)]
pub(crate) struct Health {
    reporter: HealthReporter,
    services: &'static [&'static str],
    /// Set once shutdown begins; afterwards nothing turns the status back to SERVING.
    stopping: Arc<Mutex<bool>>,
}

impl Health {
    pub(crate) fn new(reporter: HealthReporter, services: &'static [&'static str]) -> Self {
        Self {
            reporter,
            services,
            stopping: Arc::new(Mutex::new(false)),
        }
    }

    async fn set(&self, status: ServingStatus) {
        for name in std::iter::once("").chain(self.services.iter().copied()) {
            self.reporter.set_service_status(name, status).await;
        }
    }

    /// The store's state as last probed (ignored once shutdown began).
    pub(crate) async fn store_ok(&self, ok: bool) {
        let stopping = self.stopping.lock().await;
        if !*stopping {
            self.set(if ok {
                ServingStatus::Serving
            } else {
                ServingStatus::NotServing
            })
            .await;
        }
    }

    /// NOT_SERVING for good.
    pub(crate) async fn begin_shutdown(&self) {
        let mut stopping = self.stopping.lock().await;
        *stopping = true;
        self.set(ServingStatus::NotServing).await;
    }
}

/// Probes the store every `interval` until `shutdown`, reporting changes.
pub(crate) async fn watch_store<S: IngestStore>(
    store: Arc<S>,
    health: Health,
    interval: Duration,
    shutdown: CancellationToken,
) {
    let mut ok = true;
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        let now_ok = match tokio::time::timeout(interval, store.ping()).await {
            Ok(Ok(())) => true,
            Ok(Err(e)) => {
                if ok {
                    tracing::error!(error = %e, "store unreachable: health NOT_SERVING");
                }
                false
            }
            Err(_) => {
                if ok {
                    tracing::error!("store did not answer a probe in time: health NOT_SERVING");
                }
                false
            }
        };
        if now_ok != ok {
            if now_ok {
                tracing::info!("store reachable again: health SERVING");
            }
            health.store_ok(now_ok).await;
            ok = now_ok;
        }
    }
}

#[cfg(test)]
mod tests {
    use tokio_stream::wrappers::TcpListenerStream;
    use tonic_health::pb::HealthCheckRequest;
    use tonic_health::pb::health_check_response::ServingStatus as Answer;
    use tonic_health::pb::health_client::HealthClient;

    use super::*;

    async fn answer(client: &mut HealthClient<tonic::transport::Channel>, name: &str) -> Answer {
        client
            .check(HealthCheckRequest {
                service: name.into(),
            })
            .await
            .unwrap()
            .into_inner()
            .status()
    }

    #[tokio::test]
    async fn follows_the_store_until_shutdown_then_stays_not_serving() {
        let (reporter, service) = tonic_health::server::health_reporter();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let stop = CancellationToken::new();
        let server = tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming_shutdown(
                    TcpListenerStream::new(listener),
                    stop.clone().cancelled_owned(),
                ),
        );
        let channel = tonic::transport::Channel::from_shared(format!("http://{addr}"))
            .unwrap()
            .connect()
            .await
            .unwrap();
        let mut client = HealthClient::new(channel);
        let health = Health::new(reporter, &["outbox.v1.NotificationIngest"]);

        health.store_ok(true).await;
        assert_eq!(answer(&mut client, "").await, Answer::Serving);
        health.store_ok(false).await;
        assert_eq!(answer(&mut client, "").await, Answer::NotServing);
        assert_eq!(
            answer(&mut client, "outbox.v1.NotificationIngest").await,
            Answer::NotServing
        );
        health.store_ok(true).await;
        assert_eq!(answer(&mut client, "").await, Answer::Serving);
        health.begin_shutdown().await;
        health.store_ok(true).await;
        assert_eq!(answer(&mut client, "").await, Answer::NotServing);

        stop.cancel();
        server.await.unwrap().unwrap();
    }
}
