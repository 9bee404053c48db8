//! Proto <-> domain conversions for the admin API: filters, history, KPIs, lists and the
//! channels' settings (SMTP, webhook). Every inbound field is checked here, and errors name the field as the proto spells
//! it, so an operator's typo comes back as "filter.statuses: ...", not as a database error.

use std::borrow::Cow;
use std::time::Duration;

use chrono::{DateTime, Utc};
use outbox_proto::time::{from_duration, from_timestamp, to_duration, to_timestamp};
use outbox_proto::v1;

use super::convert::{notification_type_to_proto, state_view};
use crate::domain::channel::{
    DeliveryPolicy, EmailAddress, ListInput, ListTargets, NotificationList, RateLimit, Relay,
    Secret, SmtpAuth, SmtpAuthChange, SmtpSettings, Stored, TlsMode, WebhookSettings, defaults,
};
use crate::domain::consolidation::Consolidation;
use crate::domain::delivery::AttemptOutcome;
use crate::domain::history::{HistoryEntry, HistoryEvent, OperatorAction};
use crate::domain::kpi::{KpiValues, stuck_cutoff};
use crate::domain::query::NotificationFilter;
use crate::domain::retry::Backoff;
use crate::domain::smtp_relay::{self, SmtpRelay};
use crate::domain::status::Status;
use crate::domain::status_callback::CallOutcome;
use crate::domain::webhook::{WebhookFormat, cut_urls};
use crate::domain::{ContentError, NotificationType};
use crate::records::NotificationDetail;

/// Longest site id or list name a filter may name (longer ones cannot match any stored row).
const MAX_FILTER_NAME_CHARS: usize = 256;

/// A status a caller may filter on: FORWARDING is the site's, never central's.
pub(crate) fn status_from_proto(value: i32, field: &'static str) -> Result<Status, ContentError> {
    match v1::NotificationStatus::try_from(value) {
        Ok(v1::NotificationStatus::Pending) => Ok(Status::Pending),
        Ok(v1::NotificationStatus::Retrying) => Ok(Status::Retrying),
        Ok(v1::NotificationStatus::Delivered) => Ok(Status::Delivered),
        Ok(v1::NotificationStatus::Parked) => Ok(Status::Parked),
        Ok(v1::NotificationStatus::Discarded) => Ok(Status::Discarded),
        Ok(v1::NotificationStatus::Superseded) => Ok(Status::Superseded),
        Ok(v1::NotificationStatus::Cleared) => Ok(Status::Cleared),
        Ok(v1::NotificationStatus::Held) => Ok(Status::Held),
        Ok(v1::NotificationStatus::Acknowledged) => Ok(Status::Acknowledged),
        Ok(v1::NotificationStatus::Forwarding) => Err(ContentError::new(
            field,
            "FORWARDING is reported by site-forwarders only; central never stores it",
        )),
        Ok(v1::NotificationStatus::Unspecified) => {
            Err(ContentError::new(field, "UNSPECIFIED is not a status"))
        }
        Err(_) => Err(ContentError::new(
            field,
            format!("{value} is not a known status"),
        )),
    }
}

/// A type a caller may filter on or configure; UNSPECIFIED is `None`.
fn optional_type(
    value: i32,
    field: &'static str,
) -> Result<Option<NotificationType>, ContentError> {
    match v1::NotificationType::try_from(value) {
        Ok(v1::NotificationType::Unspecified) => Ok(None),
        Ok(v1::NotificationType::Email) => Ok(Some(NotificationType::Email)),
        Ok(v1::NotificationType::Webhook) => Ok(Some(NotificationType::Webhook)),
        Err(_) => Err(ContentError::new(
            field,
            format!("{value} is not a known notification type"),
        )),
    }
}

fn optional_name(text: String, field: &'static str) -> Result<Option<String>, ContentError> {
    if text.chars().count() > MAX_FILTER_NAME_CHARS {
        return Err(ContentError::new(
            field,
            format!("longer than {MAX_FILTER_NAME_CHARS} characters"),
        ));
    }
    no_control_characters(&text, field)?;
    Ok((!text.is_empty()).then_some(text))
}

/// No stored name or subject holds a control character (but a subject's tab), so a filter
/// with one could match nothing; refused by name instead, the same on every store (MS SQL
/// answered a NUL with a failed query, "store unavailable").
fn no_control_characters(text: &str, field: &'static str) -> Result<(), ContentError> {
    if text.chars().any(|c| c.is_control() && c != '\t') {
        return Err(ContentError::new(
            field,
            "must not contain control characters (NUL, CR, LF ...)",
        ));
    }
    Ok(())
}

fn optional_time(
    ts: Option<prost_types::Timestamp>,
    field: &'static str,
) -> Result<Option<DateTime<Utc>>, ContentError> {
    ts.map(|ts| {
        from_timestamp(&ts).ok_or_else(|| ContentError::new(field, "is not a valid timestamp"))
    })
    .transpose()
}

/// The instants a filter's relative conditions are judged at: `now` (scheduled_only: still
/// waiting for their time) and the stuck cutoff (stuck_only: now minus the configured
/// threshold).
#[derive(Debug, Clone, Copy)]
pub(crate) struct FilterClock {
    pub(crate) now: DateTime<Utc>,
    pub(crate) stuck_before: DateTime<Utc>,
}

impl FilterClock {
    pub(crate) fn at(now: DateTime<Utc>, stuck_age_threshold: Duration) -> Self {
        Self {
            now,
            stuck_before: stuck_cutoff(now, stuck_age_threshold),
        }
    }
}

