//! `--json`: one JSON document per command on stdout, for scripts.
//!
//! The shape is a stable interface: field names are the proto field names (snake_case), enum
//! values their short lower-case names (`"parked"`), instants RFC 3339 UTC strings, durations
//! proto3 JSON strings (`"60s"`), counts plain numbers. Unset timestamps and optional figures are
//! `null` rather than absent, so a script can index every field without checking first. There is
//! no secret anywhere (password, OAuth client secret, webhook signing secret): central never
//! returns one, only `*_set` flags saying whether one is stored.

use outbox_proto::v1;
use serde_json::{Value, json};

use super::{
    auth_name, backoff_name, channel_name, duration_json, history_kind_name, is_webhook,
    outcome_name, priority_name, role_name, status_name, time_json, tls_name, webhook_format_name,
};
use crate::commands::Report;

pub(crate) fn render(report: &Report) -> Value {
    match report {
        Report::Notifications {
            rows,
            next_page_token,
        } => json!({
            "notifications": rows.iter().map(status_view).collect::<Vec<_>>(),
            "next_page_token": next_page_token,
        }),
        Report::Status(view) => status_view(view),
        Report::Detail(detail) => notification_detail(detail),
        Report::Acted { view, .. } => status_view(view),
        Report::Bulk { result, .. } => bulk(result),
        Report::Kpis(kpis) => kpi_response(kpis),
        Report::Sites(sites) => site_health(sites),
        Report::Lists(lists) => json!({
            "lists": lists.iter().map(notification_list).collect::<Vec<_>>(),
        }),
        Report::List(list) => notification_list(list),
        Report::ListDeleted(name) => json!({ "name": name, "deleted": true }),
        Report::Smtp(config) => smtp_config(config),
        Report::SmtpDeleted => json!({ "deleted": true }),
        Report::Webhook(config) => webhook_config(config),
        Report::Incidents(list) => super::incident::list_json(list),
        Report::Incident(detail) => super::incident::detail_json(detail),
        Report::IncidentAcknowledged(answer) => super::incident::acknowledged_json(answer),
    }
}

