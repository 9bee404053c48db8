//! Handing a former active's buffer to the active before it becomes a standby.
//!
//! A node that was active may hold rows its peer never saw: Sends it acked after its last
//! replicated batch, or during a partition. It gives every row to the active (`Adopt`, which
//! skips what the active already holds) oldest first, and deletes its rows only once all of
//! them are committed there. A crash in between repeats the hand-over, which is idempotent by
//! notification id; a row the active had already forwarded and deleted is forwarded once more,
//! and central answers DUPLICATE. A row marked cleared is handed over marked (the active marks
//! its own copy if it holds one). The node's pending clears go last, once every row is adopted
//! (so every copy the active holds of a row they cleared is marked by then), in requests of at
//! most [`MAX_PENDING_CLEARS`]; the active records them as [`crate::buffer`] describes (due at
//! once, holding its unmarked rows of the key until central applied them). A repeated
//! hand-over hands them over again, which changes nothing. The pending acknowledgements follow
//! the clears the same way ([`MAX_PENDING_ACKS`] per request); the active records each as due
//! at once.

use std::sync::Arc;
use std::time::Duration;

use outbox_proto::limits::MAX_GRPC_MESSAGE_BYTES;
use outbox_proto::v1::site_pair_client::SitePairClient;
use outbox_proto::v1::{self, AdoptRequest, GetRoleRequest, NotificationSubmit};
use prost::Message;
use tonic::transport::{Channel, Endpoint};

use super::source::BATCH_BYTES;
use super::{MAX_PENDING_ACKS, MAX_PENDING_CLEARS, Pair};
use crate::buffer::{BufferError, Handover};
use crate::domain::{NodeView, Role, Seq};
use crate::link::error_chain;
use crate::wire;

/// Rows read per query during a hand-over.
const PAGE_ROWS: usize = 256;

