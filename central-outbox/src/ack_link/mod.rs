//! Acknowledgement links: the address in every message of an escalating incident that lets
//! whoever reads it stop the escalation from a phone, without a console account.
//!
//! A link is `{link_base_url}/ack/{incident}/{token}`, and the token is
//! `{page}.{expires}.{recipient}.{signature}`: the page it came with (0 for a notification that
//! joined the incident), when it stops working (Unix seconds), whom it was sent to (base64url),
//! and an HMAC-SHA256 over all of them and the incident number. A digest's link (the message of
//! several held alarms, each with its incident) adds, before the signature, the numbers of the
//! other incidents it covers (`12-13-40`), under a label of its own. The signing keys are derived
//! from the `[secrets]` keys (`Keyring::derived`), so there is one key to manage: a link signed
//! before a rotation verifies while the earlier key is still configured, and one signed with a
//! key taken out of the configuration is refused like a forged one.
//!
//! What a link proves: that central made it, for this incident and this recipient, and that it
//! has not expired. It is a bearer capability: anyone holding the message can use it until
//! then, which is why the page only acknowledges on a POST (mail scanners open links, they do
//! not submit forms), why the acknowledgement records the recipient and the client's address,
//! and why a PIN can be required on top (`[acknowledgement] pin`).
//!
//! Invariants: verification checks the signature before it reads the expiry, so a refusal says
//! "expired" only of a link central really made; the signature is compared in constant time
//! (ring's `hmac::verify`), as is the PIN.

mod settings;

pub(crate) use settings::{AckLinkSettings, AcknowledgementConfig};

use std::fmt;
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as BASE64URL;
use chrono::{DateTime, Utc};
use ring::hmac;

use crate::domain::escalation::{IncidentId, IncidentRef};
use crate::secrets::Keyring;

/// What the `[secrets]` keys are derived for (see `Keyring::derived`); changing it voids every
/// link already sent.
const PURPOSE: &str = "notification-outbox acknowledgement link v1";

/// Longest recipient a link names, in bytes: an email address is at most 254.
pub(crate) const MAX_RECIPIENT_BYTES: usize = 320;

/// Most incidents one digest's link covers (the address stays under about 1 KB); a digest
/// holding more says so, and the rest are acknowledged in the console.
pub(crate) const MAX_DIGEST_INCIDENTS: usize = 50;

/// The path every link starts with, below `link_base_url`.
pub(crate) const PATH_PREFIX: &str = "/ack";

/// Makes and checks acknowledgement links. Cheap to share behind an `Arc`.
pub(crate) struct AckLinks {
    /// The current key first; the others verify only.
    keys: Vec<hmac::Key>,
    /// `link_base_url` without its trailing slash.
    base_url: String,
    lifetime: Duration,
    /// The SHA-256 of the PIN a POST must carry, if one is configured.
    pin: Option<[u8; 32]>,
}

impl fmt::Debug for AckLinks {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AckLinks")
            .field("keys", &self.keys.len())
            .field("base_url", &self.base_url)
            .field("lifetime", &self.lifetime)
            .field("pin", &self.pin.map(|_| "***"))
            .finish()
    }
}

/// One link as a message carries it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct AckLink {
    pub url: String,
    pub expires: DateTime<Utc>,
}

/// What a valid link says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LinkClaim {
    pub incident: IncidentId,
    /// The other incidents a digest's link covers (empty for an incident's own message).
    pub also: Vec<IncidentId>,
    /// The page it came with; 0: a notification that joined the incident.
    pub page: u32,
    pub recipient: String,
    pub expires: DateTime<Utc>,
}

/// Why a link is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// Not shaped like a link central makes (cut short, or edited by hand).
    Malformed,
    /// Shaped right, but its signature does not verify: altered, for another incident, or
    /// signed with a key no longer configured.
    Forged,
    /// Central made it, and it stopped working at this moment.
    Expired(DateTime<Utc>),
}

impl LinkClaim {
    /// Every incident the link acknowledges: its own, then those of the digest.
    pub(crate) fn incidents(&self) -> Vec<IncidentId> {
        std::iter::once(self.incident)
            .chain(self.also.iter().copied())
            .collect()
    }
}

impl AckLinks {
    /// Links under `settings`, signed with keys derived from `keyring`; `None` without a
    /// current key (settings are checked against that at start-up, see `AcknowledgementConfig`).
    pub(crate) fn new(settings: &AckLinkSettings, keyring: &Keyring) -> Option<Self> {
        let keys = keyring.derived(PURPOSE);
        if keys.is_empty() {
            return None;
        }
        Some(Self {
            keys,
            base_url: settings.base_url.trim_end_matches('/').to_owned(),
            lifetime: settings.lifetime,
            pin: settings.pin.as_deref().map(digest),
        })
    }

