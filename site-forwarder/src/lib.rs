//! The site-forwarder: a site script's `Send` is committed to a local SQLite buffer and answered
//! with an id; a forwarder task streams the buffer to central and deletes each row only after
//! central acked it. Central may be away for days: the buffer grows and drains when it returns.
//!
//! [`run`] is the whole service, so tests start it in-process on port 0 (the crate's own tests
//! with `run_with`, on pair and metrics listeners they bound themselves); `main.rs` only parses the command line,
//! sets up tracing and calls it (or the client commands in [`cli`]).
//!
//! Layout: [`domain`] (plain types, no transport or storage), `wire` (the domain types as the
//! protocol carries them, for every part that talks to central or the peer), `buffer` (the
//! SQLite buffer, one handle per capability), `forwarder` (the stream to central), `clears`
//! (the central half of `ClearCondition`), `health_report` (this node's health, reported to
//! central every few seconds), `link` and `central_status` (the outgoing links to central and
//! the peer), `pair` (an active/standby pair: roles, replication, failover), `grpc` (the
//! services this node serves, their conversions, and the one mapping of its errors to gRPC
//! statuses), `metrics` (Prometheus, served on `metrics_listen` when set), [`tls`] (TLS to
//! central and between the pair, the plaintext rule for the local port), [`config`]. Lower
//! layers never import `grpc`.

// The public surface, each for what outside code uses: `main.rs` (`cli`, `config`, `domain`,
// `run`) and the `outbox-tests` crate's e2e tests (site configs with `config` and `tls`, the
// pair's `domain::Role`, the client commands in `cli`, the reported [`VERSION`]). Everything
// else is crate-only.
pub mod cli;
pub mod config;
pub mod domain;
pub mod tls;

mod acks;
mod buffer;
mod central_half;
mod central_status;
mod clears;
mod forwarder;
mod grpc;
mod health_report;
mod link;
mod metrics;
mod pair;
mod statuses;
mod wire;

/// The version this node reports to central in its health reports.
pub use health_report::VERSION;

#[cfg(test)]
mod service_tests;

use std::sync::Arc;

use outbox_proto::limits::MAX_GRPC_MESSAGE_BYTES;
use outbox_proto::v1::site_notify_server::SiteNotifyServer;
use task_supervisor::{NodeFailure, Supervisor};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tonic::transport::Server;
use tonic::transport::server::TcpIncoming;
use tonic_health::ServingStatus;

use crate::buffer::{Buffer, BufferError, RoomKeeper};
use crate::central_status::CentralStatus;
use crate::config::Config;
use crate::domain::SiteId;
use crate::forwarder::ForwardState;
use crate::grpc::site_notify::{ServiceBuffer, SiteNotifyService};
use crate::grpc::site_pair::{PairBuffer, PairEndpoint};
use crate::metrics::SiteMetrics;
use crate::pair::Pair;
use crate::pair::node::{self, Node};

/// Why the service could not start or stopped abnormally.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("invalid configuration: {0}")]
    Config(String),
    #[error("cannot open the buffer at {path}: {source}")]
    Buffer {
        path: std::path::PathBuf,
        source: BufferError,
    },
    #[error("cannot start: {0}")]
    Startup(String),
    #[error("pair.listen: cannot listen on {addr}: {source}")]
    PairListen {
        addr: std::net::SocketAddr,
        source: std::io::Error,
    },
    #[error("metrics_listen: cannot listen on {addr}: {source}")]
    MetricsListen {
        addr: std::net::SocketAddr,
        source: std::io::Error,
    },
    #[error("server reflection: {0}")]
    Reflection(#[from] tonic_reflection::server::Error),
    #[error("gRPC server failed: {0}")]
    Serve(#[from] tonic::transport::Error),
    /// A supervised task kept failing (`task_supervisor`): the node took itself out of service.
    #[error(
        "the {0} task kept failing; this node stopped so that its pair's standby (or a restart) takes over"
    )]
    TaskFailed(&'static str),
}

