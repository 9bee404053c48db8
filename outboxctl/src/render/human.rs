//! Output for people: aligned tables for collections, `key  value` blocks for one thing.
//! Instants are RFC 3339 UTC to the second with a humanised age beside them where "how long
//! ago" is the question an operator is asking.

use chrono::{DateTime, Utc};
use outbox_proto::v1;

use super::table::{Table, truncate};
use super::{
    age, age_since, auth_name, backoff_name, callback_outcome_name, channel_name, duration_human,
    history_kind_name, is_webhook, outcome_name, priority_name, role_name, status_name, time_human,
    tls_name, webhook_format_name,
};
use crate::commands::Report;

/// Subjects and errors are free text; past this many characters a table row becomes unreadable.
/// `show` prints them in full.
const MAX_CELL: usize = 60;

pub(crate) fn render(report: &Report, now: DateTime<Utc>) -> String {
    match report {
        Report::Notifications {
            rows,
            next_page_token,
        } => notifications(rows, next_page_token, now),
        Report::Status(view) => key_values(&status_fields(view, now)),
        Report::Detail(detail) => detail_text(detail, now),
        Report::Acted { action, view } => format!(
            "{} {} (now {})\n",
            action.past(),
            view.notification_id,
            status_name(view.status)
        ),
        Report::Bulk { action, result } => bulk(action.past(), result),
        Report::Kpis(kpis) => kpi_text(kpis),
        Report::Sites(sites) => site_health_text(sites, now),
        Report::Lists(lists) => list_table(lists),
        Report::List(list) => list_text(list),
        Report::ListDeleted(name) => format!("deleted list {name}\n"),
        Report::Smtp(config) => smtp_text(config),
        Report::SmtpDeleted => "deleted the SMTP configuration: email notifications park until \
                                it is set again\n"
            .to_owned(),
        Report::Webhook(config) => webhook_text(config),
        Report::Incidents(list) => super::incident::list_text(list, now),
        Report::Incident(detail) => super::incident::detail_text(detail),
        Report::IncidentAcknowledged(answer) => super::incident::acknowledged_text(answer),
    }
}

