//! `outboxctl`: the operator's command line for central's `NotificationOutbox` admin API.
//!
//! Every command is one or a few gRPC calls; the modules split the work the same way each time:
//! `args` parses, `filter` builds the selection, `upsert` builds list and SMTP settings (with
//! `secret` reading their secrets from stdin or the environment), `connect` opens the channel
//! (TLS, the bearer token and the actor header), `commands` makes the calls, `render` prints tables or JSON, `error`
//! turns any failure into one stderr line and an exit status (2 usage, 1 anything else).
//! Nothing here panics on input, a dead server or a closed pipe.

mod args;
mod commands;
mod connect;
mod error;
mod filter;
mod render;
mod secret;
mod upsert;

use std::io::Write;
use std::process::ExitCode;

use clap::Parser;
use clap::error::ErrorKind;

use crate::args::Cli;
use crate::commands::Session;
use crate::error::{CliError, Result};

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => return clap_exit(&e),
    };
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("outboxctl: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}

fn run(cli: Cli) -> Result<()> {
    let access = connect::Access {
        ca: cli.ca.clone(),
        cert: cli.cert.clone(),
        key: cli.key.clone(),
        token_file: cli.token_file.clone(),
        token: std::env::var("OUTBOX_TOKEN").ok(),
    };
    let addr = connect::normalise_addr(&cli.addr, access.ca.is_some() || access.cert.is_some());
    let actor = connect::actor_header(cli.actor.as_deref())?;
    commands::check(&cli.command)?;
    // One command, a handful of sequential calls: a single-threaded runtime is all it needs.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|source| CliError::Io {
            what: "starting the async runtime",
            source,
        })?;
    let report = runtime.block_on(async {
        let client = connect::connect(&addr, cli.timeout, actor, &access).await?;
        let mut session = Session {
            client,
            addr: addr.clone(),
        };
        session.run(cli.command).await
    })?;
    let text = if cli.json {
        let mut text =
            serde_json::to_string_pretty(&render::json::render(&report)).map_err(|e| {
                CliError::Io {
                    what: "encoding JSON",
                    source: e.into(),
                }
            })?;
        text.push('\n');
        text
    } else {
        render::human::render(&report, chrono::Utc::now())
    };
    print(&text)
}

/// Writes the output; a reader that went away (`outboxctl list | head`) is not an error.
fn print(text: &str) -> Result<()> {
    let mut stdout = std::io::stdout().lock();
    match stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
    {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(CliError::Io {
            what: "writing output",
            source: e,
        }),
        _ => Ok(()),
    }
}

/// Help and version go to stdout as clap prints them; a usage error becomes the same single
/// `outboxctl: ...` line as every other error, exit status 2.
fn clap_exit(e: &clap::Error) -> ExitCode {
    match e.kind() {
        ErrorKind::DisplayHelp
        | ErrorKind::DisplayVersion
        | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
            let _ = e.print();
            ExitCode::from(u8::try_from(e.exit_code()).unwrap_or(2))
        }
        _ => {
            eprintln!("outboxctl: {}", usage_line(&e.to_string()));
            ExitCode::from(2)
        }
    }
}

/// clap's message is several lines: the error, a blank line, usage and a hint. Keep the error
/// part, joined into one line.
fn usage_line(rendered: &str) -> String {
    let first_paragraph: Vec<&str> = rendered
        .lines()
        .take_while(|line| !line.trim().is_empty())
        .map(str::trim)
        .collect();
    let text = first_paragraph.join(" ");
    let text = text.strip_prefix("error: ").unwrap_or(&text);
    format!("{} (see --help)", error::one_line(text))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clap_errors_become_one_line() {
        let err = Cli::try_parse_from(["outboxctl", "list", "--status", "bogus"]).unwrap_err();
        let line = usage_line(&err.to_string());
        assert!(!line.contains('\n'));
        assert!(
            line.starts_with("invalid value 'bogus' for '--status"),
            "{line}"
        );
        assert!(line.contains("expected one of pending"), "{line}");

        let err = Cli::try_parse_from(["outboxctl", "show"]).unwrap_err();
        let line = usage_line(&err.to_string());
        assert!(line.contains("<ID>"), "{line}");
        assert!(!line.contains('\n'));
    }
}