    /// The link for `recipient` of `incident`'s message, valid for the configured lifetime from
    /// `now`.
    pub(crate) fn link(
        &self,
        incident: IncidentRef,
        recipient: &str,
        now: DateTime<Utc>,
    ) -> AckLink {
        self.make(
            incident.id,
            incident.page_no.unwrap_or(0),
            &[],
            recipient,
            now,
        )
    }

    /// The link for `recipient` of a digest holding alarms of `incidents` (its rows' order):
    /// one acknowledgement of it covers the first [`MAX_DIGEST_INCIDENTS`]. `None` for none.
    pub(crate) fn digest_link(
        &self,
        incidents: &[IncidentId],
        recipient: &str,
        now: DateTime<Utc>,
    ) -> Option<AckLink> {
        let (first, also) = incidents.split_first()?;
        let also = &also[..also.len().min(MAX_DIGEST_INCIDENTS - 1)];
        Some(self.make(*first, 0, also, recipient, now))
    }

    fn make(
        &self,
        incident: IncidentId,
        page: u32,
        also: &[IncidentId],
        recipient: &str,
        now: DateTime<Utc>,
    ) -> AckLink {
        let expires =
            now + chrono::Duration::from_std(self.lifetime).unwrap_or(chrono::Duration::hours(24));
        let expires_at = expires.timestamp();
        let recipient = cut(recipient);
        let also = join(also);
        let signature = hmac::sign(
            &self.keys[0],
            &signed_bytes(incident, page, expires_at, &also, recipient),
        );
        let also = if also.is_empty() {
            String::new()
        } else {
            format!("{also}.")
        };
        let url = format!(
            "{}{PATH_PREFIX}/{incident}/{page}.{expires_at}.{}.{also}{}",
            self.base_url,
            BASE64URL.encode(recipient),
            BASE64URL.encode(signature.as_ref()),
        );
        AckLink {
            url,
            expires: DateTime::from_timestamp(expires_at, 0).unwrap_or(expires),
        }
    }

    /// What `token` (the path's last segment) says about `incident`, if central made it for
    /// that incident and it has not expired at `now`.
    pub(crate) fn verify(
        &self,
        incident: IncidentId,
        token: &str,
        now: DateTime<Utc>,
    ) -> Result<LinkClaim, Refusal> {
        let parts: Vec<&str> = token.split('.').collect();
        let (page, expires, recipient, also, signature) = match parts.as_slice() {
            [page, expires, recipient, signature] => (*page, *expires, *recipient, "", *signature),
            [page, expires, recipient, also, signature] if !also.is_empty() => {
                (*page, *expires, *recipient, *also, *signature)
            }
            _ => return Err(Refusal::Malformed),
        };
        let page: u32 = page.parse().map_err(|_| Refusal::Malformed)?;
        let expires_at: i64 = expires.parse().map_err(|_| Refusal::Malformed)?;
        let recipient = BASE64URL
            .decode(recipient)
            .ok()
            .and_then(|bytes| String::from_utf8(bytes).ok())
            .filter(|r| !r.is_empty() && r.len() <= MAX_RECIPIENT_BYTES)
            .ok_or(Refusal::Malformed)?;
        let also_ids = split(also).ok_or(Refusal::Malformed)?;
        let signature = BASE64URL
            .decode(signature)
            .map_err(|_| Refusal::Malformed)?;
        let signed = signed_bytes(incident, page, expires_at, also, &recipient);
        if !self
            .keys
            .iter()
            .any(|key| hmac::verify(key, &signed, &signature).is_ok())
        {
            return Err(Refusal::Forged);
        }
        let expires = DateTime::from_timestamp(expires_at, 0).ok_or(Refusal::Malformed)?;
        if now >= expires {
            return Err(Refusal::Expired(expires));
        }
        Ok(LinkClaim {
            incident,
            also: also_ids,
            page,
            recipient,
            expires,
        })
    }

    /// Whether an acknowledgement must carry the PIN.
    pub(crate) fn needs_pin(&self) -> bool {
        self.pin.is_some()
    }

    /// Whether `presented` is the configured PIN (true when none is configured). Digests are
    /// compared, in time that does not depend on where they differ.
    pub(crate) fn pin_matches(&self, presented: &str) -> bool {
        match &self.pin {
            None => true,
            Some(expected) => {
                let presented = digest(presented.trim());
                expected
                    .iter()
                    .zip(presented.iter())
                    .fold(0u8, |acc, (a, b)| acc | (a ^ b))
                    == 0
            }
        }
    }
}

