//! The `lists`, `smtp` and `webhook` subcommands: where notifications go (email recipients,
//! webhook endpoints), how the email channel reaches its relay, and how each channel paces and
//! retries its deliveries.
//!
//! As everywhere in `args`, parsing checks shapes only; which flags make sense together (OAuth
//! flags only with `--auth xoauth2`, a burst only with a rate) is checked in `upsert`, before
//! anything is sent. No secret is ever a flag value: the SMTP password, the OAuth client secret
//! and the webhook signing secret come from stdin (`--*-stdin`) or an environment variable.

use std::time::Duration;

use clap::{Args, Subcommand, ValueEnum};
use outbox_proto::v1;

use super::{ChannelArg, parse_duration};

#[derive(Debug, Subcommand)]
pub(crate) enum ListsCommand {
    /// All notification lists, by name.
    Ls,
    /// One list: its recipients or endpoints (a webhook secret is never shown).
    Show { name: String },
    /// Create or replace a list: its recipients or endpoints, its flood consolidation and its
    /// escalation are replaced as a whole (without the --consolidate-* flags, or without
    /// --escalate-after, the list has none).
    // Boxed: its flags make it far larger than the other variants.
    Set(Box<ListSetArgs>),
    /// Delete a list. Notifications already sent to it park at delivery.
    Rm { name: String },
}

#[derive(Debug, Args)]
pub(crate) struct ListSetArgs {
    pub name: String,
    #[arg(long = "type", value_enum, default_value_t = ChannelArg::Email)]
    pub kind: ChannelArg,
    /// Email lists: a recipient address (repeatable; at least one).
    // Not `required`: a webhook list has none, and central names whatever is missing.
    #[arg(long = "recipient", value_name = "ADDRESS")]
    pub recipients: Vec<String>,
    /// Webhook lists: an endpoint URL, https or http to loopback (repeatable; at least one).
    #[arg(long = "endpoint", value_name = "URL")]
    pub endpoints: Vec<String>,
    /// Webhook lists with one --endpoint: a fallback URL, tried in order while the endpoint
    /// fails (connection, TLS, timeout, HTTP 408/429/5xx); repeatable, at most 4, each checked
    /// as an endpoint. Left out: the list has none (a set replaces the whole list).
    #[arg(long = "fallback-url", value_name = "URL")]
    pub fallback_urls: Vec<String>,
    /// Any list: an endpoint (https, or http to loopback) told every final status of the
    /// list's notifications as a POST signed with central's status_callbacks.key. Left out:
    /// none (a set replaces the whole list).
    #[arg(long = "status-callback-url", value_name = "URL")]
    pub status_callback_url: Option<String>,
    /// Webhook lists: the body's shape (central's default: generic).
    #[arg(long, value_enum)]
    pub webhook_format: Option<WebhookFormatArg>,
    /// Webhook lists: read the HMAC signing secret (16 characters or more) from the first line
    /// of stdin. Without it (or $OUTBOX_WEBHOOK_SECRET) a stored secret is kept.
    #[arg(long, conflicts_with = "clear_webhook_secret")]
    pub webhook_secret_stdin: bool,
    /// Webhook lists: remove the stored signing secret (requests go unsigned).
    #[arg(long)]
    pub clear_webhook_secret: bool,
    /// Notifications for the list beyond N (1 to 100000) within one window are held (critical
    /// ones never are).
    #[arg(long, value_name = "N", help_heading = CONSOLIDATION_HEADING)]
    pub consolidate_threshold: Option<u32>,
    /// The window: a whole number of seconds from 1s to 12h (e.g. 60s, 5m), aligned to the Unix
    /// epoch. Held notifications go out when it ends.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration,
          help_heading = CONSOLIDATION_HEADING)]
    pub consolidate_window: Option<Duration>,
    /// Most notifications in one digest (one mail, or one webhook call): 2 to 500.
    #[arg(long, value_name = "M", help_heading = CONSOLIDATION_HEADING)]
    pub consolidate_max_per_digest: Option<u32>,
    /// Escalate the list's alarms: how long the alarm itself waits for an acknowledgement
    /// before the next step pages (a whole number of seconds, 1s to 24h).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration,
          help_heading = ESCALATION_HEADING)]
    pub escalate_after: Option<Duration>,
    /// A further step, in order (repeatable, at most 8): the lists it pages and how long it
    /// waits, `LIST[,LIST...]:DURATION` (e.g. `supervisors:15m`).
    #[arg(long = "escalation-step", value_name = "LISTS:WAIT", value_parser = parse_step,
          help_heading = ESCALATION_HEADING)]
    pub escalation_steps: Vec<(Vec<String>, Duration)>,
    /// The priorities that escalate (repeatable): critical, high, normal (default critical and
    /// high; low never escalates).
    #[arg(long = "escalation-priority", value_parser = crate::filter::parse_priority,
          help_heading = ESCALATION_HEADING)]
    pub escalation_priorities: Vec<v1::NotificationPriority>,
    /// Rounds after the first, 0 to 9.
    #[arg(long, value_name = "N", help_heading = ESCALATION_HEADING)]
    pub escalation_repeat: Option<u32>,
    /// The step a repeat starts from (default 1: the list itself again).
    #[arg(long, value_name = "STEP", help_heading = ESCALATION_HEADING)]
    pub escalation_repeat_from: Option<u32>,
    /// Wait out each step even when its delivery parks (by default a parked page escalates at
    /// once).
    #[arg(long, help_heading = ESCALATION_HEADING)]
    pub no_escalate_on_park: bool,
    /// Page again from step 1 this long after an acknowledgement while the condition is not
    /// cleared (1m to 7d; default never).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration,
          help_heading = ESCALATION_HEADING)]
    pub escalation_reminder: Option<Duration>,
    /// Tell every list the incident reached who acknowledged it ("Acknowledged by X: ...").
    #[arg(long, help_heading = ESCALATION_HEADING)]
    pub escalation_notify_acknowledgement: bool,
}

