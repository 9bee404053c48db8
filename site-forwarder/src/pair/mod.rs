//! An active/standby pair of site-forwarders. Only the active accepts Sends and forwards to
//! central; the standby follows it over one `Replicate` stream ([`source`] on the active,
//! [`replica`] on the standby) and keeps a copy of its buffer, and takes over when the active
//! falls silent or an operator promotes it ([`node`] runs a node through its roles).
//!
//! Why nothing is lost or sent twice:
//! - A Send is acked after its local commit, never waiting for the standby. What the standby
//!   lacks at a failover (the replication lag, reported as `standby_lag_rows`/`_seconds` as it
//!   is at the moment they are read, see [`lag`]) stays
//!   on the old active's disk: when that node returns it hands every row over to the new
//!   active ([`handover`]) before it deletes anything, and only then becomes a standby.
//! - Both nodes may forward the same row (after a promotion, or while a partition lets both
//!   believe they are active): central's idempotent insert answers DUPLICATE to the second, so
//!   central stores and delivers each notification once.
//! - Two active nodes resolve by rank ([`NodeView::outranks`]): the higher term stays active,
//!   the other steps down (hand-over, then standby). Every promotion raises the term.
//!
//! [`Pair`] is the state the gRPC services and the node share: the role (behind a lock that a
//! Send holds while it commits, so stepping down waits for Sends in progress and no row lands
//! after the hand-over read the buffer) and the live figures for `GetBufferStats` and metrics.

pub(crate) mod handover;
pub(crate) mod lag;
pub(crate) mod node;
pub(crate) mod replica;
pub(crate) mod source;

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use tokio::sync::{Notify, RwLock, RwLockReadGuard, watch};
use tokio::time::Instant;

use crate::config::{Config, PairConfig};
use crate::domain::{NodeView, NotActive, PairStatus, Role, RoleState, Seq};
use lag::{StandbyLag, StreamId};

/// Most pending clears one `SitePair` message carries (a replication batch's list, an adoption
/// request's), and so most a peer can make this node write in one go. There is one per
/// condition key, so only thousands of distinct keys cleared during one central outage come
/// near it. A key is at most 128 bytes, an encoded clear at most ~165 bytes, 10,000 of them
/// ~1.6 MiB: beside a batch's rows (at most [`source::BATCH_BYTES`] and one row) a message stays
/// under the 4 MiB limit. An active holding more replicates the oldest 10,000 (a failover then
/// loses the central half of the rest, as all of them before they were replicated); a
/// hand-over sends them in as many requests as they need.
pub(crate) const MAX_PENDING_CLEARS: usize = 10_000;
/// Pending acknowledgements a replication batch or an adoption carries at most: as for the
/// clears (a key and an actor are 128 characters each, so ~3 MiB at most).
pub(crate) const MAX_PENDING_ACKS: usize = 10_000;

/// The pair state shared by `SiteNotify`, `SitePair`, metrics and the node task.
#[derive(Debug)]
pub(crate) struct Pair {
    /// `None` for a single node, which is always active.
    config: Option<PairConfig>,
    name: String,
    send_addr: String,
    role: RwLock<RoleState>,
    /// Mirrors `role` for readers that must not wait on the lock (stats, metrics).
    role_now: watch::Sender<RoleState>,
    promote: Notify,
    /// Standby: the active it follows (or last followed), as the active described itself.
    active: Mutex<Option<NodeView>>,
    /// Active: replication streams currently open to a standby. Standby: 1 while following.
    peer_streams: AtomicU64,
    /// Active: what the standby lacks. Locked briefly by the commit tracker, the replication
    /// stream (attach, confirm) and readers of the figures; never across an await.
    standby_lag: Mutex<StandbyLag>,
    /// Standby: when the active was last heard from (any batch, heartbeat or answer).
    last_heard: Mutex<Instant>,
    following_now: AtomicBool,
}

impl Pair {
    /// The pair state at start-up, in `initial` (the node task settles the real role first).
    pub(crate) fn new(config: &Config, initial: RoleState) -> Self {
        let name = config
            .pair
            .as_ref()
            .map_or_else(|| config.site_id.clone(), |p| p.node_name.clone());
        let send_addr = config
            .pair
            .as_ref()
            .and_then(|p| p.send_addr.clone())
            .unwrap_or_else(|| config.listen_addr.to_string());
        Self {
            config: config.pair.clone(),
            name,
            send_addr,
            role: RwLock::new(initial),
            role_now: watch::Sender::new(initial),
            promote: Notify::new(),
            active: Mutex::new(None),
            peer_streams: AtomicU64::new(0),
            standby_lag: Mutex::new(StandbyLag::default()),
            last_heard: Mutex::new(Instant::now()),
            following_now: AtomicBool::new(false),
        }
    }

    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    pub(crate) fn role_now(&self) -> RoleState {
        *self.role_now.borrow()
    }

    pub(crate) fn watch_role(&self) -> watch::Receiver<RoleState> {
        self.role_now.subscribe()
    }

    pub(crate) fn view(&self) -> NodeView {
        let now = self.role_now();
        NodeView {
            name: self.name.clone(),
            role: now.role,
            term: now.term,
            send_addr: self.send_addr.clone(),
        }
    }