/// A link's endpoint cannot be built: its setting (named in the message) is wrong.
impl From<link::LinkError> for RunError {
    fn from(e: link::LinkError) -> Self {
        Self::Config(e.to_string())
    }
}

/// The pair endpoint cannot be set up: its setting (named in the message) is wrong.
impl From<grpc::site_pair::EndpointError> for RunError {
    fn from(e: grpc::site_pair::EndpointError) -> Self {
        Self::Config(e.to_string())
    }
}

/// Listeners the caller already bound for the addresses the configuration names, used instead
/// of binding them at start-up. Whoever binds first owns the port: a caller that picks a free
/// port and hands its address over instead can lose it to any other socket in between (tests
/// that run side by side do).
#[derive(Debug, Default)]
pub(crate) struct Listeners {
    /// Bound to `pair.listen`.
    pub pair: Option<TcpListener>,
    /// Bound to `metrics_listen`.
    pub metrics: Option<TcpListener>,
}

impl Listeners {
    /// The listener for `addr` (a configured address, `key` in errors): the one given, which
    /// must be bound to it, else a new one bound there.
    async fn take(
        given: Option<TcpListener>,
        key: &str,
        addr: Option<std::net::SocketAddr>,
    ) -> Result<Option<TcpListener>, BindError> {
        match (given, addr) {
            (None, None) => Ok(None),
            (None, Some(addr)) => TcpListener::bind(addr)
                .await
                .map(Some)
                .map_err(|source| BindError::Io { addr, source }),
            (Some(_), None) => Err(BindError::Mismatch(format!(
                "{key}: not set, but a listener for it was given"
            ))),
            (Some(listener), Some(addr)) => match listener.local_addr() {
                Ok(bound) if bound == addr => Ok(Some(listener)),
                Ok(bound) => Err(BindError::Mismatch(format!(
                    "{key}: {addr}, but the listener given for it is bound to {bound}"
                ))),
                Err(e) => Err(BindError::Mismatch(format!(
                    "{key}: the listener given for it has no address: {e}"
                ))),
            },
        }
    }
}

/// Why [`Listeners::take`] has no listener.
enum BindError {
    Io {
        addr: std::net::SocketAddr,
        source: std::io::Error,
    },
    Mismatch(String),
}

/// Runs the site-forwarder on `listener` until `shutdown` is cancelled: opens the buffer, starts
/// the forwarder, serves `SiteNotify`, health and reflection. On shutdown health turns
/// NOT_SERVING, new connections stop, open ones get `shutdown_timeout` to finish, the forwarder
/// stops sending, and `Ok(())` is returned.
pub async fn run(
    config: Config,
    listener: TcpListener,
    shutdown: CancellationToken,
) -> Result<(), RunError> {
    run_with(config, listener, Listeners::default(), shutdown).await
}

