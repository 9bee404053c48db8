//! `SiteNotify.WatchStatus`: a script waits for the outcome of its notifications without
//! polling. The stream first says where each asked id stands on this node (FORWARDING while
//! buffered, or the final status central sent back), then every final status stored for an
//! asked id or condition key, as the status follower (`crate::statuses`) or, on a standby, the
//! replication stores it.
//!
//! Invariants:
//! - The stream reads the statuses stored after a cursor taken before its first answer, so
//!   none stored after the stream began is missed; one stored meanwhile may be sent twice.
//! - It waits on the buffer's announcement of new statuses, never on a timer, and reads at
//!   most [`PAGE`] statuses at a time; it ends when the caller goes away or the node stops.

use outbox_proto::v1::{NotificationStatusView, WatchStatusRequest};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tonic::Status;

use super::{buffer_status, convert};
use crate::buffer::{StatusReader, Statuses};
use crate::domain::{
    ConditionKey, LocalStatus, NotificationId, SiteId, StatusInterest, StoredStatus,
};
use crate::wire;

/// Most ids one stream may watch.
pub(crate) const MAX_WATCHED_IDS: usize = 1_000;
/// Most condition keys one stream may watch.
pub(crate) const MAX_WATCHED_KEYS: usize = 100;
/// Statuses read per query.
const PAGE: usize = 500;

/// The request's ids and keys, checked; the error names the field and the limit.
pub(crate) fn interest(request: WatchStatusRequest) -> Result<StatusInterest, Status> {
    if request.notification_ids.len() > MAX_WATCHED_IDS {
        return Err(Status::invalid_argument(format!(
            "notification_ids: {} ids, the limit is {MAX_WATCHED_IDS}",
            request.notification_ids.len()
        )));
    }
    if request.condition_keys.len() > MAX_WATCHED_KEYS {
        return Err(Status::invalid_argument(format!(
            "condition_keys: {} keys, the limit is {MAX_WATCHED_KEYS}",
            request.condition_keys.len()
        )));
    }
    if request.notification_ids.is_empty() && request.condition_keys.is_empty() && !request.all {
        return Err(Status::invalid_argument(
            "notification_ids: name at least one id or one condition key to watch, or ask for all",
        ));
    }
    let ids = request
        .notification_ids
        .iter()
        .map(|id| NotificationId::parse(id, "notification_ids"))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| Status::invalid_argument(e.to_string()))?;
    let condition_keys = request
        .condition_keys
        .into_iter()
        .map(|key| ConditionKey::parse(key, "condition_keys").map(|k| k.as_str().to_owned()))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| Status::invalid_argument(e.to_string()))?;
    Ok(StatusInterest {
        ids,
        condition_keys,
        all: request.all,
    })
}

/// One watching script's stream.
pub(crate) struct Watch {
    pub interest: StatusInterest,
    pub statuses: Statuses,
    pub reader: StatusReader,
    pub site: SiteId,
    pub out: mpsc::Sender<Result<NotificationStatusView, Status>>,
}

impl Watch {
    /// Streams until the caller goes away, a read fails (sent as the stream's status), or
    /// `stop`.
    pub(crate) async fn run(self, stop: CancellationToken) {
        let ended = tokio::select! {
            ended = self.serve() => ended,
            () = stop.cancelled() => Err(Status::unavailable("the site-forwarder is stopping")),
            () = self.out.closed() => Ok(()),
        };
        if let Err(status) = ended {
            let _ = self.out.send(Err(status)).await;
        }
    }

    async fn serve(&self) -> Result<(), Status> {
        let mut head = self.statuses.head();
        let mut cursor = *head.borrow_and_update();
        for id in &self.interest.ids {
            if let Some(view) = self.current(*id).await? {
                self.send(view).await?;
            }
        }
        loop {
            let (found, last) = self
                .statuses
                .after(cursor, self.interest.clone(), PAGE)
                .await
                .map_err(buffer_status)?;
            for stored in found {
                self.send(view(&stored)?).await?;
            }
            if last > cursor {
                cursor = last;
                continue;
            }
            if head.changed().await.is_err() {
                return Err(Status::unavailable("the site-forwarder is stopping"));
            }
        }
    }

    /// Where `id` stands on this node: buffered, or its final status, if either.
    async fn current(&self, id: NotificationId) -> Result<Option<NotificationStatusView>, Status> {
        match self.reader.local_status(id).await.map_err(buffer_status)? {
            LocalStatus::Buffered(buffered) => {
                return Ok(Some(convert::buffered_view(id, buffered, &self.site)));
            }
            LocalStatus::Rejected { .. } | LocalStatus::NotHere => {}
        }
        match self
            .reader
            .central_status(id)
            .await
            .map_err(buffer_status)?
        {
            Some(stored) => view(&stored).map(Some),
            None => Ok(None),
        }
    }

    async fn send(&self, view: NotificationStatusView) -> Result<(), Status> {
        self.out
            .send(Ok(view))
            .await
            .map_err(|_| Status::cancelled("the caller went away"))
    }
}

/// Central's view as stored; a damaged one is an internal error naming it.
pub(crate) fn view(stored: &StoredStatus) -> Result<NotificationStatusView, Status> {
    wire::view_of(&stored.status).map_err(Status::internal)
}
