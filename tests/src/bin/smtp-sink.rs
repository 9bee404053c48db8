//! `smtp-sink`: the test SMTP server as a standalone process, for `make demo`.
//!
//! Accepts every message on the given address and prints one block per message
//! to stdout (flushed, so a pipe or log sees it at once) until SIGTERM or Ctrl-C,
//! then exits 0. Messages are printed in arrival order, each exactly once. With
//! `--auth-user` and `--auth-password` it requires AUTH PLAIN or LOGIN with those
//! credentials, to try a relay configuration with a username and password.

use std::io::Write;
use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use outbox_tests::smtp_sink::{AuthRequirement, ReceivedMail, SinkOptions, SmtpSink};
use tokio::net::TcpListener;

/// Waiting for the next message is chunked only so the wait never has to be
/// unbounded; the shutdown signal interrupts it at any moment.
const WAIT_CHUNK: Duration = Duration::from_secs(3600);

#[derive(Parser, Debug)]
#[command(
    name = "smtp-sink",
    about = "Plain SMTP server that accepts every message and prints it to stdout"
)]
struct Args {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:2525")]
    listen: SocketAddr,
    /// Require AUTH PLAIN/LOGIN as this user (needs --auth-password).
    #[arg(long, requires = "auth_password")]
    auth_user: Option<String>,
    /// The password --auth-user must give.
    #[arg(
        long,
        env = "SMTP_SINK_AUTH_PASSWORD",
        hide_env_values = true,
        requires = "auth_user"
    )]
    auth_password: Option<String>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    // Signal handlers go in before anything is announced, so a SIGTERM sent right
    // after the "listening" line is never lost.
    let shutdown = shutdown_signal().context("installing signal handlers")?;
    tokio::pin!(shutdown);

    let listener = TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("binding {}", args.listen))?;
    let auth = match (args.auth_user, args.auth_password) {
        (Some(username), Some(password)) => Some(AuthRequirement::password(username, password)),
        // clap's `requires` makes a lone half an argument error.
        _ => None,
    };
    let sink = SmtpSink::serve_with(listener, SinkOptions { auth });
    let mut out = std::io::stdout();
    writeln!(out, "smtp-sink listening on {}", sink.addr())?;
    out.flush()?;

    let mut printed = 0;
    loop {
        tokio::select! {
            () = &mut shutdown => break,
            messages = sink.wait_for_messages(printed + 1, WAIT_CHUNK) => {
                for (index, mail) in messages.iter().enumerate().skip(printed) {
                    print_mail(&mut out, index + 1, mail)?;
                }
                printed = printed.max(messages.len());
            }
        }
    }
    Ok(())
}

fn print_mail(out: &mut impl Write, number: usize, mail: &ReceivedMail) -> std::io::Result<()> {
    writeln!(
        out,
        "--- mail #{number} from {} to [{}]",
        mail.mail_from,
        mail.rcpt_to.join(", ")
    )?;
    if let Some(user) = &mail.authenticated_as {
        writeln!(out, "Authenticated-As: {user}")?;
    }
    writeln!(
        out,
        "Subject: {}",
        mail.subject().unwrap_or_else(|| "(none)".into())
    )?;
    writeln!(
        out,
        "Message-ID: {}",
        mail.message_id().unwrap_or_else(|| "(none)".into())
    )?;
    writeln!(out, "{}", mail.body_text())?;
    out.flush()
}

#[cfg(unix)]
fn shutdown_signal() -> std::io::Result<impl Future<Output = ()>> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut terminate = signal(SignalKind::terminate())?;
    let mut interrupt = signal(SignalKind::interrupt())?;
    Ok(async move {
        tokio::select! {
            _ = terminate.recv() => {}
            _ = interrupt.recv() => {}
        }
    })
}

#[cfg(not(unix))]
fn shutdown_signal() -> std::io::Result<impl Future<Output = ()>> {
    Ok(async {
        if tokio::signal::ctrl_c().await.is_err() {
            // Without a handler Ctrl-C still ends the process the default way.
            std::future::pending::<()>().await;
        }
    })
}