/// [`run`], with the pair and metrics listeners already bound by the caller.
pub(crate) async fn run_with(
    config: Config,
    listener: TcpListener,
    listeners: Listeners,
    shutdown: CancellationToken,
) -> Result<(), RunError> {
    config
        .validate()
        .map_err(|e| RunError::Config(format!("{e:#}")))?;
    let site = SiteId::parse(config.site_id.clone())
        .map_err(|e| RunError::Config(format!("site_id: {}", e.problem)))?;
    tls_files::install_crypto_provider();
    // Checked on the address actually bound (not only on `listen_addr`): `run` takes any listener.
    if let Ok(addr) = listener.local_addr()
        && config
            .tls
            .plaintext_exposure(addr)
            .map_err(|e| RunError::Config(e.to_string()))?
    {
        tracing::warn!(
            %addr,
            "serving SiteNotify in PLAINTEXT on a non-loopback address (tls.allow_plaintext = \
             true): anyone on the network can send notifications as this site"
        );
    }
    let metrics_listener =
        Listeners::take(listeners.metrics, "metrics_listen", config.metrics_listen)
            .await
            .map_err(|e| match e {
                BindError::Io { addr, source } => RunError::MetricsListen { addr, source },
                BindError::Mismatch(problem) => RunError::Config(problem),
            })?;

    // Every long-lived task runs supervised; one that keeps failing fires `failure`, which
    // stops this node as a shutdown would and makes `run` return an error (task_supervisor).
    let metrics = Arc::new(SiteMetrics::new());
    let failure = NodeFailure::default();
    let faults = config
        .faults()
        .map_err(|e| RunError::Config(format!("{e:#}")))?;
    let supervisor = Supervisor::new(metrics.supervision(), failure.clone(), faults);
    let shutdown = failure.or_shutdown(&shutdown);

    let path = config.buffer_path.clone();
    let limits = config.space_limits();
    // A child token: a settle waiting to retry (full disk) gives up when the node stops.
    let stop_buffer = shutdown.child_token();
    let buffer_stop = stop_buffer.clone();
    let buffer = tokio::task::spawn_blocking(move || Buffer::open_with(&path, limits, buffer_stop))
        .await
        .map_err(|e| RunError::Startup(format!("opening the buffer panicked: {e}")))?
        .map_err(|source| RunError::Buffer {
            path: config.buffer_path.clone(),
            source,
        })?;

    if tls::plaintext_to_remote(&config.central_url) {
        tracing::warn!(
            central = %config.central_url,
            "forwarding to central in PLAINTEXT over the network; use an https:// central_url"
        );
    }
    let starting = node::starting_role(&buffer.roles(), &buffer.status(), &config)
        .await
        .map_err(|source| RunError::Buffer {
            path: config.buffer_path.clone(),
            source,
        })?;
    let pair = Arc::new(Pair::new(&config, starting));
    let state = Arc::new(ForwardState::default());
    // Built now, so a bad central_url or TLS file stops start-up, not the first forward (the
    // node task builds the forwarder from the same, already checked, settings).
    let endpoint = link::central_endpoint(&config)?;
    let central = CentralStatus::new(
        &endpoint,
        config.central_url.clone(),
        config.request_timeout,
    );
    let reporter = health_report::HealthReporter::new(
        central.channel(),
        site.clone(),
        buffer.status(),
        Arc::clone(&state),
        Arc::clone(&pair),
        config.health_report_interval,
        config.request_timeout,
    );
    let metrics_connections = metrics.metrics_listener();
    let scraper = Arc::clone(&metrics).scraper(buffer.status(), {
        let (state, pair) = (Arc::clone(&state), Arc::clone(&pair));
        move || (state.snapshot(), pair.status())
    });
    let service = SiteNotifyService::new(
        site.clone(),
        ServiceBuffer {
            intake: buffer.intake(),
            status: buffer.status(),
            statuses: buffer.statuses(),
        },
        state.clone(),
        central,
        metrics.clone(),
        Arc::clone(&pair),
        shutdown.clone(),
    );
    // A child token: shutdown ends the replication streams at once (the standby reconnects to
    // whichever node is active) and the pair endpoint with them.
    let stop_pair = shutdown.child_token();
    let pair_listener = Listeners::take(
        listeners.pair,
        "pair.listen",
        config.pair.as_ref().map(|pair| pair.listen),
    )
    .await
    .map_err(|e| match e {
        BindError::Io { addr, source } => RunError::PairListen { addr, source },
        BindError::Mismatch(problem) => RunError::Config(problem),
    })?;
    let pair_endpoint = match (&config.pair, pair_listener) {
        (Some(pair_config), Some(listener)) => Some(PairEndpoint::new(
            listener,
            &config,
            pair_config,
            site.clone(),
            PairBuffer {
                feed: buffer.replication(),
                adoption: buffer.adoption(),
            },
            Arc::clone(&pair),
            stop_pair.clone(),
        )?),
        _ => None,
    };
    let peer = pair_endpoint.as_ref().map(PairEndpoint::peer);
    let room_keeper = buffer.room_keeper();
    let node = Node::new(
        node::NodeBuffer {
            forwarding: buffer.forwarding(),
            clears: buffer.clears(),
            acks: buffer.acks(),
            statuses: buffer.statuses(),
            commits: buffer.commits(),
            roles: buffer.roles(),
            handover: buffer.handover(),
            replica: buffer.replica(),
        },
        config.clone(),
        Arc::clone(&pair),
        state,
        metrics,
        peer,
    );
    // Every task has the capabilities it uses; nothing else may reach the whole buffer.
    drop(buffer);

    let (health, health_service) = tonic_health::server::health_reporter();
    let reflection_v1 = reflection().build_v1()?;
    let reflection_v1alpha = reflection().build_v1alpha()?;
    // SiteNotify is SERVING while the buffer takes Sends; the server as a whole ("") stays
    // SERVING, since GetStatus and GetBufferStats still answer (see `follow_room`).
    let room_watch = room_keeper.watch();
    let room_now = room_watch.borrow().clone();
    set_send_health(&health, &room_now, &shutdown).await;
    let stop_room = shutdown.child_token();
    let room_task = supervisor.spawn("room", stop_room.clone(), {
        let (health, stop) = (health.clone(), stop_room.clone());
        move || {
            follow_room(
                room_keeper.clone(),
                room_watch.clone(),
                health.clone(),
                stop.clone(),
            )
        }
    });

    // A child token: stopping the node after a server failure must not cancel the caller's.
    let stop_forwarding = shutdown.child_token();
    let forwarding = supervisor.spawn("node", stop_forwarding.clone(), {
        let stop = stop_forwarding.clone();
        move || node.clone().run(stop.clone())
    });
    let reporting = supervisor.spawn("health_report", stop_forwarding.clone(), {
        let stop = stop_forwarding.clone();
        move || reporter.clone().run(stop.clone())
    });
    let pair_serving = pair_endpoint.map(PairEndpoint::serve);
    // Same reason for a child token; the endpoint lives exactly as long as the gRPC server.
    let stop_metrics = shutdown.child_token();
    let metrics_serving = metrics_listener.map(|listener| {
        let addr = listener.local_addr().ok();
        tracing::info!(addr = ?addr, "serving Prometheus metrics on /metrics");
        let serving = metrics_endpoint::serve(
            listener,
            scraper,
            metrics_endpoint::METRICS_LIMITS,
            metrics_connections,
            stop_metrics.clone(),
        );
        tokio::spawn(async move {
            if let Err(error) = serving.await {
                tracing::error!(%error, "the metrics endpoint failed; the service goes on");
            }
        })
    });

    let local_addr = listener.local_addr().ok();
    // Nagle would hold back small responses waiting for the client's delayed ACK.
    let incoming = TcpIncoming::from(listener).with_nodelay(Some(true));
    let stopping = {
        let shutdown = shutdown.clone();
        let health = health.clone();
        async move {
            shutdown.cancelled().await;
            health
                .set_not_serving::<SiteNotifyServer<SiteNotifyService>>()
                .await;
            health
                .set_service_status("", ServingStatus::NotServing)
                .await;
            tracing::info!("shutting down: no new connections, draining open requests");
        }
    };
    tracing::info!(
        addr = ?local_addr, site = %site, central = %config.central_url,
        role = pair.role_now().role.as_str(), "site-forwarder serving"
    );
    let serve = Server::builder()
        .add_service(health_service)
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha)
        .add_service(
            SiteNotifyServer::new(service).max_decoding_message_size(MAX_GRPC_MESSAGE_BYTES),
        )
        .serve_with_incoming_shutdown(incoming, stopping);

    // Graceful shutdown waits for open requests and streams; a client holding one open (a
    // health Watch, say) must not keep the process alive past the shutdown timeout.
    let grace = async {
        shutdown.cancelled().await;
        tokio::time::sleep(config.shutdown_timeout).await;
    };
    let served = tokio::select! {
        served = serve => served,
        () = grace => {
            tracing::warn!(timeout = ?config.shutdown_timeout, "connections still open at the shutdown timeout; closing them");
            Ok(())
        }
    };
    // The server may have failed on its own; the forwarder must stop either way. The metrics
    // endpoint stops too and bounds its own wait for open scrapes.
    stop_forwarding.cancel();
    stop_metrics.cancel();
    stop_pair.cancel();
    stop_buffer.cancel();
    stop_room.cancel();
    if let Err(e) = room_task.await {
        tracing::error!(error = %e, "the buffer's room check task failed");
    }
    if let Some(serving) = pair_serving {
        // Replication streams never end on their own; the grace bounds the wait.
        let _ = tokio::time::timeout(config.shutdown_timeout, serving).await;
    }
    if let Some(serving) = metrics_serving
        && let Err(e) = serving.await
    {
        tracing::error!(error = %e, "the metrics endpoint task failed");
    }
    if let Err(e) = reporting.await {
        tracing::error!(error = %e, "the health report task failed");
    }
    match tokio::time::timeout(config.shutdown_timeout, forwarding).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::error!(error = %e, "the forwarding task failed"),
        Err(_) => tracing::warn!("the forwarder did not stop within the shutdown timeout"),
    }
    served?;
    if let Some(task) = failure.task() {
        return Err(RunError::TaskFailed(task));
    }
    tracing::info!("site-forwarder stopped");
    Ok(())
}

