//! The `site-forwarder` binary: `serve` runs the service; `send`, `clear`, `acknowledge`,
//! `status`, `stats` and `promote` are small clients of a running one. Only parsing, tracing set-up and signal
//! handling live here.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Args, Parser, Subcommand};
use site_forwarder::cli::{self, DEFAULT_ADDR, SendArgs, TypeArg};
use site_forwarder::config::{Config, LogConfig, LogFormat, Overrides};
use site_forwarder::domain::Priority;
use tokio_util::sync::CancellationToken;

#[derive(Debug, Parser)]
#[command(
    name = "site-forwarder",
    version,
    about = "Site store-and-forward notification buffer"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the forwarder: local SiteNotify API, durable buffer, stream to central.
    Serve(ServeArgs),
    /// Send one notification through a running forwarder; prints its id.
    Send(SendCommand),
    /// End this site's notifications of a condition that are not delivered yet (ClearCondition);
    /// prints how many were still in the buffer. Central clears the ones it already has.
    Clear(ClearCommand),
    /// Acknowledge the escalating incidents of a condition at central (SiteNotify.Acknowledge),
    /// as an HMI's acknowledge button would; prints how many acknowledgements of this site are
    /// still to reach central.
    Acknowledge(AcknowledgeCommand),
    /// Show where a notification is.
    Status {
        /// The notification id returned by `send`.
        id: String,
        #[arg(long, default_value = DEFAULT_ADDR)]
        addr: String,
    },
    /// Show the buffer's depth, the link to central and the node's place in its pair.
    Stats {
        #[arg(long, default_value = DEFAULT_ADDR)]
        addr: String,
    },
    /// Make this node the active one of its pair now (failover by hand); the old active, if it
    /// is alive, steps down to standby when it sees the higher term.
    Promote {
        #[arg(long, default_value = DEFAULT_ADDR)]
        addr: String,
    },
}

#[derive(Debug, Args)]
struct ServeArgs {
    /// TOML configuration file (see deploy/site-forwarder.toml).
    #[arg(long)]
    config: Option<PathBuf>,
    /// Overrides `listen_addr`.
    #[arg(long)]
    listen: Option<SocketAddr>,
    /// Overrides `site_id`.
    #[arg(long)]
    site_id: Option<String>,
    /// Overrides `buffer_path`.
    #[arg(long)]
    buffer: Option<PathBuf>,
    /// Overrides `central_url`.
    #[arg(long)]
    central: Option<String>,
}

#[derive(Debug, Args)]
struct SendCommand {
    #[arg(long)]
    list: String,
    #[arg(long)]
    subject: String,
    #[arg(long)]
    body: String,
    #[arg(long = "type", value_enum, default_value_t = TypeArg::Email)]
    kind: TypeArg,
    /// Channel-specific JSON object.
    #[arg(long, default_value = "")]
    type_data: String,
    /// Name of the sending script (`source_script`).
    #[arg(long, default_value = "")]
    script: String,
    /// Sending instance (`source_instance_id`).
    #[arg(long, default_value = "")]
    instance: String,
    /// How urgent it is; central delivers higher priorities first.
    #[arg(
        long,
        value_parser = cli::priority_arg(),
        ignore_case = true,
        default_value_t = Priority::Normal
    )]
    priority: Priority,
    /// The condition it is about (e.g. tank4.level.high): a newer notification with the same
    /// key and list supersedes it, and `clear --key` ends it.
    #[arg(long, default_value = "")]
    condition_key: String,
    /// Scheduled delivery: not before this instant (RFC 3339, e.g. 2026-05-01T06:00:00Z), at
    /// most 30 days ahead. Central keeps it Pending until then.
    #[arg(long)]
    deliver_after: Option<chrono::DateTime<chrono::Utc>>,
    /// The forwarder's address; for a pair, both nodes' (repeat the flag or separate with
    /// commas): the first that accepts the Send gets it.
    #[arg(long, default_value = DEFAULT_ADDR, value_delimiter = ',')]
    addr: Vec<String>,
}

#[derive(Debug, Args)]
struct ClearCommand {
    /// The condition key to clear.
    #[arg(long)]
    key: String,
    /// The forwarder's address; for a pair, both nodes' (repeat the flag or separate with
    /// commas): the first that accepts the clear gets it.
    #[arg(long, default_value = DEFAULT_ADDR, value_delimiter = ',')]
    addr: Vec<String>,
}

