//! The notification an incident's page (or its "acknowledged by X" notice) quotes, as a backend
//! read it, and the copy of it each message is: one rule for both backends, so a page reads
//! the same whichever store fired it.

use chrono::{DateTime, Utc};

use crate::domain::escalation::Acknowledgement;
use crate::domain::{
    Body, ListName, NotificationContent, NotificationId, NotificationType, Priority, Provenance,
    SiteId, Subject, Submission, TypeData,
};
use outbox_domain::limits::{MAX_BODY_BYTES, MAX_SUBJECT_CHARS};

/// The notification a page quotes, as stored.
#[derive(Clone)]
pub(crate) struct PageSource {
    pub(crate) kind: String,
    pub(crate) subject: String,
    pub(crate) body: String,
    pub(crate) type_data: String,
    pub(crate) site: String,
    pub(crate) instance: String,
    pub(crate) script: String,
    pub(crate) origin: Option<String>,
    pub(crate) origin_parent: Option<String>,
    /// `None` when the stored time is not a valid one (the copy then cannot be made).
    pub(crate) enqueued_at: Option<DateTime<Utc>>,
}

impl PageSource {
    /// The message to `list` (of channel `kind`): the quoted notification's subject and body,
    /// its type data only on the same channel (another channel's would not mean anything),
    /// and its provenance, under a fresh id. `Err` says why it cannot be (a content rule the
    /// stored text no longer passes).
    pub(crate) fn submission(
        self,
        kind: NotificationType,
        list: &str,
        priority: Priority,
    ) -> Result<Submission, String> {
        let invalid = |e: crate::domain::ContentError| format!("{}: {}", e.field, e.problem);
        let type_data = if NotificationType::from_db(&self.kind) == Some(kind) {
            TypeData::parse(self.type_data).map_err(invalid)?
        } else {
            TypeData::empty()
        };
        let uuid = |text: Option<String>| text.and_then(|t| uuid::Uuid::parse_str(&t).ok());
        Ok(Submission {
            id: NotificationId::generate(),
            content: NotificationContent {
                kind,
                list_name: ListName::parse(list.to_owned()).map_err(invalid)?,
                subject: Subject::parse(self.subject).map_err(invalid)?,
                body: Body::parse(self.body).map_err(invalid)?,
                type_data,
            },
            provenance: Provenance {
                source_site_id: SiteId::parse(self.site).map_err(invalid)?,
                source_instance_id: self.instance,
                source_script: self.script,
                origin_execution_id: uuid(self.origin),
                origin_parent_execution_id: uuid(self.origin_parent),
                site_enqueued_at: self
                    .enqueued_at
                    .ok_or("its SiteEnqueuedAt is not a valid time")?,
            },
            priority,
            condition_key: None,
            cleared_at_site: None,
            deliver_after: None,
        })
    }

    /// Makes the copy the notice that `ack` acknowledged incident `incident` at `now`:
    /// "Acknowledged by X: " before the subject (cut to fit), and the acknowledgement first in
    /// the body, the alarm quoted after it while it fits.
    pub(crate) fn announce_acknowledgement(
        &mut self,
        incident: i64,
        ack: &Acknowledgement,
        now: DateTime<Utc>,
    ) {
        let actor = ack.actor.as_str();
        let prefix = format!("Acknowledged by {actor}: ");
        let room = MAX_SUBJECT_CHARS.saturating_sub(prefix.chars().count());
        self.subject = format!(
            "{prefix}{}",
            self.subject.chars().take(room).collect::<String>()
        );
        let notice = format!(
            "{actor} acknowledged incident {incident} ({}) at {}: nobody further is paged for it.",
            ack.means.as_str(),
            now.format("%Y-%m-%d %H:%M:%S UTC")
        );
        let quoted = format!("{notice}\n\nThe alarm:\n{}", self.body);
        self.body = if quoted.len() <= MAX_BODY_BYTES {
            quoted
        } else {
            notice
        };
    }
}