/// Checks a filter; `clock` gives the instants its stuck and scheduled conditions, when asked
/// for, are judged at.
pub(crate) fn filter(
    msg: Option<v1::NotificationFilter>,
    clock: FilterClock,
) -> Result<NotificationFilter, ContentError> {
    let Some(msg) = msg else {
        return Ok(NotificationFilter::default());
    };
    let mut statuses = Vec::with_capacity(msg.statuses.len());
    for value in msg.statuses {
        let status = status_from_proto(value, "filter.statuses")?;
        if !statuses.contains(&status) {
            statuses.push(status);
        }
    }
    let mut priorities = Vec::with_capacity(msg.priorities.len());
    for value in msg.priorities {
        // UNSPECIFIED means NORMAL where a notification is sent, but in a filter it would be
        // a silent "normal": the caller must name what they look for.
        if value == i32::from(v1::NotificationPriority::Unspecified) {
            return Err(ContentError::new(
                "filter.priorities",
                "NOTIFICATION_PRIORITY_UNSPECIFIED is not a priority to filter by",
            ));
        }
        let priority = outbox_proto::submission::priority(value, "filter.priorities")?;
        if !priorities.contains(&priority) {
            priorities.push(priority);
        }
    }
    NotificationFilter {
        statuses,
        kind: optional_type(msg.r#type, "filter.type")?,
        priorities,
        condition_key: optional_name(msg.condition_key, "filter.condition_key")?,
        source_site_id: optional_name(msg.source_site_id, "filter.source_site_id")?,
        list_name: optional_name(msg.list_name, "filter.list_name")?,
        created_from: optional_time(msg.created_from, "filter.created_from")?,
        created_to: optional_time(msg.created_to, "filter.created_to")?,
        stuck_before: msg.stuck_only.then_some(clock.stuck_before),
        scheduled_after: msg.scheduled_only.then_some(clock.now),
        subject_contains: {
            no_control_characters(&msg.subject_contains, "filter.subject_contains")?;
            (!msg.subject_contains.is_empty()).then_some(msg.subject_contains)
        },
        resolved_before: None,
    }
    .check()
}

/// A filter for a bulk operator action: only Parked rows can be acted on, so the filter may
/// name no status or exactly PARKED.
pub(crate) fn action_filter(
    msg: v1::NotificationFilter,
    parked_before: Option<prost_types::Timestamp>,
    clock: FilterClock,
) -> Result<NotificationFilter, ContentError> {
    let mut filter = filter(Some(msg), clock)?;
    filter.resolved_before = optional_time(parked_before, "parked_before")?;
    if filter.statuses.iter().any(|s| *s != OperatorAction::FROM) {
        return Err(ContentError::new(
            "filter.statuses",
            "only PARKED notifications can be retried or discarded; leave statuses empty or \
             set [PARKED]",
        ));
    }
    if filter.stuck_before.is_some() {
        return Err(ContentError::new(
            "filter.stuck_only",
            "stuck notifications are never PARKED, so this would select nothing",
        ));
    }
    if filter.scheduled_after.is_some() {
        return Err(ContentError::new(
            "filter.scheduled_only",
            "notifications waiting for their time are never PARKED, so this would select nothing",
        ));
    }
    Ok(filter)
}

fn outcome_to_proto(outcome: AttemptOutcome) -> v1::AttemptOutcome {
    match outcome {
        AttemptOutcome::InFlight => v1::AttemptOutcome::InFlight,
        AttemptOutcome::Delivered => v1::AttemptOutcome::Delivered,
        AttemptOutcome::TransientFailure => v1::AttemptOutcome::TransientFailure,
        AttemptOutcome::PermanentFailure => v1::AttemptOutcome::PermanentFailure,
        AttemptOutcome::NotSent => v1::AttemptOutcome::NotSent,
    }
}

fn history_entry(entry: HistoryEntry) -> v1::HistoryEntry {
    let mut view = v1::HistoryEntry {
        sequence: entry.sequence,
        at: Some(to_timestamp(entry.at)),
        error: entry.error.unwrap_or_default(),
        ..Default::default()
    };
    match entry.event {
        HistoryEvent::Attempt {
            outcome,
            duration,
            lease_epoch,
            digest,
            provider,
        } => {
            view.kind = v1::HistoryEntryKind::DeliveryAttempt.into();
            view.provider = provider.unwrap_or_default();
            view.outcome = outcome_to_proto(outcome).into();
            view.duration_ms = duration.map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
            view.lease_epoch = lease_epoch;
            view.digest_id = digest.map(|d| d.to_string()).unwrap_or_default();
        }
        HistoryEvent::Operator { action, actor } => {
            view.kind = match action {
                OperatorAction::Retry => v1::HistoryEntryKind::OperatorRetry,
                OperatorAction::Discard => v1::HistoryEntryKind::OperatorDiscard,
            }
            .into();
            view.actor = actor;
        }
        HistoryEvent::Superseded { by } => {
            view.kind = v1::HistoryEntryKind::Superseded.into();
            view.superseded_by = by.to_string();
        }
        HistoryEvent::Cleared { actor } => {
            view.kind = v1::HistoryEntryKind::Cleared.into();
            view.actor = actor;
        }
        HistoryEvent::Acknowledged { actor } => {
            view.kind = v1::HistoryEntryKind::Acknowledged.into();
            view.actor = actor;
        }
        HistoryEvent::StatusCallback {
            outcome,
            status,
            endpoint,
            duration,
        } => {
            view.kind = v1::HistoryEntryKind::StatusCallback.into();
            view.callback_outcome = match outcome {
                CallOutcome::Answered => v1::StatusCallbackOutcome::Answered,
                CallOutcome::Failed => v1::StatusCallbackOutcome::Failed,
                CallOutcome::GivenUp => v1::StatusCallbackOutcome::GivenUp,
            }
            .into();
            view.callback_status = super::convert::status_to_proto(status).into();
            view.provider = endpoint.unwrap_or_default();
            view.duration_ms = duration.map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        }
    }
    view
}

pub(crate) fn detail_view(detail: NotificationDetail, stuck: bool) -> v1::NotificationDetail {
    v1::NotificationDetail {
        notification: Some(state_view(detail.state, stuck)),
        body: detail.body,
        type_data: detail.type_data,
        source_instance_id: detail.source_instance_id,
        source_script: detail.source_script,
        origin_execution_id: detail.origin_execution_id.unwrap_or_default(),
        origin_parent_execution_id: detail.origin_parent_execution_id.unwrap_or_default(),
        resolved_targets: detail.resolved_targets.unwrap_or_default(),
        history: detail.history.into_iter().map(history_entry).collect(),
    }
}

/// Cuts every webhook URL in `text` to scheme, host and port, in place.
fn cut(text: &mut String) {
    if let Cow::Owned(cut) = cut_urls(text) {
        *text = cut;
    }
}

/// What a reader who may not see webhook URLs whole (`Role::sees_webhook_urls`) is shown of a
/// notification's state: its LastError with every URL cut to scheme, host and port.
pub(crate) fn cut_state_urls(view: &mut v1::NotificationStatusView) {
    cut(&mut view.last_error);
}

/// The same for a notification's detail: LastError, "Delivered to" and every attempt's error.
pub(crate) fn cut_detail_urls(view: &mut v1::NotificationDetail) {
    if let Some(state) = view.notification.as_mut() {
        cut_state_urls(state);
    }
    cut(&mut view.resolved_targets);
    for entry in &mut view.history {
        cut(&mut entry.error);
    }
}

/// The same for a list: its endpoints and fallback URLs.
pub(crate) fn cut_list_urls(view: &mut v1::NotificationList) {
    view.endpoints.iter_mut().for_each(cut);
    view.fallback_urls.iter_mut().for_each(cut);
}

/// What this node delivers through fallback providers, as `GetKpis` says it.
pub(crate) fn failover_state(
    dispatching: bool,
    on_fallback: Vec<crate::on_fallback::OnFallback>,
) -> v1::FailoverState {
    v1::FailoverState {
        dispatching,
        on_fallback: on_fallback
            .into_iter()
            .map(|f| v1::OnFallback {
                channel: notification_type_to_proto(f.channel).into(),
                list: f.list.unwrap_or_default(),
                provider: u32::try_from(f.provider).unwrap_or(u32::MAX),
                provider_name: f.provider_name,
                first_provider: f.first_name,
                since: Some(to_timestamp(f.since)),
            })
            .collect(),
    }
}

pub(crate) fn kpi_values(values: &KpiValues) -> v1::KpiValues {
    v1::KpiValues {
        queue_depth: values.queue_depth,
        stuck_count: values.stuck_count,
        parked_count: values.parked_count,
        delivered_recently: values.delivered_recently,
        oldest_pending_age_seconds: values.oldest_pending_age.map(|d| d.as_secs_f64()),
        oldest_retry_wait_age_seconds: values.oldest_retry_wait_age.map(|d| d.as_secs_f64()),
    }
}

pub(crate) fn list_view(list: Stored<NotificationList>) -> v1::NotificationList {
    let mut view = v1::NotificationList {
        name: list.value.name.as_str().to_owned(),
        r#type: notification_type_to_proto(list.value.kind()).into(),
        updated_at: Some(to_timestamp(list.updated_at)),
        consolidation: list.value.consolidation.map(|c| v1::ListConsolidation {
            threshold: c.threshold(),
            window: Some(to_duration(c.window())),
            max_per_digest: c.max_per_digest(),
        }),
        escalation: list
            .value
            .escalation
            .as_ref()
            .map(super::incident_convert::policy_view),
        status_callback_url: list
            .value
            .status_callback
            .as_ref()
            .map(ToString::to_string)
            .unwrap_or_default(),
        ..Default::default()
    };
    match list.value.targets {
        ListTargets::Email(recipients) => {
            view.recipients = recipients.iter().map(ToString::to_string).collect();
        }
        ListTargets::Webhook(target) => {
            view.endpoints = target.endpoints.iter().map(ToString::to_string).collect();
            view.fallback_urls = target.fallbacks.iter().map(ToString::to_string).collect();
            view.webhook_format = match target.format {
                WebhookFormat::Generic => v1::WebhookFormat::Generic,
                WebhookFormat::Teams => v1::WebhookFormat::Teams,
                WebhookFormat::Slack => v1::WebhookFormat::Slack,
            }
            .into();
            view.webhook_secret_set = target.secret.is_some();
        }
    }
    view
}

/// Checks a list to store. An unset type means EMAIL, as it does for `Send`. An unset webhook
/// secret keeps `current`'s (so an operator can edit endpoints without re-entering it), but only
/// for endpoints on the receivers it was given for ([`NotificationList::keeping_secret_of`]); an
/// empty one removes it.
pub(crate) fn list_from_proto(
    msg: Option<v1::NotificationList>,
    current: Option<&NotificationList>,
) -> Result<NotificationList, ContentError> {
    let msg = msg.ok_or_else(|| ContentError::new("list", "is required"))?;
    let kind = optional_type(msg.r#type, "list.type")?;
    let webhook_format = match v1::WebhookFormat::try_from(msg.webhook_format) {
        Ok(v1::WebhookFormat::Unspecified) => None,
        Ok(v1::WebhookFormat::Generic) => Some(WebhookFormat::Generic),
        Ok(v1::WebhookFormat::Teams) => Some(WebhookFormat::Teams),
        Ok(v1::WebhookFormat::Slack) => Some(WebhookFormat::Slack),
        Err(_) => {
            return Err(ContentError::new(
                "list.webhook_format",
                format!("{} is not a known format", msg.webhook_format),
            ));
        }
    };
    let keep_secret = msg.webhook_secret.is_none();
    let webhook_secret = msg.webhook_secret.filter(|secret| !secret.is_empty());
    let consolidation = msg
        .consolidation
        .map(|c| {
            let window = c
                .window
                .as_ref()
                .and_then(from_duration)
                .ok_or_else(|| ContentError::new("consolidation.window", "is required"))?;
            Consolidation::parse(c.threshold, window, c.max_per_digest)
        })
        .transpose()
        .map_err(|e| ContentError::new(list_consolidation_field(e.field), e.problem))?;
    let escalation = msg
        .escalation
        .map(super::incident_convert::policy_from_proto)
        .transpose()?;
    let input = ListInput {
        name: msg.name,
        kind,
        recipients: msg.recipients,
        endpoints: msg.endpoints,
        fallback_urls: msg.fallback_urls,
        webhook_format,
        webhook_secret,
        consolidation,
        escalation,
        status_callback_url: Some(msg.status_callback_url),
    };
    NotificationList::parse(input)
        .and_then(|list| {
            if keep_secret {
                list.keeping_secret_of(current)
            } else {
                Ok(list)
            }
        })
        .map_err(|e| {
            ContentError::new(
                match e.field {
                    "list_name" | "name" => "list.name",
                    "type" => "list.type",
                    "endpoints" => "list.endpoints",
                    "fallback_urls" => "list.fallback_urls",
                    "webhook_secret" => "list.webhook_secret",
                    "status_callback_url" => "list.status_callback_url",
                    _ => "list.recipients",
                },
                e.problem,
            )
        })
}

/// The request's name of a consolidation setting's field.
fn list_consolidation_field(field: &'static str) -> &'static str {
    match field {
        "consolidation.threshold" => "list.consolidation.threshold",
        "consolidation.window" => "list.consolidation.window",
        "consolidation.max_per_digest" => "list.consolidation.max_per_digest",
        _ => "list.consolidation",
    }
}

fn tls_view(tls: TlsMode) -> i32 {
    match tls {
        TlsMode::None => v1::SmtpTlsMode::None,
        TlsMode::StartTls => v1::SmtpTlsMode::Starttls,
        TlsMode::Implicit => v1::SmtpTlsMode::Tls,
    }
    .into()
}

pub(crate) fn smtp_view(stored: Stored<SmtpSettings>) -> v1::SmtpConfig {
    let s = stored.value;
    let mut view = v1::SmtpConfig {
        host: s.host,
        port: u32::from(s.port),
        tls_mode: tls_view(s.tls),
        fallback_relays: s
            .fallback_relays
            .iter()
            .map(|relay| v1::SmtpRelay {
                host: relay.host().to_owned(),
                port: u32::from(relay.port()),
                tls_mode: tls_view(relay.tls()),
            })
            .collect(),
        from_address: s.from_address.as_str().to_owned(),
        timeout: Some(to_duration(s.timeout)),
        overall_timeout: Some(to_duration(s.overall_timeout)),
        updated_at: Some(to_timestamp(stored.updated_at)),
        ..Default::default()
    };
    match s.auth {
        SmtpAuth::None => view.auth_mechanism = v1::SmtpAuthMechanism::None.into(),
        SmtpAuth::Password { username, .. } => {
            view.auth_mechanism = v1::SmtpAuthMechanism::Password.into();
            view.username = username;
            view.password_set = true;
        }
        SmtpAuth::XOAuth2 { username, oauth } => {
            view.auth_mechanism = v1::SmtpAuthMechanism::Xoauth2.into();
            view.username = username;
            view.oauth_token_url = oauth.token_url;
            view.oauth_client_id = oauth.client_id;
            view.oauth_client_secret_set = true;
            view.oauth_scope = oauth.scope;
        }
    }
    let p = policy_view(&s.policy);
    view.max_retries = p.max_retries;
    view.retry_delay = p.retry_delay;
    view.backoff = p.backoff;
    view.max_retry_delay = p.max_retry_delay;
    view.max_concurrent_connections = p.max_concurrent_connections;
    view.rate_limit_per_second = p.rate_limit_per_second;
    view.rate_limit_burst = p.rate_limit_burst;
    view
}

/// A channel's pacing and retry fields as both channels' messages carry them.
struct PolicyFields {
    max_retries: u32,
    retry_delay: Option<prost_types::Duration>,
    backoff: i32,
    max_retry_delay: Option<prost_types::Duration>,
    max_concurrent_connections: u32,
    rate_limit_per_second: Option<f64>,
    rate_limit_burst: u32,
}

fn policy_view(p: &DeliveryPolicy) -> PolicyFields {
    let (backoff, max_retry_delay) = match p.backoff {
        Backoff::Fixed => (v1::RetryBackoff::Fixed, None),
        Backoff::Exponential { cap } => (v1::RetryBackoff::Exponential, Some(to_duration(cap))),
    };
    PolicyFields {
        max_retries: u32::try_from(p.max_retries).unwrap_or(0),
        retry_delay: Some(to_duration(p.retry_delay)),
        backoff: backoff.into(),
        max_retry_delay,
        max_concurrent_connections: p.max_concurrent_connections,
        rate_limit_per_second: p.rate_limit.map(|r| r.per_second()),
        rate_limit_burst: p.rate_limit.map_or(0, |r| r.burst()),
    }
}

/// The webhook channel's settings; `stored` false: nothing is stored and these are the
/// defaults (no `updated_at`).
pub(crate) fn webhook_view(
    s: WebhookSettings,
    updated_at: Option<DateTime<Utc>>,
) -> v1::WebhookConfig {
    let p = policy_view(&s.policy);
    v1::WebhookConfig {
        timeout: Some(to_duration(s.timeout)),
        max_retries: p.max_retries,
        retry_delay: p.retry_delay,
        backoff: p.backoff,
        max_retry_delay: p.max_retry_delay,
        max_concurrent_connections: p.max_concurrent_connections,
        rate_limit_per_second: p.rate_limit_per_second,
        rate_limit_burst: p.rate_limit_burst,
        updated_at: updated_at.map(to_timestamp),
    }
}

/// A channel's policy from its request fields: unset (zero) fields take the channel's
/// defaults (`backoff`: an unset backoff; `connections`: an unset connection count).
fn policy_from_proto(
    f: PolicyFields,
    default_backoff: Backoff,
    default_connections: u32,
) -> Result<DeliveryPolicy, ContentError> {
    let retry_delay = duration_or(f.retry_delay, defaults::RETRY_DELAY, "retry_delay")?;
    // Decoded whatever the backoff, so a malformed value is refused even where it is not used
    // (with fixed backoff it is not stored).
    let cap = duration_or(
        f.max_retry_delay,
        defaults::MAX_RETRY_DELAY,
        "max_retry_delay",
    )?;
    let backoff = match v1::RetryBackoff::try_from(f.backoff) {
        Ok(v1::RetryBackoff::Unspecified) => match default_backoff {
            Backoff::Fixed => Backoff::Fixed,
            Backoff::Exponential { .. } => Backoff::Exponential { cap },
        },
        Ok(v1::RetryBackoff::Fixed) => Backoff::Fixed,
        Ok(v1::RetryBackoff::Exponential) => Backoff::Exponential { cap },
        Err(_) => {
            return Err(ContentError::new(
                "backoff",
                format!("{} is not a known backoff", f.backoff),
            ));
        }
    };
    // 0 means unset on the wire.
    let burst = Some(f.rate_limit_burst).filter(|&n| n > 0);
    let rate_limit = RateLimit::parse(f.rate_limit_per_second, burst)?;
    Ok(DeliveryPolicy {
        max_retries: i64::from(match f.max_retries {
            0 => defaults::MAX_RETRIES,
            n => n,
        }),
        retry_delay,
        backoff,
        max_concurrent_connections: match f.max_concurrent_connections {
            0 => default_connections,
            n => n,
        },
        rate_limit,
    })
}

/// Checks new webhook settings; errors name the request's field.
pub(crate) fn webhook_from_proto(
    msg: v1::UpsertWebhookConfigRequest,
) -> Result<WebhookSettings, ContentError> {
    let policy = policy_from_proto(
        PolicyFields {
            max_retries: msg.max_retries,
            retry_delay: msg.retry_delay,
            backoff: msg.backoff,
            max_retry_delay: msg.max_retry_delay,
            max_concurrent_connections: msg.max_concurrent_connections,
            rate_limit_per_second: msg.rate_limit_per_second,
            rate_limit_burst: msg.rate_limit_burst,
        },
        defaults::WEBHOOK_BACKOFF,
        defaults::WEBHOOK_MAX_CONNECTIONS,
    )?;
    WebhookSettings {
        timeout: duration_or(msg.timeout, defaults::WEBHOOK_TIMEOUT, "timeout")?,
        policy,
    }
    .check()
}

// An unset (zero) field takes the domain's default (`domain::channel::defaults`), as the proto
// documents it.

fn duration_or(
    d: Option<prost_types::Duration>,
    default: Duration,
    field: &'static str,
) -> Result<Duration, ContentError> {
    match d {
        None => Ok(default),
        Some(d) => match from_duration(&d) {
            Some(span) if span.is_zero() => Ok(default),
            Some(span) => Ok(span),
            None => Err(ContentError::new(field, "must not be negative")),
        },
    }
}

/// The authentication the request asks for; an unset secret asks to keep the stored one, which
/// [`SmtpAuthChange::resolve`] allows only for the same identity going to the same place.
fn smtp_auth(msg: &mut v1::UpsertSmtpConfigRequest) -> Result<SmtpAuthChange, ContentError> {
    let mechanism = match v1::SmtpAuthMechanism::try_from(msg.auth_mechanism) {
        Ok(v1::SmtpAuthMechanism::Unspecified) if msg.username.is_empty() => {
            v1::SmtpAuthMechanism::None
        }
        Ok(v1::SmtpAuthMechanism::Unspecified) => v1::SmtpAuthMechanism::Password,
        Ok(m) => m,
        Err(_) => {
            return Err(ContentError::new(
                "auth_mechanism",
                format!("{} is not a known mechanism", msg.auth_mechanism),
            ));
        }
    };
    let username = std::mem::take(&mut msg.username);
    match mechanism {
        v1::SmtpAuthMechanism::None | v1::SmtpAuthMechanism::Unspecified => {
            if !username.is_empty() || msg.password.is_some() {
                return Err(ContentError::new(
                    "password",
                    "username/password given with auth_mechanism NONE",
                ));
            }
            Ok(SmtpAuthChange::None)
        }
        v1::SmtpAuthMechanism::Password => Ok(SmtpAuthChange::Password {
            username,
            password: msg.password.take().map(Secret::new),
        }),
        v1::SmtpAuthMechanism::Xoauth2 => Ok(SmtpAuthChange::XOAuth2 {
            username,
            token_url: std::mem::take(&mut msg.oauth_token_url),
            client_id: std::mem::take(&mut msg.oauth_client_id),
            client_secret: msg.oauth_client_secret.take().map(Secret::new),
            scope: std::mem::take(&mut msg.oauth_scope),
        }),
    }
}

/// Checks new SMTP settings; see [`SmtpAuthChange::resolve`] for when a stored secret is kept.
pub(crate) fn smtp_from_proto(
    mut msg: v1::UpsertSmtpConfigRequest,
    current: Option<&SmtpSettings>,
) -> Result<SmtpSettings, ContentError> {
    let port = u16::try_from(msg.port)
        .map_err(|_| ContentError::new("port", "must be between 1 and 65535"))?;
    let tls = tls_from_proto(msg.tls_mode)
        .ok_or_else(|| ContentError::new("tls_mode", format!("must be {TLS_MODES}")))?;
    let fallback_relays = fallback_relays_from_proto(&msg.fallback_relays)?;
    let auth = smtp_auth(&mut msg)?.resolve(
        Relay {
            host: &msg.host,
            port,
            tls,
        },
        current,
    )?;
    let policy = policy_from_proto(
        PolicyFields {
            max_retries: msg.max_retries,
            retry_delay: msg.retry_delay,
            backoff: msg.backoff,
            max_retry_delay: msg.max_retry_delay,
            max_concurrent_connections: msg.max_concurrent_connections,
            rate_limit_per_second: msg.rate_limit_per_second,
            rate_limit_burst: msg.rate_limit_burst,
        },
        defaults::SMTP_BACKOFF,
        defaults::SMTP_MAX_CONNECTIONS,
    )?;
    SmtpSettings {
        host: msg.host,
        port,
        tls,
        auth,
        from_address: EmailAddress::parse(&msg.from_address, "from_address")?,
        timeout: duration_or(msg.timeout, defaults::SMTP_TIMEOUT, "timeout")?,
        overall_timeout: duration_or(
            msg.overall_timeout,
            defaults::SMTP_OVERALL_TIMEOUT,
            "overall_timeout",
        )?,
        policy,
        fallback_relays,
    }
    .check()
    // The domain names the TLS mode `tls`, as the config file does; the request calls it
    // `tls_mode`.
    .map_err(|e| match e.field {
        "tls" => ContentError::new("tls_mode", e.problem),
        _ => e,
    })
}

/// What a TLS mode must be, in a refusal.
const TLS_MODES: &str = "SMTP_TLS_MODE_NONE, SMTP_TLS_MODE_STARTTLS or SMTP_TLS_MODE_TLS";

/// A request's TLS mode; `None` for UNSPECIFIED or a number the enum does not have.
fn tls_from_proto(tls_mode: i32) -> Option<TlsMode> {
    match v1::SmtpTlsMode::try_from(tls_mode) {
        Ok(v1::SmtpTlsMode::None) => Some(TlsMode::None),
        Ok(v1::SmtpTlsMode::Starttls) => Some(TlsMode::StartTls),
        Ok(v1::SmtpTlsMode::Tls) => Some(TlsMode::Implicit),
        Ok(v1::SmtpTlsMode::Unspecified) | Err(_) => None,
    }
}

/// The fallback relays of an upsert, each checked as the text form's are.
fn fallback_relays_from_proto(relays: &[v1::SmtpRelay]) -> Result<Vec<SmtpRelay>, ContentError> {
    smtp_relay::check_count(relays.len())?;
    relays
        .iter()
        .enumerate()
        .map(|(i, relay)| {
            let tls = tls_from_proto(relay.tls_mode).ok_or_else(|| {
                ContentError::new(
                    "fallback_relays",
                    format!("relay {}: tls_mode must be {TLS_MODES}", i + 1),
                )
            })?;
            SmtpRelay::new(i + 1, &relay.host, relay.port, tls)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn smtp_request() -> v1::UpsertSmtpConfigRequest {
        v1::UpsertSmtpConfigRequest {
            host: "relay.plant.test".into(),
            port: 587,
            tls_mode: v1::SmtpTlsMode::Starttls.into(),
            username: "outbox".into(),
            password: Some("s3cret".into()),
            from_address: "outbox@plant.test".into(),
            ..Default::default()
        }
    }

    #[test]
    fn smtp_defaults_fill_zero_fields() {
        let s = smtp_from_proto(smtp_request(), None).unwrap();
        assert_eq!(s.policy.max_retries, 10);
        assert_eq!(s.policy.retry_delay, Duration::from_secs(60));
        assert_eq!(s.policy.max_concurrent_connections, 4);
        assert_eq!(s.policy.backoff, Backoff::Fixed);
        assert_eq!(s.policy.rate_limit, None);
        assert_eq!(s.timeout, Duration::from_secs(30));
    }

    /// Unset fields take the domain's webhook defaults (exponential backoff, 8 connections),
    /// and bad values come back naming the request's field.
    #[test]
    fn webhook_defaults_fill_zero_fields_and_errors_name_the_field() {
        let s = webhook_from_proto(v1::UpsertWebhookConfigRequest::default()).unwrap();
        assert_eq!(s, WebhookSettings::default());
        let set = webhook_from_proto(v1::UpsertWebhookConfigRequest {
            max_retries: 2,
            backoff: v1::RetryBackoff::Fixed.into(),
            max_concurrent_connections: 3,
            rate_limit_per_second: Some(0.5),
            ..Default::default()
        })
        .unwrap();
        assert_eq!(
            (
                set.policy.max_retries,
                set.policy.backoff,
                set.policy.max_concurrent_connections
            ),
            (2, Backoff::Fixed, 3)
        );
        assert_eq!(set.policy.rate_limit.map(|r| r.burst()), Some(1));
        let view = webhook_view(set.clone(), None);
        assert_eq!(view.updated_at, None);
        assert_eq!(view.backoff(), v1::RetryBackoff::Fixed);
        for (bad, field) in [
            (
                v1::UpsertWebhookConfigRequest {
                    max_concurrent_connections: 1000,
                    ..Default::default()
                },
                "max_concurrent_connections",
            ),
            (
                v1::UpsertWebhookConfigRequest {
                    rate_limit_per_second: Some(-1.0),
                    ..Default::default()
                },
                "rate_limit_per_second",
            ),
            (
                v1::UpsertWebhookConfigRequest {
                    backoff: 9,
                    ..Default::default()
                },
                "backoff",
            ),
            (
                v1::UpsertWebhookConfigRequest {
                    timeout: Some(prost_types::Duration {
                        seconds: -1,
                        nanos: 0,
                    }),
                    ..Default::default()
                },
                "timeout",
            ),
            // Malformed even where unused (fixed backoff does not store it).
            (
                v1::UpsertWebhookConfigRequest {
                    backoff: v1::RetryBackoff::Fixed.into(),
                    max_retry_delay: Some(prost_types::Duration {
                        seconds: -1,
                        nanos: 0,
                    }),
                    ..Default::default()
                },
                "max_retry_delay",
            ),
            // Finer than the milliseconds the stores keep.
            (
                v1::UpsertWebhookConfigRequest {
                    retry_delay: Some(prost_types::Duration {
                        seconds: 0,
                        nanos: 1,
                    }),
                    ..Default::default()
                },
                "retry_delay",
            ),
        ] {
            assert_eq!(webhook_from_proto(bad).unwrap_err().field, field);
        }
    }

    #[test]
    fn an_unset_password_keeps_the_stored_one_for_the_same_user_and_relay_only() {
        let stored = smtp_from_proto(smtp_request(), None).unwrap();
        let keep = v1::UpsertSmtpConfigRequest {
            password: None,
            max_retries: 3,
            ..smtp_request()
        };
        let updated = smtp_from_proto(keep.clone(), Some(&stored)).unwrap();
        assert_eq!(updated.policy.max_retries, 3);
        assert_eq!(updated.auth, stored.auth);
        for moved in [
            v1::UpsertSmtpConfigRequest {
                host: "other.plant.test".into(),
                ..keep.clone()
            },
            v1::UpsertSmtpConfigRequest {
                username: "someone-else".into(),
                ..keep.clone()
            },
        ] {
            assert_eq!(
                smtp_from_proto(moved, Some(&stored)).unwrap_err().field,
                "password"
            );
        }
        // AUTH in clear off this host is refused naming the request's field.
        let in_clear = v1::UpsertSmtpConfigRequest {
            tls_mode: v1::SmtpTlsMode::None.into(),
            ..smtp_request()
        };
        let err = smtp_from_proto(in_clear, Some(&stored)).unwrap_err();
        assert_eq!(err.field, "tls_mode");
        assert!(err.problem.contains("loopback"), "{err}");
    }

    /// Secrets are write-only: the views carry a "set" flag, never the value.
    #[test]
    fn views_say_whether_a_secret_is_set_and_never_carry_it() {
        let now = Utc::now();
        let password = smtp_from_proto(smtp_request(), None).unwrap();
        let view = smtp_view(Stored {
            value: password,
            updated_at: now,
        });
        assert!(view.password_set && !view.oauth_client_secret_set);
        assert!(!format!("{view:?}").contains("s3cret"), "{view:?}");
        let xoauth2 = smtp_from_proto(
            v1::UpsertSmtpConfigRequest {
                auth_mechanism: v1::SmtpAuthMechanism::Xoauth2.into(),
                password: None,
                oauth_token_url: "https://login.plant.test/token".into(),
                oauth_client_id: "outbox".into(),
                oauth_client_secret: Some("client-s3cret-value".into()),
                ..smtp_request()
            },
            None,
        )
        .unwrap();
        let view = smtp_view(Stored {
            value: xoauth2,
            updated_at: now,
        });
        assert!(view.oauth_client_secret_set && !view.password_set);
        assert!(!format!("{view:?}").contains("client-s3cret"), "{view:?}");
        let list = list_from_proto(
            Some(v1::NotificationList {
                name: "hooks".into(),
                r#type: v1::NotificationType::Webhook.into(),
                endpoints: vec!["https://hooks.plant.test/a".into()],
                webhook_secret: Some("hook-secret-0123456789".into()),
                ..Default::default()
            }),
            None,
        )
        .unwrap();
        let view = list_view(Stored {
            value: list,
            updated_at: now,
        });
        assert!(view.webhook_secret_set);
        assert_eq!(view.webhook_secret, None);
        assert!(!format!("{view:?}").contains("hook-secret"), "{view:?}");
    }

    #[test]
    fn fallback_urls_round_trip_are_cut_for_readers_and_named_when_bad() {
        let msg = v1::NotificationList {
            name: "hooks".into(),
            r#type: v1::NotificationType::Webhook.into(),
            endpoints: vec!["https://hooks.plant.test/a".into()],
            fallback_urls: vec!["https://backup.plant.test/s3cret-path".into()],
            ..Default::default()
        };
        let list = list_from_proto(Some(msg.clone()), None).unwrap();
        let mut view = list_view(Stored {
            value: list,
            updated_at: Utc::now(),
        });
        assert_eq!(view.fallback_urls, msg.fallback_urls);
        cut_list_urls(&mut view);
        assert_eq!(view.fallback_urls, ["https://backup.plant.test/\u{2026}"]);
        let bad = v1::NotificationList {
            fallback_urls: vec!["http://backup.plant.test/".into()],
            ..msg
        };
        let err = list_from_proto(Some(bad), None).unwrap_err();
        assert_eq!(err.field, "list.fallback_urls", "{err}");
        assert!(err.problem.starts_with("entry 1: "), "{err}");
    }

    #[test]
    fn bad_smtp_fields_are_named() {
        type Breaker = fn(&mut v1::UpsertSmtpConfigRequest);
        let cases: Vec<(&str, Breaker)> = vec![
            ("port", |m| m.port = 70_000),
            ("port", |m| m.port = 0),
            ("tls_mode", |m| m.tls_mode = 0),
            ("host", |m| m.host.clear()),
            ("from_address", |m| m.from_address = "nope".into()),
            ("password", |m| m.username.clear()),
            ("timeout", |m| {
                m.timeout = Some(prost_types::Duration {
                    seconds: -5,
                    nanos: 0,
                })
            }),
        ];
        for (field, break_it) in cases {
            let mut msg = smtp_request();
            break_it(&mut msg);
            assert_eq!(smtp_from_proto(msg, None).unwrap_err().field, field);
        }
    }

    fn clock(now: DateTime<Utc>) -> FilterClock {
        FilterClock::at(now, Duration::from_secs(600))
    }

    /// scheduled_only selects the rows still waiting for their time at the query's `now`; a
    /// bulk action refuses it by name, as it refuses stuck_only.
    #[test]
    fn scheduled_only_is_judged_now_and_refused_for_bulk_actions() {
        let now = Utc::now();
        let msg = v1::NotificationFilter {
            scheduled_only: true,
            ..Default::default()
        };
        let checked = filter(Some(msg.clone()), clock(now)).unwrap();
        assert_eq!(checked.scheduled_after, Some(now));
        assert_eq!(checked.stuck_before, None);
        assert_eq!(
            filter(Some(v1::NotificationFilter::default()), clock(now))
                .unwrap()
                .scheduled_after,
            None
        );
        let err = action_filter(msg, None, clock(now)).unwrap_err();
        assert_eq!(err.field, "filter.scheduled_only");
    }

    #[test]
    fn filters_name_bad_fields() {
        let now = Utc::now();
        for (msg, field) in [
            (
                v1::NotificationFilter {
                    source_site_id: "\0\u{ff}".into(),
                    ..Default::default()
                },
                "filter.source_site_id",
            ),
            (
                v1::NotificationFilter {
                    list_name: "ops\r\n".into(),
                    ..Default::default()
                },
                "filter.list_name",
            ),
            (
                v1::NotificationFilter {
                    subject_contains: "tank\0".into(),
                    ..Default::default()
                },
                "filter.subject_contains",
            ),
            (
                v1::NotificationFilter {
                    created_from: Some(prost_types::Timestamp {
                        seconds: 253_402_300_800,
                        nanos: 0,
                    }),
                    ..Default::default()
                },
                "filter.created_from",
            ),
        ] {
            assert_eq!(filter(Some(msg), clock(now)).unwrap_err().field, field);
        }
        let bad_status = v1::NotificationFilter {
            statuses: vec![v1::NotificationStatus::Forwarding.into()],
            ..Default::default()
        };
        assert_eq!(
            filter(Some(bad_status), clock(now)).unwrap_err().field,
            "filter.statuses"
        );
        let bad_type = v1::NotificationFilter {
            r#type: 42,
            ..Default::default()
        };
        assert_eq!(
            filter(Some(bad_type), clock(now)).unwrap_err().field,
            "filter.type"
        );
        let delivered = v1::NotificationFilter {
            statuses: vec![v1::NotificationStatus::Delivered.into()],
            ..Default::default()
        };
        assert_eq!(
            action_filter(delivered, None, clock(now))
                .unwrap_err()
                .field,
            "filter.statuses"
        );
    }

    #[test]
    fn lists_default_to_email_and_name_bad_recipients() {
        let list = list_from_proto(
            Some(v1::NotificationList {
                name: "ops".into(),
                recipients: vec!["a@plant.test".into()],
                ..Default::default()
            }),
            None,
        )
        .unwrap();
        assert_eq!(list.kind(), NotificationType::Email);
        let err = list_from_proto(
            Some(v1::NotificationList {
                name: "ops".into(),
                recipients: vec!["a@plant.test".into(), "bad".into()],
                ..Default::default()
            }),
            None,
        )
        .unwrap_err();
        assert_eq!(err.field, "list.recipients");
        assert!(err.problem.contains("entry 2"), "{}", err.problem);
    }
}
