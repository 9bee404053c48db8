//! Which channels (email's relays) and webhook lists (their endpoints) this node's dispatcher
//! delivers through a fallback provider right now: what `GetKpis` and the console's dashboard
//! show, so failover never hides the fault it works around.
//!
//! The dispatcher's failover state (`dispatcher::provider`, `dispatcher::list_failover`) writes
//! here on every move, and clears a channel's entries whenever it starts again on the first
//! providers (a new term under the lease, changed settings), so the board never shows more than
//! that state knows. It lives in memory only, like that state: a node that does not dispatch
//! shows nothing, and says it does not dispatch ([`FailoverBoard::dispatching`]).

use std::collections::BTreeMap;
use std::sync::{Mutex, PoisonError};

use chrono::{DateTime, Utc};
use tokio::sync::watch;

use crate::domain::NotificationType;
use crate::records::LeaseEpoch;

/// A channel or list delivering through a provider other than its first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct OnFallback {
    pub(crate) channel: NotificationType,
    /// The webhook list; `None` for the email channel (its relays are the channel's).
    pub(crate) list: Option<String>,
    /// Its place in the order: 1 is the first fallback.
    pub(crate) provider: usize,
    /// The provider's name (`host:port` of a relay, `scheme://host:port` of an endpoint).
    pub(crate) provider_name: String,
    /// The first provider's name: the one that fails.
    pub(crate) first_name: String,
    /// When it left its first provider.
    pub(crate) since: DateTime<Utc>,
}

/// What this node delivers through fallbacks; see the module documentation.
#[derive(Debug)]
pub(crate) struct FailoverBoard {
    /// By channel name and list ("" for the email channel): the order shown.
    entries: Mutex<BTreeMap<(&'static str, String), OnFallback>>,
    /// The lease epoch this node holds (`Dispatcher::lease_watch`); `None` until the
    /// dispatcher is wired in, and while it does not dispatch.
    lease: Mutex<Option<watch::Receiver<Option<LeaseEpoch>>>>,
}

impl Default for FailoverBoard {
    fn default() -> Self {
        Self {
            entries: Mutex::new(BTreeMap::new()),
            lease: Mutex::new(None),
        }
    }
}

impl FailoverBoard {
    /// Reads whether this node dispatches from `lease`.
    pub(crate) fn follow_lease(&self, lease: watch::Receiver<Option<LeaseEpoch>>) {
        *self.lease.lock().unwrap_or_else(PoisonError::into_inner) = Some(lease);
    }

    /// Whether this node holds the dispatcher lease now: only then does it move between
    /// providers, so only then does an empty board mean "all on their first".
    pub(crate) fn dispatching(&self) -> bool {
        self.lease
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
            .is_some_and(|lease| lease.borrow().is_some())
    }

    /// `channel` (or its webhook `list`) delivers through provider `provider` of `names` now,
    /// since `now` if it was on its first until now. Provider 0 takes it off the board.
    pub(crate) fn set(
        &self,
        channel: NotificationType,
        list: Option<&str>,
        provider: usize,
        names: &[String],
        now: DateTime<Utc>,
    ) {
        let key = (channel.as_str(), list.unwrap_or_default().to_owned());
        let mut entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        if provider == 0 {
            entries.remove(&key);
            return;
        }
        let name = |i: usize| names.get(i).cloned().unwrap_or_else(|| "?".to_owned());
        let since = entries.get(&key).map_or(now, |e| e.since);
        entries.insert(
            key,
            OnFallback {
                channel,
                list: list.map(str::to_owned),
                provider,
                provider_name: name(provider),
                first_name: name(0),
                since,
            },
        );
    }

    /// Takes every entry of `channel` off the board (it starts again on its first providers).
    pub(crate) fn clear(&self, channel: NotificationType) {
        self.entries
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .retain(|(c, _), _| *c != channel.as_str());
    }

    /// Everything on a fallback now, by channel and list.
    pub(crate) fn snapshot(&self) -> Vec<OnFallback> {
        self.entries
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .values()
            .cloned()
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(n: &[&str]) -> Vec<String> {
        n.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn a_move_shows_until_the_first_is_back_and_keeps_when_it_began() {
        let board = FailoverBoard::default();
        let t0 = Utc::now();
        let later = t0 + chrono::Duration::seconds(60);
        let relays = names(&["a:25", "b:25", "c:25"]);
        board.set(NotificationType::Email, None, 1, &relays, t0);
        board.set(NotificationType::Email, None, 2, &relays, later);
        let hooks = names(&["https://h.test", "https://b.test"]);
        board.set(NotificationType::Webhook, Some("ops"), 1, &hooks, later);
        let shown = board.snapshot();
        assert_eq!(shown.len(), 2);
        assert_eq!(
            shown[0],
            OnFallback {
                channel: NotificationType::Email,
                list: None,
                provider: 2,
                provider_name: "c:25".into(),
                first_name: "a:25".into(),
                since: t0,
            }
        );
        assert_eq!(shown[1].list.as_deref(), Some("ops"));
        board.set(NotificationType::Email, None, 0, &relays, later);
        assert_eq!(board.snapshot().len(), 1);
        board.clear(NotificationType::Webhook);
        assert!(board.snapshot().is_empty());
        // A provider past the names (settings changed under the caller) shows as unknown.
        board.set(NotificationType::Email, None, 5, &relays, later);
        assert_eq!(board.snapshot()[0].provider_name, "?");
    }

    #[test]
    fn a_node_dispatches_only_while_its_lease_says_so() {
        let board = FailoverBoard::default();
        assert!(!board.dispatching(), "no dispatcher wired in");
        let (lease, watch) = watch::channel(None);
        board.follow_lease(watch);
        assert!(!board.dispatching());
        lease.send_replace(Some(LeaseEpoch(3)));
        assert!(board.dispatching());
    }
}