#[derive(Debug, Args)]
struct AcknowledgeCommand {
    /// The condition key whose incidents to acknowledge.
    #[arg(long)]
    key: String,
    /// Who acknowledges (recorded at central as `site <id>: <actor>`).
    #[arg(long, default_value = "")]
    actor: String,
    /// The forwarder's address; for a pair, both nodes' (as for `clear`).
    #[arg(long, default_value = DEFAULT_ADDR, value_delimiter = ',')]
    addr: Vec<String>,
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    let outcome = match cli.command {
        Command::Serve(args) => serve(args).await,
        Command::Send(args) => send(args).await,
        Command::Clear(args) => cli::clear(&args.addr, args.key)
            .await
            .map(|cleared| println!("{cleared}"))
            .map_err(Into::into),
        Command::Acknowledge(args) => cli::acknowledge(&args.addr, args.key, args.actor)
            .await
            .map(|pending| println!("{pending}"))
            .map_err(Into::into),
        Command::Status { id, addr } => cli::status(&addr, id)
            .await
            .map(|view| print!("{}", cli::format_status(&view)))
            .map_err(Into::into),
        Command::Stats { addr } => cli::stats(&addr)
            .await
            .map(|stats| print!("{}", cli::format_stats(&stats)))
            .map_err(Into::into),
        Command::Promote { addr } => cli::promote(&addr)
            .await
            .map(|view| print!("{}", cli::format_role(&view)))
            .map_err(Into::into),
    };
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("site-forwarder: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn serve(args: ServeArgs) -> anyhow::Result<()> {
    let overrides = Overrides {
        site_id: args.site_id,
        listen_addr: args.listen,
        buffer_path: args.buffer,
        central_url: args.central,
    };
    let config = Config::load(args.config.as_deref(), overrides)?;
    init_tracing(&config.log)?;
    let listener = tokio::net::TcpListener::bind(config.listen_addr)
        .await
        .with_context(|| format!("listen_addr: cannot listen on {}", config.listen_addr))?;
    let addr = listener.local_addr()?;
    // On stdout so a supervisor or test that asked for port 0 can read the real address; logs go
    // to stderr.
    println!("site-forwarder listening on {addr}");

    let shutdown = CancellationToken::new();
    let on_signal = shutdown.clone();
    tokio::spawn(async move {
        match stop_signal().await {
            Ok(signal) => tracing::info!(signal, "stop requested"),
            Err(e) => tracing::error!(error = %e, "cannot watch for stop signals; stopping"),
        }
        on_signal.cancel();
    });
    site_forwarder::run(config, listener, shutdown).await?;
    Ok(())
}

async fn send(args: SendCommand) -> anyhow::Result<()> {
    let request = SendArgs {
        list: args.list,
        subject: args.subject,
        body: args.body,
        kind: args.kind,
        type_data: args.type_data,
        script: args.script,
        instance: args.instance,
        execution_id: None,
        parent_execution_id: None,
        priority: args.priority,
        condition_key: args.condition_key,
        deliver_after: args.deliver_after,
    };
    let id = cli::send(&args.addr, request).await?;
    println!("{id}");
    Ok(())
}

fn init_tracing(log: &LogConfig) -> anyhow::Result<()> {
    let filter = tracing_subscriber::EnvFilter::try_new(&log.filter)
        .map_err(|e| anyhow::anyhow!("log.filter: {e}"))?;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr);
    match log.format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    }
    .map_err(|e| anyhow::anyhow!("cannot set up logging: {e}"))
}

/// Resolves on SIGTERM or SIGINT with the signal's name.
async fn stop_signal() -> std::io::Result<&'static str> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let mut term = signal(SignalKind::terminate())?;
        let mut int = signal(SignalKind::interrupt())?;
        tokio::select! {
            _ = term.recv() => Ok("SIGTERM"),
            _ = int.recv() => Ok("SIGINT"),
        }
    }
    #[cfg(not(unix))]
    {
        tokio::signal::ctrl_c().await?;
        Ok("ctrl-c")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    fn send(extra: &[&str]) -> Result<SendCommand, clap::Error> {
        let mut argv = vec![
            "site-forwarder",
            "send",
            "--list",
            "ops",
            "--subject",
            "s",
            "--body",
            "b",
        ];
        argv.extend_from_slice(extra);
        match Cli::try_parse_from(argv)?.command {
            Command::Send(args) => Ok(args),
            other => panic!("not send: {other:?}"),
        }
    }

    #[test]
    fn the_command_line_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn send_priority_defaults_to_normal_and_takes_each_name() {
        assert_eq!(send(&[]).unwrap().priority, Priority::Normal);
        for priority in Priority::ALL {
            let args = send(&["--priority", priority.as_str()]).unwrap();
            assert_eq!(args.priority, priority);
            let upper = priority.as_str().to_ascii_uppercase();
            assert_eq!(send(&["--priority", &upper]).unwrap().priority, priority);
        }
    }

    #[test]
    fn send_takes_a_condition_key_and_clear_requires_one() {
        assert_eq!(send(&[]).unwrap().condition_key, "");
        let args = send(&["--condition-key", "tank4.level.high"]).unwrap();
        assert_eq!(args.condition_key, "tank4.level.high");
        assert_eq!(send(&[]).unwrap().deliver_after, None);
        let args = send(&["--deliver-after", "2026-05-01T06:00:00Z"]).unwrap();
        assert_eq!(
            args.deliver_after,
            chrono::DateTime::from_timestamp(1_777_615_200, 0)
        );
        assert!(send(&["--deliver-after", "tomorrow"]).is_err());

        let clear = |argv: &[&str]| {
            let mut all = vec!["site-forwarder", "clear"];
            all.extend_from_slice(argv);
            Cli::try_parse_from(all).map(|cli| cli.command)
        };
        let Ok(Command::Clear(args)) = clear(&["--key", "k1", "--addr", "http://a,http://b"])
        else {
            panic!("clear parses");
        };
        assert_eq!(args.key, "k1");
        assert_eq!(args.addr, vec!["http://a", "http://b"]);
        let err = clear(&[]).unwrap_err().to_string();
        assert!(err.contains("--key"), "{err}");
    }

    #[test]
    fn an_unknown_priority_is_refused_naming_the_flag_and_the_names() {
        let err = send(&["--priority", "urgent"]).unwrap_err().to_string();
        assert!(
            err.contains("'urgent'") && err.contains("--priority"),
            "{err}"
        );
        assert!(err.contains("critical, high, normal, low"), "{err}");
    }
}
