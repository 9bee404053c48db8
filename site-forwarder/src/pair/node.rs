//! A node's life through its roles: the one task that starts and stops the forwarder and the
//! standby's following, and the only place a role changes.
//!
//! - **Active**: forwards the buffer to central, serves the standby's stream, and looks at its
//!   peer's role every heartbeat interval. A peer that is active and outranks it (a higher term:
//!   it was promoted while this node was away or cut off) makes it step down: Sends stop (after
//!   the ones in progress commit), forwarding stops, and it becomes a standby that still holds
//!   its own rows.
//! - **Standby**: hands its own rows to the active if it holds any ([`super::handover`]), then
//!   follows it ([`super::replica`]). When the active has been silent for `failover_timeout`,
//!   or an operator asks, it promotes itself: a term above any it has seen, then active.
//! - A single node (no `[pair]`) is active for good and only forwards.
//!
//! The persisted record is written before the role is used: a crash at any point restarts the
//! node in a role it may hold, and an active that restarts checks its peer before forwarding.

use std::sync::Arc;
use std::time::Duration;

use outbox_proto::v1::GetRoleRequest;
use outbox_proto::v1::site_pair_client::SitePairClient;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tonic::transport::Endpoint;

use super::{NodeView, Pair, Role, RoleState, handover, replica};
use crate::buffer::{
    Acks, BufferError, Clears, Commits, Forwarding, Handover, PairRecord, Replica, Roles,
    StatusReader, Statuses,
};
use crate::config::{Config, PairConfig};
use crate::forwarder::{ForwardState, Forwarder};
use crate::metrics::SiteMetrics;

/// The role to start in: the persisted one, or on the very first start the configured one
/// (persisted at once). A single node is always active.
pub(crate) async fn starting_role(
    roles: &Roles,
    status: &StatusReader,
    config: &Config,
) -> Result<RoleState, BufferError> {
    let Some(pair) = &config.pair else {
        return Ok(RoleState {
            role: Role::Active,
            term: 0,
        });
    };
    if let Some(record) = roles.pair_record().await? {
        return Ok(RoleState {
            role: record.role,
            term: record.term,
        });
    }
    let role = pair.initial_role;
    let term = u64::from(role == Role::Active);
    // A standby that already has rows, pending clears or acknowledgements was a single node
    // before: they are its
    // own (a hand-over gives them to the active).
    let stats = status.stats().await?;
    let holds_own_rows = role == Role::Active
        || stats.depth > 0
        || stats.pending_clears > 0
        || stats.pending_acks > 0;
    roles.save_role(role, term, holds_own_rows, true).await?;
    Ok(RoleState { role, term })
}

/// What ended a role's run.
enum Next {
    Stop,
    StepDown(NodeView),
    Promote(String),
}

/// The buffer's capabilities a node's roles use.
#[derive(Clone)]
pub(crate) struct NodeBuffer {
    /// The active's forwarding and the central half of its clears and acknowledgements (its
    /// forwarder's).
    pub forwarding: Forwarding,
    pub clears: Clears,
    pub acks: Acks,
    /// The active's follower of the final statuses central sends back.
    pub statuses: Statuses,
    /// The active's commits, dated for the standby lag.
    pub commits: Commits,
    /// The role record, written before every role is used.
    pub roles: Roles,
    /// The standby's: handing its own rows over, then copying the active.
    pub handover: Handover,
    pub replica: Replica,
}

/// Cloned for each start under the supervisor: a restarted node begins from the same parts.
#[derive(Clone)]
pub(crate) struct Node {
    buffer: NodeBuffer,
    config: Config,
    pair: Arc<Pair>,
    forwarding: Arc<ForwardState>,
    metrics: Arc<SiteMetrics>,
    /// The peer's endpoint; `None` for a single node.
    peer: Option<(PairConfig, Endpoint)>,
}

