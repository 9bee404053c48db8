//! The command line: every flag and subcommand `outboxctl` accepts, as clap derive types.
//!
//! Parsing only checks shapes (a status name is a status, a duration is a duration); what the
//! values mean for a request is decided in `filter`, `upsert` and `commands`. Secrets never arrive
//! as flag values: they come from stdin or the environment, because argv is visible to every user
//! through `ps` and lands in shell history. The `lists` and `smtp` flags live in [`channel`].

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};
use outbox_proto::v1;

use crate::filter::{TimeBound, parse_priority, parse_status, parse_time_bound};

pub(crate) mod channel;

pub(crate) use channel::{
    AuthArg, BackoffArg, ListSetArgs, ListsCommand, SmtpCommand, SmtpSetArgs, WebhookCommand,
    WebhookSetArgs,
};

#[derive(Debug, Parser)]
#[command(
    name = "outboxctl",
    version,
    about = "Operate the central notification outbox: find, inspect, retry and discard \
             notifications, read KPIs and site health, manage notification lists and the SMTP \
             channel",
    after_help = "Exit status: 0 on success, 2 for usage errors, 1 for anything else \
                  (the error is one line on stderr)."
)]
pub(crate) struct Cli {
    /// Central's gRPC address.
    #[arg(
        long,
        env = "OUTBOX_ADDR",
        default_value = "http://127.0.0.1:50051",
        global = true
    )]
    pub addr: String,
    /// Print one JSON document on stdout instead of tables.
    #[arg(long, global = true)]
    pub json: bool,
    /// A display name for the audit history, sent as `x-outbox-actor`. Central uses it only
    /// when it runs unauthenticated (`[auth] mode = "none"`); otherwise it records the token's
    /// name or the client certificate's CN. Defaults to $USER.
    #[arg(long, env = "USER", global = true)]
    pub actor: Option<String>,
    /// File holding the bearer token central knows this operator by (see docs/security.md,
    /// "Operator roles"). OUTBOX_TOKEN may hold the token itself instead.
    #[arg(long, env = "OUTBOX_TOKEN_FILE", value_name = "PATH", global = true)]
    pub token_file: Option<PathBuf>,
    /// CA certificate (PEM) that central's TLS certificate must chain to; implies https.
    #[arg(long, env = "OUTBOX_CA", value_name = "PATH", global = true)]
    pub ca: Option<PathBuf>,
    /// Client certificate (PEM) for mutual TLS, with --key.
    #[arg(
        long,
        env = "OUTBOX_CERT",
        value_name = "PATH",
        global = true,
        requires = "key"
    )]
    pub cert: Option<PathBuf>,
    /// Private key (PEM) of --cert.
    #[arg(
        long,
        env = "OUTBOX_KEY",
        value_name = "PATH",
        global = true,
        requires = "cert"
    )]
    pub key: Option<PathBuf>,
    /// Connect and per-call timeout, e.g. 10s or 1m. Give it before the subcommand: after
    /// `smtp set` (or `webhook set`), --timeout is the SMTP session (or one POST's) timeout.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub timeout: Duration,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Notifications matching a filter, newest first.
    List(ListArgs),
    /// One notification in full: status, content, provenance and its attempt history.
    Show {
        /// Notification id (UUID).
        id: String,
    },
    /// The status of one notification.
    Status {
        /// Notification id (UUID).
        id: String,
    },
    /// Move Parked notifications back to Pending, by id or by filter.
    Retry(ActionArgs),
    /// Move Parked notifications to Discarded (rows are kept), by id or by filter.
    Discard(ActionArgs),
    /// Delivery health: queue depth, stuck, parked, recent deliveries; globally and per site.
    Kpis,
    /// Site health: every site-forwarder node's latest report (role, buffer depth, oldest
    /// buffered age, last forward, standby lag, version) and whether it is online.
    Sites,
    /// Notification lists: the names scripts send to, and their recipients or webhook endpoints.
    #[command(subcommand)]
    Lists(ListsCommand),
    /// The email channel's SMTP settings.
    #[command(subcommand)]
    Smtp(SmtpCommand),
    /// The webhook channel's pacing and retries.
    #[command(subcommand)]
    Webhook(WebhookCommand),
    /// Incidents of escalating lists, newest first: open, acknowledged, exhausted, ended.
    Incidents(IncidentArgs),
    /// One incident in full: its policy, its pages with their timing, its notifications and
    /// its history.
    Incident {
        /// Incident number.
        id: i64,
    },
    /// Acknowledge an incident (operator role): its escalation stops at once; a second
    /// acknowledgement says who was first.
    Ack {
        /// Incident number.
        id: i64,
    },
}

