//! A claimed row as a backend read it, and the one rule that turns it back into a deliverable
//! notification. Stored content passed validation when it was submitted, but a row can be
//! changed behind the service's back (a hand edit, a restore, an older version's data); such a
//! row cannot be delivered, and both backends park it the same way: Parked, with the reason in
//! LastError and on its attempt row (PermanentFailure), so the history says why.

use chrono::{DateTime, Utc};
use outbox_domain::ScriptOrigin;

use crate::domain::escalation::IncidentRef;
use crate::domain::{
    Body, ListName, NotificationContent, NotificationId, NotificationType, Priority, SiteId,
    Subject, TypeData,
};
use crate::records::{ClaimedNotification, LeaseEpoch};

/// The columns of a claimed row, as stored.
#[derive(Debug, Clone)]
pub(super) struct StoredClaim {
    pub row_id: i64,
    pub id: NotificationId,
    pub kind: String,
    pub list_name: String,
    pub subject: String,
    pub body: String,
    pub type_data: String,
    pub retry_count: u32,
    pub attempt_no: u32,
    pub source_site_id: String,
    pub source_instance_id: String,
    pub source_script: String,
    pub origin_execution_id: Option<String>,
    pub origin_parent_execution_id: Option<String>,
    /// `None` when the stored value is not a valid timestamp (SQLite stores milliseconds).
    pub site_enqueued_at: Option<DateTime<Utc>>,
    /// The stored rank (`Priority::rank`).
    pub priority: i64,
    /// The incident it belongs to, if any (`domain::escalation`).
    pub incident: Option<IncidentRef>,
}

impl StoredClaim {
    /// The notification to deliver, or why the row can no longer be delivered.
    pub(super) fn validate(self, epoch: LeaseEpoch) -> Result<ClaimedNotification, String> {
        let kind = NotificationType::from_db(&self.kind)
            .ok_or_else(|| format!("unknown type {:?}", self.kind))?;
        let content = NotificationContent {
            kind,
            list_name: ListName::parse(self.list_name).map_err(|e| e.to_string())?,
            subject: Subject::parse(self.subject).map_err(|e| e.to_string())?,
            body: Body::parse(self.body).map_err(|e| e.to_string())?,
            type_data: TypeData::parse(self.type_data).map_err(|e| e.to_string())?,
        };
        let origin = ScriptOrigin::parse(
            self.source_instance_id,
            self.source_script,
            self.origin_execution_id.as_deref(),
            self.origin_parent_execution_id.as_deref(),
        )
        .map_err(|e| e.to_string())?;
        let site = SiteId::parse_stored(self.source_site_id).map_err(|e| e.to_string())?;
        let enqueued = self
            .site_enqueued_at
            .ok_or("SiteEnqueuedAt is not a valid timestamp")?;
        let priority = Priority::from_rank(self.priority)
            .ok_or_else(|| format!("unknown priority rank {}", self.priority))?;
        Ok(ClaimedNotification {
            row_id: self.row_id,
            id: self.id,
            content,
            provenance: origin.at_site(site, enqueued),
            priority,
            retry_count: self.retry_count,
            attempt_no: self.attempt_no,
            epoch,
            incident: self.incident,
            digest_incidents: Vec::new(),
        })
    }
}

/// The LastError (and attempt-row error) of a row parked because it failed [`StoredClaim::validate`].
pub(super) fn invalid_row_error(problem: &str) -> String {
    format!("stored row is invalid: {problem}")
}
