//! A digest as the channel adapters see it: the held rows of one list claimed together become
//! one notification (one mail, one webhook call), and its one answer becomes each row's own
//! attempt record, so every row still reaches its own status with its own history entry.
//!
//! The digest is an ordinary [`ClaimedNotification`] to the adapters: its id is the digest's
//! (the mail's Message-ID, the webhook's Idempotency-Key), its subject and body are
//! `domain::consolidation::digest_text`, its priority the highest of its rows, and its source
//! the oldest row's (a digest spans sites; the body names each row's).

use crate::domain::consolidation::{DigestLine, digest_text};
use crate::domain::escalation::IncidentId;
use crate::domain::{ContentError, NotificationContent, NotificationId, TypeData};
use crate::records::{AttemptRecord, ClaimedNotification};

/// The rows of one list claimed as one digest, in the order they were held.
#[derive(Debug, Clone)]
pub(super) struct Digest {
    pub(super) id: NotificationId,
    pub(super) rows: Vec<ClaimedNotification>,
}

impl Digest {
    /// The one notification the adapters deliver. It carries the highest retry count of its
    /// rows, so the retry policy judges the digest by its most-tried row (rows held in one
    /// window share their history; a row whose digest failed may meet newer ones in the next).
    pub(super) fn notification(&self) -> Result<ClaimedNotification, ContentError> {
        let oldest = self
            .rows
            .iter()
            .min_by_key(|r| (r.provenance.site_enqueued_at, r.row_id))
            .ok_or_else(|| ContentError::new("digest", "has no rows"))?;
        let lines = self
            .rows
            .iter()
            .map(|r| DigestLine {
                enqueued_at: r.provenance.site_enqueued_at,
                site: r.provenance.source_site_id.as_str(),
                subject: r.content.subject.as_str(),
                id: r.id,
            })
            .collect();
        let (subject, body) = digest_text(oldest.content.list_name.as_str(), lines)?;
        Ok(ClaimedNotification {
            row_id: oldest.row_id,
            id: self.id,
            content: NotificationContent {
                kind: oldest.content.kind,
                list_name: oldest.content.list_name.clone(),
                subject,
                body,
                type_data: TypeData::empty(),
            },
            provenance: oldest.provenance.clone(),
            priority: self
                .rows
                .iter()
                .map(|r| r.priority)
                .min()
                .unwrap_or_default(),
            retry_count: self.rows.iter().map(|r| r.retry_count).max().unwrap_or(0),
            attempt_no: oldest.attempt_no,
            epoch: oldest.epoch,
            // One digest may hold the alarms of many incidents: it is none of them, and one
            // acknowledgement of it covers them all.
            incident: None,
            digest_incidents: self.incidents(),
        })
    }

    /// The incidents of its rows, in the rows' order, each once.
    fn incidents(&self) -> Vec<IncidentId> {
        let mut incidents: Vec<IncidentId> = Vec::new();
        for incident in self.rows.iter().filter_map(|r| r.incident) {
            if !incidents.contains(&incident.id) {
                incidents.push(incident.id);
            }
        }
        incidents
    }

