//! Delivery adapters: one per channel type. An adapter turns a claimed notification and its
//! resolved targets into one delivery attempt and reports `Delivered` or a classified
//! [`DeliveryError`]; it never touches the store (the dispatcher records outcomes).
//!
//! The dispatcher delivers through the [`Deliver`] trait. [`Adapters`] is its implementation: it
//! holds every adapter and what they share (one pooled HTTP client, the XOAUTH2 token cache), so
//! the dispatcher stays transport-agnostic and tests can script outcomes with their own.

pub(crate) mod email;
pub(crate) mod http;
pub(crate) mod mail_format;
pub(crate) mod oauth;
mod smtp_lane;
pub(crate) mod smtp_pool;
pub(crate) mod turn;
pub(crate) mod webhook;

// `pub` where `crate::testing` re-exports them.
#[cfg_attr(not(feature = "test-support"), allow(unreachable_pub))]
pub use email::EmailAdapter;
pub(crate) use email::EmailError;
pub(crate) use turn::StartOrder;
#[cfg_attr(not(feature = "test-support"), allow(unreachable_pub))]
pub use turn::Turn;

use std::borrow::Cow;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use crate::ack_link::{AckLink, AckLinks, MAX_DIGEST_INCIDENTS};
use crate::domain::channel::{
    DeliveryPolicy, EmailAddress, ListTargets, NotificationList, SmtpAuth, SmtpSettings,
    WebhookSettings,
};
use crate::domain::delivery::{Delivered, DeliveryError};
use crate::domain::escalation::digest_footer;
use crate::domain::failover::ProviderOutcome;
use crate::domain::retry::Backoff;
use crate::domain::webhook::{WebhookTarget, WebhookUrl};
use crate::domain::{Body, NotificationContent};
use crate::records::ClaimedNotification;
use http::HttpClient;
use oauth::TokenCache;
use webhook::{Outgoing, WebhookAdapter};

/// A channel's settings as one dispatcher sweep read them; each attempt keeps the snapshot it
/// started with.
// Email's variant is the large one and the common one; boxing it would cost an allocation for
// every attempt's copy instead of saving a few hundred bytes of the rarer webhook copies.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone)]
pub(crate) enum ChannelSettings {
    /// `None`: no SMTP configuration is stored (email rows park).
    Email(Option<SmtpSettings>),
    Webhook(WebhookSettings),
}

impl ChannelSettings {
    /// The names of the channel's providers in failover order (`host:port` of email's relay
    /// and fallback relays); empty where it has none to choose from.
    pub(crate) fn provider_names(&self) -> Vec<String> {
        match self {
            Self::Email(Some(s)) => (0..s.relays()).map(|i| s.relay_name(i)).collect(),
            Self::Email(None) | Self::Webhook(_) => Vec::new(),
        }
    }

    /// The settings an attempt at provider `index` delivers with (see `SmtpSettings::via`).
    pub(crate) fn via(&self, index: usize) -> Self {
        match self {
            Self::Email(Some(s)) => Self::Email(Some(s.via(index))),
            other => other.clone(),
        }
    }

    /// The pacing and retry policy, or the fallbacks when the channel is not configured (one
    /// slot, no limit: the rows only need to be parked).
    pub(crate) fn policy(&self) -> DeliveryPolicy {
        match self {
            Self::Email(Some(s)) => s.policy.clone(),
            Self::Webhook(s) => s.policy.clone(),
            Self::Email(None) => DeliveryPolicy {
                max_retries: 0,
                retry_delay: Duration::ZERO,
                backoff: Backoff::Fixed,
                max_concurrent_connections: 1,
                rate_limit: None,
            },
        }
    }
}

