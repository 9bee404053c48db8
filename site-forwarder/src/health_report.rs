//! Reports this node's health to central every `health_report_interval`
//! (`NotificationIngest.ReportSiteHealth`): the figures `GetBufferStats` shows (buffer depth,
//! oldest buffered age, last forward, role, standby lag) with the node's name and version.
//!
//! A unary call on a timer, not a message on the submit stream: it goes out the same way whether
//! the stream is busy, idle or down (a standby has no stream at all), the stream's contract
//! (submits in, acks out) stays as every central and site already speak it, and central checks
//! it against the caller's certificate like any other call. It rides the connection the node
//! already keeps for status lookups (`CentralStatus`), and the first report goes out at start, so
//! a node that comes back is online at central within one round trip.
//!
//! Invariants: one report in flight at a time, each bounded by `request_timeout`; a failed
//! report is not retried (the next one is due an interval later, and carries newer figures);
//! the loop stops at once on the shutdown token.

use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use outbox_proto::time::to_timestamp;
use outbox_proto::v1::SiteHealthReport;
use outbox_proto::v1::notification_ingest_client::NotificationIngestClient;
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;

use crate::buffer::StatusReader;
use crate::domain::Role;
use crate::domain::SiteId;
use crate::forwarder::ForwardState;
use crate::pair::Pair;

/// The version a node reports: this crate's.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// Sends this node's health reports until stopped.
#[derive(Clone)]
pub(crate) struct HealthReporter {
    client: NotificationIngestClient<Channel>,
    site: SiteId,
    buffer: StatusReader,
    forwarding: Arc<ForwardState>,
    pair: Arc<Pair>,
    interval: Duration,
    timeout: Duration,
}

impl HealthReporter {
    pub(crate) fn new(
        channel: Channel,
        site: SiteId,
        buffer: StatusReader,
        forwarding: Arc<ForwardState>,
        pair: Arc<Pair>,
        interval: Duration,
        timeout: Duration,
    ) -> Self {
        Self {
            client: NotificationIngestClient::new(channel),
            site,
            buffer,
            forwarding,
            pair,
            interval,
            timeout,
        }
    }

    /// Reports now and then every interval until `stop`.
    pub(crate) async fn run(mut self, stop: CancellationToken) {
        let mut tick = tokio::time::interval(self.interval);
        // A report that took long is followed by the next one an interval later, not a burst.
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // Whether the last report reached central: failures are logged when they start and end,
        // not once per interval through a long outage.
        let mut reaching = true;
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                _ = tick.tick() => {}
            }
            let sent = tokio::select! {
                () = stop.cancelled() => return,
                sent = self.report_once() => sent,
            };
            match sent {
                Ok(()) => {
                    if !reaching {
                        tracing::info!("health reports reach central again");
                    }
                    reaching = true;
                }
                Err(status) => {
                    if reaching {
                        // Refused (a certificate for another site, or a site already reported
                        // by as many nodes as central keeps): a configuration to fix.
                        let refused = matches!(
                            status.code(),
                            tonic::Code::PermissionDenied
                                | tonic::Code::InvalidArgument
                                | tonic::Code::ResourceExhausted
                        );
                        if refused {
                            tracing::warn!(%status, "central refused this node's health report");
                        } else {
                            tracing::info!(%status, "cannot report health to central; will keep trying");
                        }
                    }
                    reaching = false;
                }
            }
        }
    }

    /// Gathers the figures and sends one report, within the timeout.
    pub(crate) async fn report_once(&mut self) -> Result<(), tonic::Status> {
        let report = self.gather().await?;
        let mut request = tonic::Request::new(report);
        request.set_timeout(self.timeout);
        match tokio::time::timeout(self.timeout, self.client.report_site_health(request)).await {
            Ok(answer) => answer.map(drop),
            Err(_) => Err(tonic::Status::deadline_exceeded(format!(
                "no answer within {:?}",
                self.timeout
            ))),
        }
    }

    /// This node's figures now, as `GetBufferStats` computes them.
    async fn gather(&self) -> Result<SiteHealthReport, tonic::Status> {
        let stats = self
            .buffer
            .stats()
            .await
            .map_err(|e| tonic::Status::internal(format!("reading the buffer: {e}")))?;
        let forwarding = self.forwarding.snapshot();
        let pair = self.pair.status();
        let room = self.buffer.room_status();
        Ok(SiteHealthReport {
            site_id: self.site.as_str().to_owned(),
            node_name: pair.node_name,
            role: crate::wire::role_to_proto(pair.role).into(),
            buffer_depth: stats.depth,
            oldest_buffered_age_seconds: stats.oldest_age_seconds(Utc::now()),
            last_forward_at: forwarding.last_forward_at.map(to_timestamp),
            standby_lag_rows: pair.standby_lag_rows,
            standby_lag_seconds: pair.standby_lag_seconds,
            version: VERSION.to_owned(),
            // Only the active forwards; a standby's figure is left from when it last was active.
            central_reachable: pair.role == Role::Active && forwarding.central_reachable,
            rejected: stats.rejected,
            sends_refused: room.refusing.is_some(),
        })
    }
}
