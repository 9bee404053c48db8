//! The notification status lifecycle (Delivered and Discarded are final; Parked waits for an
//! operator):
//!
//! ```text
//! ingest -> Pending -> [attempt] -> Delivered
//!                         |-> transient failure -> Retrying -> [attempt] ...
//!                         |-> permanent failure, or retries exhausted -> Parked
//! Parked --Retry--> Pending      Parked --Discard--> Discarded
//! Pending/Retrying (not claimed) --a newer one with its condition key--> Superseded
//! Pending/Retrying (not claimed) --its condition cleared--> Cleared
//! Pending/Retrying (not claimed), an incident's page --the incident acknowledged--> Acknowledged
//! ```

use std::fmt;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Status {
    Pending,
    Retrying,
    Delivered,
    Parked,
    Discarded,
    /// Final: a newer notification with the same condition key, list and site replaced it.
    Superseded,
    /// Final: its condition was cleared before it was delivered.
    Cleared,
    /// Waiting: held back by its list's flood consolidation, to go out in a digest at
    /// NextAttemptAt (its window's end, or the retry time after a failed digest).
    Held,
    /// Final: a page of an escalating incident (`domain::escalation`) not yet handed to the
    /// relay when somebody acknowledged the incident; its history names who.
    Acknowledged,
}

impl Status {
    pub const ALL: [Status; 9] = [
        Self::Pending,
        Self::Retrying,
        Self::Delivered,
        Self::Parked,
        Self::Discarded,
        Self::Superseded,
        Self::Cleared,
        Self::Held,
        Self::Acknowledged,
    ];

    /// The stable name stored in databases and shown to operators.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "Pending",
            Self::Retrying => "Retrying",
            Self::Delivered => "Delivered",
            Self::Parked => "Parked",
            Self::Discarded => "Discarded",
            Self::Superseded => "Superseded",
            Self::Cleared => "Cleared",
            Self::Held => "Held",
            Self::Acknowledged => "Acknowledged",
        }
    }

    pub fn from_db(text: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|s| s.as_str() == text)
    }

    /// The dispatcher may still attempt delivery (alone, or in a digest when Held).
    pub fn is_due_candidate(self) -> bool {
        matches!(self, Self::Pending | Self::Retrying | Self::Held)
    }

    /// Waiting for its turn to be delivered on its own: what can be stuck. A Held row waits
    /// for its window's end by design.
    pub fn waits_in_turn(self) -> bool {
        matches!(self, Self::Pending | Self::Retrying)
    }

    /// No further delivery happens without an operator (Parked) or ever (Delivered, Discarded).
    pub fn is_terminal(self) -> bool {
        !self.is_due_candidate()
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_terminality() {
        for status in Status::ALL {
            assert_eq!(Status::from_db(status.as_str()), Some(status));
        }
        assert!(Status::Parked.is_terminal());
        assert!(Status::Delivered.is_terminal());
        assert!(!Status::Retrying.is_terminal());
        assert_eq!(Status::from_db("pending"), None);
    }
}