#[derive(Debug, thiserror::Error)]
pub(crate) enum HandoverError {
    #[error("cannot connect to the peer: {0}")]
    Connect(String),
    #[error("the peer did not answer within {0:?}")]
    Timeout(Duration),
    #[error("the peer refused: {0}")]
    Refused(tonic::Status),
    #[error("the peer is not active ({0:?}); nobody to hand the buffer to yet")]
    PeerNotActive(Role),
    #[error("the peer answered with a role this build does not know")]
    UnknownRole,
    #[error(transparent)]
    Buffer(#[from] BufferError),
}

/// Gives every buffered row to the active at `endpoint`, then empties the buffer and records
/// this node as a standby with nothing copied. Returns how many rows the active adopted.
pub(crate) async fn hand_over(
    buffer: &Handover,
    pair: &Arc<Pair>,
    endpoint: &Endpoint,
    timeout: Duration,
) -> Result<usize, HandoverError> {
    let channel = endpoint
        .connect()
        .await
        .map_err(|e| HandoverError::Connect(error_chain(&e)))?;
    let mut client = SitePairClient::new(channel).max_encoding_message_size(MAX_GRPC_MESSAGE_BYTES);
    let active = role_of(&mut client, timeout).await?;
    if active.role != Role::Active {
        return Err(HandoverError::PeerNotActive(active.role));
    }
    pair.heard_from(Some(active.clone()));

    let mut cursor = Seq::START;
    let mut adopted = 0;
    loop {
        let page = buffer.next_after(cursor, PAGE_ROWS).await?;
        let Some(last) = page.last_seq() else { break };
        if !page.unreadable.is_empty() {
            // They can never be forwarded by anyone: set aside here, as the forwarder would.
            let rejected = page
                .unreadable
                .iter()
                .map(|(seq, _, problem)| (*seq, format!("invalid in the site buffer: {problem}")))
                .collect();
            buffer.set_aside(rejected).await?;
        }
        let mut chunk: Vec<NotificationSubmit> = Vec::new();
        let mut bytes = 0;
        for (_, row) in &page.rows {
            let submit = wire::submit(row);
            bytes += submit.encoded_len();
            chunk.push(submit);
            if bytes >= BATCH_BYTES {
                let handed = Handed {
                    notifications: std::mem::take(&mut chunk),
                    ..Handed::default()
                };
                adopted += adopt(&mut client, pair, &active, handed, timeout).await?;
                bytes = 0;
            }
        }
        if !chunk.is_empty() {
            let handed = Handed {
                notifications: chunk,
                ..Handed::default()
            };
            adopted += adopt(&mut client, pair, &active, handed, timeout).await?;
        }
        cursor = last;
    }
    // This node is a standby now and takes no clears, and its forwarder (which forgets the
    // clears central applied) is stopped: the list read here is the one deleted below.
    let clears = buffer.read_pending_clears().await?;
    let handed: std::collections::HashSet<String> = clears
        .iter()
        .map(|c| c.condition_key.as_str().to_owned())
        .collect();
    let listed: Vec<v1::PendingClear> = clears.iter().map(wire::clear_to_proto).collect();
    for part in listed.chunks(MAX_PENDING_CLEARS) {
        let handed = Handed {
            pending_clears: part.to_vec(),
            ..Handed::default()
        };
        adopt(&mut client, pair, &active, handed, timeout).await?;
    }
    // Likewise the acknowledgements (this node takes none as a standby).
    let acks = buffer.read_pending_acks().await?;
    let listed: Vec<v1::PendingAck> = acks.iter().map(wire::ack_to_proto).collect();
    for part in listed.chunks(MAX_PENDING_ACKS) {
        let handed = Handed {
            pending_acks: part.to_vec(),
            ..Handed::default()
        };
        adopt(&mut client, pair, &active, handed, timeout).await?;
    }
    let finished = buffer.finish_handover(cursor, active.term).await?;
    let dropped: Vec<&String> = finished
        .deleted_clears
        .iter()
        .filter(|key| !handed.contains(*key))
        .collect();
    if !dropped.is_empty() {
        tracing::warn!(
            condition_keys = ?dropped,
            "pending clears dropped at the hand-over: central is not asked to clear the \
             notifications of these keys it received before the clear"
        );
    }
    tracing::info!(
        active = %active.name, adopted, deleted = finished.deleted,
        pending_clears = handed.len(), pending_acks = acks.len(),
        "handed the buffer and the pending clears over to the active node; now following it \
         as standby"
    );
    Ok(adopted)
}

async fn role_of(
    client: &mut SitePairClient<Channel>,
    timeout: Duration,
) -> Result<NodeView, HandoverError> {
    let view = tokio::time::timeout(timeout, client.get_role(GetRoleRequest {}))
        .await
        .map_err(|_| HandoverError::Timeout(timeout))?
        .map_err(HandoverError::Refused)?
        .into_inner();
    wire::node_view_from_proto(view).ok_or(HandoverError::UnknownRole)
}

/// What one `Adopt` request carries: rows, or (once every row is adopted) pending clears and
/// acknowledgements.
#[derive(Default)]
struct Handed {
    notifications: Vec<NotificationSubmit>,
    pending_clears: Vec<v1::PendingClear>,
    pending_acks: Vec<v1::PendingAck>,
}

async fn adopt(
    client: &mut SitePairClient<Channel>,
    pair: &Pair,
    active: &NodeView,
    handed: Handed,
    timeout: Duration,
) -> Result<usize, HandoverError> {
    let request = AdoptRequest {
        node_name: pair.name().to_owned(),
        term: active.term,
        notifications: handed.notifications,
        pending_clears: handed.pending_clears,
        pending_acks: handed.pending_acks,
    };
    let answer = tokio::time::timeout(timeout, client.adopt(request))
        .await
        .map_err(|_| HandoverError::Timeout(timeout))?
        .map_err(HandoverError::Refused)?
        .into_inner();
    pair.heard_from(None);
    Ok(answer.adopted as usize)
}