fn notifications(rows: &[v1::NotificationStatusView], next: &str, now: DateTime<Utc>) -> String {
    if rows.is_empty() {
        return "no notifications match\n".to_owned();
    }
    let mut table = Table::new(&[
        "ID",
        "STATUS",
        "PRIORITY",
        "TYPE",
        "SITE",
        "LIST",
        "RETRIES",
        "AGE",
        "DELIVER AFTER",
        "SUBJECT",
    ]);
    for v in rows {
        table.row(vec![
            v.notification_id.clone(),
            status_cell(v, now),
            priority_name(v.priority),
            channel_name(v.r#type),
            v.source_site_id.clone(),
            v.list_name.clone(),
            v.retry_count.to_string(),
            age_since(now, v.created_at.as_ref()),
            time_human(v.deliver_after.as_ref()),
            truncate(&v.subject, MAX_CELL),
        ]);
    }
    let mut out = table.render();
    if !next.is_empty() {
        out.push_str(&format!(
            "more notifications match: raise --limit, or continue with --page-token {next}\n"
        ));
    }
    out
}

/// "pending (stuck)", "pending (scheduled)": a badge belongs with the status it qualifies.
/// Scheduled: still waiting for its deliver_after (see `super::waits_for_its_time`).
fn status_cell(v: &v1::NotificationStatusView, now: DateTime<Utc>) -> String {
    let status = status_name(v.status);
    if v.stuck {
        format!("{status} (stuck)")
    } else if super::waits_for_its_time(v, now) {
        format!("{status} (scheduled)")
    } else {
        status
    }
}

fn with_age(ts: Option<&prost_types::Timestamp>, now: DateTime<Utc>) -> String {
    match ts {
        Some(_) => format!("{} ({} ago)", time_human(ts), age_since(now, ts)),
        None => "-".to_owned(),
    }
}

fn or_dash(text: &str) -> String {
    if text.is_empty() {
        "-".to_owned()
    } else {
        text.to_owned()
    }
}

fn status_fields(
    v: &v1::NotificationStatusView,
    now: DateTime<Utc>,
) -> Vec<(&'static str, String)> {
    vec![
        ("notification", v.notification_id.clone()),
        ("status", status_cell(v, now)),
        ("priority", priority_name(v.priority)),
        ("type", channel_name(v.r#type)),
        ("list", v.list_name.clone()),
        ("site", v.source_site_id.clone()),
        ("subject", v.subject.clone()),
        ("condition", or_dash(&v.condition_key)),
        ("retries", v.retry_count.to_string()),
        ("last error", or_dash(&v.last_error)),
        ("created", with_age(v.created_at.as_ref(), now)),
        ("site enqueued", time_human(v.site_enqueued_at.as_ref())),
        ("deliver after", time_human(v.deliver_after.as_ref())),
        ("last attempt", with_age(v.last_attempt_at.as_ref(), now)),
        ("next attempt", time_human(v.next_attempt_at.as_ref())),
        ("delivered", time_human(v.delivered_at.as_ref())),
        ("resolved", time_human(v.resolved_at.as_ref())),
    ]
}

fn key_values(fields: &[(&str, String)]) -> String {
    let width = fields.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
    let mut out = String::new();
    for (key, value) in fields {
        // Multi-line values (a body) are indented under their key so the block stays readable.
        let indent = " ".repeat(width + 2);
        let value = value.replace('\n', &format!("\n{indent}"));
        out.push_str(&format!("{key:<width$}  {value}\n"));
    }
    out
}

fn detail_text(d: &v1::NotificationDetail, now: DateTime<Utc>) -> String {
    let mut fields = d
        .notification
        .as_ref()
        .map(|v| status_fields(v, now))
        .unwrap_or_default();
    fields.push(("body", d.body.clone()));
    if !d.type_data.is_empty() {
        fields.push(("type data", d.type_data.clone()));
    }
    fields.push(("source instance", or_dash(&d.source_instance_id)));
    fields.push(("source script", or_dash(&d.source_script)));
    if !d.origin_execution_id.is_empty() {
        fields.push(("execution", d.origin_execution_id.clone()));
    }
    if !d.origin_parent_execution_id.is_empty() {
        fields.push(("parent execution", d.origin_parent_execution_id.clone()));
    }
    fields.push(("resolved targets", or_dash(&d.resolved_targets)));
    let mut out = key_values(&fields);
    out.push_str("\nhistory:\n");
    if d.history.is_empty() {
        out.push_str("  (no attempts yet)\n");
        return out;
    }
    let mut table = Table::new(&["#", "AT", "KIND", "OUTCOME", "TOOK", "BY", "ERROR"]);
    for h in &d.history {
        let mut by = if h.kind == i32::from(v1::HistoryEntryKind::StatusCallback) {
            // A status callback: the endpoint it called (named below).
            String::new()
        } else if !h.superseded_by.is_empty() {
            h.superseded_by.clone()
        } else if h.actor.is_empty() {
            format!("lease {}", h.lease_epoch)
        } else {
            h.actor.clone()
        };
        // The digest an attempt went out in: the id to look for in the mail's Message-ID or
        // the webhook's Idempotency-Key.
        if !h.digest_id.is_empty() {
            by.push_str(&format!(", digest {}", h.digest_id));
        }
        // The relay it was handed to: a fallback's name here is the sign of a failover.
        if !h.provider.is_empty() {
            let sep = if by.is_empty() { "" } else { ", " };
            by.push_str(&format!("{sep}via {}", h.provider));
        }
        table.row(vec![
            h.sequence.to_string(),
            time_human(h.at.as_ref()),
            history_kind_name(h.kind),
            outcome_name(h.outcome)
                // A status callback: how the call ended, and the status it told.
                .or_else(|| {
                    callback_outcome_name(h.callback_outcome)
                        .map(|o| format!("{o} {}", status_name(h.callback_status)))
                })
                .unwrap_or_else(|| "-".to_owned()),
            h.duration_ms
                .map_or_else(|| "-".to_owned(), |ms| format!("{ms}ms")),
            by,
            truncate(&or_dash(&h.error), MAX_CELL),
        ]);
    }
    out.push_str(&table.render());
    out
}

fn bulk(past: &str, r: &v1::BulkActionResponse) -> String {
    let noun = if r.changed == 1 {
        "notification"
    } else {
        "notifications"
    };
    let mut out = format!("{past} {} {noun}\n", r.changed);
    if !r.skipped.is_empty() {
        out.push_str(&format!("skipped {}:\n", r.skipped.len()));
        let mut table = Table::new(&["ID", "REASON"]);
        for s in &r.skipped {
            table.row(vec![s.notification_id.clone(), s.reason.clone()]);
        }
        out.push_str(&table.render());
    }
    if r.more_matching {
        out.push_str(
            "more parked notifications still match (rows retried by this run may have failed \
             and parked again): check them with `outboxctl list --status parked`\n",
        );
    }
    out
}

fn kpi_text(r: &v1::GetKpisResponse) -> String {
    let mut out = format!(
        "computed {}; stuck means waiting longer than {}; delivered counts the last {}\n\n",
        time_human(r.computed_at.as_ref()),
        duration_human(r.stuck_age_threshold.as_ref()),
        duration_human(r.delivered_kpi_window.as_ref()),
    );
    let mut table = Table::new(&[
        "SITE",
        "QUEUE",
        "STUCK",
        "PARKED",
        "DELIVERED",
        "OLDEST PENDING",
        "OLDEST RETRY WAIT",
    ]);
    let row = |scope: &str, k: Option<&v1::KpiValues>| {
        let k = k.copied().unwrap_or_default();
        let opt_age = |s: Option<f64>| s.map_or_else(|| "-".to_owned(), age);
        vec![
            scope.to_owned(),
            k.queue_depth.to_string(),
            k.stuck_count.to_string(),
            k.parked_count.to_string(),
            k.delivered_recently.to_string(),
            opt_age(k.oldest_pending_age_seconds),
            opt_age(k.oldest_retry_wait_age_seconds),
        ]
    };
    table.row(row("(all)", r.global.as_ref()));
    for site in &r.sites {
        table.row(row(&site.source_site_id, site.kpis.as_ref()));
    }
    out.push_str(&table.render());
    out
}

fn site_health_text(r: &v1::ListSiteHealthResponse, now: DateTime<Utc>) -> String {
    if r.nodes.is_empty() {
        return "no site has reported its health\n".to_owned();
    }
    let mut out = format!(
        "as of {}; a node is offline once its latest report is {} old\n\n",
        time_human(r.computed_at.as_ref()),
        duration_human(r.site_offline_after.as_ref()),
    );
    let mut table = Table::new(&[
        "SITE",
        "NODE",
        "ROLE",
        "STATE",
        "LAST REPORT",
        "BUFFERED",
        "OLDEST",
        "LAST FORWARD",
        "STANDBY LAG",
        "VERSION",
    ]);
    for n in &r.nodes {
        let state = if n.online {
            "online".to_owned()
        } else {
            format!("OFFLINE since {}", time_human(n.offline_since.as_ref()))
        };
        let lag = if n.standby_lag_rows == 0 {
            "-".to_owned()
        } else {
            format!("{} ({})", n.standby_lag_rows, age(n.standby_lag_seconds))
        };
        table.row(vec![
            n.site_id.clone(),
            n.node_name.clone(),
            role_name(n.role),
            state,
            format!("{} ago", age(n.last_report_age_seconds)),
            n.buffer_depth.to_string(),
            if n.buffer_depth == 0 {
                "-".to_owned()
            } else {
                age(n.oldest_buffered_age_seconds)
            },
            age_since(now, n.last_forward_at.as_ref()),
            lag,
            n.version.clone(),
        ]);
    }
    out.push_str(&table.render());
    out
}

fn list_table(lists: &[v1::NotificationList]) -> String {
    if lists.is_empty() {
        return "no notification lists\n".to_owned();
    }
    let mut table = Table::new(&[
        "NAME",
        "TYPE",
        "FORMAT",
        "SECRET",
        "UPDATED",
        "CONSOLIDATION",
        "TARGETS",
    ]);
    for l in lists {
        let (format, secret, targets) = if is_webhook(l) {
            (
                webhook_format_name(l.webhook_format),
                set_or_not(l.webhook_secret_set),
                &l.endpoints,
            )
        } else {
            ("-".to_owned(), "-".to_owned(), &l.recipients)
        };
        table.row(vec![
            l.name.clone(),
            channel_name(l.r#type),
            format,
            secret,
            time_human(l.updated_at.as_ref()),
            l.consolidation
                .as_ref()
                .map_or_else(|| "-".to_owned(), consolidation_text),
            truncate(&targets.join(", "), MAX_CELL),
        ]);
    }
    table.render()
}

fn list_text(l: &v1::NotificationList) -> String {
    let mut fields = vec![
        ("name", l.name.clone()),
        ("type", channel_name(l.r#type)),
        ("updated", time_human(l.updated_at.as_ref())),
    ];
    if is_webhook(l) {
        fields.push(("endpoints", l.endpoints.join("\n")));
        if !l.fallback_urls.is_empty() {
            fields.push(("fallback urls", l.fallback_urls.join("\n")));
        }
        fields.push(("format", webhook_format_name(l.webhook_format)));
        fields.push(("webhook secret", set_or_not(l.webhook_secret_set)));
    } else {
        fields.push(("recipients", l.recipients.join("\n")));
    }
    if !l.status_callback_url.is_empty() {
        fields.push(("status callback", l.status_callback_url.clone()));
    }
    if let Some(c) = &l.consolidation {
        fields.push(("consolidation", consolidation_text(c)));
    }
    if let Some(e) = &l.escalation {
        let callout = super::incident::policy_text(e, &l.name);
        fields.push((
            "escalation",
            callout
                .trim_end()
                .replace("\n  ", "\n")
                .trim_start()
                .to_owned(),
        ));
    }
    key_values(&fields)
}

/// "more than 20 in 1m -> digests of at most 100": the three settings in the order they act.
fn consolidation_text(c: &v1::ListConsolidation) -> String {
    format!(
        "more than {} in {} -> digests of at most {}",
        c.threshold,
        duration_human(c.window.as_ref()),
        c.max_per_digest
    )
}

/// Secrets are write-only: all anyone sees is whether one is stored.
fn set_or_not(set: bool) -> String {
    if set { "set" } else { "not set" }.to_owned()
}

/// "10/s, burst 10", or "none" when central has no rate limit for the channel.
fn rate_limit(per_second: Option<f64>, burst: u32) -> String {
    per_second.map_or_else(
        || "none".to_owned(),
        |rate| format!("{rate}/s, burst {burst}"),
    )
}

/// The webhook channel's block; "updated" says when nothing is stored (central's defaults).
fn webhook_text(c: &v1::WebhookConfig) -> String {
    let updated = match c.updated_at.as_ref() {
        Some(at) => time_human(Some(at)),
        None => "never (central's defaults; nothing stored)".to_owned(),
    };
    key_values(&[
        ("timeout", duration_human(c.timeout.as_ref())),
        ("max retries", c.max_retries.to_string()),
        ("retry delay", duration_human(c.retry_delay.as_ref())),
        ("backoff", backoff_name(c.backoff)),
        (
            "max retry delay",
            duration_human(c.max_retry_delay.as_ref()),
        ),
        ("max connections", c.max_concurrent_connections.to_string()),
        (
            "rate limit",
            rate_limit(c.rate_limit_per_second, c.rate_limit_burst),
        ),
        ("updated", updated),
    ])
}

/// The password line for password authentication, the OAuth client's lines for XOAUTH2: each
/// block shows the settings its mechanism uses.
fn smtp_text(c: &v1::SmtpConfig) -> String {
    let auth = auth_name(c.auth_mechanism, &c.username);
    let mut fields = vec![
        ("host", c.host.clone()),
        ("port", c.port.to_string()),
        ("tls", tls_name(c.tls_mode)),
        ("auth", auth.clone()),
        ("username", or_dash(&c.username)),
    ];
    if auth == "xoauth2" {
        fields.extend([
            ("oauth token url", or_dash(&c.oauth_token_url)),
            ("oauth client id", or_dash(&c.oauth_client_id)),
            ("oauth client secret", set_or_not(c.oauth_client_secret_set)),
            ("oauth scope", or_dash(&c.oauth_scope)),
        ]);
    } else {
        fields.push(("password", set_or_not(c.password_set)));
    }
    fields.extend([
        ("from", c.from_address.clone()),
        ("max retries", c.max_retries.to_string()),
        ("retry delay", duration_human(c.retry_delay.as_ref())),
        ("backoff", backoff_name(c.backoff)),
        (
            "max retry delay",
            duration_human(c.max_retry_delay.as_ref()),
        ),
        ("max connections", c.max_concurrent_connections.to_string()),
        (
            "rate limit",
            rate_limit(c.rate_limit_per_second, c.rate_limit_burst),
        ),
        ("timeout", duration_human(c.timeout.as_ref())),
        (
            "overall timeout",
            duration_human(c.overall_timeout.as_ref()),
        ),
        (
            "fallback relays",
            if c.fallback_relays.is_empty() {
                "-".to_owned()
            } else {
                c.fallback_relays
                    .iter()
                    .map(|r| format!("{}:{} {}", r.host, r.port, tls_name(r.tls_mode)))
                    .collect::<Vec<_>>()
                    .join(", ")
            },
        ),
        ("updated", time_human(c.updated_at.as_ref())),
    ]);
    key_values(&fields)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notification_table_marks_stuck_rows_and_offers_the_next_page() {
        let now = "2026-11-21T10:05:00Z".parse::<DateTime<Utc>>().unwrap();
        let row = v1::NotificationStatusView {
            notification_id: "0190-a".into(),
            status: v1::NotificationStatus::Pending.into(),
            r#type: v1::NotificationType::Email.into(),
            list_name: "ops".into(),
            source_site_id: "site-a".into(),
            subject: "Tank 4 high level".into(),
            created_at: Some(prost_types::Timestamp {
                seconds: now.timestamp() - 192,
                nanos: 0,
            }),
            stuck: true,
            priority: v1::NotificationPriority::Critical.into(),
            ..Default::default()
        };
        let text = notifications(&[row], "tok", now);
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[0].starts_with("ID "), "{text}");
        assert!(
            lines[0].contains(" STATUS           PRIORITY  TYPE "),
            "{text}"
        );
        assert!(
            lines[1].contains("pending (stuck)  critical  email "),
            "{text}"
        );
        assert!(lines[1].contains("3m 12s"), "{text}");
        assert!(lines[2].contains("--page-token tok"), "{text}");
    }

    #[test]
    fn a_scheduled_row_shows_its_time_and_says_it_waits_for_it() {
        let now = "2026-11-21T10:05:00Z".parse::<DateTime<Utc>>().unwrap();
        let at = |offset: i64| {
            Some(prost_types::Timestamp {
                seconds: now.timestamp() + offset,
                nanos: 0,
            })
        };
        let waiting = v1::NotificationStatusView {
            notification_id: "0190-s".into(),
            status: v1::NotificationStatus::Pending.into(),
            created_at: at(-60),
            deliver_after: at(3600),
            ..Default::default()
        };
        let text = notifications(std::slice::from_ref(&waiting), "", now);
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[0].contains(" DELIVER AFTER "), "{text}");
        assert!(lines[1].contains("pending (scheduled)"), "{text}");
        assert!(lines[1].contains("2026-11-21T11:05:00Z"), "{text}");
        assert_eq!(
            field(&key_values(&status_fields(&waiting, now)), "deliver after"),
            Some("2026-11-21T11:05:00Z")
        );
        // Once delivered (or its time passed), it no longer waits; its time stays shown.
        let delivered = v1::NotificationStatusView {
            status: v1::NotificationStatus::Delivered.into(),
            ..waiting.clone()
        };
        let text = notifications(&[delivered], "", now);
        assert!(!text.contains("(scheduled)"), "{text}");
        assert!(text.contains("2026-11-21T11:05:00Z"), "{text}");
        let unscheduled = v1::NotificationStatusView {
            deliver_after: None,
            ..waiting
        };
        let text = notifications(&[unscheduled], "", now);
        assert!(!text.contains("(scheduled)"), "{text}");
    }

    #[test]
    fn smtp_block_says_whether_a_password_is_set() {
        let text = smtp_text(&v1::SmtpConfig {
            host: "relay".into(),
            password_set: true,
            ..Default::default()
        });
        assert_eq!(field(&text, "password"), Some("set"), "{text}");
        assert_eq!(field(&text, "auth"), Some("none"), "{text}");
        assert_eq!(field(&text, "rate limit"), Some("none"), "{text}");
        assert!(!text.contains("oauth"), "{text}");
    }

    #[test]
    fn status_and_detail_blocks_show_the_priority() {
        let now = Utc::now();
        let view = v1::NotificationStatusView {
            notification_id: "0190-a".into(),
            priority: v1::NotificationPriority::Low.into(),
            ..Default::default()
        };
        let text = render(&Report::Status(view.clone()), now);
        assert_eq!(field(&text, "priority"), Some("low"), "{text}");
        let text = render(
            &Report::Detail(v1::NotificationDetail {
                notification: Some(view),
                ..Default::default()
            }),
            now,
        );
        assert_eq!(field(&text, "priority"), Some("low"), "{text}");
        let unspecified = render(&Report::Status(v1::NotificationStatusView::default()), now);
        assert_eq!(
            field(&unspecified, "priority"),
            Some("normal"),
            "{unspecified}"
        );
    }

    /// The value of a `key  value` line.
    fn field<'a>(text: &'a str, key: &str) -> Option<&'a str> {
        text.lines().find_map(|line| {
            let rest = line.strip_prefix(key)?;
            rest.starts_with("  ").then(|| rest.trim_start())
        })
    }

    #[test]
    fn smtp_block_shows_the_oauth_client_backoff_and_rate_limit() {
        let text = smtp_text(&v1::SmtpConfig {
            host: "smtp.office365.com".into(),
            auth_mechanism: v1::SmtpAuthMechanism::Xoauth2.into(),
            username: "outbox@plant.test".into(),
            oauth_token_url: "https://login.example.test/token".into(),
            oauth_client_id: "client-1".into(),
            oauth_client_secret_set: true,
            oauth_scope: "https://outlook.office365.com/.default".into(),
            backoff: v1::RetryBackoff::Exponential.into(),
            max_retry_delay: Some(prost_types::Duration {
                seconds: 3600,
                nanos: 0,
            }),
            rate_limit_per_second: Some(0.5),
            rate_limit_burst: 2,
            overall_timeout: Some(prost_types::Duration {
                seconds: 120,
                nanos: 0,
            }),
            ..Default::default()
        });
        for (key, value) in [
            ("auth", "xoauth2"),
            ("oauth token url", "https://login.example.test/token"),
            ("oauth client id", "client-1"),
            ("oauth client secret", "set"),
            ("oauth scope", "https://outlook.office365.com/.default"),
            ("backoff", "exponential"),
            ("max retry delay", "1h"),
            ("rate limit", "0.5/s, burst 2"),
            ("overall timeout", "2m"),
        ] {
            assert_eq!(field(&text, key), Some(value), "{key}:\n{text}");
        }
        assert!(!text.contains("password"), "{text}");
    }

    fn webhook_list() -> v1::NotificationList {
        v1::NotificationList {
            name: "hooks".into(),
            r#type: v1::NotificationType::Webhook.into(),
            endpoints: vec![
                "https://hooks.example.test/a".into(),
                "https://hooks.example.test/b".into(),
            ],
            webhook_format: v1::WebhookFormat::Teams.into(),
            webhook_secret_set: true,
            ..Default::default()
        }
    }

    #[test]
    fn webhook_lists_show_endpoints_format_and_whether_signed() {
        let text = list_text(&webhook_list());
        assert!(
            text.contains(
                "endpoints       https://hooks.example.test/a\n                \
                 https://hooks.example.test/b\n"
            ),
            "{text}"
        );
        assert_eq!(field(&text, "format"), Some("teams"), "{text}");
        assert_eq!(field(&text, "webhook secret"), Some("set"), "{text}");
        assert!(!text.contains("recipients"), "{text}");

        let email = v1::NotificationList {
            name: "ops".into(),
            r#type: v1::NotificationType::Email.into(),
            recipients: vec!["a@plant.test".into()],
            ..Default::default()
        };
        let table = list_table(&[webhook_list(), email]);
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(
            lines[0], "NAME   TYPE     FORMAT  SECRET  UPDATED  CONSOLIDATION  TARGETS",
            "{table}"
        );
        assert_eq!(
            lines[1],
            "hooks  webhook  teams   set     -        -              \
             https://hooks.example.test/a, https://hooks.example.test/b"
        );
        assert_eq!(
            lines[2],
            "ops    email    -       -       -        -              a@plant.test"
        );
    }

    fn consolidated(list: v1::NotificationList) -> v1::NotificationList {
        v1::NotificationList {
            consolidation: Some(v1::ListConsolidation {
                threshold: 20,
                window: Some(prost_types::Duration {
                    seconds: 60,
                    nanos: 0,
                }),
                max_per_digest: 100,
            }),
            ..list
        }
    }

    #[test]
    fn lists_show_their_consolidation_and_nothing_when_off() {
        let text = list_text(&consolidated(webhook_list()));
        assert_eq!(
            field(&text, "consolidation"),
            Some("more than 20 in 1m -> digests of at most 100"),
            "{text}"
        );
        let off = list_text(&webhook_list());
        assert!(!off.contains("consolidation"), "{off}");

        let table = list_table(&[consolidated(webhook_list())]);
        let row = table.lines().nth(1).unwrap_or_default();
        assert!(
            row.contains("  more than 20 in 1m -> digests of at most 100  https://"),
            "{table}"
        );
    }

    #[test]
    fn history_names_the_digest_an_attempt_went_out_in() {
        let attempt = |sequence, digest_id: &str| v1::HistoryEntry {
            sequence,
            kind: v1::HistoryEntryKind::DeliveryAttempt.into(),
            outcome: v1::AttemptOutcome::Delivered.into(),
            lease_epoch: 3,
            digest_id: digest_id.into(),
            ..Default::default()
        };
        let text = detail_text(
            &v1::NotificationDetail {
                notification: Some(v1::NotificationStatusView::default()),
                history: vec![attempt(1, ""), attempt(2, "0190-digest")],
                ..Default::default()
            },
            Utc::now(),
        );
        let rows: Vec<&str> = text.lines().skip_while(|l| !l.starts_with("#")).collect();
        assert!(rows[1].contains(" lease 3 "), "{text}");
        assert!(!rows[1].contains("digest"), "{text}");
        assert!(rows[2].contains(" lease 3, digest 0190-digest "), "{text}");
    }
}
