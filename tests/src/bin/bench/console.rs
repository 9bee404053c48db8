//! The console's figures: how long a page of the notification list takes to render with a
//! million rows in the table, under each filter the indexes serve, and what a refresh of the
//! dashboard tiles costs.
//!
//! Central runs on the memory figure's fixture (a million Delivered rows spread over 30 days,
//! one site, one list) with the console on and `[auth] mode = "none"`, so no login is timed.
//! The `history` group measures the same pages on its year of history (`history_reads`).
//! Each request is one fresh loopback HTTP/1.1 connection (`metrics_endpoint::get`), timed from
//! connect to the last byte; the page must answer 200 and contain the list table, so an error
//! page cannot pass for a fast one. Deep pages follow the page's own `next-page` link (keyset
//! paging): page 20 must cost what page 1 costs.
//!
//! A subject keyword search is not among the filters: it reads every row by design (the admin
//! API says so), and the memory figure already times the worst of it.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};

use crate::load::Percentiles;
use crate::report::RunRecord;
use crate::rig::Rig;
use crate::services::{self, SITE_ID, Service};

/// Requests per filter (after two unmeasured ones that warm the page cache).
const REQUESTS: usize = 100;
/// Pages followed through `next-page` for the deep-paging figure.
pub(crate) const DEEP_PAGES: usize = 20;

/// Filters as the list page's form sends them, each served by an index of `Notifications`, and
/// whether its first page has rows (every fixture row is Delivered, none stuck or parked).
fn filters() -> Vec<(&'static str, String, bool)> {
    let day_ago = (chrono::Utc::now() - chrono::Duration::days(1))
        .format("%Y-%m-%dT%H:%M")
        .to_string();
    vec![
        ("none", String::new(), true),
        ("status=DELIVERED", "status=DELIVERED".into(), true),
        ("status=PARKED (none match)", "status=PARKED".into(), false),
        ("site", format!("site={SITE_ID}"), true),
        ("list", format!("list={}", services::LIST), true),
        ("last day", format!("from={day_ago}"), true),
        ("stuck only (none match)", "stuck=on".into(), false),
    ]
}

async fn fetch(addr: SocketAddr, path: &str) -> Result<(Duration, String)> {
    let started = Instant::now();
    let reply = metrics_endpoint::get(addr, path)
        .await
        .with_context(|| format!("GET {path}"))?;
    let took = started.elapsed();
    if reply.status != 200 {
        bail!(
            "GET {path} answered {}: {}",
            reply.status,
            reply.body.chars().take(300).collect::<String>()
        );
    }
    Ok((took, reply.body))
}

/// How many notification rows the list page shows.
fn rows_shown(html: &str) -> usize {
    html.matches("data-notification-id=").count()
}

/// The `href` of the page's `next-page` link, unescaped.
fn next_page(html: &str) -> Option<String> {
    let at = html.find("id=\"next-page\"")?;
    let tag_start = html[..at].rfind('<')?;
    let tag_end = at + html[at..].find('>')?;
    let tag = &html[tag_start..tag_end];
    let href = tag.split("href=\"").nth(1)?.split('"').next()?;
    Some(href.replace("&amp;", "&"))
}

pub(crate) async fn console(rig: &mut Rig) -> Result<RunRecord> {
    let fixtures = rig.memory_fixtures()?;
    let dir = rig.run_dir("console")?;
    let (central, console_addr) = central_with_console(
        rig,
        dir.path(),
        &format!("sqlite://{}", fixtures.central.display()),
        "",
    )
    .await?;
    let pages = pages(console_addr).await;
    central.stop().await?;
    let pages = pages?;
    let mut details = pages.details;
    details["rows"] = json!(rig.sizes.memory_rows);
    Ok(RunRecord::new()
        .value("console.list_p99", pages.worst_p99)
        .value("console.deep_p99", pages.deep_p99)
        .value("console.tiles_p50", pages.tiles_p50)
        .value("console.tiles_p99", pages.tiles_p99)
        .detail("console", details))
}