/// Like consolidation: `lists set` replaces the list, so without `--escalate-after` it has no
/// escalation.
const ESCALATION_HEADING: &str =
    "Escalation (needs --escalate-after: without it the list has none)";

/// `supervisors,manager:15m` -> the step's lists and wait.
fn parse_step(text: &str) -> Result<(Vec<String>, Duration), String> {
    let (lists, wait) = text.rsplit_once(':').ok_or_else(|| {
        format!("{text:?}: expected LIST[,LIST...]:DURATION, e.g. supervisors:15m")
    })?;
    let lists: Vec<String> = lists
        .split(',')
        .map(|l| l.trim().to_owned())
        .filter(|l| !l.is_empty())
        .collect();
    if lists.is_empty() {
        return Err(format!("{text:?}: name at least one list before the ':'"));
    }
    Ok((lists, parse_duration(wait.trim())?))
}

/// `lists set` replaces the list, so leaving the flags out turns consolidation off: the heading
/// says so where an operator looks for the flags.
const CONSOLIDATION_HEADING: &str =
    "Flood consolidation (all three flags, or none: without them the list has none)";

#[derive(Debug, Subcommand)]
pub(crate) enum SmtpCommand {
    /// The SMTP settings central delivers with (secrets are never shown, only whether set).
    Show,
    /// Replace the SMTP settings. Secrets come from stdin (--password-stdin or
    /// --oauth-client-secret-stdin, one per run) or $OUTBOX_SMTP_PASSWORD /
    /// $OUTBOX_SMTP_OAUTH_CLIENT_SECRET; without either, a stored secret is kept.
    // Boxed: twenty flags make it far larger than the other variants.
    Set(Box<SmtpSetArgs>),
    /// Delete the SMTP settings: email notifications park until they are set again.
    Rm,
}

