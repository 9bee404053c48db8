//! The dispatcher's short-lived copy of the channel configuration it reads on every sweep and
//! every attempt: each channel's settings and the notification lists.
//!
//! Reading them from the store for each delivery cost a trip to a read connection per row, a
//! sixth of the dispatch rate in `make bench`. A copy is used for at most [`MAX_AGE`]; a change
//! made through this node's admin API ([`ConfigCache::invalidate`]) is seen at once, one made on
//! another replica within `MAX_AGE` and one read. Absence is never cached: a notification is
//! parked for a missing list or missing SMTP settings only on a fresh read, so configuring them
//! and sending right away (on any replica) never parks anything. The webhook channel always has
//! settings (the domain's defaults while none are stored), so its copy is what it delivers with,
//! stored or default.
//!
//! A list older than `MAX_AGE` is still served, for up to [`MAX_STALE`] more, while one task
//! reads it again: an attempt never waits for the database to re-read a list it already has.
//! On Babelfish under load that read took over two seconds, every attempt started after the
//! copy expired waited for it, and some ran out their time bound (half the claim) before the
//! relay was even called.
//!
//! Ages are measured on tokio's clock, so a test on a paused clock can age the copies.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use crate::domain::ListName;
use crate::domain::channel::{NotificationList, SmtpSettings, WebhookSettings};
use crate::store::{ReadChannelSettings, Result};

/// Longest a cached value is used as it is.
pub(crate) const MAX_AGE: Duration = Duration::from_secs(1);

/// How long past [`MAX_AGE`] a list may still be served while it is read again. Beyond it (the
/// store failing all along) an attempt reads the list itself, and fails if it cannot.
pub(crate) const MAX_STALE: Duration = Duration::from_secs(30);

/// Cached channel settings and lists. Shared by the dispatcher and the admin service.
#[derive(Debug, Default)]
pub(crate) struct ConfigCache {
    /// Bumped by every local change; entries from an older generation are stale.
    generation: AtomicU64,
    smtp: Mutex<Option<Entry<SmtpSettings>>>,
    webhook: Mutex<Option<Entry<WebhookSettings>>>,
    lists: Mutex<HashMap<ListName, Entry<Arc<NotificationList>>>>,
    /// Lists being read again in the background, each by one task.
    refreshing: Mutex<HashSet<ListName>>,
}

#[derive(Debug, Clone)]
struct Entry<T> {
    generation: u64,
    read_at: Instant,
    value: T,
}

impl<T: Clone> Entry<T> {
    fn fresh(&self, generation: u64, now: Instant) -> Option<T> {
        (self.generation == generation && now.duration_since(self.read_at) < MAX_AGE)
            .then(|| self.value.clone())
    }
}

impl ConfigCache {
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// Forgets everything: the configuration was just changed through this node.
    pub(crate) fn invalidate(&self) {
        self.generation.fetch_add(1, Ordering::AcqRel);
    }

    /// The SMTP settings if a fresh copy is at hand, without a store call. `None`: the store
    /// must be read (no copy, an old one, or no settings stored: absence is never cached).
    pub(crate) fn fresh_smtp_settings(&self) -> Option<SmtpSettings> {
        let generation = self.generation.load(Ordering::Acquire);
        lock(&self.smtp)
            .as_ref()
            .and_then(|e| e.fresh(generation, Instant::now()))
    }

    /// The stored SMTP settings, `None` when there are none.
    pub(crate) async fn smtp_settings<S: ReadChannelSettings>(
        &self,
        store: &S,
    ) -> Result<Option<SmtpSettings>> {
        let cached = self.fresh_smtp_settings();
        if cached.is_some() {
            return Ok(cached);
        }
        let generation = self.generation.load(Ordering::Acquire);
        let read_at = Instant::now();
        let value = store.smtp_settings().await?.map(|s| s.value);
        *lock(&self.smtp) = value.clone().map(|value| Entry {
            generation,
            read_at,
            value,
        });
        Ok(value)
    }

    /// The webhook settings if a fresh copy is at hand, without a store call.
    pub(crate) fn fresh_webhook_settings(&self) -> Option<WebhookSettings> {
        let generation = self.generation.load(Ordering::Acquire);
        lock(&self.webhook)
            .as_ref()
            .and_then(|e| e.fresh(generation, Instant::now()))
    }

    /// The webhook settings to deliver with: the stored ones, or the domain's defaults while
    /// none are stored.
    pub(crate) async fn webhook_settings<S: ReadChannelSettings>(
        &self,
        store: &S,
    ) -> Result<WebhookSettings> {
        if let Some(cached) = self.fresh_webhook_settings() {
            return Ok(cached);
        }
        let generation = self.generation.load(Ordering::Acquire);
        let read_at = Instant::now();
        let value = store
            .webhook_settings()
            .await?
            .map_or_else(WebhookSettings::default, |s| s.value);
        *lock(&self.webhook) = Some(Entry {
            generation,
            read_at,
            value: value.clone(),
        });
        Ok(value)
    }