impl Node {
    pub(crate) fn new(
        buffer: NodeBuffer,
        config: Config,
        pair: Arc<Pair>,
        forwarding: Arc<ForwardState>,
        metrics: Arc<SiteMetrics>,
        peer: Option<(PairConfig, Endpoint)>,
    ) -> Self {
        Self {
            buffer,
            config,
            pair,
            forwarding,
            metrics,
            peer,
        }
    }

    /// Runs the node until `shutdown`.
    pub(crate) async fn run(self, shutdown: CancellationToken) {
        // An active that restarts may have been replaced while it was down.
        if self.pair.role_now().role == Role::Active
            && let Some(peer) = self.outranking_peer().await
        {
            self.step_down(peer).await;
        }
        loop {
            let next = match self.pair.role_now().role {
                Role::Active => self.run_active(&shutdown).await,
                Role::Standby => self.run_standby(&shutdown).await,
            };
            match next {
                Next::Stop => return,
                Next::StepDown(peer) => self.step_down(peer).await,
                Next::Promote(reason) => self.promote(&reason, &shutdown).await,
            }
        }
    }

    async fn run_active(&self, shutdown: &CancellationToken) -> Next {
        let forwarder = match Forwarder::new(
            self.buffer.forwarding.clone(),
            self.buffer.clears.clone(),
            self.buffer.acks.clone(),
            self.buffer.statuses.clone(),
            &self.config,
            Arc::clone(&self.forwarding),
            Arc::clone(&self.metrics),
        ) {
            Ok(forwarder) => forwarder,
            Err(error) => {
                // Checked at start-up already; nothing to forward with.
                tracing::error!(%error, "cannot forward to central");
                shutdown.cancelled().await;
                return Next::Stop;
            }
        };
        let stop_forwarding = shutdown.child_token();
        let forwarding = tokio::spawn(forwarder.run(stop_forwarding.clone()));
        let next = match &self.peer {
            None => {
                shutdown.cancelled().await;
                Next::Stop
            }
            Some((pair, _)) => {
                let mut tick = tokio::time::interval(pair.heartbeat_interval());
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                let watch_peer = async {
                    loop {
                        tokio::select! {
                            () = shutdown.cancelled() => break Next::Stop,
                            _ = tick.tick() => {
                                if let Some(peer) = self.outranking_peer().await {
                                    break Next::StepDown(peer);
                                }
                            }
                        }
                    }
                };
                // Polled beside the peer check (which may wait on the peer for seconds), so
                // every commit is dated within microseconds for the standby lag.
                let next = tokio::select! {
                    next = watch_peer => next,
                    never = self.pair.track_commits(self.buffer.commits.head()) => match never {},
                };
                self.pair.stopped_tracking();
                next
            }
        };
        stop_forwarding.cancel();
        if let Err(e) = forwarding.await {
            tracing::error!(error = %e, "the forwarder task failed");
        }
        next
    }

    /// The peer, when it is active and outranks this node; `None` when it does not or cannot
    /// be asked (a silent peer is the standby's business, not the active's).
    async fn outranking_peer(&self) -> Option<NodeView> {
        let (pair, endpoint) = self.peer.as_ref()?;
        let ask = async {
            let channel = endpoint.connect().await.ok()?;
            let view = SitePairClient::new(channel)
                .get_role(GetRoleRequest {})
                .await
                .ok()?
                .into_inner();
            crate::wire::node_view_from_proto(view)
        };
        let peer = tokio::time::timeout(pair.failover_timeout, ask)
            .await
            .ok()??;
        (peer.role == Role::Active && peer.outranks(&self.pair.view())).then_some(peer)
    }

    async fn run_standby(&self, shutdown: &CancellationToken) -> Next {
        let Some((pair, endpoint)) = &self.peer else {
            // A single node is never a standby; nothing to follow.
            return Next::Promote("no pair is configured".into());
        };
        tokio::select! {
            () = shutdown.cancelled() => Next::Stop,
            () = self.pair.promotion_requested().notified() => {
                Next::Promote("an operator asked for it".into())
            }
            () = silence(&self.pair, pair.failover_timeout) => Next::Promote(format!(
                "nothing heard from the active for {:?} (failover_timeout)",
                pair.failover_timeout
            )),
            never = self.follow_forever(pair, endpoint) => match never {},
        }
    }

