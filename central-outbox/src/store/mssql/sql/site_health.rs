//! The statements of site health at central: replacing a site node's latest report, stamped
//! with the database's clock, reading every node's report with that clock's reading, and
//! forgetting the nodes that have been silent for the retention by the same clock.

use std::time::Duration;

use super::super::millis_i64;
use super::{Param, Statement, text};
use crate::domain::site_health::{MAX_NODES_PER_SITE, SiteHealthReport};

/// Replaces the health report of site @P1's node @P2 (@P3..@P12 in select_site_health.sql's
/// column order, without ReceivedAt), received now by the database's clock, in one transaction;
/// a node not stored yet is inserted only while its site has fewer than @P13
/// ([`MAX_NODES_PER_SITE`]) nodes. Answers `Stored` 1 if the report was stored, 0 if the site
/// was full. The count and the insert are one statement, but without SERIALIZABLE (which the
/// backend does not use, for Babelfish) first reports of several new nodes of one site at the
/// same instant may each find the last place free: the bound can be passed by the few in such a
/// race, never grown without bound, and every later new node is refused until the purge has
/// brought the site back under it. Two first reports of one node racing to insert (a node
/// reporting to two replicas at once) end one of them with a duplicate key; run again, it
/// updates.
pub(crate) fn record_site_health(report: &SiteHealthReport) -> Statement {
    let flag = |set: bool| Param::Int(Some(i32::from(set)));
    let count = |n: u64| Param::BigInt(Some(i64::try_from(n).unwrap_or(i64::MAX)));
    Statement::fixed(include_str!("record_site_health.sql"))
        .set("@P1", text(report.site.as_str()))
        .set("@P2", text(report.node.as_str()))
        .set("@P3", text(report.role.as_str()))
        .set("@P4", count(report.buffer_depth))
        .set(
            "@P5",
            Param::BigInt(Some(millis_i64(report.oldest_buffered_age))),
        )
        .set("@P6", Param::Time(report.last_forward_at))
        .set("@P7", count(report.standby_lag_rows))
        .set("@P8", Param::BigInt(Some(millis_i64(report.standby_lag))))
        .set("@P9", text(&report.version))
        .set("@P10", flag(report.central_reachable))
        .set("@P11", count(report.rejected))
        .set("@P12", flag(report.sends_refused))
        .set(
            "@P13",
            Param::Int(Some(i32::try_from(MAX_NODES_PER_SITE).unwrap_or(i32::MAX))),
        )
}

/// The database's clock (first result) and every node's latest report, by site then node
/// (second): the clock the offline rule is applied with is the one that stamped the reports.
pub(crate) const SELECT_SITE_HEALTH: &str = include_str!("select_site_health.sql");

/// Deletes every node whose latest report is `silent_for` old or older by the database's clock,
/// and answers them (SiteId, NodeName). The age is bound as whole seconds (@P1) and the
/// remaining milliseconds (@P2): DATEADD takes an int, and a retention of years in milliseconds
/// does not fit one. The retention is at most 3650 days (`config`), 315,360,000 seconds.
pub(crate) fn forget_silent_nodes(silent_for: Duration) -> Statement {
    let seconds = i32::try_from(silent_for.as_secs()).unwrap_or(i32::MAX);
    let millis = i32::try_from(silent_for.subsec_millis()).unwrap_or(0);
    Statement::fixed(include_str!("forget_silent_nodes.sql"))
        .set("@P1", Param::Int(Some(seconds)))
        .set("@P2", Param::Int(Some(millis)))
}
