//! The `central-outbox` binary: reads configuration, sets up logging and runs the service until
//! SIGTERM or Ctrl-C.

use std::path::PathBuf;

use anyhow::Context;
use central_outbox::config::{ApplyChannels, Config, Overrides};
use clap::Parser;
use tokio_util::sync::CancellationToken;

#[derive(Debug, Parser)]
#[command(
    version,
    about = "Central notification outbox: ingest, store and deliver notifications"
)]
struct Args {
    /// TOML configuration file (see deploy/central-outbox.toml).
    #[arg(long, short)]
    config: Option<PathBuf>,
    /// gRPC listen address, e.g. 0.0.0.0:50051.
    #[arg(long)]
    listen: Option<std::net::SocketAddr>,
    /// Store URL, e.g. sqlite://var/central.db.
    #[arg(long)]
    database: Option<String>,
    /// Write the config file's [smtp], [webhook] and [[lists]] over what the database holds
    /// (what operators set through the admin API), then serve as usual. Without it the
    /// database wins and the file only seeds what is missing. For one start, on purpose.
    #[arg(long)]
    apply_config: bool,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let config = Config::load(
        args.config.as_deref(),
        Overrides {
            listen_addr: args.listen,
            database: args.database,
        },
    )?;
    central_outbox::telemetry::init(&config.log)?;
    let mut settings = config.validate()?;
    if args.apply_config {
        settings.apply_channels = ApplyChannels::ReplaceStored;
    }
    let listener = tokio::net::TcpListener::bind(settings.listen_addr)
        .await
        .with_context(|| format!("listen_addr: cannot listen on {}", settings.listen_addr))?;
    let shutdown = CancellationToken::new();
    tokio::spawn(cancel_on_signal(shutdown.clone()));
    central_outbox::run(settings, listener, shutdown).await?;
    Ok(())
}

async fn cancel_on_signal(shutdown: CancellationToken) {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(term) => term,
                Err(e) => {
                    tracing::error!(error = %e, "cannot listen for SIGTERM");
                    let _ = ctrl_c.await;
                    shutdown.cancel();
                    return;
                }
            };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
    shutdown.cancel();
}
