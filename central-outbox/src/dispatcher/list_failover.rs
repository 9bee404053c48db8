//! Failover of webhook lists: a list with fallback URLs has its own providers (its endpoint,
//! then its fallbacks, in order), so each such list has its own failover state, kept by the
//! webhook channel's loop beside the channel's (`super::provider`). The rule is
//! `domain::failover`'s, with the same policy as the email channel's relays.
//!
//! The loop never reads a list (that is the attempt's, through the config cache, so the loop
//! never waits for the database). So the state learns a list's providers from the attempts:
//! an attempt is started with the loop's [`Route`] for its list (the provider it believes is
//! active, and the names it believes the list has); the attempt resolves the list, goes to that
//! provider if the list still has those names (else to the first), and reports back what it
//! found ([`ListReport`]): the list's names and first endpoint, and how the provider answered.
//! A list whose providers changed starts again on its first; one without fallbacks any more, or
//! gone, leaves the state. A list the state does not know yet goes to its first, as a new list
//! does.
//!
//! Every move shows: the `outbox_list_provider{list}` gauge (an alert rule watches it),
//! `outbox_list_failovers_total{list, reason}`, a warning naming both endpoints (by scheme, host
//! and port: the rest of a URL may be its credential), the provider on each attempt's history
//! entry, and the node's [`FailoverBoard`]. While a list is on a fallback, its first endpoint is
//! probed (`Deliver::probe_endpoint`, a HEAD) every `probe_every`; a good probe moves it back.
//!
//! Invariants: at most one probe under way per list; a probe's answer counts only for the
//! list state it was started for (a list whose providers changed meanwhile ignores it).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use tokio::task::JoinSet;

use crate::delivery::{ChannelSettings, Deliver};
use crate::domain::failover::{FailoverPolicy, Moved, ProviderOutcome, ProviderSelector};
use crate::domain::webhook::WebhookUrl;
use crate::domain::{ListName, NotificationType};
use crate::metrics::Metrics;
use crate::on_fallback::FailoverBoard;

/// Where the loop believes a list's next attempt goes.
#[derive(Debug, Clone)]
pub(super) struct Route {
    pub(super) index: usize,
    /// The list's provider names as last reported; the attempt goes to `index` only if the
    /// list it resolves still has exactly these.
    pub(super) names: Arc<Vec<String>>,
}

impl Route {
    /// The provider of a list with providers `names` that this route sends to: its index if
    /// the names are the ones it was made for, else the first.
    pub(super) fn index_for(route: Option<&Self>, names: &[String]) -> usize {
        route
            .filter(|r| r.names.as_slice() == names && r.index < names.len())
            .map_or(0, |r| r.index)
    }
}

/// What an attempt found out about its list's providers.
#[derive(Debug, Clone)]
pub(super) struct ListReport {
    pub(super) list: ListName,
    pub(super) seen: Seen,
}

#[derive(Debug, Clone)]
pub(super) enum Seen {
    /// The list has fallbacks: its providers' names and its first endpoint (for the probe),
    /// and how the provider the attempt went to answered (`None`: it was not asked).
    Providers {
        names: Vec<String>,
        first: WebhookUrl,
        answered: Option<(usize, ProviderOutcome)>,
    },
    /// The list is gone, or has no fallbacks (any more): nothing to choose from.
    Nothing,
}

/// One list's failover state.
struct ListState {
    names: Arc<Vec<String>>,
    first: WebhookUrl,
    selector: ProviderSelector,
    /// Which state this is, for a probe's answer to find it (`None`: no probe under way).
    generation: u64,
    probing: bool,
}

/// Every webhook list's failover state on this node; see the module documentation.
pub(super) struct ListFailovers {
    policy: FailoverPolicy,
    metrics: Arc<Metrics>,
    board: Arc<FailoverBoard>,
    lists: HashMap<ListName, ListState>,
    /// Each state's generation is new, so a probe started for an earlier one is ignored.
    next_generation: u64,
    /// The probes under way: each answers with its list, the generation it was started for
    /// and the outcome.
    probes: JoinSet<(ListName, u64, ProviderOutcome)>,
}

impl ListFailovers {
    pub(super) fn new(
        policy: FailoverPolicy,
        metrics: Arc<Metrics>,
        board: Arc<FailoverBoard>,
    ) -> Self {
        Self {
            policy,
            metrics,
            board,
            lists: HashMap::new(),
            next_generation: 0,
            probes: JoinSet::new(),
        }
    }

    /// Where `list`'s next attempt goes, as far as this state knows (`None`: a list it does
    /// not follow, which goes to its first).
    pub(super) fn route(&self, list: &ListName) -> Option<Route> {
        self.lists.get(list).map(|state| Route {
            index: state.selector.active(),
            names: Arc::clone(&state.names),
        })
    }

