//! What operators read on a year of history (issue 37): `GetKpis` computed fresh (no
//! `max_age`, so every call runs the KPI statements), the console's pages, and central's
//! memory once it has answered them.
//!
//! Central runs on a copy of the `history` group's database with the console on and the admin
//! API open (`console::central_with_console`). Its rows are the console figure's kind
//! (Delivered, one site, one list), so the console's pages and their checks apply unchanged.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use outbox_proto::v1;
use outbox_proto::v1::notification_outbox_client::NotificationOutboxClient;
use serde_json::json;

use crate::console::{self, Pages};
use crate::load::Percentiles;
use crate::proc_stats::Memory;
use crate::rig::Rig;
use crate::services::Service;

/// Fresh `GetKpis` calls timed (after two unmeasured ones).
const KPI_CALLS: usize = 200;
/// The KPIs' delivered window: a day (some 14,000 of 5,000,000 rows) rather than central's
/// minute, so the count has rows to read.
const KPI_WINDOW: &str = "\n[kpis]\ndelivered_kpi_window = \"24h\"\n";
/// Lets allocator and page-cache activity of the last request settle before RSS is read.
const SETTLE: Duration = Duration::from_millis(500);

pub(crate) struct Reads {
    pub kpis: Percentiles,
    pub pages: Pages,
    pub memory: Memory,
}

/// The reads on a copy of the history (`rig.set_history(true)` must be on).
pub(crate) async fn reads(rig: &mut Rig) -> Result<Reads> {
    let dir = rig.run_dir("history-reads")?;
    let db = rig.central_db(dir.path()).await?;
    let (central, console_addr) =
        console::central_with_console(rig, dir.path(), &db.url(), KPI_WINDOW).await?;
    let measured = async {
        let kpis = kpis(&central, rig.sizes.history_rows).await?;
        let pages = console::pages(console_addr).await?;
        tokio::time::sleep(SETTLE).await;
        Ok::<_, anyhow::Error>((kpis, pages, central.memory()?))
    }
    .await;
    central.stop().await?;
    let (kpis, pages, memory) = measured?;
    Ok(Reads {
        kpis,
        pages,
        memory,
    })
}

/// [`KPI_CALLS`] fresh `GetKpis`, each checked against the history: nothing waiting, and the
/// rows delivered within the KPI window as many as the fixture spread into it.
async fn kpis(central: &Service, history_rows: u64) -> Result<Percentiles> {
    let mut outbox = NotificationOutboxClient::new(central.connect().await?);
    let mut samples = Vec::with_capacity(KPI_CALLS);
    for i in 0..KPI_CALLS + 2 {
        let started = Instant::now();
        let reply = outbox
            .get_kpis(v1::GetKpisRequest::default())
            .await
            .context("GetKpis")?
            .into_inner();
        let took = started.elapsed();
        let global = reply.global.context("GetKpis: no global figures")?;
        let window = reply
            .delivered_kpi_window
            .and_then(|w| Duration::try_from(w).ok())
            .context("GetKpis: no delivered_kpi_window")?;
        // The fixture spreads its rows evenly over 365 days, ending now.
        let expected = history_rows as f64 * window.as_secs_f64() / (365.0 * 24.0 * 3600.0);
        let delivered = global.delivered_recently as f64;
        if global.queue_depth != 0 || (delivered - expected).abs() > expected * 0.05 + 2.0 {
            bail!(
                "GetKpis on the history: queue depth {} (0 expected), {delivered} delivered \
                 within {window:?} (about {expected:.0} expected)",
                global.queue_depth
            );
        }
        if i >= 2 {
            samples.push(took);
        }
    }
    Ok(Percentiles::of(samples))
}

impl Reads {
    pub(crate) fn to_json(&self) -> serde_json::Value {
        json!({
            "get_kpis_fresh": self.kpis.to_json(),
            "console": self.pages.details.clone(),
            "central_memory": self.memory.to_json(),
        })
    }
}
