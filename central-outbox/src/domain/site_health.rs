//! Site health at central: what a site-forwarder node reports about itself, and the offline rule.
//!
//! Each node (active or standby) reports every few seconds; central keeps only the latest report
//! per (site, node), stamped with the time it was received by the database's clock. Whether a
//! node is online is never stored: it is decided when the reports are read, from that stamp and
//! the database's clock at the read ([`SiteHealthSnapshot::assess`]), so every central replica
//! reading the same rows agrees, whatever its own clock says, and a node that stops reporting
//! turns offline without anything being written.
//!
//! What a report can make central keep is bounded: at most [`MAX_NODES_PER_SITE`] nodes per site
//! (a report from one more is refused, see [`SiteHealthWrite`]), and a node not heard from for
//! `retention.site_health_retention` is forgotten by the purge, which frees its place.

use std::time::Duration;

use chrono::{DateTime, Utc};

use super::{ContentError, SiteId};

/// Longest `version` a report may carry, in characters.
pub const MAX_VERSION_CHARS: usize = 64;

/// The longest age or lag a report may state: a century. Larger values (or negative ones, NaN,
/// infinity) are a broken client, refused naming the field.
const MAX_REPORTED_SECONDS: f64 = 100.0 * 365.0 * 24.0 * 3600.0;

/// Most nodes one site may have reported at once. A site is one node or an active/standby pair;
/// 16 leaves room for nodes renamed or rebuilt (an old name keeps its place until it has been
/// silent for the retention and is forgotten), while a client that invents node names (a bug, or
/// anybody where sites are not told apart) cannot grow the table, the admin API's answer or the
/// `/metrics` series without bound.
pub const MAX_NODES_PER_SITE: usize = 16;

/// What recording a report did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SiteHealthWrite {
    /// Stored as the node's latest report.
    Stored,
    /// Not stored: the node is new and its site already has [`MAX_NODES_PER_SITE`] nodes.
    SiteFull,
}

/// A node's place in its site's pair (a single node is active).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NodeRole {
    Active,
    Standby,
}

impl NodeRole {
    /// The name stored in the database.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Active => "Active",
            Self::Standby => "Standby",
        }
    }

    /// The stored name back; `None` for anything else.
    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "Active" => Some(Self::Active),
            "Standby" => Some(Self::Standby),
            _ => None,
        }
    }
}

/// One node's report, validated. Figures are as the node saw them when it sent the report.
#[derive(Debug, Clone, PartialEq)]
pub struct SiteHealthReport {
    pub site: SiteId,
    /// The node's name in its pair, under the same rules as a site id (a single node uses its
    /// site id).
    pub node: SiteId,
    pub role: NodeRole,
    pub buffer_depth: u64,
    /// Zero when the buffer is empty.
    pub oldest_buffered_age: Duration,
    /// By the node's clock; `None` if it has forwarded nothing since it started.
    pub last_forward_at: Option<DateTime<Utc>>,
    pub standby_lag_rows: u64,
    pub standby_lag: Duration,
    pub version: String,
    pub central_reachable: bool,
    pub rejected: u64,
    pub sends_refused: bool,
}

/// A node name, by the rules of a site id; the error names `field`.
pub fn parse_node_name(text: String, field: &'static str) -> Result<SiteId, ContentError> {
    SiteId::parse(text).map_err(|e| ContentError::new(field, e.problem))
}

/// A site id; the error names `field`.
pub fn parse_site(text: String, field: &'static str) -> Result<SiteId, ContentError> {
    SiteId::parse(text).map_err(|e| ContentError::new(field, e.problem))
}

/// A reported version: at most [`MAX_VERSION_CHARS`] characters, no control characters.
pub fn parse_version(text: String, field: &'static str) -> Result<String, ContentError> {
    if text.chars().count() > MAX_VERSION_CHARS {
        return Err(ContentError::new(
            field,
            format!("is longer than {MAX_VERSION_CHARS} characters"),
        ));
    }
    if text.chars().any(char::is_control) {
        return Err(ContentError::new(
            field,
            "must not contain control characters",
        ));
    }
    Ok(text)
}

/// A reported age or lag in seconds: finite, not negative, at most a century.
pub fn parse_seconds(seconds: f64, field: &'static str) -> Result<Duration, ContentError> {
    if !(0.0..=MAX_REPORTED_SECONDS).contains(&seconds) {
        return Err(ContentError::new(
            field,
            format!("{seconds} is not a number of seconds between 0 and a century"),
        ));
    }
    Ok(Duration::from_secs_f64(seconds))
}