    /// Holds the role for the duration of a buffer write that only the active may make (a Send,
    /// an adoption): `Err` saying where to send instead when this node is not active.
    pub(crate) async fn while_active(&self) -> Result<RwLockReadGuard<'_, RoleState>, NotActive> {
        let guard = self.role.read().await;
        match guard.role {
            Role::Active => Ok(guard),
            Role::Standby => Err(self.not_active()),
        }
    }

    /// The refusal a standby gives, naming the active when it knows it.
    pub(crate) fn not_active(&self) -> NotActive {
        NotActive {
            node: self.name.clone(),
            active: lock(&self.active).clone(),
            peer_url: self.config.as_ref().map(|c| c.peer_url.clone()),
        }
    }

    /// Changes the role; waits for every Send and adoption in progress to finish first, so none
    /// commits under the old role after this returns.
    pub(crate) async fn set_role(&self, state: RoleState) {
        let mut guard = self.role.write().await;
        *guard = state;
        self.role_now.send_replace(state);
    }

    /// Asks the node task to promote this node now (a standby); see [`node`].
    pub(crate) fn request_promotion(&self) {
        self.promote.notify_one();
    }

    pub(crate) fn promotion_requested(&self) -> &Notify {
        &self.promote
    }

    pub(crate) fn heard_from(&self, active: Option<NodeView>) {
        *lock(&self.last_heard) = Instant::now();
        if let Some(active) = active {
            *lock(&self.active) = Some(active);
        }
    }

    pub(crate) fn last_heard(&self) -> Instant {
        *lock(&self.last_heard)
    }

    pub(crate) fn active_followed(&self) -> Option<NodeView> {
        lock(&self.active).clone()
    }

    pub(crate) fn set_following(&self, following: bool) {
        self.following_now.store(following, Ordering::Relaxed);
    }

    pub(crate) fn stream_opened(&self) {
        self.peer_streams.fetch_add(1, Ordering::Relaxed);
    }

    /// A replication stream ended. The lag stays: the standby still holds only what it
    /// confirmed.
    pub(crate) fn stream_closed(&self) {
        self.peer_streams.fetch_sub(1, Ordering::Relaxed);
    }

    /// A standby's stream starts from its hello: it holds every seq up to `holds`.
    pub(crate) fn standby_attached(&self, holds: Seq) -> StreamId {
        lock(&self.standby_lag).attach(holds)
    }

    /// The standby of `stream` committed every seq up to `through`.
    pub(crate) fn standby_confirmed(&self, stream: StreamId, through: Seq) {
        lock(&self.standby_lag).confirmed(stream, through);
    }

    /// Runs while this node is active: dates each move of the buffer's `head` for the lag's
    /// age (see [`lag`]). Never returns; drop it when the node stops being active, then call
    /// [`Self::stopped_tracking`].
    pub(crate) async fn track_commits(
        &self,
        mut head: watch::Receiver<Seq>,
    ) -> std::convert::Infallible {
        lock(&self.standby_lag).activate(head.clone(), chrono::Utc::now());
        loop {
            if head.changed().await.is_err() {
                // The buffer is gone (shutdown): nothing more will be committed.
                return std::future::pending().await;
            }
            let seq = *head.borrow_and_update();
            lock(&self.standby_lag).committed(seq, chrono::Utc::now());
        }
    }

    /// This node stopped being active: no lag to report.
    pub(crate) fn stopped_tracking(&self) {
        lock(&self.standby_lag).deactivate();
    }

    pub(crate) fn status(&self) -> PairStatus {
        let now = self.role_now();
        let active = self.active_followed();
        let standby = now.role == Role::Standby;
        let lag = if standby {
            lag::LagFigures::NONE
        } else {
            lock(&self.standby_lag).figures(chrono::Utc::now())
        };
        PairStatus {
            role: now.role,
            term: now.term,
            node_name: self.name.clone(),
            peer_connected: if standby {
                self.following_now.load(Ordering::Relaxed)
            } else {
                self.peer_streams.load(Ordering::Relaxed) > 0
            },
            standby_lag_rows: lag.rows,
            standby_lag_seconds: lag.age.as_secs_f64(),
            active_node: match (standby, active) {
                (true, Some(active)) => active.name,
                _ => String::new(),
            },
            active_silent_seconds: if standby && self.config.is_some() {
                self.last_heard().elapsed().as_secs_f64()
            } else {
                0.0
            },
        }
    }
}

/// A poisoned lock only means another thread panicked while holding it; the data (plain
/// figures) is still usable.
fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{ConditionKey, PendingClear};
    use crate::wire::clear_to_proto;
    use outbox_proto::v1;

    /// The longest list a message may carry, of the longest keys, the highest seqs and
    /// sub-second times, fits under the message limit beside a full batch of rows (at most
    /// `BATCH_BYTES` and one row, which is under 512 KiB).
    #[test]
    fn the_most_pending_clears_a_message_carries_fit_beside_a_batch_of_rows() {
        use outbox_domain::limits::MAX_CONDITION_KEY_CHARS;
        use prost::Message;
        let clear = |i: usize| PendingClear {
            condition_key: ConditionKey::parse(
                format!("{i:0>width$}", width = MAX_CONDITION_KEY_CHARS),
                "condition_key",
            )
            .unwrap(),
            up_to: Seq(i64::MAX),
            cleared_at: chrono::DateTime::from_timestamp(4_000_000_000, 999_000_000).unwrap(),
        };
        let batch = v1::ReplicationBatch {
            batch: u64::MAX,
            head_seq: i64::MAX,
            pending_clears: (0..MAX_PENDING_CLEARS)
                .map(|i| clear_to_proto(&clear(i)))
                .collect(),
            pending_clears_included: true,
            ..v1::ReplicationBatch::default()
        };
        let bytes = batch.encoded_len();
        assert!(bytes < 2 * 1024 * 1024, "{bytes}");
        assert!(
            bytes + source::BATCH_BYTES + 512 * 1024 < outbox_proto::limits::MAX_GRPC_MESSAGE_BYTES,
            "{bytes}"
        );
    }
}