/// Central on `database` with the console on and `[auth] mode = "none"` (so no login is
/// timed, and the admin API answers too), and the console's address; `sections` (whole TOML
/// sections) are appended to its config.
pub(crate) async fn central_with_console(
    rig: &Rig,
    dir: &std::path::Path,
    database: &str,
    sections: &str,
) -> Result<(Service, SocketAddr)> {
    let console_addr = services::free_addr()?;
    let toml = format!(
        "{}\n[auth]\nmode = \"none\"\n\n[console]\nlisten = \"{console_addr}\"\n{sections}",
        services::central_toml(services::free_addr()?, database, services::free_addr()?)
    );
    let central = Service::central(&rig.bins, dir, "central", &toml).await?;
    Ok((central, console_addr))
}

/// What [`pages`] measured.
pub(crate) struct Pages {
    /// The worst p99 of the list pages (every filter, and the deep pages).
    pub worst_p99: f64,
    pub deep_p99: f64,
    pub tiles_p50: f64,
    pub tiles_p99: f64,
    pub details: Value,
}

/// The list page under each filter, [`DEEP_PAGES`] pages by their next-page links and the
/// dashboard, of the console at `console_addr` on a table of Delivered rows of one site and one
/// list (the fixtures' rows), [`REQUESTS`] times each.
pub(crate) async fn pages(console_addr: SocketAddr) -> Result<Pages> {
    let mut pages = serde_json::Map::new();
    let mut worst_p99: f64 = 0.0;
    for (label, query, has_rows) in filters() {
        let path = format!("/notifications?{query}");
        let mut samples = Vec::with_capacity(REQUESTS);
        let mut shown = 0;
        for i in 0..REQUESTS + 2 {
            let (took, body) = fetch(console_addr, &path).await?;
            if !body.contains("id=\"notifications\"") {
                bail!("{path}: no notification table in the page");
            }
            shown = rows_shown(&body);
            if (shown > 0) != has_rows {
                bail!("{path}: the page shows {shown} rows");
            }
            if i >= 2 {
                samples.push(took);
            }
        }
        let p = Percentiles::of(samples);
        worst_p99 = worst_p99.max(p.p99);
        let mut figures = p.to_json();
        figures["rows_per_page"] = json!(shown);
        pages.insert(label.to_string(), figures);
    }

    // Keyset paging: follow the next-page links from the first page.
    let mut path = "/notifications".to_string();
    let mut deep = Vec::with_capacity(DEEP_PAGES);
    for _ in 0..DEEP_PAGES {
        let (took, body) = fetch(console_addr, &path).await?;
        if rows_shown(&body) == 0 {
            bail!("{path}: an empty page before page {DEEP_PAGES}");
        }
        deep.push(took);
        path = next_page(&body)
            .with_context(|| format!("{path}: no next-page link before page {DEEP_PAGES}"))?;
    }
    let deep = Percentiles::of(deep);
    worst_p99 = worst_p99.max(deep.p99);

    // The dashboard: tiles and site health, as each refresh asks for them.
    let mut tiles = Vec::with_capacity(REQUESTS);
    for i in 0..REQUESTS + 2 {
        let (took, body) = fetch(console_addr, "/").await?;
        if !body.contains("data-tile=\"queue_depth\"") {
            bail!("the dashboard has no queue depth tile");
        }
        if i >= 2 {
            tiles.push(took);
        }
    }
    let tiles = Percentiles::of(tiles);
    Ok(Pages {
        worst_p99,
        deep_p99: deep.p99,
        tiles_p50: tiles.p50,
        tiles_p99: tiles.p99,
        details: json!({
            "requests_per_filter": REQUESTS,
            "list_pages": pages,
            "deep_pages": deep.to_json(),
            "dashboard": tiles.to_json(),
        }),
    })
}
