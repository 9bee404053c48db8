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

pub mod handover;
pub mod lag;
pub mod node;
pub mod replica;
pub mod service;
pub mod source;

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use outbox_proto::v1;
use serde::Deserialize;
use tokio::sync::{Notify, RwLock, RwLockReadGuard, watch};
use tokio::time::Instant;
use tonic::transport::Endpoint;

use crate::config::{Config, PairConfig};
use crate::domain::{ConditionKey, ContentError, PendingClear, Seq};
use crate::forwarder::ForwardError;
use lag::{StandbyLag, StreamId};

/// Most pending clears one `SitePair` message carries (a replication batch's list, an adoption
/// request's), and so most a peer can make this node write in one go. There is one per
/// condition key, so only thousands of distinct keys cleared during one central outage come
/// near it. A key is at most 128 bytes, an encoded clear at most ~165 bytes, 10,000 of them
/// ~1.6 MiB: beside a batch's rows (at most [`source::BATCH_BYTES`] and one row) a message stays
/// under the 4 MiB limit. An active holding more replicates the oldest 10,000 (a failover then
/// loses the central half of the rest, as all of them before they were replicated); a
/// hand-over sends them in as many requests as they need.
pub const MAX_PENDING_CLEARS: usize = 10_000;

/// A pending clear as the pair link carries it.
pub fn clear_to_proto(clear: &PendingClear) -> v1::PendingClear {
    v1::PendingClear {
        condition_key: clear.condition_key.as_str().to_owned(),
        up_to_seq: clear.up_to.0,
        cleared_at: Some(outbox_proto::time::to_timestamp(clear.cleared_at)),
    }
}

/// A pending clear from the peer, checked as the buffer would check its own; the error names
/// the field.
pub fn clear_from_proto(clear: v1::PendingClear) -> Result<PendingClear, ContentError> {
    let condition_key = ConditionKey::parse(clear.condition_key, "condition_key")?;
    if clear.up_to_seq < 0 {
        return Err(ContentError::new("up_to_seq", "must not be negative"));
    }
    let cleared_at = clear
        .cleared_at
        .as_ref()
        .ok_or_else(|| ContentError::new("cleared_at", "is required"))?;
    let cleared_at = outbox_proto::time::from_timestamp(cleared_at)
        .ok_or_else(|| ContentError::new("cleared_at", "is not a valid timestamp"))?;
    Ok(PendingClear {
        condition_key,
        up_to: Seq(clear.up_to_seq),
        // The precision the buffer keeps, so what is stored is what was sent.
        cleared_at: crate::domain::to_buffer_precision(cleared_at),
    })
}

/// A node's role in its pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    Active,
    Standby,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Active => "active",
            Role::Standby => "standby",
        }
    }

    pub fn from_db(text: &str) -> Option<Self> {
        match text {
            "active" => Some(Role::Active),
            "standby" => Some(Role::Standby),
            _ => None,
        }
    }

    pub fn to_proto(self) -> v1::NodeRole {
        match self {
            Role::Active => v1::NodeRole::Active,
            Role::Standby => v1::NodeRole::Standby,
        }
    }
}

/// A node as its peer sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeView {
    pub name: String,
    pub role: Role,
    pub term: u64,
    pub send_addr: String,
}

impl NodeView {
    /// Of two active nodes, whether `self` stays active: the higher term, or with equal terms
    /// (two nodes both configured active that never met) the lower name.
    pub fn outranks(&self, other: &NodeView) -> bool {
        (self.term, std::cmp::Reverse(&self.name)) > (other.term, std::cmp::Reverse(&other.name))
    }

    pub fn to_proto(&self) -> v1::NodeRoleView {
        v1::NodeRoleView {
            node_name: self.name.clone(),
            role: self.role.to_proto().into(),
            term: self.term,
            send_addr: self.send_addr.clone(),
        }
    }

    /// `None` when the role is not one this build knows.
    pub fn from_proto(view: v1::NodeRoleView) -> Option<Self> {
        let role = match v1::NodeRole::try_from(view.role).ok()? {
            v1::NodeRole::Active => Role::Active,
            v1::NodeRole::Standby => Role::Standby,
            v1::NodeRole::Unspecified => return None,
        };
        Some(Self {
            name: view.node_name,
            role,
            term: view.term,
            send_addr: view.send_addr,
        })
    }
}

/// The role and term as the services see them. Changed only by [`node`], under the write lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RoleState {
    pub role: Role,
    pub term: u64,
}