/// What a link's signature covers: a label, then every field, NUL-separated (no field but the
/// recipient, which comes last, can hold a NUL). A digest's link (one covering more incidents)
/// has a label of its own, so neither kind can pass for the other.
fn signed_bytes(
    incident: IncidentId,
    page: u32,
    expires_at: i64,
    also: &str,
    recipient: &str,
) -> Vec<u8> {
    if also.is_empty() {
        format!(
            "ack-link\0{}\0{page}\0{expires_at}\0{recipient}",
            incident.0
        )
        .into_bytes()
    } else {
        format!(
            "ack-digest\0{}\0{page}\0{expires_at}\0{also}\0{recipient}",
            incident.0
        )
        .into_bytes()
    }
}

/// Incident numbers as a token carries them: `12-13-40`.
fn join(ids: &[IncidentId]) -> String {
    ids.iter()
        .map(|i| i.0.to_string())
        .collect::<Vec<_>>()
        .join("-")
}

/// The numbers of [`join`] back; `None` when they are not, or are too many.
fn split(text: &str) -> Option<Vec<IncidentId>> {
    if text.is_empty() {
        return Some(Vec::new());
    }
    let ids = text
        .split('-')
        .map(|n| n.parse().ok().map(IncidentId))
        .collect::<Option<Vec<_>>>()?;
    (ids.len() < MAX_DIGEST_INCIDENTS).then_some(ids)
}

fn digest(text: &str) -> [u8; 32] {
    use sha2::Digest;
    sha2::Sha256::digest(text.as_bytes()).into()
}

