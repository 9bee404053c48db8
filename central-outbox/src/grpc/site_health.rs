//! Site health at the gRPC edge: a `SiteHealthReport` into the domain's report (bad input names
//! the field), and each node's assessed health back into a `SiteHealthView`.

use std::time::Duration;

use outbox_proto::time::{from_timestamp, to_duration, to_timestamp};
use outbox_proto::v1;

use crate::domain::ContentError;
use crate::domain::site_health::{
    NodeHealth, NodeRole, SiteHealthReport, SiteHealthSnapshot, parse_node_name, parse_seconds,
    parse_site, parse_version,
};

/// Validates a report as received.
pub(crate) fn report(msg: v1::SiteHealthReport) -> Result<SiteHealthReport, ContentError> {
    let role = match v1::NodeRole::try_from(msg.role) {
        Ok(v1::NodeRole::Active) => NodeRole::Active,
        Ok(v1::NodeRole::Standby) => NodeRole::Standby,
        _ => return Err(ContentError::new("role", "must be ACTIVE or STANDBY")),
    };
    let last_forward_at = msg
        .last_forward_at
        .as_ref()
        .map(|ts| {
            from_timestamp(ts)
                .ok_or_else(|| ContentError::new("last_forward_at", "is not a valid timestamp"))
        })
        .transpose()?;
    Ok(SiteHealthReport {
        site: parse_site(msg.site_id, "site_id")?,
        node: parse_node_name(msg.node_name, "node_name")?,
        role,
        buffer_depth: msg.buffer_depth,
        oldest_buffered_age: parse_seconds(
            msg.oldest_buffered_age_seconds,
            "oldest_buffered_age_seconds",
        )?,
        last_forward_at,
        standby_lag_rows: msg.standby_lag_rows,
        standby_lag: parse_seconds(msg.standby_lag_seconds, "standby_lag_seconds")?,
        version: parse_version(msg.version, "version")?,
        central_reachable: msg.central_reachable,
        rejected: msg.rejected,
        sends_refused: msg.sends_refused,
    })
}

fn role(role: NodeRole) -> v1::NodeRole {
    match role {
        NodeRole::Active => v1::NodeRole::Active,
        NodeRole::Standby => v1::NodeRole::Standby,
    }
}

/// One node as `ListSiteHealth` shows it.
pub(crate) fn view(node: &NodeHealth) -> v1::SiteHealthView {
    let r = &node.stored.report;
    v1::SiteHealthView {
        site_id: r.site.as_str().to_owned(),
        node_name: r.node.as_str().to_owned(),
        role: role(r.role).into(),
        online: node.online,
        last_report_at: Some(to_timestamp(node.stored.received_at)),
        last_report_age_seconds: node.report_age.as_secs_f64(),
        offline_since: node.offline_since.map(to_timestamp),
        buffer_depth: r.buffer_depth,
        oldest_buffered_age_seconds: r.oldest_buffered_age.as_secs_f64(),
        last_forward_at: r.last_forward_at.map(to_timestamp),
        standby_lag_rows: r.standby_lag_rows,
        standby_lag_seconds: r.standby_lag.as_secs_f64(),
        version: r.version.clone(),
        central_reachable: r.central_reachable,
        rejected: r.rejected,
        sends_refused: r.sends_refused,
    }
}

/// The whole answer of `ListSiteHealth`.
pub(crate) fn list(
    snapshot: &SiteHealthSnapshot,
    offline_after: Duration,
) -> v1::ListSiteHealthResponse {
    v1::ListSiteHealthResponse {
        nodes: snapshot.assess(offline_after).iter().map(view).collect(),
        computed_at: Some(to_timestamp(snapshot.read_at)),
        site_offline_after: Some(to_duration(offline_after)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn valid() -> v1::SiteHealthReport {
        v1::SiteHealthReport {
            site_id: "north".into(),
            node_name: "north-b".into(),
            role: v1::NodeRole::Standby.into(),
            buffer_depth: 7,
            oldest_buffered_age_seconds: 1.25,
            last_forward_at: Some(to_timestamp(chrono::Utc::now())),
            standby_lag_rows: 0,
            standby_lag_seconds: 0.0,
            version: "0.1.0".into(),
            central_reachable: false,
            rejected: 1,
            sends_refused: false,
        }
    }

    #[test]
    fn a_valid_report_converts_and_a_bad_field_is_named() {
        let report = report(valid()).unwrap();
        assert_eq!(report.role, NodeRole::Standby);
        assert_eq!(report.oldest_buffered_age, Duration::from_millis(1250));
        assert_eq!(report.node.as_str(), "north-b");
        type Spoil = fn(&mut v1::SiteHealthReport);
        let cases: [(&str, Spoil); 5] = [
            ("site_id", |m| m.site_id = "no spaces".into()),
            ("node_name", |m| m.node_name.clear()),
            ("role", |m| m.role = v1::NodeRole::Unspecified.into()),
            ("oldest_buffered_age_seconds", |m| {
                m.oldest_buffered_age_seconds = -1.0;
            }),
            ("version", |m| m.version = "v".repeat(65)),
        ];
        for (field, spoil) in cases {
            let mut msg = valid();
            spoil(&mut msg);
            assert_eq!(super::report(msg).unwrap_err().field, field);
        }
    }
}