/// The pair state shared by `SiteNotify`, `SitePair`, metrics and the node task.
#[derive(Debug)]
pub struct Pair {
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

/// The pair's figures at one moment, for `GetBufferStats` and `/metrics`.
#[derive(Debug, Clone, PartialEq)]
pub struct PairStatus {
    pub role: Role,
    pub term: u64,
    pub node_name: String,
    pub peer_connected: bool,
    pub standby_lag_rows: u64,
    pub standby_lag_seconds: f64,
    pub active_node: String,
    pub active_silent_seconds: f64,
}

impl Pair {
    /// The pair state at start-up, in `initial` (the node task settles the real role first).
    pub fn new(config: &Config, initial: RoleState) -> Self {
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

    pub fn config(&self) -> Option<&PairConfig> {
        self.config.as_ref()
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn role_now(&self) -> RoleState {
        *self.role_now.borrow()
    }

    pub fn watch_role(&self) -> watch::Receiver<RoleState> {
        self.role_now.subscribe()
    }

    pub fn view(&self) -> NodeView {
        let now = self.role_now();
        NodeView {
            name: self.name.clone(),
            role: now.role,
            term: now.term,
            send_addr: self.send_addr.clone(),
        }
    }

    /// Holds the role for the duration of a buffer write that only the active may make (a Send,
    /// an adoption): `Err` with the status to answer when this node is not active.
    pub async fn while_active(&self) -> Result<RwLockReadGuard<'_, RoleState>, tonic::Status> {
        let guard = self.role.read().await;
        match guard.role {
            Role::Active => Ok(guard),
            Role::Standby => Err(self.not_active()),
        }
    }

    /// The refusal a standby gives, naming the active when it knows it.
    pub fn not_active(&self) -> tonic::Status {
        let active = lock(&self.active).clone();
        let whom = match active {
            Some(active) => format!(
                "send to the active node {} at {}",
                active.name, active.send_addr
            ),
            None => format!(
                "send to the active node (its peer at {}; not reached yet)",
                self.config
                    .as_ref()
                    .map_or("(none configured)", |c| c.peer_url.as_str())
            ),
        };
        tonic::Status::unavailable(format!(
            "this site-forwarder ({}) is the standby of its pair and accepts no Sends; {whom}",
            self.name
        ))
    }

    /// Changes the role; waits for every Send and adoption in progress to finish first, so none
    /// commits under the old role after this returns.
    pub(crate) async fn set_role(&self, state: RoleState) {
        let mut guard = self.role.write().await;
        *guard = state;
        self.role_now.send_replace(state);
    }

    /// Asks the node task to promote this node now (a standby); see [`node`].
    pub fn request_promotion(&self) {
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

    pub fn status(&self) -> PairStatus {
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

/// The peer's `SitePair` endpoint, with TLS from `[tls]` for an `https://` URL.
pub fn peer_endpoint(config: &Config, pair: &PairConfig) -> Result<Endpoint, ForwardError> {
    let mut endpoint =
        Endpoint::from_shared(pair.peer_url.clone()).map_err(|source| ForwardError::BadUrl {
            url: pair.peer_url.clone(),
            source,
        })?;
    if let Some(tls) = config.tls.client_config_for(
        &pair.peer_url,
        pair.peer_domain.as_deref(),
        config.connect_timeout,
    )? {
        endpoint = endpoint
            .tls_config(tls)
            .map_err(|source| ForwardError::TlsConfig {
                url: pair.peer_url.clone(),
                source,
            })?;
    }
    // Pings after a heartbeat interval without a byte, answered within `link_timeout`: a dead
    // replication connection is dropped well before the standby would promote itself, so a
    // new one gets a chance first.
    Ok(endpoint
        .connect_timeout(config.connect_timeout)
        .tcp_nodelay(true)
        .http2_keep_alive_interval(pair.heartbeat_interval())
        .keep_alive_timeout(pair.link_timeout())
        .keep_alive_while_idle(true))
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

    fn view(name: &str, term: u64) -> NodeView {
        NodeView {
            name: name.into(),
            role: Role::Active,
            term,
            send_addr: String::new(),
        }
    }

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

    #[test]
    fn a_pending_clear_crosses_the_link_unchanged_and_a_bad_one_names_its_field() {
        let at = crate::domain::to_buffer_precision(chrono::Utc::now());
        let clear = PendingClear {
            condition_key: ConditionKey::parse("tank4.level.high".into(), "condition_key").unwrap(),
            up_to: Seq(42),
            cleared_at: at,
        };
        let wire = clear_to_proto(&clear);
        assert_eq!(clear_from_proto(wire.clone()).unwrap(), clear);
        let broken = [
            v1::PendingClear {
                condition_key: "tank 4".into(),
                ..wire.clone()
            },
            v1::PendingClear {
                up_to_seq: -1,
                ..wire.clone()
            },
            v1::PendingClear {
                cleared_at: None,
                ..wire.clone()
            },
            v1::PendingClear {
                cleared_at: Some(prost_types::Timestamp {
                    seconds: 0,
                    nanos: -1,
                }),
                ..wire
            },
        ];
        let fields: Vec<String> = broken
            .into_iter()
            .map(|bad| clear_from_proto(bad).unwrap_err().to_string())
            .collect();
        for (problem, field) in
            fields
                .iter()
                .zip(["condition_key:", "up_to_seq:", "cleared_at:", "cleared_at:"])
        {
            assert!(problem.starts_with(field), "{problem}");
        }
    }

    #[test]
    fn the_higher_term_outranks_then_the_lower_name() {
        assert!(view("b", 3).outranks(&view("a", 2)));
        assert!(!view("a", 2).outranks(&view("b", 3)));
        assert!(view("a", 2).outranks(&view("b", 2)));
        assert!(!view("b", 2).outranks(&view("a", 2)));
        assert!(!view("a", 2).outranks(&view("a", 2)), "never both ways");
    }
}
