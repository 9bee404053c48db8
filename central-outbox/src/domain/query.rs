//! What an operator can ask of the Notifications table: a filter (shared by QueryNotifications
//! and the bulk Retry/Discard forms) and keyset pagination over it, newest first.

use chrono::{DateTime, Utc};

use super::status::Status;
use super::{ContentError, NotificationType, Priority};

/// Longest subject keyword accepted (the subject itself is at most this long).
pub const MAX_KEYWORD_CHARS: usize = 500;
/// Rows per page when the caller does not say.
pub const DEFAULT_PAGE_SIZE: usize = 50;
/// Most rows per page; larger requests are served this many.
pub const MAX_PAGE_SIZE: usize = 500;

/// Set fields are ANDed; `None`/empty means "any".
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NotificationFilter {
    pub statuses: Vec<Status>,
    pub kind: Option<NotificationType>,
    pub priorities: Vec<Priority>,
    /// Exactly this condition key.
    pub condition_key: Option<String>,
    pub source_site_id: Option<String>,
    pub list_name: Option<String>,
    /// CreatedAt >= this.
    pub created_from: Option<DateTime<Utc>>,
    /// CreatedAt < this.
    pub created_to: Option<DateTime<Utc>>,
    /// Only Pending/Retrying rows waiting since before this instant (now − stuck threshold):
    /// created before it and, when scheduled, due before it (`schedule::waiting_since`).
    pub stuck_before: Option<DateTime<Utc>>,
    /// Only Pending rows still waiting for their time at this instant (now): scheduled for
    /// after it (`schedule::waits_for_its_time`).
    pub scheduled_after: Option<DateTime<Utc>>,
    /// Case-insensitive (ASCII) substring of the subject.
    pub subject_contains: Option<String>,
    /// Only rows resolved (for Parked rows: parked) before this instant.
    pub resolved_before: Option<DateTime<Utc>>,
}

impl NotificationFilter {
    /// Checks the combination; the single fields were checked as they were converted.
    pub fn check(self) -> Result<Self, ContentError> {
        if let (Some(from), Some(to)) = (self.created_from, self.created_to)
            && from >= to
        {
            return Err(ContentError::new(
                "filter.created_from",
                "must be earlier than filter.created_to",
            ));
        }
        if let Some(keyword) = &self.subject_contains
            && keyword.chars().count() > MAX_KEYWORD_CHARS
        {
            return Err(ContentError::new(
                "filter.subject_contains",
                format!("longer than {MAX_KEYWORD_CHARS} characters"),
            ));
        }
        Ok(self)
    }
}

/// A position in the newest-first order: the last row of the previous page. CreatedAt ties are
/// broken by the store's insertion-ordered row id, so the order is total and stable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cursor {
    pub created_at: DateTime<Utc>,
    pub row_id: i64,
}

impl Cursor {
    const PREFIX: &'static str = "v1.";

    /// The opaque page token handed to clients.
    pub fn token(self) -> String {
        format!(
            "{}{}.{}",
            Self::PREFIX,
            self.created_at.timestamp_micros(),
            self.row_id
        )
    }

    pub fn parse_token(token: &str) -> Result<Self, ContentError> {
        let bad = || ContentError::new("page_token", "is not a token from QueryNotifications");
        let rest = token.strip_prefix(Self::PREFIX).ok_or_else(bad)?;
        let (micros, row_id) = rest.split_once('.').ok_or_else(bad)?;
        let micros: i64 = micros.parse().map_err(|_| bad())?;
        let row_id: i64 = row_id.parse().map_err(|_| bad())?;
        let created_at = DateTime::from_timestamp_micros(micros).ok_or_else(bad)?;
        Ok(Self { created_at, row_id })
    }
}

/// One page request.
#[derive(Debug, Clone)]
pub struct PageRequest {
    pub filter: NotificationFilter,
    /// Rows after this position; `None` for the first page.
    pub after: Option<Cursor>,
    /// 1..=[`MAX_PAGE_SIZE`].
    pub size: usize,
}

impl PageRequest {
    /// Applies the documented default and cap to a requested page size.
    pub fn page_size(requested: u32) -> usize {
        match usize::try_from(requested) {
            Ok(0) => DEFAULT_PAGE_SIZE,
            Ok(n) => n.min(MAX_PAGE_SIZE),
            Err(_) => MAX_PAGE_SIZE,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn page_tokens_round_trip_and_garbage_is_named() {
        let cursor = Cursor {
            created_at: DateTime::from_timestamp_millis(1_700_000_000_123).unwrap(),
            row_id: 42,
        };
        assert_eq!(Cursor::parse_token(&cursor.token()).unwrap(), cursor);
        for bad in ["", "v1.", "v1.x.1", "v2.1.1", "v1.1", "v1.1.1.1"] {
            assert_eq!(Cursor::parse_token(bad).unwrap_err().field, "page_token");
        }
    }

    #[test]
    fn page_size_has_a_default_and_a_cap() {
        assert_eq!(PageRequest::page_size(0), DEFAULT_PAGE_SIZE);
        assert_eq!(PageRequest::page_size(7), 7);
        assert_eq!(PageRequest::page_size(100_000), MAX_PAGE_SIZE);
    }

    #[test]
    fn an_empty_or_inverted_created_range_is_refused() {
        let at = Utc::now();
        let filter = NotificationFilter {
            created_from: Some(at),
            created_to: Some(at),
            ..Default::default()
        };
        assert_eq!(filter.check().unwrap_err().field, "filter.created_from");
    }
}
