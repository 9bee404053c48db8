//! A notification list as a backend read it, and the one rule that turns it back into a
//! [`NotificationList`]. Both backends store a list the same way (its type, webhook format and
//! sealed secret, its fallback URLs in one column (`WebhookFallbacks`, in order, as
//! [`fallbacks_text`] writes them), its consolidation columns, and its targets in a table of
//! their own), so both decode it here: a stored value that breaks a rule (a hand edit, a restore) is a corrupt
//! store, named by its column, on either backend alike.

use std::time::Duration;

use crate::domain::channel::{EmailAddress, ListTargets, NotificationList};
use crate::domain::consolidation::Consolidation;
use crate::domain::webhook::{WebhookFormat, WebhookTarget, WebhookUrl};
use crate::domain::{ContentError, ListName, NotificationType};
use crate::secrets::{Keyring, Slot};
use crate::store::{Result, StoreError};

/// The columns of a stored list, and its targets, as read.
#[derive(Debug, Clone)]
pub(super) struct StoredList {
    pub(super) name: ListName,
    /// `NotificationLists.Type` (`NotificationType::from_db`).
    pub(super) kind: String,
    /// `WebhookFormat`; `None`: the generic format.
    pub(super) webhook_format: Option<String>,
    /// `WebhookSecret`, sealed by the store's [`Keyring`].
    pub(super) webhook_secret: Option<String>,
    /// `WebhookFallbacks` ([`fallbacks_text`]); `None` or empty: none.
    pub(super) webhook_fallbacks: Option<String>,
    /// The recipient addresses or endpoint URLs, in the order the list reads in.
    pub(super) targets: Vec<String>,
    /// `ConsolidateThreshold`, `ConsolidateWindowSeconds`, `ConsolidateMaxPerDigest`: all
    /// three set, or the list does not consolidate.
    pub(super) consolidation: [Option<i64>; 3],
    /// `Escalation`: the policy's stored text (`stored_policy`); `None`: the list does not
    /// escalate.
    pub(super) escalation: Option<String>,
    /// `StatusCallbackUrl`; `None`: the list has no status callback.
    pub(super) status_callback: Option<String>,
}

impl StoredList {
    /// The list, with its secret opened; a value that breaks a rule is [`StoreError::Corrupt`].
    pub(super) fn decode(self, secrets: &Keyring) -> Result<NotificationList> {
        let Self {
            name,
            kind,
            webhook_format,
            webhook_secret,
            webhook_fallbacks,
            targets,
            consolidation,
            escalation,
            status_callback,
        } = self;
        let status_callback = status_callback
            .map(|u| WebhookUrl::parse(&u).map_err(|e| corrupt(format!("StatusCallbackUrl: {e}"))))
            .transpose()?;
        let escalation = escalation
            .map(|text| super::stored_policy::decode(&text).map_err(corrupt))
            .transpose()?;
        let consolidation = match consolidation {
            [Some(threshold), Some(window), Some(max)] => {
                Some(consolidation_settings(threshold, window, max).map_err(corrupt)?)
            }
            _ => None,
        };
        let kind = NotificationType::from_db(&kind)
            .ok_or_else(|| corrupt(format!("list type {kind:?}")))?;
        let targets = match kind {
            NotificationType::Email => ListTargets::Email(
                targets
                    .iter()
                    .map(|a| EmailAddress::parse(a, "recipients").map_err(corrupt))
                    .collect::<Result<_>>()?,
            ),
            NotificationType::Webhook => ListTargets::Webhook(WebhookTarget {
                endpoints: targets
                    .iter()
                    .map(|u| WebhookUrl::parse(u).map_err(corrupt))
                    .collect::<Result<_>>()?,
                fallbacks: webhook_fallbacks
                    .as_deref()
                    .unwrap_or_default()
                    .split_ascii_whitespace()
                    .map(|u| {
                        WebhookUrl::parse(u).map_err(|e| corrupt(format!("WebhookFallbacks: {e}")))
                    })
                    .collect::<Result<_>>()?,
                format: match webhook_format {
                    None => WebhookFormat::Generic,
                    Some(f) => WebhookFormat::parse(&f)
                        .ok_or_else(|| corrupt(format!("webhook format {f:?}")))?,
                },
                secret: webhook_secret
                    .map(|s| secrets.open(&s, Slot::WebhookSecret(name.as_str())))
                    .transpose()?,
            }),
        };
        Ok(NotificationList {
            name,
            targets,
            consolidation,
            escalation,
            status_callback,
        })
    }
}

/// The `WebhookFallbacks` value of `list`: its fallback URLs in order, separated by one space
/// (a parsed URL never holds whitespace); `None` for a list without any.
pub(super) fn fallbacks_text(list: &NotificationList) -> Option<String> {
    match &list.targets {
        ListTargets::Webhook(target) if !target.fallbacks.is_empty() => Some(
            target
                .fallbacks
                .iter()
                .map(WebhookUrl::as_str)
                .collect::<Vec<_>>()
                .join(" "),
        ),
        _ => None,
    }
}

/// A list's stored consolidation columns as domain settings. A value beyond what the domain
/// allows (negative, or past its limit) fails the domain's check, naming the setting.
pub(super) fn consolidation_settings(
    threshold: i64,
    window_seconds: i64,
    max_per_digest: i64,
) -> std::result::Result<Consolidation, ContentError> {
    let int = |v: i64| u32::try_from(v).unwrap_or(u32::MAX);
    Consolidation::parse(
        int(threshold),
        Duration::from_secs(u64::try_from(window_seconds).unwrap_or(u64::MAX)),
        int(max_per_digest),
    )
}

fn corrupt(what: impl std::fmt::Display) -> StoreError {
    StoreError::Corrupt(what.to_string())
}