    /// Takes in what an attempt found out, at `now`.
    pub(super) fn reported(&mut self, report: ListReport, now: Instant) {
        let ListReport { list, seen } = report;
        let Seen::Providers {
            names,
            first,
            answered,
        } = seen
        else {
            if self.lists.remove(&list).is_some() {
                self.metrics.forget_list_provider(list.as_str());
                self.board.set(
                    NotificationType::Webhook,
                    Some(list.as_str()),
                    0,
                    &[],
                    chrono::Utc::now(),
                );
            }
            return;
        };
        let known = match self.lists.get_mut(&list) {
            Some(state) if *state.names == names => {
                // Same providers; the endpoint's path may have changed (names show none of
                // it), and the probe goes where attempts would.
                state.first = first.clone();
                true
            }
            _ => false,
        };
        if !known {
            if self
                .lists
                .get(&list)
                .is_some_and(|s| s.selector.on_fallback())
            {
                tracing::warn!(
                    list = %list,
                    endpoints = ?names,
                    "the list's endpoints changed while it was on a fallback: it goes back to its first"
                );
            }
            self.next_generation += 1;
            let state = ListState {
                selector: ProviderSelector::new(self.policy, names.len()),
                names: Arc::new(names),
                first,
                generation: self.next_generation,
                probing: false,
            };
            self.metrics.set_list_provider(list.as_str(), 0);
            self.board.set(
                NotificationType::Webhook,
                Some(list.as_str()),
                0,
                &state.names,
                chrono::Utc::now(),
            );
            self.lists.insert(list.clone(), state);
        }
        if let Some((index, outcome)) = answered {
            let moved = self
                .lists
                .get_mut(&list)
                .and_then(|state| state.selector.record(index, outcome, now));
            if let Some(moved) = moved {
                self.moved(&list, moved);
            }
        }
    }

    /// When the next probe is due: the earliest of the lists on a fallback with no probe under
    /// way.
    pub(super) fn probe_at(&self) -> Option<tokio::time::Instant> {
        self.lists
            .values()
            .filter(|state| !state.probing)
            .filter_map(|state| state.selector.next_probe_at())
            .min()
            .map(tokio::time::Instant::from_std)
    }

    /// Starts the probes due at `now`, each as a task of its own (the loop never waits for an
    /// endpoint).
    pub(super) fn start_probes<D: Deliver>(
        &mut self,
        delivery: &Arc<D>,
        channel: &ChannelSettings,
        now: Instant,
    ) {
        for (list, state) in &mut self.lists {
            if state.probing || !state.selector.probe_due(now) {
                continue;
            }
            state.probing = true;
            let (delivery, channel) = (Arc::clone(delivery), channel.clone());
            let (list, generation, first) = (list.clone(), state.generation, state.first.clone());
            self.probes.spawn(async move {
                let outcome = delivery.probe_endpoint(&channel, &first).await;
                (list, generation, outcome)
            });
        }
    }

    /// Whether a probe is under way.
    pub(super) fn probing(&self) -> bool {
        !self.probes.is_empty()
    }

    /// The next probe's answer (pending while there is none; the loop's select checks
    /// [`Self::probing`] first), taken in at once: a good one moves its list back to its first.
    /// A probe task that panicked is lost, and its list is probed again at its next interval.
    pub(super) async fn probe_answered(&mut self) {
        let Some(joined) = self.probes.join_next().await else {
            return std::future::pending().await;
        };
        let (list, generation, outcome) = match joined {
            Ok(answer) => answer,
            Err(e) => {
                tracing::error!(error = %e, "a webhook endpoint probe task failed");
                // Which list it was is lost with the task: let every list probe again.
                self.lists.values_mut().for_each(|s| s.probing = false);
                return;
            }
        };
        let now = tokio::time::Instant::now().into_std();
        let Some(state) = self
            .lists
            .get_mut(&list)
            .filter(|s| s.generation == generation)
        else {
            return;
        };
        state.probing = false;
        tracing::debug!(list = %list, ?outcome, "probed the list's first endpoint");
        if let Some(moved) = state.selector.probed(outcome, now) {
            self.moved(&list, moved);
        }
    }

    /// Forgets every list's state: this node's term under the lease changed, and what it
    /// learnt in another term is no longer its to act on (nor to show).
    pub(super) fn new_term(&mut self) {
        for list in self.lists.keys() {
            self.metrics.forget_list_provider(list.as_str());
        }
        self.lists.clear();
        self.board.clear(NotificationType::Webhook);
        self.stop();
    }

    /// Stops the probes under way (the loop is draining, or a new term began).
    pub(super) fn stop(&mut self) {
        self.probes.abort_all();
        self.lists.values_mut().for_each(|s| s.probing = false);
    }