    /// The list called `name`, `None` when there is none. A copy past [`MAX_AGE`] is served
    /// while a background task reads the list again (see the module documentation).
    pub(crate) async fn list<S: ReadChannelSettings>(
        self: &Arc<Self>,
        store: &Arc<S>,
        name: &ListName,
    ) -> Result<Option<Arc<NotificationList>>> {
        let generation = self.generation.load(Ordering::Acquire);
        let copy = lock(&self.lists)
            .get(name)
            .filter(|e| e.generation == generation)
            .map(|e| (e.read_at.elapsed(), Arc::clone(&e.value)));
        match copy {
            Some((age, list)) if age < MAX_AGE => Ok(Some(list)),
            Some((age, list)) if age < MAX_AGE + MAX_STALE => {
                self.read_list_in_background(store, name);
                Ok(Some(list))
            }
            _ => self.read_list(&**store, name).await,
        }
    }

    /// Starts one task reading list `name` again, unless one is under way.
    fn read_list_in_background<S: ReadChannelSettings>(
        self: &Arc<Self>,
        store: &Arc<S>,
        name: &ListName,
    ) {
        if !lock(&self.refreshing).insert(name.clone()) {
            return;
        }
        let (cache, store, name) = (Arc::clone(self), Arc::clone(store), name.clone());
        tokio::spawn(async move {
            if let Err(e) = cache.read_list(&*store, &name).await {
                tracing::warn!(
                    list = name.as_str(),
                    error = %e,
                    "cannot read the list again; its copy is used meanwhile"
                );
            }
            lock(&cache.refreshing).remove(&name);
        });
    }

    /// Reads list `name` from the store and keeps the copy (forgets it if there is none).
    async fn read_list<S: ReadChannelSettings>(
        &self,
        store: &S,
        name: &ListName,
    ) -> Result<Option<Arc<NotificationList>>> {
        let generation = self.generation.load(Ordering::Acquire);
        let read_at = Instant::now();
        let value = store.list(name).await?.map(|s| Arc::new(s.value));
        let mut lists = lock(&self.lists);
        match &value {
            Some(list) => {
                lists.insert(
                    name.clone(),
                    Entry {
                        generation,
                        read_at,
                        value: Arc::clone(list),
                    },
                );
            }
            None => {
                lists.remove(name);
            }
        }
        // Lists deleted elsewhere, and no longer asked for, would otherwise stay here for good.
        lists.retain(|_, e| e.read_at.elapsed() < MAX_AGE + MAX_STALE);
        Ok(value)
    }
}

/// The caches hold plain values, so a panic elsewhere cannot leave them inconsistent.
fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::channel::ListInput;
    use crate::store::ChannelSettingsStore;
    use crate::store::sqlite::SqliteStore;

    fn list(recipient: &str) -> NotificationList {
        NotificationList::parse(ListInput {
            name: "ops".into(),
            recipients: vec![recipient.into()],
            ..ListInput::default()
        })
        .unwrap()
    }

    fn recipients(list: Option<Arc<NotificationList>>) -> Vec<String> {
        list.map(|l| l.target_names()).unwrap_or_default()
    }

    #[tokio::test]
    async fn a_local_change_is_seen_at_once_and_absence_is_never_cached() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(
            SqliteStore::open(&dir.path().join("c.db"), group_commit::Durability::Full).unwrap(),
        );
        let cache = Arc::new(ConfigCache::new());
        let ops = ListName::parse("ops".into()).unwrap();

        // Missing: not remembered, so a list created right after is found.
        assert!(cache.list(&store, &ops).await.unwrap().is_none());
        store.upsert_list(list("a@example.com")).await.unwrap();
        assert_eq!(
            recipients(cache.list(&store, &ops).await.unwrap()),
            ["a@example.com"]
        );

        // Changed through this node: invalidate() makes the next read fresh.
        store.upsert_list(list("b@example.com")).await.unwrap();
        cache.invalidate();
        assert_eq!(
            recipients(cache.list(&store, &ops).await.unwrap()),
            ["b@example.com"]
        );

        // Deleted through this node: gone at once, not served from the copy.
        store.delete_list(&ops).await.unwrap();
        cache.invalidate();
        assert!(cache.list(&store, &ops).await.unwrap().is_none());

        assert!(cache.smtp_settings(&*store).await.unwrap().is_none());
    }
}