pub(crate) fn status_view(v: &v1::NotificationStatusView) -> Value {
    json!({
        "notification_id": v.notification_id,
        "status": status_name(v.status),
        "type": channel_name(v.r#type),
        "priority": priority_name(v.priority),
        "condition_key": v.condition_key,
        "list_name": v.list_name,
        "source_site_id": v.source_site_id,
        "subject": v.subject,
        "retry_count": v.retry_count,
        "last_error": v.last_error,
        "stuck": v.stuck,
        "deliver_after": time_json(v.deliver_after.as_ref()),
        "created_at": time_json(v.created_at.as_ref()),
        "site_enqueued_at": time_json(v.site_enqueued_at.as_ref()),
        "last_attempt_at": time_json(v.last_attempt_at.as_ref()),
        "next_attempt_at": time_json(v.next_attempt_at.as_ref()),
        "delivered_at": time_json(v.delivered_at.as_ref()),
        "resolved_at": time_json(v.resolved_at.as_ref()),
    })
}

fn notification_detail(d: &v1::NotificationDetail) -> Value {
    json!({
        "notification": d.notification.as_ref().map(status_view),
        "body": d.body,
        "type_data": d.type_data,
        "source_instance_id": d.source_instance_id,
        "source_script": d.source_script,
        "origin_execution_id": d.origin_execution_id,
        "origin_parent_execution_id": d.origin_parent_execution_id,
        "resolved_targets": d.resolved_targets,
        "history": d.history.iter().map(history_entry).collect::<Vec<_>>(),
    })
}

fn history_entry(h: &v1::HistoryEntry) -> Value {
    json!({
        "sequence": h.sequence,
        "kind": history_kind_name(h.kind),
        "outcome": outcome_name(h.outcome),
        "at": time_json(h.at.as_ref()),
        "duration_ms": h.duration_ms,
        "error": h.error,
        "lease_epoch": h.lease_epoch,
        "actor": h.actor,
        "superseded_by": h.superseded_by,
        "digest_id": h.digest_id,
        "provider": h.provider,
        "callback_outcome": super::callback_outcome_name(h.callback_outcome),
        "callback_status": super::callback_outcome_name(h.callback_outcome)
            .map(|_| status_name(h.callback_status)),
    })
}

fn bulk(r: &v1::BulkActionResponse) -> Value {
    json!({
        "changed": r.changed,
        "changed_ids": r.changed_ids,
        "skipped": r.skipped.iter().map(|s| json!({
            "notification_id": s.notification_id,
            "reason": s.reason,
        })).collect::<Vec<_>>(),
        "more_matching": r.more_matching,
    })
}

fn kpi_values(k: Option<&v1::KpiValues>) -> Value {
    let k = k.copied().unwrap_or_default();
    json!({
        "queue_depth": k.queue_depth,
        "stuck_count": k.stuck_count,
        "parked_count": k.parked_count,
        "delivered_recently": k.delivered_recently,
        "oldest_pending_age_seconds": k.oldest_pending_age_seconds,
        "oldest_retry_wait_age_seconds": k.oldest_retry_wait_age_seconds,
    })
}

/// Every node with every field; `offline_since` and `last_forward_at` are `null` when unset.
fn site_health(r: &v1::ListSiteHealthResponse) -> Value {
    json!({
        "nodes": r.nodes.iter().map(|n| json!({
            "site_id": n.site_id,
            "node_name": n.node_name,
            "role": role_name(n.role),
            "online": n.online,
            "last_report_at": time_json(n.last_report_at.as_ref()),
            "last_report_age_seconds": n.last_report_age_seconds,
            "offline_since": time_json(n.offline_since.as_ref()),
            "buffer_depth": n.buffer_depth,
            "oldest_buffered_age_seconds": n.oldest_buffered_age_seconds,
            "last_forward_at": time_json(n.last_forward_at.as_ref()),
            "standby_lag_rows": n.standby_lag_rows,
            "standby_lag_seconds": n.standby_lag_seconds,
            "version": n.version,
            "central_reachable": n.central_reachable,
            "rejected": n.rejected,
            "sends_refused": n.sends_refused,
        })).collect::<Vec<_>>(),
        "computed_at": time_json(r.computed_at.as_ref()),
        "site_offline_after": duration_json(r.site_offline_after.as_ref()),
    })
}

fn kpi_response(r: &v1::GetKpisResponse) -> Value {
    json!({
        "global": kpi_values(r.global.as_ref()),
        "sites": r.sites.iter().map(|s| json!({
            "source_site_id": s.source_site_id,
            "kpis": kpi_values(s.kpis.as_ref()),
        })).collect::<Vec<_>>(),
        "computed_at": time_json(r.computed_at.as_ref()),
        "stuck_age_threshold": duration_json(r.stuck_age_threshold.as_ref()),
        "delivered_kpi_window": duration_json(r.delivered_kpi_window.as_ref()),
    })
}

/// Every field for every list, so scripts need not branch on the type to index it: an email
/// list has no endpoints and a `null` format, a webhook list no recipients. `consolidation` is
/// `null` when off, else in the request's own form (`{"threshold": 20, "window": "60s",
/// "max_per_digest": 100}`), so a script can send back what it read.
fn notification_list(l: &v1::NotificationList) -> Value {
    let webhook_format = is_webhook(l).then(|| webhook_format_name(l.webhook_format));
    json!({
        "name": l.name,
        "type": channel_name(l.r#type),
        "recipients": l.recipients,
        "endpoints": l.endpoints,
        "fallback_urls": l.fallback_urls,
        "status_callback_url": l.status_callback_url,
        "webhook_format": webhook_format,
        "webhook_secret_set": l.webhook_secret_set,
        "consolidation": l.consolidation.as_ref().map(|c| json!({
            "threshold": c.threshold,
            "window": duration_json(c.window.as_ref()),
            "max_per_digest": c.max_per_digest,
        })),
        "escalation": l.escalation.as_ref().map(super::incident::policy_json),
        "updated_at": time_json(l.updated_at.as_ref()),
    })
}

fn smtp_config(c: &v1::SmtpConfig) -> Value {
    json!({
        "host": c.host,
        "port": c.port,
        "tls_mode": tls_name(c.tls_mode),
        "auth_mechanism": auth_name(c.auth_mechanism, &c.username),
        "username": c.username,
        "password_set": c.password_set,
        "oauth_token_url": c.oauth_token_url,
        "oauth_client_id": c.oauth_client_id,
        "oauth_client_secret_set": c.oauth_client_secret_set,
        "oauth_scope": c.oauth_scope,
        "from_address": c.from_address,
        "max_retries": c.max_retries,
        "retry_delay": duration_json(c.retry_delay.as_ref()),
        "backoff": backoff_name(c.backoff),
        "max_retry_delay": duration_json(c.max_retry_delay.as_ref()),
        "max_concurrent_connections": c.max_concurrent_connections,
        "rate_limit_per_second": c.rate_limit_per_second,
        // Meaningless without a rate: null with it, as the rate is.
        "rate_limit_burst": c.rate_limit_per_second.map(|_| c.rate_limit_burst),
        "timeout": duration_json(c.timeout.as_ref()),
        "overall_timeout": duration_json(c.overall_timeout.as_ref()),
        "fallback_relays": c.fallback_relays.iter().map(|r| json!({
            "host": r.host,
            "port": r.port,
            "tls_mode": tls_name(r.tls_mode),
        })).collect::<Vec<_>>(),
        "updated_at": time_json(c.updated_at.as_ref()),
    })
}

/// `updated_at` is null while nothing is stored (the settings shown are central's defaults).
fn webhook_config(c: &v1::WebhookConfig) -> Value {
    json!({
        "timeout": duration_json(c.timeout.as_ref()),
        "max_retries": c.max_retries,
        "retry_delay": duration_json(c.retry_delay.as_ref()),
        "backoff": backoff_name(c.backoff),
        "max_retry_delay": duration_json(c.max_retry_delay.as_ref()),
        "max_concurrent_connections": c.max_concurrent_connections,
        "rate_limit_per_second": c.rate_limit_per_second,
        "rate_limit_burst": c.rate_limit_per_second.map(|_| c.rate_limit_burst),
        "updated_at": time_json(c.updated_at.as_ref()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_view_uses_proto_names_and_short_enums() {
        let view = v1::NotificationStatusView {
            notification_id: "0190".into(),
            status: v1::NotificationStatus::Parked.into(),
            r#type: v1::NotificationType::Email.into(),
            list_name: "ops".into(),
            retry_count: 3,
            created_at: Some(prost_types::Timestamp {
                seconds: 1_795_255_200,
                nanos: 0,
            }),
            ..Default::default()
        };
        let value = status_view(&view);
        assert_eq!(value["status"], "parked");
        assert_eq!(value["type"], "email");
        assert_eq!(value["priority"], "normal", "unspecified reads as normal");
        assert_eq!(value["retry_count"], 3);
        assert_eq!(value["created_at"], "2026-11-21T10:00:00Z");
        assert_eq!(value["delivered_at"], Value::Null);
    }

    #[test]
    fn the_priority_is_in_rows_and_in_the_detail() {
        let view = v1::NotificationStatusView {
            priority: v1::NotificationPriority::High.into(),
            ..Default::default()
        };
        let rows = render(&Report::Notifications {
            rows: vec![view.clone()],
            next_page_token: String::new(),
        });
        assert_eq!(rows["notifications"][0]["priority"], "high");
        let detail = render(&Report::Detail(v1::NotificationDetail {
            notification: Some(view),
            ..Default::default()
        }));
        assert_eq!(detail["notification"]["priority"], "high");
    }

    #[test]
    fn smtp_config_has_no_password_field() {
        let value = smtp_config(&v1::SmtpConfig {
            host: "relay".into(),
            username: "u".into(),
            password_set: true,
            tls_mode: v1::SmtpTlsMode::Tls.into(),
            ..Default::default()
        });
        assert_eq!(value["password_set"], true);
        assert_eq!(value["tls_mode"], "tls");
        assert!(value.get("password").is_none());
    }

    #[test]
    fn smtp_config_shows_oauth_backoff_and_rate_limit_but_no_client_secret() {
        let value = smtp_config(&v1::SmtpConfig {
            host: "relay".into(),
            username: "outbox@plant.test".into(),
            auth_mechanism: v1::SmtpAuthMechanism::Xoauth2.into(),
            oauth_token_url: "https://login.example.test/token".into(),
            oauth_client_id: "client-1".into(),
            oauth_client_secret_set: true,
            backoff: v1::RetryBackoff::Exponential.into(),
            max_retry_delay: Some(prost_types::Duration {
                seconds: 3600,
                nanos: 0,
            }),
            rate_limit_per_second: Some(10.0),
            rate_limit_burst: 20,
            overall_timeout: Some(prost_types::Duration {
                seconds: 120,
                nanos: 0,
            }),
            ..Default::default()
        });
        assert_eq!(value["auth_mechanism"], "xoauth2");
        assert_eq!(value["oauth_token_url"], "https://login.example.test/token");
        assert_eq!(value["oauth_client_id"], "client-1");
        assert_eq!(value["oauth_client_secret_set"], true);
        assert_eq!(value["oauth_scope"], "");
        assert_eq!(value["backoff"], "exponential");
        assert_eq!(value["max_retry_delay"], "3600s");
        assert_eq!(value["rate_limit_per_second"], 10.0);
        assert_eq!(value["rate_limit_burst"], 20);
        assert_eq!(value["overall_timeout"], "120s");
        assert!(value.get("oauth_client_secret").is_none());

        let unlimited = smtp_config(&v1::SmtpConfig::default());
        assert_eq!(unlimited["rate_limit_per_second"], Value::Null);
        assert_eq!(unlimited["rate_limit_burst"], Value::Null);
        assert_eq!(unlimited["backoff"], "fixed");
        assert_eq!(unlimited["max_retry_delay"], Value::Null);
    }

    #[test]
    fn lists_have_every_field_and_no_webhook_secret() {
        let webhook = notification_list(&v1::NotificationList {
            name: "hooks".into(),
            r#type: v1::NotificationType::Webhook.into(),
            endpoints: vec!["https://hooks.example.test/a".into()],
            webhook_format: v1::WebhookFormat::Slack.into(),
            webhook_secret: Some("never-printed-0123456789".into()),
            webhook_secret_set: true,
            ..Default::default()
        });
        assert_eq!(webhook["type"], "webhook");
        assert_eq!(
            webhook["endpoints"],
            json!(["https://hooks.example.test/a"])
        );
        assert_eq!(webhook["recipients"], json!([]));
        assert_eq!(webhook["webhook_format"], "slack");
        assert_eq!(webhook["webhook_secret_set"], true);
        assert!(webhook.get("webhook_secret").is_none());
        assert!(!webhook.to_string().contains("never-printed"));

        let email = notification_list(&v1::NotificationList {
            name: "ops".into(),
            r#type: v1::NotificationType::Email.into(),
            recipients: vec!["a@plant.test".into()],
            ..Default::default()
        });
        assert_eq!(email["recipients"], json!(["a@plant.test"]));
        assert_eq!(email["endpoints"], json!([]));
        assert_eq!(email["webhook_format"], Value::Null);
        assert_eq!(email["webhook_secret_set"], false);
        assert_eq!(email["consolidation"], Value::Null, "off");
    }

    #[test]
    fn consolidation_is_in_the_request_form_and_digests_are_named() {
        let list = notification_list(&v1::NotificationList {
            name: "ops".into(),
            r#type: v1::NotificationType::Email.into(),
            consolidation: Some(v1::ListConsolidation {
                threshold: 20,
                window: Some(prost_types::Duration {
                    seconds: 60,
                    nanos: 0,
                }),
                max_per_digest: 100,
            }),
            ..Default::default()
        });
        assert_eq!(
            list["consolidation"],
            json!({"threshold": 20, "window": "60s", "max_per_digest": 100})
        );
        let entry = history_entry(&v1::HistoryEntry {
            kind: v1::HistoryEntryKind::DeliveryAttempt.into(),
            digest_id: "0190-digest".into(),
            ..Default::default()
        });
        assert_eq!(entry["digest_id"], "0190-digest");
        assert_eq!(history_entry(&v1::HistoryEntry::default())["digest_id"], "");
    }
}
