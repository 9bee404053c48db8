//! Client side of the `site-forwarder` binary: `send`, `clear`, `acknowledge`, `status`, `stats`
//! and `promote` against a running forwarder's local `SiteNotify` API, and the plain-text
//! rendering of their answers. `send`, `clear` and `acknowledge` take the addresses of both
//! nodes of a pair and use the first that accepts. Output is meant for scripts as much as for
//! people: `send` prints only the id, `clear` and `acknowledge` only the count; every failure is one line on stderr carrying the gRPC status message, with a
//! non-zero exit.

use std::fmt::Write as _;
use std::time::Duration;

use chrono::SecondsFormat;
use clap::builder::{PossibleValuesParser, TypedValueParser};
use outbox_proto::submission::priority_to_proto;
use outbox_proto::time::from_timestamp;
use outbox_proto::v1::site_notify_client::SiteNotifyClient;
use outbox_proto::v1::{
    AcknowledgeRequest, BufferStats, ClearConditionRequest, GetBufferStatsRequest,
    GetNotificationStatusRequest, NodeRole, NodeRoleView, NotificationPriority, NotificationStatus,
    NotificationStatusView, NotificationType, PromoteRequest, SendRequest,
};
use tonic::transport::{Channel, Endpoint};

use crate::domain::Priority;

/// Default address of the local API, matching the server's default `listen_addr`.
pub const DEFAULT_ADDR: &str = "http://127.0.0.1:50052";
/// The forwarder is local: if it does not accept a connection within this, it is not running.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Bound on one call. `Send` waits for an fsync and `GetStatus` may ask central (which the
/// forwarder bounds by its own `request_timeout`, 10 s by default), so this leaves headroom.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Debug, thiserror::Error)]
pub enum CliError {
    #[error("cannot reach the site-forwarder at {addr}: {detail}")]
    Connect { addr: String, detail: String },
    #[error("{} ({:?})", .0.message(), .0.code())]
    Rpc(tonic::Status),
}

pub type Result<T, E = CliError> = std::result::Result<T, E>;

/// Notification type as given on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum TypeArg {
    #[default]
    Email,
    Webhook,
}

/// Parses `--priority`: one of the domain's priority names (`critical`, `high`, `normal`,
/// `low`). Listing them as possible values makes clap name them in `--help` and in the error
/// for anything else.
pub fn priority_arg() -> impl TypedValueParser<Value = Priority> {
    PossibleValuesParser::new(Priority::ALL.map(Priority::as_str)).try_map(|name| {
        // Cannot miss: the possible values are exactly the names `parse_name` knows.
        Priority::parse_name(&name).ok_or_else(|| format!("{name:?} is not a priority"))
    })
}

/// What `site-forwarder send` sends.
#[derive(Debug, Clone, Default)]
pub struct SendArgs {
    pub list: String,
    pub subject: String,
    pub body: String,
    pub kind: TypeArg,
    pub type_data: String,
    pub script: String,
    pub instance: String,
    pub execution_id: Option<String>,
    pub parent_execution_id: Option<String>,
    pub priority: Priority,
    /// Empty: none.
    pub condition_key: String,
    /// Not to be delivered before this instant; `None`: at once.
    pub deliver_after: Option<chrono::DateTime<chrono::Utc>>,
}

async fn connect(addr: &str) -> Result<SiteNotifyClient<Channel>> {
    let failed = |detail: String| CliError::Connect {
        addr: addr.to_owned(),
        detail,
    };
    let endpoint = Endpoint::from_shared(addr.to_owned())
        .map_err(|e| failed(e.to_string()))?
        .connect_timeout(CONNECT_TIMEOUT)
        .timeout(CALL_TIMEOUT);
    let channel = endpoint
        .connect()
        .await
        .map_err(|e| failed(crate::link::error_chain(&e)))?;
    Ok(SiteNotifyClient::new(channel))
}

/// Sends one notification to the first of `addrs` that accepts it; returns its id (see
/// [`on_first_accepting`]).
pub async fn send(addrs: &[String], args: SendArgs) -> Result<String> {
    let kind = match args.kind {
        TypeArg::Email => NotificationType::Email,
        TypeArg::Webhook => NotificationType::Webhook,
    };
    let request = SendRequest {
        r#type: kind.into(),
        list_name: args.list,
        subject: args.subject,
        body: args.body,
        type_data: args.type_data,
        source_instance_id: args.instance,
        source_script: args.script,
        origin_execution_id: args.execution_id,
        origin_parent_execution_id: args.parent_execution_id,
        priority: priority_to_proto(args.priority).into(),
        condition_key: args.condition_key,
        deliver_after: args.deliver_after.map(outbox_proto::time::to_timestamp),
    };
    on_first_accepting(addrs, async |mut client| {
        let response = client.send(request.clone()).await?;
        Ok(response.into_inner().notification_id)
    })
    .await
}

