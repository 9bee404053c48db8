//! How urgent a notification is. Central serves a channel's due rows highest priority first
//! (see central's `domain::serve_order` for the whole rule, including how lower priorities are
//! kept from starving); the site stores and forwards the priority unchanged.
//!
//! Databases store the [`Priority::rank`], so that an ascending index on it puts the most urgent
//! rows first. The ranks are part of the stored format and never change.

use std::fmt;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub enum Priority {
    /// Never held back by flood consolidation, served before everything else.
    Critical,
    High,
    /// What a notification is when its sender says nothing.
    #[default]
    Normal,
    Low,
}

impl Priority {
    /// Most urgent first.
    pub const ALL: [Priority; 4] = [Self::Critical, Self::High, Self::Normal, Self::Low];

    /// The stored rank: 0 (critical) to 3 (low), so ascending order is most urgent first.
    pub fn rank(self) -> u8 {
        match self {
            Self::Critical => 0,
            Self::High => 1,
            Self::Normal => 2,
            Self::Low => 3,
        }
    }

    /// Inverse of [`Self::rank`]; `None` for a rank no priority has.
    pub fn from_rank(rank: i64) -> Option<Self> {
        Self::ALL.into_iter().find(|p| i64::from(p.rank()) == rank)
    }

    /// The name operators see and type (`critical`, `high`, `normal`, `low`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Critical => "critical",
            Self::High => "high",
            Self::Normal => "normal",
            Self::Low => "low",
        }
    }

    /// Inverse of [`Self::as_str`], ignoring ASCII case.
    pub fn parse_name(text: &str) -> Option<Self> {
        Self::ALL
            .into_iter()
            .find(|p| p.as_str().eq_ignore_ascii_case(text))
    }
}

impl fmt::Display for Priority {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranks_and_names_round_trip_most_urgent_first() {
        for (i, p) in Priority::ALL.into_iter().enumerate() {
            assert_eq!(usize::from(p.rank()), i);
            assert_eq!(Priority::from_rank(i64::from(p.rank())), Some(p));
            assert_eq!(Priority::parse_name(&p.as_str().to_uppercase()), Some(p));
        }
        assert_eq!(Priority::from_rank(4), None);
        assert_eq!(Priority::parse_name("urgent"), None);
        assert_eq!(Priority::default(), Priority::Normal);
        assert!(Priority::Critical < Priority::Low);
    }
}
