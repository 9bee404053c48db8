//! What a delivery attempt can end in, as adapters report it and as attempt rows record it.

use std::fmt;

/// Why an attempt failed, and so what happens next: a transient failure is retried after the
/// retry delay, a permanent one parks the notification for an operator.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DeliveryError {
    #[error("{0}")]
    Transient(String),
    /// Transient, and the server said when to come back (HTTP 429/503 Retry-After): the next
    /// attempt is never scheduled sooner.
    #[error("{message}")]
    Throttled {
        message: String,
        retry_after: std::time::Duration,
    },
    #[error("{0}")]
    Permanent(String),
}

impl DeliveryError {
    pub fn transient(message: impl Into<String>) -> Self {
        Self::Transient(message.into())
    }

    pub fn permanent(message: impl Into<String>) -> Self {
        Self::Permanent(message.into())
    }

    pub fn message(&self) -> &str {
        match self {
            Self::Transient(m) | Self::Permanent(m) => m,
            Self::Throttled { message, .. } => message,
        }
    }
}

/// A successful delivery: who it went to, snapshotted into the row for audit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivered {
    pub resolved_targets: Vec<String>,
}

/// The outcome column of an attempt row. `InFlight` is written before the adapter is called and
/// stays if the attempt never finished (crash, lease loss): a possible duplicate, made visible.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttemptOutcome {
    InFlight,
    Delivered,
    TransientFailure,
    PermanentFailure,
    /// Claimed and never handed to the channel: the claim was released (the row had waited too
    /// long for a free slot to finish within its claim), and the row is due again at once. The
    /// attempt's error says why; no mail or call went out for it.
    NotSent,
}

impl AttemptOutcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::InFlight => "InFlight",
            Self::Delivered => "Delivered",
            Self::TransientFailure => "TransientFailure",
            Self::PermanentFailure => "PermanentFailure",
            Self::NotSent => "NotSent",
        }
    }

    pub fn from_db(text: &str) -> Option<Self> {
        [
            Self::InFlight,
            Self::Delivered,
            Self::TransientFailure,
            Self::PermanentFailure,
            Self::NotSent,
        ]
        .into_iter()
        .find(|o| o.as_str() == text)
    }

    pub fn of(result: &Result<Delivered, DeliveryError>) -> Self {
        match result {
            Ok(_) => Self::Delivered,
            Err(DeliveryError::Transient(_) | DeliveryError::Throttled { .. }) => {
                Self::TransientFailure
            }
            Err(DeliveryError::Permanent(_)) => Self::PermanentFailure,
        }
    }
}

impl fmt::Display for AttemptOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