#[derive(Debug, Args)]
pub(crate) struct SmtpSetArgs {
    #[arg(long)]
    pub host: String,
    #[arg(long)]
    pub port: u16,
    #[arg(long, value_enum)]
    pub tls: TlsArg,
    /// Envelope and header sender address.
    #[arg(long = "from", value_name = "ADDRESS")]
    pub from_address: String,
    /// How to authenticate (default: password with --username, else none).
    #[arg(long = "auth", value_enum)]
    pub auth: Option<AuthArg>,
    /// User name for AUTH (password and xoauth2); omit for no authentication.
    #[arg(long)]
    pub username: Option<String>,
    /// Read the password from the first line of stdin.
    #[arg(long, requires = "username")]
    pub password_stdin: bool,
    /// XOAUTH2: the OAuth2 token endpoint (https, or http to loopback).
    #[arg(long, value_name = "URL")]
    pub oauth_token_url: Option<String>,
    /// XOAUTH2: the client id for the client-credentials grant.
    #[arg(long, value_name = "ID")]
    pub oauth_client_id: Option<String>,
    /// XOAUTH2: the scope to ask for, if the provider needs one.
    #[arg(long, value_name = "SCOPE")]
    pub oauth_scope: Option<String>,
    /// XOAUTH2: read the client secret from the first line of stdin.
    #[arg(long)]
    pub oauth_client_secret_stdin: bool,
    /// Retries after the first attempt before a transiently failing notification is parked
    /// (N + 1 attempts in all; central's default: 10).
    #[arg(long, value_name = "N")]
    pub max_retries: Option<u32>,
    /// Delay between attempts (the first, with exponential backoff), e.g. 1m (default: 1m).
    #[arg(long, value_parser = parse_duration)]
    pub retry_delay: Option<Duration>,
    /// fixed: every retry waits --retry-delay; exponential: doubling, with jitter, up to
    /// --max-retry-delay (default: fixed).
    #[arg(long, value_enum)]
    pub backoff: Option<BackoffArg>,
    /// Exponential backoff: the longest wait, e.g. 1h (central's default: 1h).
    #[arg(long, value_parser = parse_duration)]
    pub max_retry_delay: Option<Duration>,
    /// Parallel SMTP sessions (central's default: 4).
    #[arg(long, value_name = "N")]
    pub max_connections: Option<u32>,
    /// Deliveries per second at most, e.g. 10 or 0.5 (default: no limit).
    #[arg(long, value_name = "RATE", value_parser = parse_rate)]
    pub rate_limit_per_second: Option<f64>,
    /// Deliveries allowed at once above the rate (central's default: one second's worth).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub rate_limit_burst: Option<u32>,
    /// Per-session timeout, e.g. 30s (central's default: 30s).
    #[arg(long = "timeout", id = "session_timeout", value_parser = parse_duration)]
    pub session_timeout: Option<Duration>,
    /// Longest one whole delivery may take, e.g. 2m (central's default: 2m).
    #[arg(long, value_parser = parse_duration)]
    pub overall_timeout: Option<Duration>,
    /// A relay to fail over to while the one above is down, "HOST:PORT TLS" with TLS none,
    /// starttls or tls (one argument: quote it), reached without authentication. Repeatable, in
    /// order, at most 4; none: no failover.
    #[arg(long = "fallback-relay", value_name = "HOST:PORT TLS", value_parser = parse_relay)]
    pub fallback_relays: Vec<v1::SmtpRelay>,
}

/// The shape of `--fallback-relay`: `host:port tls` (central checks the host and the port's
/// range, as for every other way in).
fn parse_relay(text: &str) -> Result<v1::SmtpRelay, String> {
    let mut parts = text.split_whitespace();
    let (Some(address), Some(tls), None) = (parts.next(), parts.next(), parts.next()) else {
        return Err(format!(
            "{text:?} is not \"HOST:PORT TLS\" (TLS none, starttls or tls)"
        ));
    };
    let tls = TlsArg::from_str(tls, true)
        .map_err(|_| format!("{tls:?} is not a TLS mode (none, starttls or tls)"))?;
    let (host, port) = address
        .rsplit_once(':')
        .ok_or_else(|| format!("{address:?} has no port (HOST:PORT)"))?;
    let port = port
        .parse::<u32>()
        .map_err(|_| format!("{port:?} is not a port number"))?;
    // The API takes an IPv6 address bare; on the command line it is bracketed, [::1]:25.
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    Ok(v1::SmtpRelay {
        host: host.to_owned(),
        port,
        tls_mode: tls.proto().into(),
    })
}

#[derive(Debug, Subcommand)]
pub(crate) enum WebhookCommand {
    /// The webhook channel's pacing and retries central delivers with (its defaults while none
    /// are stored).
    Show,
    /// Replace the webhook channel's settings as a whole: flags left out take central's
    /// defaults. (Endpoints and signing secrets are per list: `lists set --type webhook`.)
    Set(WebhookSetArgs),
}