#[derive(Debug, Args)]
pub(crate) struct IncidentArgs {
    /// Only these statuses (repeatable).
    #[arg(long, value_enum)]
    pub status: Vec<IncidentStatusArg>,
    /// Only incidents with a page that fired late (the dispatcher was down or behind).
    #[arg(long)]
    pub late: bool,
    /// At most N incidents (central caps it at 500).
    #[arg(long, default_value_t = 50, value_name = "N",
          value_parser = clap::value_parser!(u32).range(1..=500))]
    pub limit: u32,
    /// Continue from an earlier answer's next page token.
    #[arg(long, value_name = "TOKEN")]
    pub page_token: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum IncidentStatusArg {
    Open,
    Acknowledged,
    Exhausted,
    Cleared,
    Discarded,
}

impl IncidentStatusArg {
    pub(crate) fn proto(self) -> v1::IncidentStatus {
        match self {
            Self::Open => v1::IncidentStatus::Open,
            Self::Acknowledged => v1::IncidentStatus::Acknowledged,
            Self::Exhausted => v1::IncidentStatus::Exhausted,
            Self::Cleared => v1::IncidentStatus::Cleared,
            Self::Discarded => v1::IncidentStatus::Discarded,
        }
    }
}

/// Which notifications: the filter flags shared by `list` and the bulk forms of retry/discard.
#[derive(Debug, Args, Default)]
pub(crate) struct SelectArgs {
    /// Only this delivery channel.
    #[arg(long = "type", value_enum)]
    pub kind: Option<ChannelArg>,
    /// Only these priorities (repeatable): critical, high, normal, low.
    #[arg(long, value_parser = parse_priority)]
    pub priority: Vec<v1::NotificationPriority>,
    /// Only notifications from this source site.
    #[arg(long)]
    pub site: Option<String>,
    /// Only notifications about this condition key (e.g. tank4.level.high).
    #[arg(long)]
    pub condition_key: Option<String>,
    /// Only notifications sent to this notification list.
    #[arg(long)]
    pub list: Option<String>,
    /// Created at or after: RFC 3339 (2026-11-21T10:00:00Z) or an age such as 1h (now - 1h).
    #[arg(long, value_parser = parse_time_bound)]
    pub since: Option<TimeBound>,
    /// Created before: RFC 3339 or an age such as 30m (now - 30m).
    #[arg(long, value_parser = parse_time_bound)]
    pub until: Option<TimeBound>,
    /// Only subjects containing KEYWORD (case-insensitive).
    #[arg(long, value_name = "KEYWORD")]
    pub subject: Option<String>,
}

impl SelectArgs {
    /// Whether any filter flag was given (the bulk forms need `--all-parked` for them).
    pub(crate) fn is_set(&self) -> bool {
        self.kind.is_some()
            || !self.priority.is_empty()
            || self.site.is_some()
            || self.condition_key.is_some()
            || self.list.is_some()
            || self.since.is_some()
            || self.until.is_some()
            || self.subject.is_some()
    }
}

#[derive(Debug, Args)]
pub(crate) struct ListArgs {
    /// Only these statuses (repeatable): pending, held, retrying, delivered, parked, discarded,
    /// superseded, cleared.
    #[arg(long, value_parser = parse_status)]
    pub status: Vec<v1::NotificationStatus>,
    /// Only Pending/Retrying notifications older than central's stuck threshold.
    #[arg(long)]
    pub stuck: bool,
    /// Only scheduled notifications still waiting for their deliver_after time.
    #[arg(long)]
    pub scheduled: bool,
    #[command(flatten)]
    pub select: SelectArgs,
    /// Show at most N rows in total (0: all), following page tokens as needed.
    #[arg(long, default_value_t = 50, value_name = "N")]
    pub limit: u32,
    /// Rows fetched per call (central caps it at 500).
    #[arg(long, default_value_t = 100, value_name = "N",
          value_parser = clap::value_parser!(u32).range(1..=500))]
    pub page_size: u32,
    /// Continue from the `next_page_token` of an earlier `list --json`.
    #[arg(long, value_name = "TOKEN")]
    pub page_token: Option<String>,
}

