//! The final statuses central sends back (`NotificationIngest.WatchSiteStatus`): what the node
//! keeps of each, so `GetStatus` and `WatchStatus` answer from them, also while central is away.
//!
//! Central's own view of the notification is kept as central sent it (`view`, the encoded
//! `NotificationStatusView`, opaque here): the node answers with exactly what central said,
//! and a field central adds later passes through without a change here.

use std::sync::Arc;

use chrono::{DateTime, Utc};

use super::NotificationId;

/// Position of a status in this node's table: strictly increasing in the order they were
/// stored, never reused, and the same on both nodes of a pair (a standby stores the active's).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct StatusSeq(pub i64);

/// One final status of one notification, as central decided it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CentralStatus {
    pub notification_id: NotificationId,
    /// Central's order of its changes: of two statuses of one notification, the higher wins.
    pub central_seq: i64,
    pub condition_key: Option<String>,
    /// When central decided it.
    pub decided_at: DateTime<Utc>,
    /// Central's `NotificationStatusView`, encoded.
    pub view: Arc<[u8]>,
}

/// A status as this node stored it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredStatus {
    pub seq: StatusSeq,
    pub status: CentralStatus,
}

/// The notifications a `WatchStatus` asks about: these ids, and every one with one of these
/// condition keys; or, with `all`, every one.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StatusInterest {
    pub ids: Vec<NotificationId>,
    pub condition_keys: Vec<String>,
    pub all: bool,
}