/// Keeps the buffer's room check current and `outbox.v1.SiteNotify`'s health in step with it
/// until `stop`: NOT_SERVING while the buffer refuses Sends (a load balancer or an operator's
/// probe then sees that this node cannot take them; the reason is in `GetBufferStats`, the log
/// and the Send error), SERVING again once it takes them.
async fn follow_room(
    keeper: RoomKeeper,
    mut room: tokio::sync::watch::Receiver<buffer::RoomStatus>,
    health: tonic_health::server::HealthReporter,
    stop: CancellationToken,
) {
    let checks = keeper.keep_current(stop.clone());
    tokio::pin!(checks);
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            () = &mut checks => return,
            changed = room.changed() => {
                // The room lives as long as this task holds the keeper; never spin.
                if changed.is_err() {
                    return;
                }
                let status = room.borrow_and_update().clone();
                set_send_health(&health, &status, &stop).await;
            }
        }
    }
}

/// SiteNotify's health for `status`, unless the node is stopping (shutdown sets NOT_SERVING,
/// and a late SERVING must not undo it: checked after setting, too).
async fn set_send_health(
    health: &tonic_health::server::HealthReporter,
    status: &buffer::RoomStatus,
    stop: &CancellationToken,
) {
    if stop.is_cancelled() {
        return;
    }
    let serving = if status.refusing.is_none() {
        ServingStatus::Serving
    } else {
        ServingStatus::NotServing
    };
    health
        .set_service_status(SITE_NOTIFY_HEALTH_NAME, serving)
        .await;
    if stop.is_cancelled() {
        health
            .set_service_status(SITE_NOTIFY_HEALTH_NAME, ServingStatus::NotServing)
            .await;
    }
}

/// The name health reports SiteNotify under (its fully qualified gRPC service name), as
/// `set_serving::<SiteNotifyServer<_>>` names it.
const SITE_NOTIFY_HEALTH_NAME: &str =
    <SiteNotifyServer<SiteNotifyService> as tonic::server::NamedService>::NAME;

/// Reflection over the site's own API and the health service, so `grpcurl list` works.
fn reflection() -> tonic_reflection::server::Builder<'static> {
    outbox_proto::reflection(&["outbox.v1.SiteNotify"])
}
