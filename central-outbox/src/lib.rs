//! central-outbox: accepts notifications from sites over gRPC, stores each exactly once in the
//! `Notifications` table, and (on the node holding the dispatcher lease) delivers them by email
//! with retry, parking and a per-attempt audit trail.
//!
//! [`run`] is the whole service: tests start it in-process on a port-0 listener, `main` starts it
//! from the command line. Dependencies point inward: `grpc` and `store` know `domain`; `domain`
//! knows neither. The records passed to and from the store (`records`) know only `domain`, so
//! delivery and metrics handle them without knowing the store.

// The public surface, each for what outside code uses: `main.rs` (`config`, `telemetry`, `run`),
// the `outbox-tests` crate's e2e tests and bench (configs with `auth` and `tls`, the `store`
// backends and their `records`, `domain`, and the dispatcher's lease name the bench holds from a
// second replica), and central's store conformance suite in `tests/conformance` (`store`,
// `records`, `domain`, `testing`). Test doubles and the few internals a test drives directly are
// re-exported from [`testing`], compiled only with the `test-support` feature (which the test
// crates enable as a dev-dependency feature) or for this crate's unit tests; everything else is
// crate-only.
mod ack_link;
pub mod auth;
pub mod bootstrap;
pub mod config;
pub mod domain;
pub mod records;
pub mod store;
pub mod telemetry;
#[cfg(any(test, feature = "test-support"))]
pub mod testing;
pub mod tls;

mod config_cache;
mod console;
mod delivery;
mod dispatcher;
mod drain;
mod escalation_clock;
mod grpc;
mod health;
mod kpi_gauges;
mod metrics;
mod on_fallback;
mod purge;
mod secrets;
mod self_alerts;
pub mod status_callbacks;
mod status_feed;

use std::sync::Arc;

use outbox_proto::limits::MAX_GRPC_MESSAGE_BYTES;
use outbox_proto::v1::notification_ingest_server::NotificationIngestServer;
use outbox_proto::v1::notification_outbox_server::{NotificationOutbox, NotificationOutboxServer};
use tokio::net::TcpListener;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::config::{DatabaseUrl, Settings};
use crate::config_cache::ConfigCache;
use crate::delivery::Adapters;
use crate::dispatcher::Dispatcher;
use crate::domain::kpi::KpiSettings;
use crate::grpc::admin::OutboxService;
use crate::grpc::ingest::{IngestService, SiteIdentity};
use crate::health::Health;
use crate::metrics::Metrics;
use crate::status_feed::StatusFeed;
use crate::store::mssql::MsSqlStore;
use crate::store::sqlite::SqliteStore;
use crate::store::{AdminStore, ChannelSettingsStore, OutboxStore, StoreError};
use futures_util::future::BoxFuture;
use task_supervisor::{NodeFailure, Supervisor};

pub use dispatcher::DISPATCHER_LEASE;