/// One delivery attempt of a claimed notification to its list (already resolved, and of the
/// notification's channel), with the settings the dispatcher's sweep read. The answer is
/// `Delivered` or a classified [`DeliveryError`]; an implementation never touches the store.
/// An implementation that lines attempts up (more than one per connection) waits for `turn`
/// before it takes a place in line and lets it go after ([`turn`]); any other drops it.
pub(crate) trait Deliver: Send + Sync + 'static {
    fn deliver(
        &self,
        channel: &ChannelSettings,
        list: &NotificationList,
        n: &ClaimedNotification,
        turn: Turn,
    ) -> impl Future<Output = Result<Delivered, DeliveryError>> + Send;

    /// How many attempts the dispatcher keeps under way per connection of `channel`: one,
    /// unless the adapter queues work behind its connections (email: one transaction waits
    /// behind each, so its envelope can go out with the previous message's end of data; see
    /// `smtp_lane`). The connections themselves stay at `max_concurrent_connections`.
    fn attempts_per_connection(&self, _channel: &ChannelSettings) -> usize {
        1
    }

    /// Whether `channel`'s first provider answers, by the adapter's cheapest exchange with it
    /// (email: connect, EHLO, STARTTLS if the settings ask for it, QUIT; nothing is sent). Only
    /// asked while the channel is on another provider. An adapter with one provider per
    /// channel need not say.
    fn probe_first(
        &self,
        _channel: &ChannelSettings,
    ) -> impl Future<Output = ProviderOutcome> + Send {
        std::future::ready(ProviderOutcome::Answered)
    }

    /// Whether webhook endpoint `endpoint` (the first of a list on a fallback) answers, by the
    /// cheapest exchange with it (a HEAD: nothing is posted). An adapter without webhook
    /// endpoints need not say.
    fn probe_endpoint(
        &self,
        _channel: &ChannelSettings,
        _endpoint: &WebhookUrl,
    ) -> impl Future<Output = ProviderOutcome> + Send {
        std::future::ready(ProviderOutcome::Answered)
    }
}

impl Deliver for Adapters {
    async fn deliver(
        &self,
        channel: &ChannelSettings,
        list: &NotificationList,
        n: &ClaimedNotification,
        turn: Turn,
    ) -> Result<Delivered, DeliveryError> {
        match (channel, &list.targets) {
            (ChannelSettings::Email(None), _) => {
                Err(DeliveryError::permanent("no SMTP configuration"))
            }
            (ChannelSettings::Email(Some(smtp)), ListTargets::Email(recipients)) => {
                self.email(smtp, n, recipients, turn).await
            }
            (ChannelSettings::Webhook(settings), ListTargets::Webhook(target)) => {
                self.webhook(settings, n, list.name.as_str(), target).await
            }
            // The dispatcher checks the list's kind first; answer sanely anyway.
            _ => Err(DeliveryError::permanent(
                "the list's channel does not match the notification's",
            )),
        }
    }

    fn attempts_per_connection(&self, channel: &ChannelSettings) -> usize {
        match channel {
            ChannelSettings::Email(Some(_)) => EMAIL_ATTEMPTS_PER_CONNECTION,
            ChannelSettings::Email(None) | ChannelSettings::Webhook(_) => 1,
        }
    }

    async fn probe_first(&self, channel: &ChannelSettings) -> ProviderOutcome {
        match channel {
            ChannelSettings::Email(Some(smtp)) => match smtp_pool::probe(smtp).await {
                Ok(()) => ProviderOutcome::Answered,
                Err(e) => {
                    tracing::info!(relay = %smtp.relay_name(0), error = %e, "the first relay still does not answer");
                    ProviderOutcome::Failed
                }
            },
            ChannelSettings::Email(None) | ChannelSettings::Webhook(_) => ProviderOutcome::Answered,
        }
    }

    async fn probe_endpoint(
        &self,
        channel: &ChannelSettings,
        endpoint: &WebhookUrl,
    ) -> ProviderOutcome {
        match channel {
            ChannelSettings::Webhook(settings) => {
                self.webhook.probe(endpoint, settings.timeout).await
            }
            ChannelSettings::Email(_) => ProviderOutcome::Answered,
        }
    }
}