    /// Hands over (when needed) and follows the active, reconnecting after every break.
    /// Attempts start at least `forward_retry_interval` apart, or a heartbeat interval when
    /// that is shorter: the standby must find the active again well within `failover_timeout`,
    /// and one peer's attempts cost nothing. A stream that was open longer than that (declared
    /// dead, or ended by the active) is followed by a new attempt at once.
    async fn follow_forever(
        &self,
        pair: &PairConfig,
        endpoint: &Endpoint,
    ) -> std::convert::Infallible {
        let spacing = self
            .config
            .forward_retry_interval
            .min(pair.heartbeat_interval());
        let mut reported = false;
        loop {
            let started = Instant::now();
            let error = self.follow_once(endpoint).await;
            let next_attempt = started + spacing;
            let retry_in = next_attempt.saturating_duration_since(Instant::now());
            if reported {
                tracing::debug!(%error, ?retry_in, "still cannot follow the active node");
            } else {
                tracing::warn!(%error, ?retry_in, "cannot follow the active node; will retry");
                reported = true;
            }
            tokio::time::sleep_until(next_attempt).await;
        }
    }

    /// Hands over (when this node holds rows of its own) and follows the active until that
    /// stops; returns why it stopped.
    async fn follow_once(&self, endpoint: &Endpoint) -> String {
        let record = match self.buffer.roles.pair_record().await {
            Ok(record) => record,
            Err(e) => return e.to_string(),
        };
        if record.is_some_and(|r: PairRecord| r.holds_own_rows)
            && let Err(e) = handover::hand_over(
                &self.buffer.handover,
                &self.pair,
                endpoint,
                self.config.request_timeout,
            )
            .await
        {
            return format!("hand-over: {e}");
        }
        let Some((pair, _)) = &self.peer else {
            return "no pair is configured".into();
        };
        replica::follow(
            &self.buffer.roles,
            &self.buffer.replica,
            &self.pair,
            endpoint,
            replica::FollowTiming {
                open_timeout: self.config.request_timeout,
                silence: pair.heartbeat_interval() + pair.link_timeout(),
            },
        )
        .await
        .to_string()
    }

    async fn promote(&self, reason: &str, shutdown: &CancellationToken) {
        let seen = self.pair.active_followed().map_or(0, |a| a.term);
        let term = self.pair.role_now().term.max(seen) + 1;
        // Persisted first: a crash right after must not restart this node as a standby that
        // throws away rows it has already started to accept.
        while let Err(error) = self
            .buffer
            .roles
            .save_role(Role::Active, term, true, false)
            .await
        {
            tracing::error!(%error, "cannot record the promotion; retrying");
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep(self.config.forward_retry_interval) => {}
            }
        }
        self.pair
            .set_role(RoleState {
                role: Role::Active,
                term,
            })
            .await;
        self.metrics.promoted();
        tracing::warn!(term, %reason, "promoted to active: accepting Sends and forwarding to central");
    }

    async fn step_down(&self, peer: NodeView) {
        // Sends stop first (waiting for those in progress), so the hand-over sees every row.
        self.pair
            .set_role(RoleState {
                role: Role::Standby,
                term: peer.term,
            })
            .await;
        self.pair.heard_from(Some(peer.clone()));
        tracing::warn!(
            active = %peer.name, term = peer.term,
            "the peer is active in a later term; stepping down to standby, handing the buffer over"
        );
        // If this fails the record still says active, and the next start steps down again.
        if let Err(error) = self
            .buffer
            .roles
            .save_role(Role::Standby, peer.term, true, true)
            .await
        {
            tracing::error!(%error, "cannot record the step-down");
        }
    }
}

/// Resolves once nothing has been heard from the active for `timeout`.
async fn silence(pair: &Pair, timeout: Duration) {
    loop {
        let deadline = pair.last_heard() + timeout;
        if Instant::now() >= deadline {
            return;
        }
        tokio::time::sleep_until(deadline).await;
    }
}
