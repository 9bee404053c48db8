//! Central's domain: notifications and their lifecycle, delivery outcomes and the retry policy,
//! notification lists and channel settings. Plain Rust: nothing here knows about gRPC, SQL or
//! SMTP, so every rule can be unit-tested and every backend and transport shares it.

pub mod channel;
pub mod consolidation;
pub mod delivery;
pub mod escalation;
pub mod failover;
pub mod history;
pub mod kpi;
pub mod query;
pub mod rate;
pub mod retry;
pub mod schedule;
pub mod self_alert;
pub mod serve_order;
pub mod site_health;
pub mod smtp_relay;
pub mod status;
pub mod status_callback;
pub mod webhook;

pub use outbox_domain::{
    Body, ConditionKey, ContentError, ListName, NotificationContent, NotificationId,
    NotificationType, Priority, Provenance, SiteId, Subject, Submission, TypeData,
};

use sha2::{Digest, Sha256};

/// SHA-256 of a notification's content fields. Two submits with the same id are the same
/// notification only if their hashes match; provenance is deliberately left out (a resubmit after
/// a site failover may carry another instance id, and that is still the same notification).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ContentHash(pub [u8; 32]);

impl ContentHash {
    pub fn of(content: &NotificationContent) -> Self {
        let mut hasher = Sha256::new();
        // Each field is length-prefixed so that moving bytes between fields changes the hash.
        for field in [
            content.kind.as_str(),
            content.list_name.as_str(),
            content.subject.as_str(),
            content.body.as_str(),
            content.type_data.as_str(),
        ] {
            hasher.update((field.len() as u64).to_le_bytes());
            hasher.update(field.as_bytes());
        }
        Self(hasher.finalize().into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn content(subject: &str, body: &str) -> NotificationContent {
        NotificationContent {
            kind: NotificationType::Email,
            list_name: ListName::parse("ops".into()).unwrap(),
            subject: Subject::parse(subject.into()).unwrap(),
            body: Body::parse(body.into()).unwrap(),
            type_data: TypeData::empty(),
        }
    }

    #[test]
    fn hash_changes_with_any_content_field_and_field_boundaries() {
        let base = ContentHash::of(&content("ab", "c"));
        assert_eq!(base, ContentHash::of(&content("ab", "c")));
        assert_ne!(base, ContentHash::of(&content("a", "bc")));
        assert_ne!(base, ContentHash::of(&content("ab", "d")));
    }
}