#[derive(Debug, Args)]
pub(crate) struct WebhookSetArgs {
    /// Retries after the first attempt before a transiently failing notification is parked
    /// (N + 1 attempts in all; central's default: 10).
    #[arg(long, value_name = "N")]
    pub max_retries: Option<u32>,
    /// Delay before a retry (the first, with exponential backoff), e.g. 30s (default: 1m).
    #[arg(long, value_parser = parse_duration)]
    pub retry_delay: Option<Duration>,
    /// fixed: every retry waits --retry-delay; exponential: doubling, with jitter, up to
    /// --max-retry-delay (central's default for webhooks: exponential).
    #[arg(long, value_enum)]
    pub backoff: Option<BackoffArg>,
    /// Exponential backoff: the longest wait, e.g. 1h (central's default: 1h).
    #[arg(long, value_parser = parse_duration)]
    pub max_retry_delay: Option<Duration>,
    /// POSTs in flight at once (central's default: 8).
    #[arg(long, value_name = "N")]
    pub max_connections: Option<u32>,
    /// Deliveries per second at most, e.g. 10 or 0.5 (default: no limit).
    #[arg(long, value_name = "RATE", value_parser = parse_rate)]
    pub rate_limit_per_second: Option<f64>,
    /// Deliveries allowed at once above the rate (central's default: one second's worth).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub rate_limit_burst: Option<u32>,
    /// Longest one POST may take, e.g. 10s (central's default: 10s).
    #[arg(long = "timeout", id = "post_timeout", value_parser = parse_duration)]
    pub post_timeout: Option<Duration>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum TlsArg {
    None,
    Starttls,
    Tls,
}

impl TlsArg {
    pub(crate) fn proto(self) -> v1::SmtpTlsMode {
        match self {
            Self::None => v1::SmtpTlsMode::None,
            Self::Starttls => v1::SmtpTlsMode::Starttls,
            Self::Tls => v1::SmtpTlsMode::Tls,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum AuthArg {
    /// No AUTH.
    None,
    /// AUTH PLAIN or LOGIN with --username and a password.
    Password,
    /// AUTH XOAUTH2 with a token from an OAuth2 client-credentials grant.
    Xoauth2,
}

impl AuthArg {
    pub(crate) fn proto(self) -> v1::SmtpAuthMechanism {
        match self {
            Self::None => v1::SmtpAuthMechanism::None,
            Self::Password => v1::SmtpAuthMechanism::Password,
            Self::Xoauth2 => v1::SmtpAuthMechanism::Xoauth2,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum BackoffArg {
    Fixed,
    Exponential,
}

impl BackoffArg {
    pub(crate) fn proto(self) -> v1::RetryBackoff {
        match self {
            Self::Fixed => v1::RetryBackoff::Fixed,
            Self::Exponential => v1::RetryBackoff::Exponential,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum WebhookFormatArg {
    /// The outbox's own JSON document.
    Generic,
    /// A Microsoft Teams incoming-webhook message card.
    Teams,
    /// A Slack incoming-webhook message.
    Slack,
}

impl WebhookFormatArg {
    pub(crate) fn proto(self) -> v1::WebhookFormat {
        match self {
            Self::Generic => v1::WebhookFormat::Generic,
            Self::Teams => v1::WebhookFormat::Teams,
            Self::Slack => v1::WebhookFormat::Slack,
        }
    }
}

/// A positive, finite number of deliveries per second. Zero is refused rather than read as "no
/// limit": leaving the flag out says that.
fn parse_rate(text: &str) -> Result<f64, String> {
    match text.trim().parse::<f64>() {
        Ok(rate) if rate.is_finite() && rate > 0.0 => Ok(rate),
        _ => Err(
            "expected a positive number of deliveries per second, such as 10 or 0.5 \
                  (leave the flag out for no limit)"
                .to_owned(),
        ),
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;
    use crate::args::{Cli, Command};

    fn smtp_set(extra: &[&str]) -> Result<SmtpSetArgs, clap::Error> {
        let mut argv = vec![
            "outboxctl",
            "smtp",
            "set",
            "--host",
            "relay",
            "--port",
            "587",
            "--tls",
            "starttls",
            "--from",
            "a@b.test",
        ];
        argv.extend_from_slice(extra);
        let cli = Cli::try_parse_from(argv)?;
        match cli.command {
            Command::Smtp(SmtpCommand::Set(set)) => Ok(*set),
            other => panic!("not smtp set: {other:?}"),
        }
    }

    #[test]
    fn smtp_set_takes_oauth_backoff_and_rate_limit_flags() {
        let set = smtp_set(&[
            "--auth",
            "xoauth2",
            "--username",
            "outbox@plant.test",
            "--oauth-token-url",
            "https://login.example.test/token",
            "--oauth-client-id",
            "client-1",
            "--oauth-scope",
            "https://outlook.office365.com/.default",
            "--oauth-client-secret-stdin",
            "--backoff",
            "exponential",
            "--max-retry-delay",
            "1h",
            "--rate-limit-per-second",
            "0.5",
            "--rate-limit-burst",
            "3",
            "--overall-timeout",
            "2m",
        ])
        .unwrap();
        assert_eq!(set.auth, Some(AuthArg::Xoauth2));
        assert_eq!(set.oauth_client_id.as_deref(), Some("client-1"));
        assert!(set.oauth_client_secret_stdin);
        assert_eq!(set.backoff, Some(BackoffArg::Exponential));
        assert_eq!(set.max_retry_delay, Some(Duration::from_secs(3600)));
        assert_eq!(set.rate_limit_per_second, Some(0.5));
        assert_eq!(set.rate_limit_burst, Some(3));
        assert_eq!(set.overall_timeout, Some(Duration::from_secs(120)));
    }

    #[test]
    fn fallback_relays_keep_their_order_and_bad_shapes_are_refused() {
        let set = smtp_set(&[
            "--fallback-relay",
            "smtp2.plant.test:25 starttls",
            "--fallback-relay",
            "[::1]:2525 NONE",
        ])
        .unwrap();
        let relays: Vec<(&str, u32, i32)> = set
            .fallback_relays
            .iter()
            .map(|r| (r.host.as_str(), r.port, r.tls_mode))
            .collect();
        assert_eq!(
            relays,
            [
                ("smtp2.plant.test", 25, v1::SmtpTlsMode::Starttls.into()),
                ("::1", 2525, v1::SmtpTlsMode::None.into()),
            ]
        );
        for bad in ["smtp2:25", "smtp2 starttls", "smtp2:x none", "smtp2:25 ssl"] {
            assert!(smtp_set(&["--fallback-relay", bad]).is_err(), "{bad}");
        }
    }

    #[test]
    fn rates_must_be_positive_and_bursts_at_least_one() {
        for bad in ["0", "-1", "NaN", "inf", "ten"] {
            assert!(
                smtp_set(&["--rate-limit-per-second", bad]).is_err(),
                "{bad}"
            );
        }
        assert!(smtp_set(&["--rate-limit-per-second", "1", "--rate-limit-burst", "0"]).is_err());
    }

    #[test]
    fn no_secret_is_taken_as_a_flag_value() {
        for flag in [
            "--password",
            "--oauth-client-secret",
            "--webhook-secret",
            "--secret",
        ] {
            assert!(
                smtp_set(&[flag, "hunter2hunter2hunter2"]).is_err(),
                "{flag}"
            );
        }
        let err = Cli::try_parse_from([
            "outboxctl",
            "lists",
            "set",
            "hooks",
            "--type",
            "webhook",
            "--webhook-secret",
            "hunter2hunter2hunter2",
        ]);
        assert!(err.is_err());
    }

    #[test]
    fn webhook_set_takes_pacing_flags_and_its_own_timeout() {
        let cli = Cli::try_parse_from([
            "outboxctl",
            "--timeout",
            "5s",
            "webhook",
            "set",
            "--max-retries",
            "3",
            "--backoff",
            "fixed",
            "--max-connections",
            "2",
            "--timeout",
            "4s",
        ])
        .unwrap();
        assert_eq!(cli.timeout, Duration::from_secs(5));
        let Command::Webhook(WebhookCommand::Set(set)) = cli.command else {
            panic!("not webhook set");
        };
        assert_eq!(set.max_retries, Some(3));
        assert_eq!(set.backoff, Some(BackoffArg::Fixed));
        assert_eq!(set.max_connections, Some(2));
        assert_eq!(set.post_timeout, Some(Duration::from_secs(4)));
    }

    #[test]
    fn lists_set_takes_endpoints_without_recipients() {
        let cli = Cli::try_parse_from([
            "outboxctl",
            "lists",
            "set",
            "hooks",
            "--type",
            "webhook",
            "--endpoint",
            "https://hooks.example.test/a",
            "--endpoint",
            "https://hooks.example.test/b",
            "--webhook-format",
            "teams",
            "--webhook-secret-stdin",
        ])
        .unwrap();
        let Command::Lists(ListsCommand::Set(set)) = cli.command else {
            panic!("not lists set");
        };
        assert_eq!(set.kind, ChannelArg::Webhook);
        assert_eq!(set.endpoints.len(), 2);
        assert!(set.recipients.is_empty());
        assert_eq!(set.webhook_format, Some(WebhookFormatArg::Teams));
        assert!(set.webhook_secret_stdin);
        let cli = Cli::try_parse_from([
            "outboxctl",
            "lists",
            "set",
            "hooks",
            "--type",
            "webhook",
            "--endpoint",
            "https://h.test/a",
            "--fallback-url",
            "https://b.test/a",
            "--fallback-url",
            "https://c.test/a",
        ])
        .unwrap();
        let Command::Lists(ListsCommand::Set(with_fallbacks)) = cli.command else {
            panic!("not lists set");
        };
        assert_eq!(
            with_fallbacks.fallback_urls,
            ["https://b.test/a", "https://c.test/a"]
        );

        let both = Cli::try_parse_from([
            "outboxctl",
            "lists",
            "set",
            "hooks",
            "--type",
            "webhook",
            "--webhook-secret-stdin",
            "--clear-webhook-secret",
        ]);
        assert!(both.is_err(), "setting and clearing the secret at once");
    }
}
