//! Figures 7 and 8: resident memory of central holding `memory_rows` notifications and of a site
//! holding as many buffered, and the site's Send rate with that backlog next to its rate with an
//! empty buffer, measured back to back in the same run so the ratio compares like with like.
//!
//! RSS is read after each service has served a few typical requests (for central: KPIs, the
//! first page of the UI list, a status filter, a subject search that reads every row, and
//! single-notification lookups; for the site: buffer stats, which count every row, and a few
//! Sends), so it includes what answering costs, not just start-up.
//!
//! Disk traffic is kept away from the Send measurements: the site's full buffer is copied first
//! (its Sends add rows, so every run needs a fresh copy), while central runs on the shared
//! fixture itself (it only reads the rows; start-up rewrites its config rows and the lease).
//! Copying and deleting the ~1 GB of both files right before a Send loop measurably slowed
//! fsync on the `discard`-mounted disk this was developed on.

use std::time::Duration;

use anyhow::{Context, Result};
use outbox_proto::v1;
use outbox_proto::v1::notification_outbox_client::NotificationOutboxClient;
use serde_json::json;

use crate::fixtures;
use crate::proc_stats::{CpuWindow, flush_disk, own_pid};
use crate::report::RunRecord;
use crate::rig::{Rig, check_count};
use crate::services::{self, Service};
use crate::site_figures::{buffer_stats, lone_site, send_closed_loop, send_once, site_clients};

/// Lets allocator and page-cache activity of the last request settle before RSS is read.
const SETTLE: Duration = Duration::from_millis(500);

pub(crate) async fn memory(rig: &mut Rig) -> Result<RunRecord> {
    let fixtures = rig.memory_fixtures()?;
    let rows = rig.sizes.memory_rows;
    let dir = rig.run_dir("memory")?;
    let full_site = dir.path().join("site-full.db");
    fixtures::copy_db(&fixtures.site, &full_site)?;
    flush_disk();

    // Central with the full table.
    // Always SQLite: on MS SQL this group is skipped (see `Backend::unsupported`).
    // The admin API open (`[auth] mode = "none"`, on loopback): the figure is memory, not auth.
    let toml = format!(
        "{}\n[auth]\nmode = \"none\"\n",
        services::central_toml(
            services::free_addr()?,
            &format!("sqlite://{}", fixtures.central.display()),
            services::free_addr()?,
        )
    );
    let central = Service::central(&rig.bins, dir.path(), "central", &toml).await?;
    let central_memory = {
        let mut outbox = NotificationOutboxClient::new(central.connect().await?);
        let kpis = outbox
            .get_kpis(v1::GetKpisRequest::default())
            .await
            .context("GetKpis")?
            .into_inner();
        let delivered_filter = v1::NotificationFilter {
            statuses: vec![v1::NotificationStatus::Delivered.into()],
            ..Default::default()
        };
        // A subject search that matches nothing reads every row: the worst an operator's
        // query can do to the page cache.
        let search_filter = v1::NotificationFilter {
            subject_contains: "no such subject".into(),
            ..Default::default()
        };
        for filter in [None, Some(delivered_filter), Some(search_filter)] {
            let page = outbox
                .query_notifications(v1::QueryNotificationsRequest {
                    filter,
                    page_size: 50,
                    page_token: String::new(),
                })
                .await
                .context("QueryNotifications")?
                .into_inner();
            for n in page.notifications.iter().take(5) {
                outbox
                    .get_notification_status(v1::GetNotificationStatusRequest {
                        notification_id: n.notification_id.clone(),
                    })
                    .await
                    .context("GetNotificationStatus")?;
            }
        }
        tokio::time::sleep(SETTLE).await;
        let memory = central.memory()?;
        central.stop().await?;
        let queue = kpis.global.map(|k| k.queue_depth).unwrap_or(0);
        check_count("central's queue depth (all rows are delivered)", queue, 0)?;
        memory
    };

    // The Send rate with the full buffer and with an empty one. Which goes first alternates
    // from run to run, so whatever the first loop of a pair pays (or gains) cancels out in the
    // median instead of biasing the ratio.
    let full_first = rig.next_memory_run() % 2 == 1;
    let mut empty = None;
    let mut full = None;
    let mut site_memory = None;
    let mut site_after_load = None;
    let mut cores = None;
    let empty_dir = rig.run_dir("memory-empty-site")?;
    for full_turn in [full_first, !full_first] {
        if !full_turn {
            let site = lone_site(rig, empty_dir.path(), None).await?;
            flush_disk();
            empty = Some(send_closed_loop(rig, &site).await?);
            site.stop().await?;
            continue;
        }
        let site = lone_site(rig, dir.path(), Some(&full_site)).await?;
        check_count("buffered rows", buffer_stats(&site).await?.depth, rows)?;
        for client in site_clients(&site, 1).await? {
            for _ in 0..10 {
                send_once(client.clone())
                    .await
                    .map_err(anyhow::Error::msg)?;
            }
        }
        tokio::time::sleep(SETTLE).await;
        site_memory = Some(site.memory()?);
        flush_disk();
        let cpu = CpuWindow::start(&[("site", site.pid()), ("bench", own_pid())]);
        full = Some(send_closed_loop(rig, &site).await?);
        cores = Some(cpu.cores());
        site_after_load = Some(site.memory()?);
        site.stop().await?;
    }
    let (Some(empty), Some(full), Some(site_memory), Some(site_after_load), Some(cores)) =
        (empty, full, site_memory, site_after_load, cores)
    else {
        anyhow::bail!("the memory run skipped a step");
    };

    Ok(RunRecord::new()
        .value("memory.central_rss", central_memory.rss_mib())
        .value("memory.site_rss", site_memory.rss_mib())
        .value("send_full.ratio", full.rate / empty.rate)
        .value("send_full.rate", full.rate)
        .value("send_full.empty_rate", empty.rate)
        .detail("rows", json!(rows))
        .detail("central_memory", central_memory.to_json())
        .detail("site_memory", site_memory.to_json())
        .detail("site_memory_after_send_load", site_after_load.to_json())
        .detail("send_empty", empty.to_json())
        .detail("send_full", full.to_json())
        .detail("fixture_build_seconds", json!(fixtures.build_seconds))
        .detail("full_buffer_measured_first", json!(full_first))
        .cpu(cores))
}
