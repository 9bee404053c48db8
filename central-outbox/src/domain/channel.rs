//! Notification lists (who a notification goes to) and the email channel's settings (how it
//! gets there). Both live in the database and are resolved at delivery time, so an operator's
//! edit applies to every notification not yet delivered.

use std::fmt;
use std::time::Duration;

use super::{ContentError, ListName, NotificationType};

/// A syntactically plausible mailbox address (`local@domain`). Deliberately simple: the relay is
/// the judge of deliverability; this only keeps garbage and header injection out of the store.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct EmailAddress(String);

/// Longest address SMTP allows (RFC 5321 path limit minus the angle brackets).
const MAX_ADDRESS_LEN: usize = 254;

impl EmailAddress {
    pub fn parse(text: &str, field: &'static str) -> Result<Self, ContentError> {
        let bad = |why: &str| {
            ContentError::new(field, format!("{text:?} is not an email address: {why}"))
        };
        if text.len() > MAX_ADDRESS_LEN {
            return Err(ContentError::new(
                field,
                format!("address is longer than {MAX_ADDRESS_LEN} bytes"),
            ));
        }
        let (local, domain) = text.rsplit_once('@').ok_or_else(|| bad("no '@'"))?;
        if local.is_empty() || domain.is_empty() {
            return Err(bad("empty local part or domain"));
        }
        if text
            .chars()
            .any(|c| c.is_whitespace() || c.is_control() || matches!(c, '<' | '>' | ',' | ';'))
        {
            return Err(bad("contains whitespace, control or separator characters"));
        }
        if domain.starts_with('.') || domain.ends_with('.') || domain.contains("..") {
            return Err(bad("malformed domain"));
        }
        Ok(Self(text.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    pub fn domain(&self) -> &str {
        self.0.rsplit_once('@').map_or("", |(_, d)| d)
    }
}

impl fmt::Display for EmailAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A named set of recipients for one channel type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotificationList {
    pub name: ListName,
    pub kind: NotificationType,
    pub recipients: Vec<EmailAddress>,
}

/// Most recipients one list may have: a list is a team, not a mailing campaign, and every
/// address goes into one message's BCC.
pub const MAX_LIST_RECIPIENTS: usize = 1000;

impl NotificationList {
    /// Checks a list as an operator or the config file gives it. Errors name `name`, `type` or
    /// `recipients` (with the entry's position).
    pub fn parse(
        name: String,
        kind: NotificationType,
        recipients: &[String],
    ) -> Result<Self, ContentError> {
        let name = ListName::parse(name)?;
        if kind != NotificationType::Email {
            return Err(ContentError::new(
                "type",
                "only email lists can be configured in this version",
            ));
        }
        if recipients.is_empty() {
            return Err(ContentError::new("recipients", "at least one is required"));
        }
        if recipients.len() > MAX_LIST_RECIPIENTS {
            return Err(ContentError::new(
                "recipients",
                format!(
                    "{} given, at most {MAX_LIST_RECIPIENTS} allowed",
                    recipients.len()
                ),
            ));
        }
        let recipients = recipients
            .iter()
            .enumerate()
            .map(|(i, address)| {
                EmailAddress::parse(address, "recipients").map_err(|e| {
                    ContentError::new("recipients", format!("entry {}: {}", i + 1, e.problem))
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self {
            name,
            kind,
            recipients,
        })
    }
}

/// A stored configuration value and when it was last written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stored<T> {
    pub value: T,
    pub updated_at: chrono::DateTime<chrono::Utc>,
}

/// A credential that must never be shown: `Debug` and `Display` print a placeholder.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: String) -> Self {
        Self(value)
    }

    /// The only way to the value: call sites that need it are easy to find and review.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(***)")
    }
}

/// How the SMTP connection is protected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TlsMode {
    /// Plain text. Only for a relay on the same host or a trusted segment.
    None,
    /// Connect in plain text and require the STARTTLS upgrade; fail if the server lacks it.
    StartTls,
    /// TLS from the first byte (usually port 465).
    Implicit,
}

impl TlsMode {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::StartTls => "starttls",
            Self::Implicit => "tls",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "none" => Some(Self::None),
            "starttls" => Some(Self::StartTls),
            "tls" => Some(Self::Implicit),
            _ => None,
        }
    }
}

/// SMTP authentication.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SmtpAuth {
    None,
    /// PLAIN or LOGIN, whichever the server offers.
    Password {
        username: String,
        password: Secret,
    },
}

/// Everything the email adapter needs to reach the relay, plus the channel's delivery policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SmtpSettings {
    pub host: String,
    pub port: u16,
    pub tls: TlsMode,
    pub auth: SmtpAuth,
    pub from_address: EmailAddress,
    /// Raw configured values; [`super::retry::RetryPolicy::clamped`] makes them safe.
    pub max_retries: i64,
    pub retry_delay: Duration,
    /// Most SMTP sessions open at once, and so most deliveries in flight.
    pub max_concurrent_connections: u32,
    /// Per-command and connect timeout.
    pub timeout: Duration,
}

/// Most SMTP sessions one channel may open at once.
pub const MAX_SMTP_CONNECTIONS: u32 = 256;

impl SmtpSettings {
    /// Checks the values no delivery could work without; errors name the field. Retry settings
    /// are not refused: [`super::retry::RetryPolicy::clamped`] makes non-positive ones safe, as
    /// the seeds specify.
    pub fn check(self) -> Result<Self, ContentError> {
        if self.host.trim().is_empty() {
            return Err(ContentError::new("host", "must not be empty"));
        }
        if self.host.len() > 253
            || self
                .host
                .chars()
                .any(|c| c.is_whitespace() || c.is_control())
        {
            return Err(ContentError::new("host", "is not a host name or address"));
        }
        if self.port == 0 {
            return Err(ContentError::new("port", "must be between 1 and 65535"));
        }
        if let SmtpAuth::Password { username, password } = &self.auth {
            if username.trim().is_empty() || username.len() > 256 {
                return Err(ContentError::new("username", "must be 1 to 256 characters"));
            }
            if password.expose().is_empty() {
                return Err(ContentError::new("password", "must not be empty"));
            }
        }
        if self.max_concurrent_connections == 0
            || self.max_concurrent_connections > MAX_SMTP_CONNECTIONS
        {
            return Err(ContentError::new(
                "max_concurrent_connections",
                format!("must be between 1 and {MAX_SMTP_CONNECTIONS}"),
            ));
        }
        if self.timeout.is_zero() {
            return Err(ContentError::new("timeout", "must be positive"));
        }
        Ok(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_are_checked_and_name_the_field() {
        assert!(EmailAddress::parse("ops@example.test", "recipients").is_ok());
        for bad in [
            "",
            "no-at",
            "@x.test",
            "a@",
            "a b@x.test",
            "a@x..test",
            "a@x.test\r\nBcc: y",
        ] {
            let err = EmailAddress::parse(bad, "recipients").unwrap_err();
            assert_eq!(err.field, "recipients", "{bad:?}");
        }
        assert_eq!(
            EmailAddress::parse("ops@plant.example.test", "f")
                .unwrap()
                .domain(),
            "plant.example.test"
        );
    }

    #[test]
    fn secrets_do_not_leak_through_debug() {
        let auth = SmtpAuth::Password {
            username: "u".into(),
            password: Secret::new("hunter2".into()),
        };
        assert!(!format!("{auth:?}").contains("hunter2"));
    }
}
