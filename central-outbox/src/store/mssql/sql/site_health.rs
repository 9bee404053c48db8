//! The statements of site health at central: replacing a site node's latest report, stamped
//! with the database's clock, and reading every node's report with that clock's reading.

use super::super::millis_i64;
use super::{Param, Statement, text};
use crate::domain::site_health::SiteHealthReport;

/// Replaces the health report of site @P1's node @P2 (@P3..@P12 in select_site_health.sql's
/// column order, without ReceivedAt), received now by the database's clock, in one transaction. Two
/// first reports of one node racing to insert (a node reporting to two replicas at once) end
/// one of them with a duplicate key; run again, it updates.
pub fn record_site_health(report: &SiteHealthReport) -> Statement {
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
}

/// The database's clock (first result) and every node's latest report, by site then node
/// (second): the clock the offline rule is applied with is the one that stamped the reports.
pub const SELECT_SITE_HEALTH: &str = include_str!("select_site_health.sql");
