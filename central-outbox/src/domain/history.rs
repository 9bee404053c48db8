//! A notification's audit history: every delivery attempt and every operator action, in the
//! order they happened, and the operator actions themselves (Retry and Discard, both only from
//! Parked; each recorded with who did it and when).

use std::time::Duration;

use chrono::{DateTime, Utc};

use super::NotificationId;
use super::delivery::AttemptOutcome;
use super::status::Status;

/// What an operator can do to a Parked notification.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OperatorAction {
    /// Parked → Pending, RetryCount 0, NextAttemptAt and LastError cleared.
    Retry,
    /// Parked → Discarded; the row is kept for the audit record.
    Discard,
}

impl OperatorAction {
    /// The status an action applies to. Only Parked rows can be retried or discarded: anything
    /// else is still being worked on or already final.
    pub const FROM: Status = Status::Parked;

    pub fn target(self) -> Status {
        match self {
            Self::Retry => Status::Pending,
            Self::Discard => Status::Discarded,
        }
    }

    /// The history entry's stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Retry => "OperatorRetry",
            Self::Discard => "OperatorDiscard",
        }
    }

    pub fn verb(self) -> &'static str {
        match self {
            Self::Retry => "retried",
            Self::Discard => "discarded",
        }
    }
}

/// Who asked for an operator action, as the request said (free text, bounded).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Actor(String);

impl Actor {
    /// Longest actor name kept; longer ones are cut (it is an audit label, not an identity).
    pub const MAX_CHARS: usize = 128;

    pub fn new(name: &str) -> Self {
        let name: String = name
            .trim()
            .chars()
            .filter(|c| !c.is_control())
            .take(Self::MAX_CHARS)
            .collect();
        if name.is_empty() {
            Self::unknown()
        } else {
            Self(name)
        }
    }

    pub fn unknown() -> Self {
        Self("unknown".into())
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// What one history entry records.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HistoryEvent {
    Attempt {
        outcome: AttemptOutcome,
        /// Unset while InFlight.
        duration: Option<Duration>,
        lease_epoch: i64,
        /// The digest the notification went out in (flood consolidation), if it did: the
        /// digest's id, which is its mail's Message-ID (`<id@domain>`) or its webhook call's
        /// Idempotency-Key.
        digest: Option<NotificationId>,
        /// The relay the attempt was handed to (`host:port`), where it reached one.
        provider: Option<String>,
    },
    Operator {
        action: OperatorAction,
        actor: String,
    },
    /// A newer notification with the same condition key, list and site ended this one.
    Superseded { by: NotificationId },
    /// Its condition was cleared, by `actor`: the site (`site <id>`, at the site or through
    /// central's ClearCondition), or an operator.
    Cleared { actor: String },
    /// A page of an incident, ended before it was handed to the relay because `actor`
    /// acknowledged the incident.
    Acknowledged { actor: String },
    /// A call of its list's status callback (`domain::status_callback`), telling the endpoint
    /// the final status `status`; the entry's error says why one was not answered.
    StatusCallback {
        outcome: super::status_callback::CallOutcome,
        status: super::status::Status,
        /// `scheme://host:port` of the endpoint called; `None` when there was none to call.
        endpoint: Option<String>,
        /// How long the call took; `None` when no call was made.
        duration: Option<Duration>,
    },
}

/// The stored names of the condition-key history entries (the attempts table's Outcome
/// column; its Actor column holds the replacing notification's id or who cleared).
pub const SUPERSEDED_ENTRY: &str = "Superseded";
pub const CLEARED_ENTRY: &str = "Cleared";
/// The stored name of the entry of a page ended by its incident's acknowledgement (the Actor
/// column holds who acknowledged).
pub const ACKNOWLEDGED_ENTRY: &str = "Acknowledged";

/// The history entry that records a row ended in `status` by something else than its own
/// attempt (a newer state, a clear, an acknowledgement of its incident, a discard of its
/// incident's alarm): what a pending ending writes when it is applied. `None` for a status no
/// such ending leads to.
pub fn ending_entry(status: &str) -> Option<&'static str> {
    match status {
        SUPERSEDED_ENTRY => Some(SUPERSEDED_ENTRY),
        CLEARED_ENTRY => Some(CLEARED_ENTRY),
        ACKNOWLEDGED_ENTRY => Some(ACKNOWLEDGED_ENTRY),
        "Discarded" => Some(OperatorAction::Discard.as_str()),
        _ => None,
    }
}

/// The actor recorded when a site clears one of its conditions.
pub fn site_actor(site: &str) -> Actor {
    Actor::new(&format!("site {site}"))
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HistoryEntry {
    /// 1, 2, 3, ... in the order written.
    pub sequence: u32,
    pub at: DateTime<Utc>,
    pub error: Option<String>,
    pub event: HistoryEvent,
}

/// A notification's whole history: its attempts and actions (`attempts`, numbered as stored)
/// and its status callback calls (`calls`), in the order they happened (an attempt before a
/// call at the same millisecond: a call always follows the status it tells), numbered 1, 2, 3...
/// A history without calls keeps its stored numbers.
pub fn with_calls(attempts: Vec<HistoryEntry>, calls: Vec<HistoryEntry>) -> Vec<HistoryEntry> {
    if calls.is_empty() {
        return attempts;
    }
    // A merge, not a sort: each side keeps its stored order whatever the clocks did.
    let mut entries = Vec::with_capacity(attempts.len() + calls.len());
    let mut calls = calls.into_iter().peekable();
    for attempt in attempts {
        while let Some(call) = calls.next_if(|c| c.at < attempt.at) {
            entries.push(call);
        }
        entries.push(attempt);
    }
    entries.extend(calls);
    for (i, entry) in entries.iter_mut().enumerate() {
        entry.sequence = u32::try_from(i + 1).unwrap_or(u32::MAX);
    }
    entries
}

/// Why an operator action did not change a notification.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ActionRefusal {
    NotFound,
    /// The notification is in this status, not Parked.
    WrongStatus(Status),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn actor_names_are_bounded_and_never_empty() {
        assert_eq!(Actor::new("  ").as_str(), "unknown");
        assert_eq!(Actor::new("ann\r\n").as_str(), "ann");
        assert_eq!(
            Actor::new(&"x".repeat(500)).as_str().len(),
            Actor::MAX_CHARS
        );
    }
}