    /// Each row's record of the digest's one attempt: the same outcome, error, duration and next
    /// state, fenced by the row's own claim.
    pub(super) fn records(&self, answer: &AttemptRecord) -> Vec<AttemptRecord> {
        self.rows
            .iter()
            .map(|r| AttemptRecord {
                row_id: r.row_id,
                id: r.id,
                attempt_no: r.attempt_no,
                epoch: r.epoch,
                ..answer.clone()
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use chrono::{TimeZone, Utc};
    use outbox_domain::ScriptOrigin;

    use super::*;
    use crate::domain::delivery::AttemptOutcome;
    use crate::domain::retry::Transition;
    use crate::domain::status::Status;
    use crate::domain::{NotificationType, Priority, SiteId};
    use crate::records::LeaseEpoch;

    fn held(
        row_id: i64,
        site: &str,
        minute: u32,
        priority: Priority,
        retries: u32,
    ) -> ClaimedNotification {
        let content = NotificationContent::parse(
            NotificationType::Email,
            "operators".into(),
            format!("alarm {row_id}"),
            "body".into(),
            r#"{"tank": 4}"#.into(),
        )
        .unwrap();
        let origin = ScriptOrigin::parse("node".into(), "alarm.py".into(), None, None).unwrap();
        let at = Utc.with_ymd_and_hms(2026, 11, 25, 10, minute, 0).unwrap();
        ClaimedNotification {
            row_id,
            id: NotificationId::generate(),
            content,
            provenance: origin.at_site(SiteId::parse(site.into()).unwrap(), at),
            priority,
            retry_count: retries,
            attempt_no: u32::try_from(row_id).unwrap(),
            epoch: LeaseEpoch(7),
            incident: None,
            digest_incidents: Vec::new(),
        }
    }

    #[test]
    fn a_digest_is_one_notification_under_its_own_id_from_its_oldest_row() {
        let rows = vec![
            held(11, "site-b", 5, Priority::Low, 0),
            held(12, "site-a", 3, Priority::High, 2),
            held(13, "site-a", 4, Priority::Normal, 1),
        ];
        let digest = Digest {
            id: NotificationId::generate(),
            rows: rows.clone(),
        };
        let n = digest.notification().unwrap();
        assert_eq!(n.id, digest.id);
        assert_eq!(n.row_id, 12, "the oldest row's");
        assert_eq!(n.provenance.source_site_id.as_str(), "site-a");
        assert_eq!(n.priority, Priority::High, "the most urgent row's");
        assert_eq!(n.retry_count, 2, "the most-tried row's");
        assert_eq!(n.content.list_name.as_str(), "operators");
        assert_eq!(
            n.content.type_data.as_str(),
            "",
            "rows' type data is not merged"
        );
        assert_eq!(
            n.content.subject.as_str(),
            "3 notifications for operators from site-a, site-b"
        );
        for row in &rows {
            assert!(n.content.body.as_str().contains(&row.id.to_string()));
        }
    }

    #[test]
    fn a_digest_covers_the_incidents_of_its_rows_each_once() {
        use crate::domain::escalation::IncidentRef;
        let of = |id, page_no| {
            Some(IncidentRef {
                id: IncidentId(id),
                page_no,
            })
        };
        let mut rows = vec![
            held(31, "site-a", 1, Priority::High, 0),
            held(32, "site-a", 2, Priority::High, 0),
            held(33, "site-a", 3, Priority::High, 0),
            held(34, "site-a", 4, Priority::Normal, 0),
        ];
        rows[0].incident = of(9, Some(1));
        rows[1].incident = of(10, Some(1));
        // A newer state of incident 9's condition, joined to it.
        rows[2].incident = of(9, None);
        let digest = Digest {
            id: NotificationId::generate(),
            rows,
        };
        let n = digest.notification().unwrap();
        assert_eq!(n.incident, None);
        assert_eq!(n.digest_incidents, [IncidentId(9), IncidentId(10)]);
    }

    #[test]
    fn each_row_gets_the_digests_outcome_under_its_own_claim() {
        let rows = vec![
            held(21, "site-a", 1, Priority::Normal, 0),
            held(22, "site-a", 2, Priority::Normal, 0),
        ];
        let digest = Digest {
            id: NotificationId::generate(),
            rows: rows.clone(),
        };
        let answer = AttemptRecord {
            row_id: 21,
            id: digest.id,
            attempt_no: 21,
            epoch: LeaseEpoch(7),
            outcome: AttemptOutcome::TransientFailure,
            error: Some("451 try later".into()),
            duration: Duration::from_millis(40),
            transition: Transition {
                status: Status::Retrying,
                retry_count: 1,
                next_attempt_at: None,
                last_error: Some("451 try later".into()),
                resolved_at: None,
                resolved_targets: None,
            },
            provider: None,
        };
        let records = digest.records(&answer);
        assert_eq!(records.len(), 2);
        for (record, row) in records.iter().zip(&rows) {
            assert_eq!(
                (record.row_id, record.id, record.attempt_no, record.epoch),
                (row.row_id, row.id, row.attempt_no, row.epoch)
            );
            assert_eq!(record.outcome, AttemptOutcome::TransientFailure);
            assert_eq!(record.error.as_deref(), Some("451 try later"));
            assert_eq!(record.transition.retry_count, 1);
        }
    }
}
