//! The dashboard: the KPI tiles (GetKpis, global and per source site), what delivers through a
//! fallback provider (GetKpis' failover state: the email channel on a fallback relay, webhook
//! lists on a fallback URL), and every site node's health (ListSiteHealth): online, or offline since when, and the backlog at the site. When
//! central does not tell sites apart (no client certificates required), a warning says that
//! any client may act as any site, so the health shown may not be the site's own.

use askama::Template;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use outbox_proto::v1;

use super::display;
use super::reply::{self, Failure, Layout};
use super::{Shared, Visit};

/// One KPI tile; `key` is its `data-tile`.
struct Tile {
    key: &'static str,
    label: &'static str,
    value: String,
    /// Shown as a warning when the figure is not zero.
    alarming: bool,
}

/// The figures of one source site.
struct SiteKpis {
    site: String,
    queue_depth: u64,
    stuck: u64,
    parked: u64,
    delivered_recent: u64,
    oldest_pending_age: String,
}

/// A channel or webhook list delivering through a fallback provider.
struct OnFallbackRow {
    channel: String,
    /// The webhook list; empty for the email channel.
    list: String,
    provider: String,
    first: String,
    since: String,
}

/// One site node's health row.
struct SiteNode {
    site: String,
    node: String,
    role: String,
    online: bool,
    /// "online" or "offline since <time>".
    state: String,
    buffer_depth: u64,
    oldest_age: String,
    last_report_age: String,
    last_forward: String,
    standby_lag: String,
    version: String,
}

#[derive(Template)]
#[template(path = "console/dashboard.html")]
struct DashboardPage {
    layout: Layout,
    tiles: Vec<Tile>,
    /// Whether the node that answered dispatches: only then does `on_fallback` say anything.
    dispatching: bool,
    on_fallback: Vec<OnFallbackRow>,
    sites: Vec<SiteKpis>,
    nodes: Vec<SiteNode>,
    computed_at: String,
    delivered_window: String,
    stuck_after: String,
    offline_after: String,
    /// Ingest does not tell sites apart (no client certificates required): warn.
    sites_unverified: bool,
}

fn tiles(kpis: &v1::KpiValues) -> Vec<Tile> {
    vec![
        Tile {
            key: "queue_depth",
            label: "Queue depth",
            value: kpis.queue_depth.to_string(),
            alarming: false,
        },
        Tile {
            key: "stuck",
            label: "Stuck",
            value: kpis.stuck_count.to_string(),
            alarming: kpis.stuck_count > 0,
        },
        Tile {
            key: "parked",
            label: "Parked",
            value: kpis.parked_count.to_string(),
            alarming: kpis.parked_count > 0,
        },
        Tile {
            key: "delivered_recent",
            label: "Delivered recently",
            value: kpis.delivered_recently.to_string(),
            alarming: false,
        },
        Tile {
            key: "oldest_pending_age",
            label: "Oldest pending",
            value: display::age(kpis.oldest_pending_age_seconds),
            alarming: false,
        },
    ]
}

/// The tile of what delivers through a fallback provider: how many channels and lists do, or
/// a dash on a node that does not dispatch (it cannot know).
fn fallback_tile(state: &v1::FailoverState) -> Tile {
    Tile {
        key: "on_fallback",
        label: "On a fallback provider",
        value: if state.dispatching {
            state.on_fallback.len().to_string()
        } else {
            "\u{2014}".to_owned()
        },
        alarming: !state.on_fallback.is_empty(),
    }
}

fn on_fallback_row(f: v1::OnFallback) -> OnFallbackRow {
    OnFallbackRow {
        channel: display::kind(f.channel),
        provider: format!("{} (fallback {})", f.provider_name, f.provider),
        first: f.first_provider,
        since: display::time(f.since.as_ref()),
        list: f.list,
    }
}

