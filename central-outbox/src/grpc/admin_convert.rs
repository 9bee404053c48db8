//! Proto <-> domain conversions for the admin API: filters, history, KPIs, lists and SMTP
//! settings. Every inbound field is checked here, and errors name the field as the proto spells
//! it, so an operator's typo comes back as "filter.statuses: ...", not as a database error.

use std::time::Duration;

use chrono::{DateTime, Utc};
use outbox_proto::time::{from_duration, from_timestamp, to_duration, to_timestamp};
use outbox_proto::v1;

use super::convert::{notification_type_to_proto, state_view};
use crate::domain::channel::{
    EmailAddress, NotificationList, Secret, SmtpAuth, SmtpSettings, Stored, TlsMode,
};
use crate::domain::delivery::AttemptOutcome;
use crate::domain::history::{HistoryEntry, HistoryEvent, OperatorAction};
use crate::domain::kpi::KpiValues;
use crate::domain::query::NotificationFilter;
use crate::domain::status::Status;
use crate::domain::{ContentError, NotificationType};
use crate::store::NotificationDetail;

/// Longest site id or list name a filter may name (longer ones cannot match any stored row).
const MAX_FILTER_NAME_CHARS: usize = 256;

/// A status a caller may filter on: FORWARDING is the site's, never central's.
pub fn status_from_proto(value: i32, field: &'static str) -> Result<Status, ContentError> {
    match v1::NotificationStatus::try_from(value) {
        Ok(v1::NotificationStatus::Pending) => Ok(Status::Pending),
        Ok(v1::NotificationStatus::Retrying) => Ok(Status::Retrying),
        Ok(v1::NotificationStatus::Delivered) => Ok(Status::Delivered),
        Ok(v1::NotificationStatus::Parked) => Ok(Status::Parked),
        Ok(v1::NotificationStatus::Discarded) => Ok(Status::Discarded),
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
    Ok((!text.is_empty()).then_some(text))
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

/// Checks a filter. `stuck_before` is the instant before which a live row counts as stuck (now
/// minus the configured threshold); it applies only when the filter asks for stuck rows.
pub fn filter(
    msg: Option<v1::NotificationFilter>,
    stuck_before: DateTime<Utc>,
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
    NotificationFilter {
        statuses,
        kind: optional_type(msg.r#type, "filter.type")?,
        source_site_id: optional_name(msg.source_site_id, "filter.source_site_id")?,
        list_name: optional_name(msg.list_name, "filter.list_name")?,
        created_from: optional_time(msg.created_from, "filter.created_from")?,
        created_to: optional_time(msg.created_to, "filter.created_to")?,
        stuck_before: msg.stuck_only.then_some(stuck_before),
        subject_contains: (!msg.subject_contains.is_empty()).then_some(msg.subject_contains),
    }
    .check()
}

/// A filter for a bulk operator action: only Parked rows can be acted on, so the filter may
/// name no status or exactly PARKED.
pub fn action_filter(
    msg: v1::NotificationFilter,
    stuck_before: DateTime<Utc>,
) -> Result<NotificationFilter, ContentError> {
    let filter = filter(Some(msg), stuck_before)?;
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
    Ok(filter)
}

fn outcome_to_proto(outcome: AttemptOutcome) -> v1::AttemptOutcome {
    match outcome {
        AttemptOutcome::InFlight => v1::AttemptOutcome::InFlight,
        AttemptOutcome::Delivered => v1::AttemptOutcome::Delivered,
        AttemptOutcome::TransientFailure => v1::AttemptOutcome::TransientFailure,
        AttemptOutcome::PermanentFailure => v1::AttemptOutcome::PermanentFailure,
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
        } => {
            view.kind = v1::HistoryEntryKind::DeliveryAttempt.into();
            view.outcome = outcome_to_proto(outcome).into();
            view.duration_ms = duration.map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
            view.lease_epoch = lease_epoch;
        }
        HistoryEvent::Operator { action, actor } => {
            view.kind = match action {
                OperatorAction::Retry => v1::HistoryEntryKind::OperatorRetry,
                OperatorAction::Discard => v1::HistoryEntryKind::OperatorDiscard,
            }
            .into();
            view.actor = actor;
        }
    }
    view
}

pub fn detail_view(detail: NotificationDetail, stuck: bool) -> v1::NotificationDetail {
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

pub fn kpi_values(values: &KpiValues) -> v1::KpiValues {
    v1::KpiValues {
        queue_depth: values.queue_depth,
        stuck_count: values.stuck_count,
        parked_count: values.parked_count,
        delivered_recently: values.delivered_recently,
        oldest_pending_age_seconds: values.oldest_pending_age.map(|d| d.as_secs_f64()),
        oldest_retry_wait_age_seconds: values.oldest_retry_wait_age.map(|d| d.as_secs_f64()),
    }
}

pub fn list_view(list: Stored<NotificationList>) -> v1::NotificationList {
    v1::NotificationList {
        name: list.value.name.as_str().to_owned(),
        r#type: notification_type_to_proto(list.value.kind).into(),
        recipients: list
            .value
            .recipients
            .iter()
            .map(|r| r.as_str().to_owned())
            .collect(),
        updated_at: Some(to_timestamp(list.updated_at)),
    }
}

/// Checks a list to store. An unset type means EMAIL, as it does for `Send`.
pub fn list_from_proto(
    msg: Option<v1::NotificationList>,
) -> Result<NotificationList, ContentError> {
    let msg = msg.ok_or_else(|| ContentError::new("list", "is required"))?;
    let kind = optional_type(msg.r#type, "list.type")?.unwrap_or(NotificationType::Email);
    NotificationList::parse(msg.name, kind, &msg.recipients).map_err(|e| {
        ContentError::new(
            match e.field {
                "list_name" | "name" => "list.name",
                "type" => "list.type",
                _ => "list.recipients",
            },
            e.problem,
        )
    })
}

pub fn smtp_view(stored: Stored<SmtpSettings>) -> v1::SmtpConfig {
    let s = stored.value;
    let (username, password_set) = match &s.auth {
        SmtpAuth::None => (String::new(), false),
        SmtpAuth::Password { username, .. } => (username.clone(), true),
    };
    v1::SmtpConfig {
        host: s.host,
        port: u32::from(s.port),
        tls_mode: match s.tls {
            TlsMode::None => v1::SmtpTlsMode::None,
            TlsMode::StartTls => v1::SmtpTlsMode::Starttls,
            TlsMode::Implicit => v1::SmtpTlsMode::Tls,
        }
        .into(),
        username,
        password_set,
        from_address: s.from_address.as_str().to_owned(),
        max_retries: u32::try_from(s.max_retries).unwrap_or(0),
        retry_delay: Some(to_duration(s.retry_delay)),
        max_concurrent_connections: s.max_concurrent_connections,
        timeout: Some(to_duration(s.timeout)),
        updated_at: Some(to_timestamp(stored.updated_at)),
    }
}

/// The defaults an unset (zero) field takes, as the proto documents them.
const DEFAULT_MAX_RETRIES: u32 = 10;
const DEFAULT_RETRY_DELAY: Duration = Duration::from_secs(60);
const DEFAULT_CONNECTIONS: u32 = 4;
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

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

/// Checks new SMTP settings. An unset password keeps `current`'s, if it has one for the same
/// username: operators can change the host without re-entering a secret.
pub fn smtp_from_proto(
    msg: v1::UpsertSmtpConfigRequest,
    current: Option<&SmtpSettings>,
) -> Result<SmtpSettings, ContentError> {
    let port = u16::try_from(msg.port)
        .map_err(|_| ContentError::new("port", "must be between 1 and 65535"))?;
    let tls = match v1::SmtpTlsMode::try_from(msg.tls_mode) {
        Ok(v1::SmtpTlsMode::None) => TlsMode::None,
        Ok(v1::SmtpTlsMode::Starttls) => TlsMode::StartTls,
        Ok(v1::SmtpTlsMode::Tls) => TlsMode::Implicit,
        Ok(v1::SmtpTlsMode::Unspecified) | Err(_) => {
            return Err(ContentError::new(
                "tls_mode",
                "must be SMTP_TLS_MODE_NONE, SMTP_TLS_MODE_STARTTLS or SMTP_TLS_MODE_TLS",
            ));
        }
    };
    let auth = if msg.username.is_empty() {
        if msg.password.is_some() {
            return Err(ContentError::new(
                "password",
                "given without a username; set username too, or leave both empty",
            ));
        }
        SmtpAuth::None
    } else {
        let password = match (msg.password, current.map(|c| &c.auth)) {
            (Some(password), _) => Secret::new(password),
            (None, Some(SmtpAuth::Password { username, password }))
                if *username == msg.username =>
            {
                password.clone()
            }
            (None, _) => {
                return Err(ContentError::new(
                    "password",
                    "required when setting a username (or changing it)",
                ));
            }
        };
        SmtpAuth::Password {
            username: msg.username,
            password,
        }
    };
    let max_retries = match msg.max_retries {
        0 => DEFAULT_MAX_RETRIES,
        n => n,
    };
    let connections = match msg.max_concurrent_connections {
        0 => DEFAULT_CONNECTIONS,
        n => n,
    };
    SmtpSettings {
        host: msg.host,
        port,
        tls,
        auth,
        from_address: EmailAddress::parse(&msg.from_address, "from_address")?,
        max_retries: i64::from(max_retries),
        retry_delay: duration_or(msg.retry_delay, DEFAULT_RETRY_DELAY, "retry_delay")?,
        max_concurrent_connections: connections,
        timeout: duration_or(msg.timeout, DEFAULT_TIMEOUT, "timeout")?,
    }
    .check()
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
        assert_eq!(s.max_retries, 10);
        assert_eq!(s.retry_delay, Duration::from_secs(60));
        assert_eq!(s.max_concurrent_connections, 4);
        assert_eq!(s.timeout, Duration::from_secs(30));
    }

    #[test]
    fn an_unset_password_keeps_the_stored_one_for_the_same_user_only() {
        let stored = smtp_from_proto(smtp_request(), None).unwrap();
        let keep = v1::UpsertSmtpConfigRequest {
            password: None,
            host: "other.plant.test".into(),
            ..smtp_request()
        };
        let updated = smtp_from_proto(keep.clone(), Some(&stored)).unwrap();
        assert_eq!(updated.auth, stored.auth);
        let other_user = v1::UpsertSmtpConfigRequest {
            username: "someone-else".into(),
            ..keep
        };
        assert_eq!(
            smtp_from_proto(other_user, Some(&stored))
                .unwrap_err()
                .field,
            "password"
        );
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

    #[test]
    fn filters_name_bad_fields() {
        let now = Utc::now();
        let bad_status = v1::NotificationFilter {
            statuses: vec![v1::NotificationStatus::Forwarding.into()],
            ..Default::default()
        };
        assert_eq!(
            filter(Some(bad_status), now).unwrap_err().field,
            "filter.statuses"
        );
        let bad_type = v1::NotificationFilter {
            r#type: 42,
            ..Default::default()
        };
        assert_eq!(
            filter(Some(bad_type), now).unwrap_err().field,
            "filter.type"
        );
        let delivered = v1::NotificationFilter {
            statuses: vec![v1::NotificationStatus::Delivered.into()],
            ..Default::default()
        };
        assert_eq!(
            action_filter(delivered, now).unwrap_err().field,
            "filter.statuses"
        );
    }

    #[test]
    fn lists_default_to_email_and_name_bad_recipients() {
        let list = list_from_proto(Some(v1::NotificationList {
            name: "ops".into(),
            recipients: vec!["a@plant.test".into()],
            ..Default::default()
        }))
        .unwrap();
        assert_eq!(list.kind, NotificationType::Email);
        let err = list_from_proto(Some(v1::NotificationList {
            name: "ops".into(),
            recipients: vec!["a@plant.test".into(), "bad".into()],
            ..Default::default()
        }))
        .unwrap_err();
        assert_eq!(err.field, "list.recipients");
        assert!(err.problem.contains("entry 2"), "{}", err.problem);
    }
}
