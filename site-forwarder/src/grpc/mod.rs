//! The gRPC edge of the forwarder: the local `SiteNotify` service, the `SitePair` service a node
//! serves its peer, the local API's proto <-> domain conversions, and the one mapping from the
//! forwarder's errors (the buffer's, the replication stream's) to `tonic::Status`. Handlers stay
//! thin: validate, call the buffer (or central, or the pair), answer.

pub(crate) mod convert;
pub(crate) mod site_notify;
pub(crate) mod site_pair;
pub(crate) mod watch_status;

use tonic::Status;

use crate::buffer::BufferError;
use crate::domain::{ContentError, NotActive};
use crate::pair::source::SourceError;

/// A standby's refusal: UNAVAILABLE, so a script retries, naming the node to send to instead.
impl From<NotActive> for Status {
    fn from(refusal: NotActive) -> Self {
        Status::unavailable(refusal.to_string())
    }
}

/// Bad input: the message names the field and the rule (`subject: must not be empty`).
pub(crate) fn invalid_argument(e: ContentError) -> Status {
    Status::invalid_argument(e.to_string())
}

/// The one mapping from buffer failures to gRPC codes. UNAVAILABLE tells the script to retry:
/// nothing was stored. RESOURCE_EXHAUSTED says the same for a Send refused to keep room for
/// draining, with the setting and the limit that refused it.
pub(crate) fn buffer_status(e: BufferError) -> Status {
    match e {
        BufferError::Database(detail) => {
            tracing::error!(%detail, "site buffer unavailable");
            Status::unavailable(format!(
                "the site buffer is unavailable, nothing was stored; retry later ({detail})"
            ))
        }
        BufferError::Corrupt(detail) => {
            tracing::error!(%detail, "invalid data in the site buffer");
            Status::internal(format!("the site buffer holds invalid data: {detail}"))
        }
        // The room check already logged the change of state; one line per refused Send would
        // flood the log while scripts retry. RESOURCE_EXHAUSTED: this node is out of room, not
        // down; a script retries later (the buffer drains by itself once central is back).
        BufferError::NoRoom(why) => Status::resource_exhausted(format!(
            "the site buffer takes no Sends now, nothing was stored; retry later (it takes \
             Sends again by itself once central has drained it): {why}"
        )),
    }
}

/// How a replication stream's end reaches the standby. UNAVAILABLE and RESOURCE_EXHAUSTED say
/// "reconnect and resume"; FAILED_PRECONDITION that this node is no longer the one to follow.
impl From<SourceError> for Status {
    fn from(e: SourceError) -> Self {
        let message = e.to_string();
        match e {
            SourceError::Buffer(_) | SourceError::BufferClosed | SourceError::Unconfirmed(_) => {
                Status::unavailable(message)
            }
            SourceError::FellBehind => Status::resource_exhausted(message),
            SourceError::UnexpectedMessage => Status::invalid_argument(message),
            SourceError::Standby(status) => status,
            SourceError::NotActive => Status::failed_precondition(message),
            SourceError::StandbyGone => Status::cancelled(message),
        }
    }
}