fn node(view: v1::SiteHealthView) -> SiteNode {
    let state = if view.online {
        "online".to_owned()
    } else {
        format!(
            "offline since {}",
            display::time(view.offline_since.as_ref())
        )
    };
    SiteNode {
        role: display::role(view.role),
        online: view.online,
        state,
        buffer_depth: view.buffer_depth,
        oldest_age: display::age(Some(view.oldest_buffered_age_seconds)),
        last_report_age: display::age(Some(view.last_report_age_seconds)),
        last_forward: display::time(view.last_forward_at.as_ref()),
        standby_lag: if view.standby_lag_rows == 0 {
            String::new()
        } else {
            format!(
                "{} rows, {}",
                view.standby_lag_rows,
                display::age(Some(view.standby_lag_seconds))
            )
        },
        version: view.version,
        site: view.site_id,
        node: view.node_name,
    }
}

/// `GET /`.
pub(super) async fn show(State(console): State<Shared>, visit: Visit) -> Response {
    let (kpis, health) = tokio::join!(
        console.outbox.get_kpis(visit.request(v1::GetKpisRequest {
            // The tiles refresh every few seconds in every open tab: share the figures
            // `/metrics` computes at most once a second instead of a query per refresh.
            max_age: Some(prost_types::Duration {
                seconds: 1,
                nanos: 0,
            }),
        })),
        console
            .outbox
            .list_site_health(visit.request(v1::ListSiteHealthRequest {})),
    );
    let (kpis, health) = match (kpis, health) {
        (Ok(kpis), Ok(health)) => (kpis.into_inner(), health.into_inner()),
        (Err(status), _) | (_, Err(status)) => {
            return reply::error_page(Some(visit.layout("dashboard")), Failure::from(status));
        }
    };
    let global = kpis.global.unwrap_or_default();
    let failover = kpis.failover.unwrap_or_default();
    let mut tiles = tiles(&global);
    tiles.push(fallback_tile(&failover));
    let page = DashboardPage {
        layout: visit.layout("dashboard"),
        tiles,
        dispatching: failover.dispatching,
        on_fallback: failover
            .on_fallback
            .into_iter()
            .map(on_fallback_row)
            .collect(),
        sites: kpis
            .sites
            .into_iter()
            .map(|s| {
                let k = s.kpis.unwrap_or_default();
                SiteKpis {
                    site: s.source_site_id,
                    queue_depth: k.queue_depth,
                    stuck: k.stuck_count,
                    parked: k.parked_count,
                    delivered_recent: k.delivered_recently,
                    oldest_pending_age: display::age(k.oldest_pending_age_seconds),
                }
            })
            .collect(),
        nodes: health.nodes.into_iter().map(node).collect(),
        computed_at: display::time(kpis.computed_at.as_ref()),
        delivered_window: display::duration(kpis.delivered_kpi_window.as_ref()),
        stuck_after: display::duration(kpis.stuck_age_threshold.as_ref()),
        offline_after: display::duration(health.site_offline_after.as_ref()),
        sites_unverified: !console.site_identity.tells_sites_apart(),
    };
    reply::page(StatusCode::OK, &page, visit.set_cookie.as_deref())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fallback_tile_counts_only_on_the_dispatching_node() {
        let mut state = v1::FailoverState::default();
        let tile = fallback_tile(&state);
        assert_eq!((tile.value.as_str(), tile.alarming), ("\u{2014}", false));
        state.dispatching = true;
        assert_eq!(fallback_tile(&state).value, "0");
        state.on_fallback.push(v1::OnFallback {
            channel: v1::NotificationType::Webhook.into(),
            list: "ops-hooks".into(),
            provider: 1,
            provider_name: "http://127.0.0.1:9".into(),
            first_provider: "https://h.test".into(),
            since: None,
        });
        let tile = fallback_tile(&state);
        assert_eq!((tile.value.as_str(), tile.alarming), ("1", true));
        let row = on_fallback_row(state.on_fallback.remove(0));
        assert_eq!(row.provider, "http://127.0.0.1:9 (fallback 1)");
        assert_eq!(row.list, "ops-hooks");
    }
}