/// Email attempts under way per SMTP connection: the one being sent, the one whose envelope
/// rides behind its message, and one more. The dispatcher starts an attempt only once an
/// earlier one has been answered, and a connection does not wait for that: with two, the
/// next message would usually go out before a transaction was waiting to ride behind it, so
/// every other message would cost two round trips again. More would only wait longer.
const EMAIL_ATTEMPTS_PER_CONNECTION: usize = 3;

/// Every channel's adapter.
pub(crate) struct Adapters {
    email: EmailAdapter,
    webhook: WebhookAdapter,
    tokens: TokenCache,
    /// The HTTP client the webhook and OAuth calls share, lent to the heartbeat too.
    http: HttpClient,
    /// Signs the acknowledgement links of incident messages, when links are on.
    links: Option<Arc<AckLinks>>,
}

impl std::fmt::Debug for Adapters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Adapters").finish_non_exhaustive()
    }
}

impl Adapters {
    pub(crate) fn new() -> Result<Self, String> {
        let http = HttpClient::new()?;
        Ok(Self {
            email: EmailAdapter::new(),
            webhook: WebhookAdapter::new(http.clone()),
            tokens: TokenCache::new(http.clone()),
            http,
            links: None,
        })
    }

    /// Messages of incidents carry acknowledgement links made by `links`.
    pub(crate) fn with_ack_links(mut self, links: Option<Arc<AckLinks>>) -> Self {
        self.links = links;
        self
    }

    /// The outbound HTTP client (one pool, one TLS set-up for every HTTP call central makes).
    pub(crate) fn http(&self) -> HttpClient {
        self.http.clone()
    }

    /// One email delivery attempt. A notification of an incident, when links are on, goes as
    /// one message per recipient, each with the link bound to that recipient (one after the
    /// other on the pool's connections; the first failure ends the attempt, and its retry sends
    /// to every recipient again, as any retry does); any other goes as one message to all.
    pub(crate) async fn email(
        &self,
        settings: &SmtpSettings,
        n: &ClaimedNotification,
        recipients: &[EmailAddress],
        turn: Turn,
    ) -> Result<Delivered, DeliveryError> {
        if !self.carries_links(n) {
            let content = with_incident_footer(n, None);
            return self
                .email_message(settings, n, &content, recipients, turn)
                .await;
        }
        if recipients.is_empty() {
            return Err(DeliveryError::permanent(
                "the notification list has no recipients",
            ));
        }
        let now = chrono::Utc::now();
        let mut turn = Some(turn);
        for recipient in recipients {
            let link = self.link_for(n, recipient.as_str(), now);
            let content = with_incident_footer(n, link.as_ref());
            // Only the first message waits for its place in the channel's start order; the
            // rest follow it.
            let turn = turn.take().unwrap_or_else(Turn::unordered);
            self.email_message(settings, n, &content, std::slice::from_ref(recipient), turn)
                .await?;
        }
        Ok(Delivered {
            resolved_targets: recipients.iter().map(ToString::to_string).collect(),
        })
    }

    /// Whether `n`'s messages carry acknowledgement links: links are on, and it is a message
    /// of an incident or a digest holding alarms of incidents.
    fn carries_links(&self, n: &ClaimedNotification) -> bool {
        self.links.is_some() && (n.incident.is_some() || !n.digest_incidents.is_empty())
    }

    /// The acknowledgement link of `n`'s message to `recipient`, when it carries one.
    fn link_for(
        &self,
        n: &ClaimedNotification,
        recipient: &str,
        now: chrono::DateTime<chrono::Utc>,
    ) -> Option<AckLink> {
        let links = self.links.as_ref()?;
        match n.incident {
            Some(incident) => Some(links.link(incident, recipient, now)),
            None => links.digest_link(&n.digest_incidents, recipient, now),
        }
    }

