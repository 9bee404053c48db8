//! The standby's side of `Replicate`: connect to the active, say what is already copied, apply
//! every batch durably and confirm it.
//!
//! Invariants:
//! - A batch is confirmed only after it is committed here; the active's reported lag is
//!   therefore what a failover without the active's disk would lose.
//! - Batches that arrived together are applied in one transaction, in order (each batch's adds
//!   before its removes), and confirmed by the last one's number.
//! - Every batch (heartbeats included) counts as hearing from the active; nothing else does.
//! - The active sends a batch at least every heartbeat interval, so a stream silent for a
//!   heartbeat interval and [`crate::config::PairConfig::link_timeout`] is dead (a link that
//!   stopped passing packets without closing anything): following ends and starts again on a
//!   new connection, well before the standby would promote itself.
//! - A batch that lists the active's pending clears replaces the standby's with that list (the
//!   last one when several batches are applied together), in the same transaction as the
//!   batch's rows. At most [`MAX_PENDING_CLEARS`] are taken from one list.

use std::sync::Arc;
use std::time::Duration;

use futures_util::FutureExt;
use outbox_proto::limits::MAX_GRPC_MESSAGE_BYTES;
use outbox_proto::v1::site_pair_client::SitePairClient;
use outbox_proto::v1::{ReplicaHello, ReplicaMessage, ReplicationBatch, replica_message};
use tokio::sync::mpsc;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Endpoint;

use super::source::{WINDOW, span_from_proto};
use super::{MAX_PENDING_ACKS, MAX_PENDING_CLEARS, Pair};
use crate::buffer::{BufferError, PairRecord, Replica, ReplicaChanges, Roles};
use crate::domain::{Role, Seq, StatusSeq};
use crate::link::error_chain;
use crate::wire::{ack_from_proto, clear_from_proto, node_view_from_proto};

/// Why following the active stopped (the standby then retries, until it is promoted).
#[derive(Debug, thiserror::Error)]
pub(crate) enum FollowError {
    #[error("cannot connect to the peer: {0}")]
    Connect(String),
    #[error("the peer did not open the replication stream: {0}")]
    Open(tonic::Status),
    #[error("the peer did not answer within {0:?}")]
    Timeout(Duration),
    #[error(
        "no batch from the active for {0:?} (heartbeats are due every fifth of failover_timeout)"
    )]
    Silent(Duration),
    #[error("the replication stream broke: {0}")]
    Stream(tonic::Status),
    #[error("the peer closed the replication stream")]
    Closed,
    #[error("the peer's first batch did not say who it is")]
    NoHello,
    #[error(transparent)]
    Buffer(#[from] BufferError),
}

/// How long following waits on the active.
#[derive(Debug, Clone, Copy)]
pub(crate) struct FollowTiming {
    /// For the stream to open and its first batch.
    pub open_timeout: Duration,
    /// For any further batch: a heartbeat interval and the link timeout.
    pub silence: Duration,
}

/// Follows the active at `endpoint` until the stream ends; always returns why.
pub(crate) async fn follow(
    roles: &Roles,
    replica: &Replica,
    pair: &Arc<Pair>,
    endpoint: &Endpoint,
    timing: FollowTiming,
) -> FollowError {
    let outcome = follow_inner(roles, replica, pair, endpoint, timing).await;
    pair.set_following(false);
    match outcome {
        Ok(never) => match never {},
        Err(e) => e,
    }
}

async fn follow_inner(
    roles: &Roles,
    replica: &Replica,
    pair: &Arc<Pair>,
    endpoint: &Endpoint,
    timing: FollowTiming,
) -> Result<std::convert::Infallible, FollowError> {
    let open_timeout = timing.open_timeout;
    let record = roles.pair_record().await?.unwrap_or(PairRecord {
        role: Role::Standby,
        term: 0,
        holds_own_rows: false,
        replicated_through: Seq::START,
        statuses_through: StatusSeq::default(),
    });
    let channel = endpoint
        .connect()
        .await
        .map_err(|e| FollowError::Connect(error_chain(&e)))?;
    let mut client = SitePairClient::new(channel).max_decoding_message_size(MAX_GRPC_MESSAGE_BYTES);
    // Confirmations never outnumber the active's window, so this never fills.
    let (confirm, confirmations) = mpsc::channel(WINDOW + 4);
    let hello = ReplicaMessage {
        message: Some(replica_message::Message::Hello(ReplicaHello {
            node_name: pair.name().to_owned(),
            term: record.term,
            replicated_through: record.replicated_through.0,
            statuses_through: record.statuses_through.0,
        })),
    };
    let _ = confirm.send(hello).await;
    let mut batches = tokio::time::timeout(
        open_timeout,
        client.replicate(ReceiverStream::new(confirmations)),
    )
    .await
    .map_err(|_| FollowError::Timeout(open_timeout))?
    .map_err(FollowError::Open)?
    .into_inner();

    let first = tokio::time::timeout(open_timeout, batches.next())
        .await
        .map_err(|_| FollowError::Timeout(open_timeout))?;
    let first = match first {
        Some(Ok(batch)) => batch,
        Some(Err(status)) => return Err(FollowError::Stream(status)),
        None => return Err(FollowError::Closed),
    };
    let active = first
        .active
        .clone()
        .and_then(node_view_from_proto)
        .ok_or(FollowError::NoHello)?;
    if active.term != record.term {
        // A different term means a different history: the active sends a full copy, so the
        // copy restarts from nothing here too.
        roles
            .save_role(Role::Standby, active.term, false, true)
            .await?;
    }
    tracing::info!(
        active = %active.name, term = active.term, replicated_through = record.replicated_through.0,
        "following the active node"
    );
    pair.heard_from(Some(active));
    pair.set_following(true);

    let mut pending = vec![first];
    loop {
        // Everything that arrived together is applied in one transaction.
        while pending.len() < WINDOW {
            match batches.next().now_or_never() {
                Some(Some(Ok(batch))) => pending.push(batch),
                Some(Some(Err(status))) => return Err(FollowError::Stream(status)),
                Some(None) => return Err(FollowError::Closed),
                None => break,
            }
        }
        let last = pending.last().map_or(0, |b| b.batch);
        replica
            .apply_replica(changes(std::mem::take(&mut pending)))
            .await?;
        pair.heard_from(None);
        let confirmed = ReplicaMessage {
            message: Some(replica_message::Message::AppliedBatch(last)),
        };
        if confirm.send(confirmed).await.is_err() {
            return Err(FollowError::Closed);
        }
        let next = tokio::time::timeout(timing.silence, batches.next())
            .await
            .map_err(|_| FollowError::Silent(timing.silence))?;
        match next {
            Some(Ok(batch)) => pending.push(batch),
            Some(Err(status)) => return Err(FollowError::Stream(status)),
            None => return Err(FollowError::Closed),
        }
    }
}

