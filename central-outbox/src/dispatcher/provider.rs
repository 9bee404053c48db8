//! A channel loop's provider failover: which provider (relay) the next attempt goes to, what
//! each attempt's answer says about its provider, and the probe of the first provider while the
//! channel is on another. The rule is `domain::failover`'s; this module applies it to the loop's
//! settings, clock and tasks, and makes every move visible: the `outbox_channel_provider` gauge
//! (which an alert rule watches), `outbox_channel_failovers_total`, a warning naming both
//! relays, the provider on every attempt's history entry, and this node's
//! [`FailoverBoard`] (GetKpis, the console). A webhook list's endpoints are its own providers
//! (`super::list_failover`).
//!
//! The state lives in the dispatching node's memory (see `domain::failover` for why that is
//! enough): a new leader, or a change of the channel's relays, starts on the first provider.

use std::sync::Arc;
use std::time::Instant;

use tokio::task::JoinHandle;

use super::attempt::Provider;
use crate::delivery::{ChannelSettings, Deliver};
use crate::domain::NotificationType;
use crate::domain::failover::{FailoverPolicy, Moved, ProviderOutcome, ProviderSelector};
use crate::metrics::Metrics;
use crate::on_fallback::FailoverBoard;

/// One channel's failover state; see the module documentation.
pub(super) struct Failover {
    kind: NotificationType,
    policy: FailoverPolicy,
    metrics: Arc<Metrics>,
    board: Arc<FailoverBoard>,
    /// The providers' names in order, from the settings last followed; empty while the channel
    /// has none to choose from (webhook, or email with no settings stored).
    names: Vec<String>,
    selector: ProviderSelector,
    /// The probe of the first provider under way.
    probe: Option<JoinHandle<ProviderOutcome>>,
}

impl Failover {
    pub(super) fn new(
        kind: NotificationType,
        policy: FailoverPolicy,
        metrics: Arc<Metrics>,
        board: Arc<FailoverBoard>,
    ) -> Self {
        Self {
            kind,
            policy,
            metrics,
            board,
            names: Vec::new(),
            selector: ProviderSelector::new(policy, 1),
            probe: None,
        }
    }

    /// Follows the channel's settings: a changed list of providers starts again on the first
    /// (the admin's order is new evidence that the first is wanted).
    pub(super) fn follow(&mut self, channel: &ChannelSettings) {
        let names = channel.provider_names();
        if names == self.names {
            return;
        }
        if self.selector.on_fallback() {
            tracing::warn!(
                channel = %self.kind,
                relays = ?names,
                "the channel's relays changed while it was on a fallback: it goes back to its first"
            );
        }
        self.selector = ProviderSelector::new(self.policy, names.len());
        self.names = names;
        self.metrics.set_channel_provider(self.kind, 0);
        self.board
            .set(self.kind, None, 0, &self.names, chrono::Utc::now());
        if let Some(probe) = self.probe.take() {
            probe.abort();
        }
    }

    /// Starts again on the first provider: this node's term under the lease changed, and what
    /// it learnt in another term is no longer its to act on (nor to show: a standby's gauge
    /// reads 0).
    pub(super) fn new_term(&mut self) {
        self.selector = ProviderSelector::new(self.policy, self.names.len());
        self.metrics.set_channel_provider(self.kind, 0);
        self.board
            .set(self.kind, None, 0, &self.names, chrono::Utc::now());
        self.stop();
    }

    /// The provider the next attempt goes to; `None` while the channel has none.
    pub(super) fn provider(&self) -> Option<Provider> {
        let index = self.selector.active();
        self.names.get(index).map(|name| Provider {
            index,
            name: name.clone(),
        })
    }

    /// An attempt at provider `index` ended so, at `now`.
    pub(super) fn answered(&mut self, index: usize, outcome: ProviderOutcome, now: Instant) {
        if let Some(moved) = self.selector.record(index, outcome, now) {
            self.moved(moved);
        }
    }

    /// When the next probe of the first provider is due: only while the channel is on another
    /// and no probe is under way.
    pub(super) fn probe_at(&self) -> Option<tokio::time::Instant> {
        if self.probe.is_some() {
            return None;
        }
        self.selector
            .next_probe_at()
            .map(tokio::time::Instant::from_std)
    }

    /// Starts the probe of `channel`'s first provider, as a task of its own (the loop never
    /// waits for a relay).
    pub(super) fn start_probe<D: Deliver>(&mut self, delivery: &Arc<D>, channel: &ChannelSettings) {
        let delivery = Arc::clone(delivery);
        let channel = channel.clone();
        self.probe = Some(tokio::spawn(
            async move { delivery.probe_first(&channel).await },
        ));
    }

    /// Whether a probe is under way.
    pub(super) fn probing(&self) -> bool {
        self.probe.is_some()
    }

    /// The answer of the probe under way (pending while there is none; the loop's select
    /// checks [`Self::probing`] first). A probe task that panicked counts as a failed probe.
    pub(super) async fn probe_answer(&mut self) -> ProviderOutcome {
        match self.probe.as_mut() {
            Some(probe) => probe.await.unwrap_or_else(|e| {
                tracing::error!(channel = %self.kind, error = %e, "a relay probe task failed");
                ProviderOutcome::Failed
            }),
            None => std::future::pending().await,
        }
    }

    /// The probe under way answered `outcome` at `now`; a good one moves the channel back to
    /// its first provider.
    pub(super) fn probed(&mut self, outcome: ProviderOutcome, now: Instant) {
        self.probe = None;
        tracing::debug!(channel = %self.kind, ?outcome, "probed the first relay");
        if let Some(moved) = self.selector.probed(outcome, now) {
            self.moved(moved);
        }
    }

    /// Stops a probe under way (the loop is draining).
    pub(super) fn stop(&mut self) {
        if let Some(probe) = self.probe.take() {
            probe.abort();
        }
    }

    fn moved(&self, moved: Moved) {
        let name = |index: usize| self.names.get(index).map_or("?", String::as_str);
        tracing::warn!(
            channel = %self.kind,
            from = name(moved.from),
            to = name(moved.to),
            why = %moved.why,
            "the channel moved to another relay"
        );
        self.metrics
            .channel_moved(self.kind, moved.to, moved.why.as_str());
        self.board
            .set(self.kind, None, moved.to, &self.names, chrono::Utc::now());
    }
}