/// `recipient` cut to [`MAX_RECIPIENT_BYTES`] on a character boundary.
fn cut(recipient: &str) -> &str {
    let mut end = recipient.len().min(MAX_RECIPIENT_BYTES);
    while !recipient.is_char_boundary(end) {
        end -= 1;
    }
    &recipient[..end]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::secrets::SecretsConfig;
    use base64::engine::general_purpose::STANDARD as BASE64;

    fn keyring(current: u8, previous: &[u8]) -> Keyring {
        Keyring::load(&SecretsConfig {
            key: Some(BASE64.encode([current; 32])),
            previous_keys: previous.iter().map(|b| BASE64.encode([*b; 32])).collect(),
            ..Default::default()
        })
        .unwrap()
    }

    fn settings(pin: Option<&str>) -> AckLinkSettings {
        AckLinkSettings {
            base_url: "https://outbox.plant.example/".into(),
            lifetime: Duration::from_secs(24 * 3600),
            pin: pin.map(str::to_owned),
            listen: None,
        }
    }

    fn links(keyring: &Keyring) -> AckLinks {
        AckLinks::new(&settings(None), keyring).unwrap()
    }

    const INCIDENT: IncidentRef = IncidentRef {
        id: IncidentId(12),
        page_no: Some(2),
    };

    fn now() -> DateTime<Utc> {
        DateTime::from_timestamp(1_800_000_000, 0).unwrap()
    }

    /// The token of `link`: the last segment of its path.
    fn token(link: &AckLink) -> &str {
        link.url.rsplit('/').next().unwrap()
    }

    #[test]
    fn a_link_names_its_incident_and_verifies_for_its_recipient_until_it_expires() {
        let links = links(&keyring(1, &[]));
        let link = links.link(INCIDENT, "alice@plant.example", now());
        assert!(
            link.url
                .starts_with("https://outbox.plant.example/ack/12/2."),
            "{}",
            link.url
        );
        assert_eq!(link.expires, now() + chrono::Duration::hours(24));
        let claim = links.verify(IncidentId(12), token(&link), now()).unwrap();
        assert_eq!(
            claim,
            LinkClaim {
                incident: IncidentId(12),
                also: Vec::new(),
                page: 2,
                recipient: "alice@plant.example".into(),
                expires: link.expires,
            }
        );
        let just_before = link.expires - chrono::Duration::seconds(1);
        assert!(
            links
                .verify(IncidentId(12), token(&link), just_before)
                .is_ok()
        );
        assert_eq!(
            links.verify(IncidentId(12), token(&link), link.expires),
            Err(Refusal::Expired(link.expires))
        );
    }

    #[test]
    fn another_incident_an_edited_field_or_another_key_is_refused_as_forged() {
        let links = links(&keyring(1, &[]));
        let link = links.link(INCIDENT, "alice@plant.example", now());
        let token = token(&link);
        assert_eq!(
            links.verify(IncidentId(13), token, now()),
            Err(Refusal::Forged)
        );
        let parts: Vec<&str> = token.split('.').collect();
        let bob = BASE64URL.encode("bob@plant.example");
        let later = (now().timestamp() + 999_999).to_string();
        for edited in [
            format!("3.{}.{}.{}", parts[1], parts[2], parts[3]),
            format!("{}.{later}.{}.{}", parts[0], parts[2], parts[3]),
            format!("{}.{}.{bob}.{}", parts[0], parts[1], parts[3]),
        ] {
            assert_eq!(
                links.verify(IncidentId(12), &edited, now()),
                Err(Refusal::Forged),
                "{edited}"
            );
        }
        // An expired link signed with another key is forged, not expired: nothing of it is
        // believed.
        let other = self::links(&keyring(2, &[]));
        let foreign = other.link(INCIDENT, "alice@plant.example", now());
        assert_eq!(
            links.verify(IncidentId(12), self::token(&foreign), foreign.expires),
            Err(Refusal::Forged)
        );
        for malformed in [
            "",
            "2.1.YQ",
            "x.1.YQ.AA",
            "2.1..AA",
            "2.1.YQ.AA.extra",
            "2.1.!.AA",
        ] {
            assert_eq!(
                links.verify(IncidentId(12), malformed, now()),
                Err(Refusal::Malformed),
                "{malformed:?}"
            );
        }
    }

    #[test]
    fn a_digests_link_covers_its_incidents_and_none_can_be_added_or_dropped() {
        let links = links(&keyring(1, &[]));
        let ids = [IncidentId(7), IncidentId(9), IncidentId(12)];
        let link = links
            .digest_link(&ids, "alice@plant.example", now())
            .unwrap();
        assert!(link.url.contains("/ack/7/0."), "{}", link.url);
        let claim = links.verify(IncidentId(7), token(&link), now()).unwrap();
        assert_eq!(claim.incidents(), ids);
        let parts: Vec<&str> = token(&link).split('.').collect();
        assert_eq!(parts[3], "9-12");
        for edited in [
            format!(
                "{}.{}.{}.9-12-13.{}",
                parts[0], parts[1], parts[2], parts[4]
            ),
            format!("{}.{}.{}.9.{}", parts[0], parts[1], parts[2], parts[4]),
            // Without the others: a single incident's link does not verify either.
            format!("{}.{}.{}.{}", parts[0], parts[1], parts[2], parts[4]),
        ] {
            assert_eq!(
                links.verify(IncidentId(7), &edited, now()),
                Err(Refusal::Forged),
                "{edited}"
            );
        }
        assert!(
            links
                .digest_link(&[], "alice@plant.example", now())
                .is_none()
        );
        let many: Vec<IncidentId> = (1..=80).map(IncidentId).collect();
        let capped = links
            .digest_link(&many, "alice@plant.example", now())
            .unwrap();
        let claim = links.verify(IncidentId(1), token(&capped), now()).unwrap();
        assert_eq!(claim.incidents(), many[..MAX_DIGEST_INCIDENTS]);
    }

    #[test]
    fn a_link_signed_before_a_rotation_verifies_while_the_earlier_key_is_configured() {
        let before = links(&keyring(1, &[]));
        let link = before.link(INCIDENT, "alice@plant.example", now());
        let rotated = links(&keyring(2, &[1]));
        assert!(rotated.verify(IncidentId(12), token(&link), now()).is_ok());
        let dropped = links(&keyring(2, &[]));
        assert_eq!(
            dropped.verify(IncidentId(12), token(&link), now()),
            Err(Refusal::Forged)
        );
        assert!(AckLinks::new(&settings(None), &Keyring::none()).is_none());
    }

    #[test]
    fn a_joined_notification_s_link_says_page_0_and_a_long_recipient_is_cut() {
        let links = links(&keyring(1, &[]));
        let joined = IncidentRef {
            id: IncidentId(7),
            page_no: None,
        };
        let long = format!("{}@plant.example", "é".repeat(400));
        let link = links.link(joined, &long, now());
        let claim = links.verify(IncidentId(7), token(&link), now()).unwrap();
        assert_eq!(claim.page, 0);
        assert!(claim.recipient.len() <= MAX_RECIPIENT_BYTES);
        assert!(long.starts_with(&claim.recipient));
    }

    #[test]
    fn the_pin_is_checked_only_when_one_is_configured() {
        let open = links(&keyring(1, &[]));
        assert!(!open.needs_pin());
        assert!(open.pin_matches(""));
        let guarded = AckLinks::new(&settings(Some("4711")), &keyring(1, &[])).unwrap();
        assert!(guarded.needs_pin());
        assert!(guarded.pin_matches("4711"));
        assert!(
            guarded.pin_matches(" 4711 "),
            "surrounding blanks are a typing slip"
        );
        for wrong in ["", "4712", "47111", "471"] {
            assert!(!guarded.pin_matches(wrong), "{wrong:?}");
        }
        assert!(!format!("{guarded:?}").contains("4711"));
    }
}