/// The buffer changes of `batches`, in order.
fn changes(batches: Vec<ReplicationBatch>) -> ReplicaChanges {
    let mut changes = ReplicaChanges::default();
    for batch in batches {
        // Each batch's adds precede its removes; a later batch's adds follow earlier removes,
        // which is harmless: a seq is never reused on the active once removed.
        changes
            .retained
            .extend(batch.retained.iter().map(span_from_proto));
        for row in batch.adds {
            let Some(notification) = row.notification else {
                continue;
            };
            match outbox_proto::submission::parse(notification) {
                // Priority, condition key and the clear mark included: a promoted standby
                // forwards the row as the active would have.
                Ok(n) => changes.adds.push((Seq(row.seq), n)),
                Err(problem) => tracing::error!(
                    seq = row.seq, %problem,
                    "the active sent a row that breaks the content rules; not copied"
                ),
            }
        }
        changes.removes.extend(batch.removes.into_iter().map(Seq));
        if batch.pending_clears_included {
            changes.pending_clears = Some(pending_clears(batch.pending_clears));
        }
        if batch.pending_acks_included {
            changes.pending_acks = Some(pending_acks(batch.pending_acks));
        }
        for replicated in batch.statuses {
            let seq = StatusSeq(replicated.status_seq);
            match replicated
                .change
                .ok_or_else(|| "change: missing".to_owned())
                .and_then(crate::wire::central_status_from_proto)
            {
                Ok(status) => changes.statuses.push((seq, status)),
                // Central's status stays at central: GetStatus here asks central for it.
                Err(problem) => tracing::error!(
                    status_seq = seq.0, %problem,
                    "the active sent a final status this node cannot store; not copied"
                ),
            }
        }
    }
    changes
}

/// The active's list of pending clears, each checked; one that breaks the rules is left out
/// (it could never be sent to central), and so is any beyond [`MAX_PENDING_CLEARS`] (the
/// active sends no more).
fn pending_clears(list: Vec<outbox_proto::v1::PendingClear>) -> Vec<crate::domain::PendingClear> {
    if list.len() > MAX_PENDING_CLEARS {
        tracing::error!(
            listed = list.len(),
            kept = MAX_PENDING_CLEARS,
            "the active listed more pending clears than a standby takes; the rest are not copied"
        );
    }
    list.into_iter()
        .take(MAX_PENDING_CLEARS)
        .enumerate()
        .filter_map(|(i, clear)| match clear_from_proto(clear) {
            Ok(clear) => Some(clear),
            Err(problem) => {
                tracing::error!(
                    %problem,
                    "the active sent pending_clears[{i}] that breaks the rules; not copied"
                );
                None
            }
        })
        .collect()
}

/// The active's list of pending acknowledgements, checked as the clears are.
fn pending_acks(list: Vec<outbox_proto::v1::PendingAck>) -> Vec<crate::domain::PendingAck> {
    if list.len() > MAX_PENDING_ACKS {
        tracing::error!(
            listed = list.len(),
            kept = MAX_PENDING_ACKS,
            "the active listed more pending acknowledgements than a standby takes; the rest \
             are not copied"
        );
    }
    list.into_iter()
        .take(MAX_PENDING_ACKS)
        .enumerate()
        .filter_map(|(i, ack)| match ack_from_proto(ack) {
            Ok(ack) => Some(ack),
            Err(problem) => {
                tracing::error!(
                    %problem,
                    "the active sent pending_acks[{i}] that breaks the rules; not copied"
                );
                None
            }
        })
        .collect()
}