/// Clears a condition at the first of `addrs` that accepts it (see [`on_first_accepting`]);
/// returns how many buffered notifications it ended there.
pub async fn clear(addrs: &[String], condition_key: String) -> Result<u32> {
    let request = ClearConditionRequest {
        condition_key,
        source_site_id: String::new(),
    };
    on_first_accepting(addrs, async |mut client| {
        let response = client.clear_condition(request.clone()).await?;
        Ok(response.into_inner().cleared)
    })
    .await
}

/// Acknowledges a condition's incidents at central through the first of `addrs` that accepts it
/// (queued there until the alarm before it has been forwarded); returns how many of the site's
/// acknowledgements are still to reach central.
pub async fn acknowledge(addrs: &[String], condition_key: String, actor: String) -> Result<u32> {
    let request = AcknowledgeRequest {
        condition_key,
        actor,
    };
    on_first_accepting(addrs, async |mut client| {
        let response = client.acknowledge(request.clone()).await?;
        Ok(response.into_inner().pending)
    })
    .await
}

/// Makes `call` on the first of `addrs` that accepts it. A node that cannot be reached, or
/// answers UNAVAILABLE (a standby, a buffer that cannot write), is skipped: nothing was stored
/// there. Any other answer (INVALID_ARGUMENT, ...) is final.
async fn on_first_accepting<T>(
    addrs: &[String],
    mut call: impl AsyncFnMut(SiteNotifyClient<Channel>) -> Result<T, tonic::Status>,
) -> Result<T> {
    let mut last = None;
    for addr in addrs {
        let client = match connect(addr).await {
            Ok(client) => client,
            Err(e) => {
                last = Some(e);
                continue;
            }
        };
        match call(client).await {
            Ok(answer) => return Ok(answer),
            Err(status) if status.code() == tonic::Code::Unavailable => {
                last = Some(CliError::Rpc(status));
            }
            Err(status) => return Err(CliError::Rpc(status)),
        }
    }
    Err(last.unwrap_or_else(|| CliError::Connect {
        addr: String::new(),
        detail: "no address given".into(),
    }))
}

/// Promotes the node at `addr` to active (see `SiteNotify.Promote`).
pub async fn promote(addr: &str) -> Result<NodeRoleView> {
    let mut client = connect(addr).await?;
    let view = client
        .promote(PromoteRequest {})
        .await
        .map_err(CliError::Rpc)?;
    Ok(view.into_inner())
}

pub fn format_role(view: &NodeRoleView) -> String {
    format!(
        "{} is {} (term {})\n",
        view.node_name,
        role_name(view.role),
        view.term
    )
}

fn role_name(role: i32) -> &'static str {
    match NodeRole::try_from(role) {
        Ok(NodeRole::Active) => "active",
        Ok(NodeRole::Standby) => "standby",
        Ok(NodeRole::Unspecified) | Err(_) => "unknown",
    }
}

pub async fn status(addr: &str, id: String) -> Result<NotificationStatusView> {
    let mut client = connect(addr).await?;
    let request = GetNotificationStatusRequest {
        notification_id: id,
    };
    let view = client.get_status(request).await.map_err(CliError::Rpc)?;
    Ok(view.into_inner())
}

pub async fn stats(addr: &str) -> Result<BufferStats> {
    let mut client = connect(addr).await?;
    let stats = client
        .get_buffer_stats(GetBufferStatsRequest {})
        .await
        .map_err(CliError::Rpc)?;
    Ok(stats.into_inner())
}

pub fn status_name(status: i32) -> &'static str {
    match NotificationStatus::try_from(status) {
        Ok(NotificationStatus::Pending) => "Pending",
        Ok(NotificationStatus::Retrying) => "Retrying",
        Ok(NotificationStatus::Delivered) => "Delivered",
        Ok(NotificationStatus::Parked) => "Parked",
        Ok(NotificationStatus::Discarded) => "Discarded",
        Ok(NotificationStatus::Forwarding) => "Forwarding",
        Ok(NotificationStatus::Superseded) => "Superseded",
        Ok(NotificationStatus::Cleared) => "Cleared",
        Ok(NotificationStatus::Held) => "Held",
        Ok(NotificationStatus::Acknowledged) => "Acknowledged",
        Ok(NotificationStatus::Unspecified) | Err(_) => "Unknown",
    }
}

