//! Delivery adapters: one per channel type. An adapter turns a claimed notification and its
//! resolved targets into one delivery attempt and reports `Delivered` or a classified
//! [`DeliveryError`]; it never touches the store (the dispatcher records outcomes).
//!
//! [`Adapters`] is the one thing the dispatcher calls: it holds every adapter and what they share
//! (one pooled HTTP client, the XOAUTH2 token cache), so the dispatcher stays transport-agnostic.

pub mod email;
pub mod http;
pub mod oauth;
pub mod smtp_pool;
pub mod webhook;

pub use email::EmailAdapter;

use crate::domain::channel::{EmailAddress, SmtpAuth, SmtpSettings, WebhookSettings};
use crate::domain::delivery::{Delivered, DeliveryError};
use crate::domain::webhook::WebhookTarget;
use crate::store::ClaimedNotification;
use http::HttpClient;
use oauth::TokenCache;
use webhook::{Outgoing, WebhookAdapter};

/// Every channel's adapter.
pub struct Adapters {
    email: EmailAdapter,
    webhook: WebhookAdapter,
    tokens: TokenCache,
}

impl std::fmt::Debug for Adapters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Adapters").finish_non_exhaustive()
    }
}

impl Adapters {
    pub fn new() -> Result<Self, String> {
        let http = HttpClient::new()?;
        Ok(Self {
            email: EmailAdapter::new(),
            webhook: WebhookAdapter::new(http.clone()),
            tokens: TokenCache::new(http),
        })
    }

    /// One email delivery attempt. With XOAUTH2 the access token comes from the cache (fetched
    /// when missing or near expiry); a token the server refuses is dropped from the cache, so the
    /// next attempt fetches a fresh one.
    pub async fn email(
        &self,
        settings: &SmtpSettings,
        n: &ClaimedNotification,
        recipients: &[EmailAddress],
    ) -> Result<Delivered, DeliveryError> {
        let SmtpAuth::XOAuth2 { oauth, .. } = &settings.auth else {
            return self
                .email
                .deliver(settings, n.id, &n.content, recipients, None)
                .await;
        };
        let token = self.tokens.token(oauth, settings.timeout).await?;
        let result = self
            .email
            .deliver(settings, n.id, &n.content, recipients, Some(&token))
            .await;
        if let Err(e) = &result
            && email::is_auth_failure(e)
        {
            self.tokens.invalidate(oauth);
            // A refused token is normally a revoked or rotated one; a fresh token fixes it, so
            // this attempt counts as transient. A server that refuses every token still parks
            // the notification once retries run out.
            return Err(DeliveryError::transient(format!(
                "the SMTP server refused the XOAUTH2 access token; a new one is fetched for the \
                 next attempt ({})",
                e.message()
            )));
        }
        result
    }

    /// One webhook delivery attempt (every endpoint of the list).
    pub async fn webhook(
        &self,
        settings: &WebhookSettings,
        n: &ClaimedNotification,
        target: &WebhookTarget,
    ) -> Result<Delivered, DeliveryError> {
        let outgoing = Outgoing {
            id: n.id,
            content: &n.content,
            provenance: &n.provenance,
        };
        self.webhook.deliver(settings, &outgoing, target).await
    }
}