#[derive(Debug, Args)]
pub(crate) struct ActionArgs {
    /// Notification ids: one acts singly (errors if it is not Parked), several act in bulk
    /// (ids that are not Parked are reported as skipped).
    // Not `required`: with neither ids nor --all-parked, `commands` explains both ways in one
    // line, which clap's "<IDS> missing" does not.
    #[arg(conflicts_with = "all_parked")]
    pub ids: Vec<String>,
    /// Act on every Parked notification matching the filter flags, oldest first.
    #[arg(long)]
    pub all_parked: bool,
    #[command(flatten)]
    pub select: SelectArgs,
    /// Do not ask for confirmation (required when stdin is not a terminal).
    #[arg(long, short = 'y')]
    pub yes: bool,
    /// Rows acted on per call when selecting by filter (central caps it at 1000).
    #[arg(long, default_value_t = 1000, value_name = "N",
          value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub batch_size: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum ChannelArg {
    Email,
    Webhook,
}

impl ChannelArg {
    pub(crate) fn proto(self) -> v1::NotificationType {
        match self {
            Self::Email => v1::NotificationType::Email,
            Self::Webhook => v1::NotificationType::Webhook,
        }
    }
}

/// `10s`, `1m`, `1h 30m`: humantime's syntax, the same as the services' config files.
fn parse_duration(text: &str) -> Result<Duration, String> {
    humantime::parse_duration(text)
        .map_err(|e| format!("{e} (expected a duration such as 30s, 5m or 1h)"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_command_line_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn global_timeout_and_smtp_session_timeout_are_distinct() {
        let cli = Cli::try_parse_from([
            "outboxctl",
            "--timeout",
            "3s",
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
            "--timeout",
            "45s",
        ])
        .unwrap();
        assert_eq!(cli.timeout, Duration::from_secs(3));
        let Command::Smtp(SmtpCommand::Set(set)) = cli.command else {
            panic!("not smtp set");
        };
        assert_eq!(set.session_timeout, Some(Duration::from_secs(45)));
    }

    #[test]
    fn json_is_accepted_after_the_subcommand() {
        let cli = Cli::try_parse_from(["outboxctl", "kpis", "--json"]).unwrap();
        assert!(cli.json);
    }

    #[test]
    fn priority_is_a_repeatable_filter_on_list_retry_and_discard() {
        let cli = Cli::try_parse_from([
            "outboxctl",
            "list",
            "--priority",
            "critical",
            "--priority",
            "HIGH",
        ])
        .unwrap();
        let Command::List(list) = cli.command else {
            panic!("not list");
        };
        assert_eq!(
            list.select.priority,
            [
                v1::NotificationPriority::Critical,
                v1::NotificationPriority::High
            ]
        );
        for verb in ["retry", "discard"] {
            let cli = Cli::try_parse_from(["outboxctl", verb, "--all-parked", "--priority", "low"])
                .unwrap();
            let (Command::Retry(args) | Command::Discard(args)) = cli.command else {
                panic!("not {verb}");
            };
            assert_eq!(args.select.priority, [v1::NotificationPriority::Low]);
            assert!(args.select.is_set(), "a filter flag");
        }
        let err = Cli::try_parse_from(["outboxctl", "list", "--priority", "urgent"])
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("'urgent'") && err.contains("--priority"),
            "{err}"
        );
        assert!(err.contains("critical, high, normal, low"), "{err}");
    }

    #[test]
    fn retry_takes_ids_or_all_parked_but_not_both() {
        assert!(Cli::try_parse_from(["outboxctl", "retry", "x", "--all-parked"]).is_err());
        assert!(Cli::try_parse_from(["outboxctl", "retry", "--all-parked", "--site", "a"]).is_ok());
    }
}