/// Why the service stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("cannot open the store: {0}")]
    Store(#[from] StoreError),
    #[error("metrics_listen: cannot listen on {addr}: {source}")]
    MetricsListen {
        addr: std::net::SocketAddr,
        source: std::io::Error,
    },
    #[error("console.listen: cannot listen on {addr}: {source}")]
    ConsoleListen {
        addr: std::net::SocketAddr,
        source: std::io::Error,
    },
    #[error("acknowledgement.listen: cannot listen on {addr}: {source}")]
    AckListen {
        addr: std::net::SocketAddr,
        source: std::io::Error,
    },
    #[error("cannot set up delivery: {0}")]
    Delivery(String),
    #[error("cannot build server reflection: {0}")]
    Reflection(#[from] tonic_reflection::server::Error),
    #[error("gRPC server failed: {0}")]
    Serve(#[from] tonic::transport::Error),
    #[error("stored secrets: {0}")]
    Secrets(StoreError),
    #[error(transparent)]
    Tls(#[from] tls::TlsError),
    /// A supervised task kept failing (`supervisor`): the node took itself out of service.
    #[error(
        "the {0} task kept failing; this node stopped so that another replica (or a restart) takes over"
    )]
    TaskFailed(&'static str),
}

/// gRPC service names reported by the health service, besides the overall "" entry.
const SERVICE_NAMES: [&str; 2] = [
    "outbox.v1.NotificationIngest",
    "outbox.v1.NotificationOutbox",
];

/// Runs central until `shutdown` is cancelled: opens the store, seeds the configured channels
/// and lists where none are stored (or replaces them, see `bootstrap`), starts the dispatcher
/// and serves gRPC on `listener`.
pub async fn run(
    settings: Settings,
    listener: TcpListener,
    shutdown: CancellationToken,
) -> Result<(), RunError> {
    tls_files::install_crypto_provider();
    // Checked on the address actually bound (not only on `listen_addr`): `run` takes any listener.
    if let Ok(addr) = listener.local_addr()
        && settings.tls.plaintext_exposure(addr)?
    {
        tracing::warn!(
            %addr,
            "serving gRPC in PLAINTEXT on a non-loopback address (tls.allow_plaintext = true): \
             anyone on the network can read notifications and submit as any site"
        );
    }
    // Bound first, so a taken metrics port fails start-up before anything else happens.
    let metrics_listener = match settings.metrics_listen {
        Some(addr) => Some(
            TcpListener::bind(addr)
                .await
                .map_err(|source| RunError::MetricsListen { addr, source })?,
        ),
        None => None,
    };
    // Likewise the console's port.
    let console_listener = match &settings.console {
        Some(console) => Some(TcpListener::bind(console.listen).await.map_err(|source| {
            RunError::ConsoleListen {
                addr: console.listen,
                source,
            }
        })?),
        None => None,
    };
    // And the acknowledgement page's own, when it has one.
    let ack_listener = match settings.ack_links.as_ref().and_then(|a| a.listen) {
        Some(addr) => Some(
            TcpListener::bind(addr)
                .await
                .map_err(|source| RunError::AckListen { addr, source })?,
        ),
        None => None,
    };
    let listeners = Listeners {
        grpc: listener,
        metrics: metrics_listener,
        console: console_listener,
        ack: ack_listener,
    };
    // Before the store opens (which takes a while on a busy MS SQL server), so that the warning
    // about sites that are not verified is among the first lines of the log.
    let metrics = Metrics::new().with_failed_logins(settings.auth.failed_logins());
    SiteIdentity::for_tls(&settings.tls).announce(settings.tls.serves_tls(), &metrics);
    match &settings.database {
        DatabaseUrl::Sqlite(path) => {
            let store = SqliteStore::open(path, group_commit::Durability::Full)?
                .with_secrets(settings.secrets.clone());
            // Before anything is served: a secret sealed with a key not configured stops start-up.
            let resealed = store.reseal_secrets().await.map_err(RunError::Secrets)?;
            resealed.log(&settings.secrets);
            serve(Arc::new(store), settings, metrics, listeners, shutdown).await
        }
        DatabaseUrl::MsSql(options) => {
            let store = MsSqlStore::open(options.clone())
                .await?
                .with_secrets(settings.secrets.clone());
            let resealed = store.reseal_secrets().await.map_err(RunError::Secrets)?;
            resealed.log(&settings.secrets);
            let metrics = metrics.with_store_connections(store.connections_opened());
            serve(Arc::new(store), settings, metrics, listeners, shutdown).await
        }
    }
}

struct Listeners {
    grpc: TcpListener,
    metrics: Option<TcpListener>,
    console: Option<TcpListener>,
    /// `[acknowledgement] listen`.
    ack: Option<TcpListener>,
}

/// The KPI and site health figures, read at most once per [`kpi_gauges::REUSE`] however many
/// scrapes, `GetKpis` calls and console tabs ask (see [`kpi_gauges`]).
fn kpi_cache<S: AdminStore>(
    store: Arc<S>,
    metrics: Arc<Metrics>,
    kpis: KpiSettings,
    site_offline_after: std::time::Duration,
) -> Arc<kpi_gauges::KpiGauges> {
    let read: kpi_gauges::ReadKpis = Box::new(move || {
        let store = Arc::clone(&store);
        Box::pin(async move {
            let (figures, health) =
                tokio::join!(store.kpis(kpis.at(chrono::Utc::now())), store.site_health());
            Ok(kpi_gauges::Figures {
                kpis: figures?,
                sites: health?.assess(site_offline_after),
            })
        })
    });
    kpi_gauges::KpiGauges::new(read, metrics)
}

/// Serves `/metrics` until `shutdown`. The lease gauges are current; the KPI and site health
/// gauges are brought up to date at scrape time within the bounds of [`kpi_gauges`] (one query
/// at a time, figures reused for a second, a scrape waits two seconds at most).
fn spawn_metrics(
    listener: TcpListener,
    gauges: Arc<kpi_gauges::KpiGauges>,
    metrics: Arc<Metrics>,
    shutdown: CancellationToken,
) -> tokio::task::JoinHandle<()> {
    let connections = metrics.metrics_listener();
    let render = move || -> BoxFuture<'static, String> {
        let gauges = Arc::clone(&gauges);
        let metrics = Arc::clone(&metrics);
        Box::pin(async move {
            gauges.refresh().await;
            metrics.render()
        })
    };
    tracing::info!(addr = ?listener.local_addr().ok(), "serving /metrics");
    let limits = metrics_endpoint::METRICS_LIMITS;
    tokio::spawn(async move {
        if let Err(e) =
            metrics_endpoint::serve(listener, render, limits, connections, shutdown).await
        {
            tracing::error!(error = %e, "metrics endpoint failed");
        }
    })
}

/// Starts the self-alerts' watch (when they have a list) and heartbeat (when configured),
/// supervised, until `stop`; see `self_alerts`.
fn spawn_self_alerts<S: OutboxStore>(
    supervisor: &Supervisor,
    parts: self_alerts::WatchParts<S>,
    http: delivery::http::HttpClient,
    stop: CancellationToken,
) -> Vec<tokio::task::JoinHandle<()>> {
    let heartbeat = parts.settings.heartbeat.clone();
    let (store, metrics, lease) = (
        Arc::clone(&parts.store),
        Arc::clone(&parts.metrics),
        parts.lease.clone(),
    );
    let watch = self_alerts::SelfWatch::new(parts);
    let mut tasks = Vec::new();
    if let Some(settings) = heartbeat {
        let beat = self_alerts::heartbeat::Heartbeat {
            store,
            metrics,
            http,
            settings,
            lease,
            routable: watch.routable(),
        };
        tasks.push(supervisor.spawn("heartbeat", stop.clone(), {
            let stop = stop.clone();
            move || beat.clone().run(stop.clone())
        }));
    }
    if watch.has_routes() {
        tasks.push(supervisor.spawn("self_alerts", stop.clone(), {
            let stop = stop.clone();
            move || watch.clone().run(stop.clone())
        }));
    }
    tasks
}

async fn serve<S: OutboxStore>(
    store: Arc<S>,
    settings: Settings,
    metrics: Metrics,
    listeners: Listeners,
    shutdown: CancellationToken,
) -> Result<(), RunError> {
    let listener = listeners.grpc;
    let metrics = Arc::new(metrics);
    let site_identity = SiteIdentity::for_tls(&settings.tls);
    // The file seeds what the database lacks (or, with --apply-config, replaces it).
    bootstrap::apply(&*store, &settings).await?;

    // Every long-lived task runs supervised; one that keeps failing fires `failure`, which
    // stops this node as a shutdown would (see `supervisor`) and makes `run` return an error.
    let failure = NodeFailure::default();
    let supervisor = Supervisor::new(
        metrics.supervision(),
        failure.clone(),
        settings.faults.clone(),
    );
    // Everything below stops in the order `drain` sets out, from this token on.
    let mut drain =
        drain::DrainOrder::new(failure.or_shutdown(&shutdown), settings.shutdown_timeout);
    let shutdown = drain.shutdown.clone();

    let wake = Arc::new(Notify::new());
    let config = Arc::new(ConfigCache::new());
    // Validation made sure a key signs them (see `ack_link::AcknowledgementConfig`).
    let ack_links = settings
        .ack_links
        .as_ref()
        .and_then(|a| ack_link::AckLinks::new(a, &settings.secrets))
        .map(Arc::new);
    let adapters = Arc::new(
        Adapters::new()
            .map_err(RunError::Delivery)?
            .with_ack_links(ack_links.clone()),
    );
    let http = adapters.http();
    // The site status streams wake on what this node's dispatcher records, and on a poll.
    let outcomes_recorded = Arc::new(Notify::new());
    // So do the status callbacks.
    let callbacks_wake = Arc::new(Notify::new());
    let status_feed = Arc::new(StatusFeed::default());
    let dispatcher = Dispatcher::new(
        Arc::clone(&store),
        Arc::clone(&metrics),
        adapters,
        Arc::clone(&config),
        settings.dispatcher.clone(),
        Arc::clone(&wake),
    )
    .with_supervisor(supervisor.clone())
    .with_outcomes_recorded(vec![
        Arc::clone(&outcomes_recorded),
        Arc::clone(&callbacks_wake),
    ]);
    let dispatcher_stop = drain.dispatch.clone();
    let dispatcher_lease = dispatcher.lease_watch();
    let on_fallback = dispatcher.on_fallback();
    let purge_task = supervisor.spawn("purge", dispatcher_stop.clone(), {
        let (store, metrics) = (Arc::clone(&store), Arc::clone(&metrics));
        let (lease, stop, purge) = (
            dispatcher.lease_watch(),
            dispatcher_stop.clone(),
            settings.purge,
        );
        move || {
            purge::run(
                Arc::clone(&store),
                Arc::clone(&metrics),
                purge,
                lease.clone(),
                stop.clone(),
            )
        }
    });
    let escalation_task = supervisor.spawn("escalation", dispatcher_stop.clone(), {
        let (store, metrics, wake) = (Arc::clone(&store), Arc::clone(&metrics), Arc::clone(&wake));
        let (lease, stop) = (dispatcher.lease_watch(), dispatcher_stop.clone());
        move || {
            escalation_clock::run(
                Arc::clone(&store),
                Arc::clone(&metrics),
                lease.clone(),
                Arc::clone(&wake),
                stop.clone(),
            )
        }
    });
    let callbacks_task = supervisor.spawn("status_callbacks", dispatcher_stop.clone(), {
        let store = Arc::clone(&store);
        let caller = Arc::new(status_callbacks::Caller {
            http: http.clone(),
            settings: settings.status_callbacks.clone(),
            metrics: Arc::clone(&metrics),
        });
        let (lease, stop) = (dispatcher.lease_watch(), dispatcher_stop.clone());
        move || {
            status_callbacks::run(
                Arc::clone(&store),
                Arc::clone(&caller),
                lease.clone(),
                Arc::clone(&callbacks_wake),
                stop.clone(),
            )
        }
    });
    let dispatcher_task = supervisor.spawn_once(
        "dispatcher",
        dispatcher_stop.clone(),
        dispatcher.run(dispatcher_stop.clone()),
    );
    drain.stops_after_server("dispatcher", dispatcher_task);
    drain.stops_after_server("purge", purge_task);
    drain.stops_after_server("escalation", escalation_task);
    drain.stops_after_server("status_callbacks", callbacks_task);
    let kpi_cache = kpi_cache(
        Arc::clone(&store),
        Arc::clone(&metrics),
        settings.kpis,
        settings.site_offline_after,
    );
    let self_alert_tasks = settings.self_alerts.clone().map(|self_alerts| {
        spawn_self_alerts(
            &supervisor,
            self_alerts::WatchParts {
                store: Arc::clone(&store),
                metrics: Arc::clone(&metrics),
                kpis: Arc::clone(&kpi_cache),
                settings: self_alerts,
                site_offline_after: settings.site_offline_after,
                node_id: settings.dispatcher.node_id.clone(),
                lease: dispatcher_lease.clone(),
                certificates: settings.tls.watched_certificates(),
                wake: Arc::clone(&wake),
            },
            http.clone(),
            shutdown.clone(),
        )
    });
    let metrics_task = listeners.metrics.map(|listener| {
        spawn_metrics(
            listener,
            Arc::clone(&kpi_cache),
            Arc::clone(&metrics),
            shutdown.clone(),
        )
    });

    let (reporter, health_service) = tonic_health::server::health_reporter();
    let health = Health::new(reporter, &SERVICE_NAMES);
    health.store_ok(true).await;
    let health_task = supervisor.spawn("health", shutdown.clone(), {
        let (store, health, stop) = (Arc::clone(&store), health.clone(), shutdown.clone());
        let interval = settings.health_check_interval;
        move || health::watch_store(Arc::clone(&store), health.clone(), interval, stop.clone())
    });
    drain.stops_with_server("health", health_task);
    for task in self_alert_tasks.into_iter().flatten() {
        drain.stops_with_server("self-alert", task);
    }
    if let Some(task) = metrics_task {
        drain.stops_with_server("metrics", task);
    }
    let reflection_v1 = outbox_proto::reflection(&SERVICE_NAMES).build_v1()?;
    let reflection_v1alpha = outbox_proto::reflection(&SERVICE_NAMES).build_v1alpha()?;

    let ingest = IngestService::new(
        Arc::clone(&store),
        Arc::clone(&metrics),
        Arc::clone(&wake),
        drain.streams.clone(),
    )
    .with_site_identity(site_identity)
    .with_stream_limit(settings.server.max_ingest_streams)
    .with_status_feed(Arc::clone(&status_feed));
    let status_feed_task = supervisor.spawn("status_feed", shutdown.clone(), {
        let (feed, store, metrics) = (status_feed, Arc::clone(&store), Arc::clone(&metrics));
        let (recorded, stop) = (outcomes_recorded, shutdown.clone());
        move || {
            Arc::clone(&feed).run(
                Arc::clone(&store),
                Arc::clone(&metrics),
                Arc::clone(&recorded),
                stop.clone(),
            )
        }
    });
    drain.stops_with_server("status_feed", status_feed_task);
    // One instance for the gRPC port and the console: the console calls it in-process.
    let outbox = Arc::new(
        OutboxService::new(
            Arc::clone(&store),
            settings.kpis,
            Arc::clone(&wake),
            config,
            settings.auth.clone(),
        )
        .with_site_offline_after(settings.site_offline_after)
        .with_status_callback_key(settings.status_callbacks.key.is_some())
        .with_kpi_cache(kpi_cache)
        .with_failover_board(on_fallback),
    );
    let ack_page = ack_links.map(|links| {
        let desk: Arc<dyn console::ack_page::IncidentDesk> = Arc::clone(&store) as _;
        Arc::new(console::ack_page::AckPage::new(
            links,
            desk,
            settings.auth.clone(),
        ))
    });
    // Served on its own listener when it has one, else with the console.
    let (own_ack_listener, console_ack_page) = match listeners.ack {
        Some(listener) => (ack_page.map(|page| (listener, page)), None),
        None => (None, ack_page),
    };
    if let (Some(listener), Some(console)) = (listeners.console, &settings.console) {
        let shared: Arc<dyn NotificationOutbox> = Arc::clone(&outbox) as _;
        // With [tls] the console is served over TLS too, with secure cookies.
        let tls = settings.tls.console_config()?;
        let console = console::Console::new(shared, settings.auth.clone(), console, tls.is_some())
            .with_site_identity(site_identity)
            .with_ack_page(console_ack_page);
        let stop = shutdown.clone();
        let connections = metrics.console_listener();
        drain.http(
            "console",
            tokio::spawn(async move {
                if let Err(e) = console::serve(listener, console, tls, connections, stop).await {
                    tracing::error!(error = %e, "web console failed");
                }
            }),
        );
    }
    if let Some((listener, page)) = own_ack_listener {
        let tls = settings.tls.console_config()?;
        let stop = shutdown.clone();
        let connections = metrics.ack_listener();
        drain.http(
            "acknowledgement page",
            tokio::spawn(async move {
                if let Err(e) =
                    console::serve_ack_page(listener, page, tls, connections, stop).await
                {
                    tracing::error!(error = %e, "acknowledgement page failed");
                }
            }),
        );
    }
    let local_addr = listener.local_addr().ok();
    tracing::info!(
        addr = ?local_addr,
        tls = settings.tls.serves_tls(),
        client_certificates = settings.tls.requires_client_certificates(),
        "central-outbox serving"
    );

    let server = settings
        .tls
        .server_builder()?
        // Pings, so a site's stream over a link gone silent ends instead of lingering.
        .http2_keepalive_interval(Some(settings.server.http2_keepalive_interval))
        .http2_keepalive_timeout(Some(settings.server.http2_keepalive_timeout))
        // What one connection can make central hold (see ServerConfig); submit streams across
        // all connections are bounded by the ingest service (server.max_ingest_streams).
        .max_concurrent_streams(settings.server.max_concurrent_streams)
        .concurrency_limit_per_connection(settings.server.concurrency_limit_per_connection)
        .initial_stream_window_size(grpc::HTTP2_STREAM_WINDOW_BYTES)
        .initial_connection_window_size(grpc::HTTP2_CONNECTION_WINDOW_BYTES)
        .add_service(health_service)
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha)
        .add_service(
            NotificationIngestServer::new(ingest).max_decoding_message_size(MAX_GRPC_MESSAGE_BYTES),
        )
        .add_service(
            NotificationOutboxServer::from_arc(outbox)
                .max_decoding_message_size(MAX_GRPC_MESSAGE_BYTES),
        )
        .serve_with_incoming_shutdown(grpc::incoming(listener), drain.server_shutdown(health));
    let served = drain.serve(server).await;
    served?;
    if let Some(task) = failure.task() {
        return Err(RunError::TaskFailed(task));
    }
    tracing::info!("central-outbox stopped");
    Ok(())
}