    /// One message of `n` with `content` to `recipients`. With XOAUTH2 the access token comes
    /// from the cache (fetched when missing or near expiry); a token the server refuses is
    /// dropped from the cache, so the next attempt fetches a fresh one.
    async fn email_message(
        &self,
        settings: &SmtpSettings,
        n: &ClaimedNotification,
        content: &NotificationContent,
        recipients: &[EmailAddress],
        turn: Turn,
    ) -> Result<Delivered, DeliveryError> {
        let SmtpAuth::XOAuth2 { oauth, .. } = &settings.auth else {
            return self
                .email
                .deliver(settings, n.id, content, n.priority, recipients, None, turn)
                .await
                .map_err(EmailError::into_delivery_error);
        };
        let token = self.tokens.token(oauth, settings.timeout).await?;
        match self
            .email
            .deliver(
                settings,
                n.id,
                content,
                n.priority,
                recipients,
                Some(&token),
                turn,
            )
            .await
        {
            Err(EmailError::CredentialsRefused(e)) => {
                self.tokens.invalidate(oauth);
                // A refused token is normally a revoked or rotated one; a fresh token fixes it,
                // so this attempt counts as transient. A server that refuses every token still
                // parks the notification once retries run out.
                Err(DeliveryError::transient(format!(
                    "the SMTP server refused the XOAUTH2 access token; a new one is fetched for \
                     the next attempt ({})",
                    e.message()
                )))
            }
            other => other.map_err(EmailError::into_delivery_error),
        }
    }

    /// One webhook delivery attempt (every endpoint of the list). A notification of an
    /// incident, when links are on, carries a link bound to the list (`list <name>`): one
    /// document goes to all its endpoints, so the list is the recipient a webhook link names.
    pub(crate) async fn webhook(
        &self,
        settings: &WebhookSettings,
        n: &ClaimedNotification,
        list: &str,
        target: &WebhookTarget,
    ) -> Result<Delivered, DeliveryError> {
        let link = self
            .links
            .as_ref()
            .zip(n.incident)
            .map(|(links, incident)| {
                links.link(incident, &format!("list {list}"), chrono::Utc::now())
            });
        let content = with_incident_footer(n, link.as_ref());
        let outgoing = Outgoing {
            id: n.id,
            content: &content,
            provenance: &n.provenance,
            incident: n.incident,
            digest_incidents: &n.digest_incidents,
            acknowledge_url: link.as_ref().map(|l| l.url.as_str()),
        };
        self.webhook.deliver(settings, &outgoing, target).await
    }
}

/// The content a notification of an incident goes out with: its body and, after a signature
/// separator, what the incident is and how to acknowledge it (`IncidentRef::footer`, with
/// `link` where the message carries one), so that whoever reads it can stop the escalation; a
/// digest holding alarms of incidents names them the same way (`digest_footer`). Other
/// notifications go out as they are. A body already at its limit goes without the footer rather
/// than not at all.
fn with_incident_footer<'a>(
    n: &'a ClaimedNotification,
    link: Option<&AckLink>,
) -> Cow<'a, NotificationContent> {
    let footer = match n.incident {
        Some(incident) => incident.footer(link.map(|l| (l.url.as_str(), l.expires))),
        None if !n.digest_incidents.is_empty() => {
            let covered = n.digest_incidents.len().min(MAX_DIGEST_INCIDENTS);
            digest_footer(
                &n.digest_incidents,
                link.map(|l| (l.url.as_str(), l.expires, covered)),
            )
        }
        None => return Cow::Borrowed(&n.content),
    };
    let text = format!("{}\n\n-- \n{footer}\n", n.content.body.as_str());
    match Body::parse(text) {
        Ok(body) => Cow::Owned(NotificationContent {
            body,
            ..n.content.clone()
        }),
        Err(_) => Cow::Borrowed(&n.content),
    }
}