    fn moved(&self, list: &ListName, moved: Moved) {
        let Some(state) = self.lists.get(list) else {
            return;
        };
        let name = |index: usize| state.names.get(index).map_or("?", String::as_str);
        tracing::warn!(
            list = %list,
            from = name(moved.from),
            to = name(moved.to),
            why = %moved.why,
            "the webhook list moved to another endpoint"
        );
        self.metrics
            .list_moved(list.as_str(), moved.to, moved.why.as_str());
        self.board.set(
            NotificationType::Webhook,
            Some(list.as_str()),
            moved.to,
            &state.names,
            chrono::Utc::now(),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use ProviderOutcome::{Answered, Failed};

    fn failovers() -> (ListFailovers, Arc<FailoverBoard>, Arc<Metrics>) {
        let board = Arc::new(FailoverBoard::default());
        let metrics = Arc::new(Metrics::new());
        (
            ListFailovers::new(
                FailoverPolicy::default(),
                Arc::clone(&metrics),
                Arc::clone(&board),
            ),
            board,
            metrics,
        )
    }

    fn seen(names: &[&str], answered: Option<(usize, ProviderOutcome)>) -> Seen {
        Seen::Providers {
            names: names.iter().map(|n| (*n).to_owned()).collect(),
            first: WebhookUrl::parse("https://h.test/hook").unwrap(),
            answered,
        }
    }

    fn report(list: &ListName, seen: Seen) -> ListReport {
        ListReport {
            list: list.clone(),
            seen,
        }
    }

    #[test]
    fn a_list_learnt_from_its_attempts_moves_after_three_failures_and_shows_it() {
        let (mut f, board, metrics) = failovers();
        let ops = ListName::parse("ops".to_owned()).unwrap();
        let names = ["https://h.test", "https://b.test"];
        let t0 = Instant::now();
        assert!(f.route(&ops).is_none(), "unknown: its first");
        for _ in 0..3 {
            let route = f.route(&ops);
            let index = Route::index_for(route.as_ref(), &names.map(String::from));
            f.reported(report(&ops, seen(&names, Some((index, Failed)))), t0);
        }
        let route = f.route(&ops).unwrap();
        assert_eq!(route.index, 1);
        assert_eq!(board.snapshot()[0].provider_name, "https://b.test");
        assert!(
            metrics
                .render()
                .contains("outbox_list_provider{list=\"ops\"} 1")
        );
        assert!(f.probe_at().is_some(), "its first is probed");
        // The route holds only for the names it was made for.
        assert_eq!(Route::index_for(Some(&route), &names.map(String::from)), 1);
        assert_eq!(
            Route::index_for(
                Some(&route),
                &["https://h.test".to_owned(), "https://c.test".to_owned()]
            ),
            0
        );
        // The endpoints changed: back on the first, off the board.
        f.reported(
            report(&ops, seen(&["https://h.test", "https://c.test"], None)),
            t0,
        );
        assert_eq!(f.route(&ops).unwrap().index, 0);
        assert!(board.snapshot().is_empty());
        // No fallbacks any more: forgotten, and so is its gauge.
        f.reported(report(&ops, Seen::Nothing), t0);
        assert!(f.route(&ops).is_none());
        assert!(
            !metrics
                .render()
                .contains("outbox_list_provider{list=\"ops\"}")
        );
    }

    #[test]
    fn a_permanent_refusal_never_moves_a_list_and_a_new_term_forgets_all() {
        let (mut f, board, _) = failovers();
        let ops = ListName::parse("ops".to_owned()).unwrap();
        let names = ["https://h.test", "https://b.test"];
        let t0 = Instant::now();
        for _ in 0..10 {
            f.reported(report(&ops, seen(&names, Some((0, Answered)))), t0);
        }
        assert_eq!(f.route(&ops).unwrap().index, 0);
        for _ in 0..3 {
            f.reported(report(&ops, seen(&names, Some((0, Failed)))), t0);
        }
        assert_eq!(board.snapshot().len(), 1);
        f.new_term();
        assert!(f.route(&ops).is_none());
        assert!(board.snapshot().is_empty());
        assert!(f.probe_at().is_none());
    }

    #[tokio::test]
    async fn a_good_probe_moves_the_list_back_to_its_first() {
        struct Up;
        impl Deliver for Up {
            async fn deliver(
                &self,
                _: &ChannelSettings,
                _: &crate::domain::channel::NotificationList,
                _: &crate::records::ClaimedNotification,
                _: crate::delivery::Turn,
            ) -> Result<crate::domain::delivery::Delivered, crate::domain::delivery::DeliveryError>
            {
                unreachable!("only probed")
            }
        }
        let (mut f, board, _) = failovers();
        let ops = ListName::parse("ops".to_owned()).unwrap();
        let names = ["https://h.test", "https://b.test"];
        let t0 = Instant::now();
        for _ in 0..3 {
            f.reported(report(&ops, seen(&names, Some((0, Failed)))), t0);
        }
        let settings = ChannelSettings::Webhook(crate::domain::channel::WebhookSettings::default());
        let due = t0 + FailoverPolicy::default().probe_every;
        f.start_probes(
            &Arc::new(Up),
            &settings,
            due - std::time::Duration::from_secs(1),
        );
        assert!(!f.probing(), "not due yet");
        f.start_probes(&Arc::new(Up), &settings, due);
        assert!(f.probing());
        assert!(f.probe_at().is_none(), "one probe at a time");
        f.probe_answered().await;
        assert_eq!(f.route(&ops).unwrap().index, 0);
        assert!(board.snapshot().is_empty());
    }
}