/// UNSPECIFIED reads as normal: it is what a central that predates priorities answers, and
/// it treats every notification as normal.
fn priority_name(priority: i32) -> &'static str {
    match NotificationPriority::try_from(priority) {
        Ok(NotificationPriority::Critical) => "critical",
        Ok(NotificationPriority::High) => "high",
        Ok(NotificationPriority::Normal | NotificationPriority::Unspecified) => "normal",
        Ok(NotificationPriority::Low) => "low",
        Err(_) => "unknown",
    }
}

fn type_name(kind: i32) -> &'static str {
    match NotificationType::try_from(kind) {
        Ok(NotificationType::Email) => "Email",
        Ok(NotificationType::Webhook) => "Webhook",
        Ok(NotificationType::Unspecified) | Err(_) => "Unknown",
    }
}

fn time(ts: Option<&prost_types::Timestamp>) -> Option<String> {
    ts.and_then(from_timestamp)
        .map(|at| at.to_rfc3339_opts(SecondsFormat::Millis, true))
}

/// The status name on the first line (what scripts check), then `key: value` lines; unset
/// values are left out.
pub fn format_status(view: &NotificationStatusView) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "{}", status_name(view.status));
    let _ = writeln!(out, "id: {}", view.notification_id);
    let _ = writeln!(out, "type: {}", type_name(view.r#type));
    let _ = writeln!(out, "priority: {}", priority_name(view.priority));
    let _ = writeln!(out, "list: {}", view.list_name);
    let _ = writeln!(out, "site: {}", view.source_site_id);
    if !view.condition_key.is_empty() {
        let _ = writeln!(out, "condition_key: {}", view.condition_key);
    }
    let _ = writeln!(out, "retry_count: {}", view.retry_count);
    if !view.last_error.is_empty() {
        let _ = writeln!(out, "last_error: {}", view.last_error);
    }
    for (key, value) in [
        ("site_enqueued_at", &view.site_enqueued_at),
        ("created_at", &view.created_at),
        ("last_attempt_at", &view.last_attempt_at),
        ("deliver_after", &view.deliver_after),
        ("next_attempt_at", &view.next_attempt_at),
        ("delivered_at", &view.delivered_at),
    ] {
        if let Some(at) = time(value.as_ref()) {
            let _ = writeln!(out, "{key}: {at}");
        }
    }
    out
}

pub fn format_stats(stats: &BufferStats) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "depth: {}", stats.depth);
    let _ = writeln!(out, "in_flight: {}", stats.in_flight);
    let _ = writeln!(out, "rejected: {}", stats.rejected);
    let _ = writeln!(out, "central_reachable: {}", stats.central_reachable);
    // Only when it matters: why nothing is forwarded although central answers.
    if !stats.forward_refused_reason.is_empty() {
        let _ = writeln!(out, "forward_refused: {}", stats.forward_refused_reason);
    }
    // Only when it matters: the line a script's author looks for when Sends fail.
    if stats.sends_refused {
        let _ = writeln!(out, "sends_refused: {}", stats.sends_refused_reason);
    }
    if let Some(at) = time(stats.oldest_enqueued_at.as_ref()) {
        let _ = writeln!(out, "oldest_enqueued_at: {at}");
        let _ = writeln!(out, "oldest_age_seconds: {:.3}", stats.oldest_age_seconds);
    }
    match time(stats.last_forward_at.as_ref()) {
        Some(at) => {
            let _ = writeln!(out, "last_forward_at: {at}");
        }
        None => {
            let _ = writeln!(out, "last_forward_at: never");
        }
    }
    if !stats.node_name.is_empty() {
        let _ = writeln!(out, "node: {}", stats.node_name);
    }
    let _ = writeln!(out, "role: {}", role_name(stats.role));
    let _ = writeln!(out, "term: {}", stats.term);
    let _ = writeln!(out, "peer_connected: {}", stats.peer_connected);
    if stats.role == i32::from(NodeRole::Standby) {
        let _ = writeln!(out, "active_node: {}", stats.active_node);
        let _ = writeln!(
            out,
            "active_silent_seconds: {:.3}",
            stats.active_silent_seconds
        );
    } else {
        let _ = writeln!(out, "standby_lag_rows: {}", stats.standby_lag_rows);
        let _ = writeln!(out, "standby_lag_seconds: {:.3}", stats.standby_lag_seconds);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_starts_with_the_name_and_skips_unset_values() {
        let view = NotificationStatusView {
            notification_id: "id-1".into(),
            status: NotificationStatus::Retrying.into(),
            r#type: NotificationType::Email.into(),
            list_name: "ops".into(),
            retry_count: 2,
            last_error: "smtp 451".into(),
            ..Default::default()
        };
        let text = format_status(&view);
        assert!(text.starts_with("Retrying\n"), "{text}");
        assert!(text.contains("retry_count: 2\n"));
        assert!(text.contains("last_error: smtp 451\n"));
        assert!(!text.contains("delivered_at"));
        assert!(
            text.contains("priority: normal\n"),
            "unspecified reads as normal: {text}"
        );

        let critical = NotificationStatusView {
            priority: NotificationPriority::Critical.into(),
            ..view
        };
        assert!(format_status(&critical).contains("priority: critical\n"));
        assert!(!text.contains("condition_key"), "none named: {text}");
        assert!(!text.contains("deliver_after"), "not scheduled: {text}");
    }

    #[test]
    fn a_scheduled_notification_shows_when_it_is_due() {
        let at = chrono::DateTime::from_timestamp(1_800_000_000, 0).unwrap();
        let view = NotificationStatusView {
            status: NotificationStatus::Forwarding.into(),
            deliver_after: Some(outbox_proto::time::to_timestamp(at)),
            ..Default::default()
        };
        let text = format_status(&view);
        assert!(
            text.contains("deliver_after: 2027-01-15T08:00:00.000Z\n"),
            "{text}"
        );
    }

    #[test]
    fn a_cleared_notification_shows_its_status_and_key() {
        let view = NotificationStatusView {
            status: NotificationStatus::Cleared.into(),
            condition_key: "tank4.level.high".into(),
            ..Default::default()
        };
        let text = format_status(&view);
        assert!(text.starts_with("Cleared\n"), "{text}");
        assert!(text.contains("condition_key: tank4.level.high\n"), "{text}");
        assert_eq!(
            status_name(NotificationStatus::Superseded.into()),
            "Superseded"
        );
    }

    #[test]
    fn stats_show_the_pair_from_each_side() {
        let standby = BufferStats {
            role: NodeRole::Standby.into(),
            term: 3,
            node_name: "site-a-2".into(),
            peer_connected: true,
            active_node: "site-a-1".into(),
            active_silent_seconds: 0.25,
            ..Default::default()
        };
        let text = format_stats(&standby);
        for line in [
            "node: site-a-2\n",
            "role: standby\n",
            "term: 3\n",
            "peer_connected: true\n",
            "active_node: site-a-1\n",
            "active_silent_seconds: 0.250\n",
        ] {
            assert!(text.contains(line), "{line:?} in {text}");
        }
        assert!(!text.contains("standby_lag"), "{text}");
        assert!(!text.contains("sends_refused"), "{text}");

        let active = BufferStats {
            role: NodeRole::Active.into(),
            standby_lag_rows: 12,
            standby_lag_seconds: 0.5,
            ..Default::default()
        };
        let text = format_stats(&active);
        assert!(text.contains("role: active\n") && text.contains("standby_lag_rows: 12\n"));
        assert!(text.contains("standby_lag_seconds: 0.500\n"), "{text}");
        let full = BufferStats {
            sends_refused: true,
            sends_refused_reason: "max_buffer_bytes: the limit is 1048576".into(),
            ..Default::default()
        };
        assert!(
            format_stats(&full).contains("sends_refused: max_buffer_bytes: the limit is 1048576\n")
        );
        assert!(!text.contains("forward_refused"), "{text}");
        let refused = BufferStats {
            forward_refused_reason: "source_site_id: \"site-a\" is not the caller's site".into(),
            ..Default::default()
        };
        assert!(
            format_stats(&refused)
                .contains("forward_refused: source_site_id: \"site-a\" is not the caller's site\n")
        );
        assert_eq!(
            format_role(&NodeRoleView {
                node_name: "site-a-2".into(),
                role: NodeRole::Active.into(),
                term: 4,
                send_addr: String::new(),
            }),
            "site-a-2 is active (term 4)\n"
        );
    }
}
