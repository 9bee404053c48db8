//! Delivery adapters: one per channel type. An adapter turns a claimed notification and its
//! resolved targets into one delivery attempt and reports `Delivered` or a classified
//! [`DeliveryError`]; it never touches the store (the dispatcher records outcomes).
//!
//! [`Adapters`] is the one thing the dispatcher calls: it holds every adapter and the shared
//! machinery they need (the XOAUTH2 token cache), so the dispatcher stays transport-agnostic.

pub mod email;

pub use email::EmailAdapter;

use crate::domain::channel::{EmailAddress, SmtpAuth, SmtpSettings, WebhookSettings};
use crate::domain::delivery::{Delivered, DeliveryError};
use crate::domain::webhook::WebhookTarget;
use crate::store::ClaimedNotification;

/// Every channel's adapter.
#[derive(Debug, Default)]
pub struct Adapters {
    email: EmailAdapter,
}

impl Adapters {
    pub fn new() -> Result<Self, String> {
        Ok(Self {
            email: EmailAdapter::new(),
        })
    }

    /// One email delivery attempt.
    pub async fn email(
        &self,
        settings: &SmtpSettings,
        n: &ClaimedNotification,
        recipients: &[EmailAddress],
    ) -> Result<Delivered, DeliveryError> {
        if let SmtpAuth::XOAuth2 { .. } = settings.auth {
            return Err(DeliveryError::permanent("XOAUTH2 is not available yet"));
        }
        self.email
            .deliver(settings, n.id, &n.content, recipients, None)
            .await
    }

    /// One webhook delivery attempt (every endpoint of the list).
    pub async fn webhook(
        &self,
        _settings: &WebhookSettings,
        _n: &ClaimedNotification,
        _target: &WebhookTarget,
    ) -> Result<Delivered, DeliveryError> {
        Err(DeliveryError::permanent(
            "no delivery adapter for type Webhook",
        ))
    }
}