/// A stored report and when central received it (the database's clock).
#[derive(Debug, Clone, PartialEq)]
pub struct StoredSiteHealth {
    pub report: SiteHealthReport,
    pub received_at: DateTime<Utc>,
}

/// Every stored report, with the database's clock at the moment they were read.
#[derive(Debug, Clone, PartialEq)]
pub struct SiteHealthSnapshot {
    pub read_at: DateTime<Utc>,
    /// By site id, then node name.
    pub nodes: Vec<StoredSiteHealth>,
}

/// A node's latest report and what it means at the time of the read.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeHealth {
    pub stored: StoredSiteHealth,
    /// Since the report was received (zero if the clock read earlier than the stamp).
    pub report_age: Duration,
    pub online: bool,
    /// When it went offline (`received_at + offline_after`); `None` while online.
    pub offline_since: Option<DateTime<Utc>>,
}

impl SiteHealthSnapshot {
    /// Each node with its age and the offline rule applied: a node whose latest report is
    /// `offline_after` old or older is offline, since the moment it reached that age.
    pub fn assess(&self, offline_after: Duration) -> Vec<NodeHealth> {
        self.nodes
            .iter()
            .map(|stored| {
                let report_age = (self.read_at - stored.received_at)
                    .to_std()
                    .unwrap_or(Duration::ZERO);
                let online = report_age < offline_after;
                let offline_since = (!online).then(|| {
                    stored.received_at
                        + chrono::Duration::from_std(offline_after).unwrap_or(chrono::Duration::MAX)
                });
                NodeHealth {
                    stored: stored.clone(),
                    report_age,
                    online,
                    offline_since,
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stored(received_at: DateTime<Utc>) -> StoredSiteHealth {
        StoredSiteHealth {
            report: SiteHealthReport {
                site: SiteId::parse("north".into()).unwrap(),
                node: SiteId::parse("north-a".into()).unwrap(),
                role: NodeRole::Active,
                buffer_depth: 3,
                oldest_buffered_age: Duration::from_secs(2),
                last_forward_at: None,
                standby_lag_rows: 0,
                standby_lag: Duration::ZERO,
                version: "1.0.0".into(),
                central_reachable: true,
                rejected: 0,
                sends_refused: false,
            },
            received_at,
        }
    }

    #[test]
    fn a_node_is_offline_from_the_moment_its_report_is_offline_after_old() {
        let received = DateTime::from_timestamp(1_700_000_000, 0).unwrap();
        let offline_after = Duration::from_secs(180);
        let at = |secs: i64| SiteHealthSnapshot {
            read_at: received + chrono::Duration::seconds(secs),
            nodes: vec![stored(received)],
        };
        let fresh = &at(179).assess(offline_after)[0];
        assert!(fresh.online);
        assert_eq!(fresh.report_age, Duration::from_secs(179));
        assert_eq!(fresh.offline_since, None);
        let gone = &at(180).assess(offline_after)[0];
        assert!(!gone.online);
        assert_eq!(
            gone.offline_since,
            Some(received + chrono::Duration::seconds(180))
        );
        // A read clock behind the stamp (replicas a moment apart) is age zero, online.
        let early = &at(-5).assess(offline_after)[0];
        assert!(early.online);
        assert_eq!(early.report_age, Duration::ZERO);
    }

    #[test]
    fn reported_figures_are_checked_naming_the_field() {
        assert_eq!(
            parse_seconds(1.5, "oldest_buffered_age_seconds").unwrap(),
            Duration::from_millis(1500)
        );
        for bad in [-1.0, f64::NAN, f64::INFINITY, 1e12] {
            let e = parse_seconds(bad, "standby_lag_seconds").unwrap_err();
            assert_eq!(e.field, "standby_lag_seconds");
        }
        assert!(parse_version("0.1.0".into(), "version").is_ok());
        assert!(parse_version("x".repeat(65), "version").is_err());
        assert!(parse_version("1.0\n".into(), "version").is_err());
        assert_eq!(
            parse_node_name("a b".into(), "node_name")
                .unwrap_err()
                .field,
            "node_name"
        );
        assert_eq!(
            parse_site(String::new(), "site_id").unwrap_err().field,
            "site_id"
        );
        assert_eq!(NodeRole::parse("Standby"), Some(NodeRole::Standby));
        assert_eq!(
            NodeRole::parse(NodeRole::Active.as_str()),
            Some(NodeRole::Active)
        );
        assert_eq!(NodeRole::parse("standby"), None);
    }
}
