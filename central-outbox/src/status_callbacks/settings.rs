//! `[status_callbacks]`: the key every status callback is signed with, how long a change is
//! retried, and how long one call may take.
//!
//! One key for the whole central, not one per list: the receiving IT system checks every call
//! with the key its administrator was given, whichever list it is for, and the key lives in a
//! file (or the environment), never in the database or the admin API, so nobody who can edit
//! lists can read it or point it at a host of their choosing.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::bail;
use serde::{Deserialize, Serialize};

use crate::domain::channel::Secret;
use crate::domain::status_callback::{MAX_GIVE_UP_AFTER, MIN_GIVE_UP_AFTER};

/// The shortest key accepted: it keys an HMAC-SHA256, as a webhook list's secret does.
pub const MIN_KEY_CHARS: usize = 16;
/// The bounds of `status_callbacks.timeout`.
const TIMEOUT_RANGE: (Duration, Duration) = (Duration::from_secs(1), Duration::from_secs(60));

/// `[status_callbacks]` as written.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StatusCallbacksConfig {
    /// The signing key (at least 16 characters); prefer `key_file` or
    /// `OUTBOX_CENTRAL_STATUS_CALLBACKS__KEY` to writing it here.
    pub key: Option<String>,
    /// A file holding the key (surrounding whitespace ignored).
    pub key_file: Option<PathBuf>,
    /// How long a change that is not answered is retried, from when its status was decided
    /// (1 s to 7 days; default 24 hours).
    #[serde(with = "humantime_serde")]
    pub give_up_after: Duration,
    /// How long one call may take (1 s to 60 s; default 10 s).
    #[serde(with = "humantime_serde")]
    pub timeout: Duration,
}

impl Default for StatusCallbacksConfig {
    fn default() -> Self {
        Self {
            key: None,
            key_file: None,
            give_up_after: Duration::from_secs(24 * 3600),
            timeout: Duration::from_secs(10),
        }
    }
}

impl std::fmt::Debug for StatusCallbacksConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StatusCallbacksConfig")
            .field("key", &self.key.as_ref().map(|_| "***"))
            .field("key_file", &self.key_file)
            .field("give_up_after", &self.give_up_after)
            .field("timeout", &self.timeout)
            .finish()
    }
}

/// `[status_callbacks]` checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatusCallbackSettings {
    /// `None`: no key, so no list may name a status callback (the admin API refuses one, and
    /// a stored one's changes wait until a key is configured or their time runs out).
    pub key: Option<Secret>,
    pub give_up_after: Duration,
    pub timeout: Duration,
}

impl Default for StatusCallbackSettings {
    fn default() -> Self {
        let config = StatusCallbacksConfig::default();
        Self {
            key: None,
            give_up_after: config.give_up_after,
            timeout: config.timeout,
        }
    }
}

impl StatusCallbacksConfig {
    /// Checks the section; errors name the key.
    pub fn validate(&self) -> anyhow::Result<StatusCallbackSettings> {
        if !(MIN_GIVE_UP_AFTER..=MAX_GIVE_UP_AFTER).contains(&self.give_up_after) {
            bail!(
                "status_callbacks.give_up_after: must be between {} and {}",
                humantime::format_duration(MIN_GIVE_UP_AFTER),
                humantime::format_duration(MAX_GIVE_UP_AFTER)
            );
        }
        let (shortest, longest) = TIMEOUT_RANGE;
        if !(shortest..=longest).contains(&self.timeout) {
            bail!(
                "status_callbacks.timeout: must be between {} and {}",
                humantime::format_duration(shortest),
                humantime::format_duration(longest)
            );
        }
        let (key, name) = match (&self.key, &self.key_file) {
            (Some(_), Some(_)) => bail!(
                "status_callbacks.key: set key_file or key \
                 (OUTBOX_CENTRAL_STATUS_CALLBACKS__KEY), not both"
            ),
            (Some(key), None) => (Some(key.trim().to_owned()), "status_callbacks.key"),
            (None, Some(path)) => match std::fs::read_to_string(path) {
                Ok(text) => (Some(text.trim().to_owned()), "status_callbacks.key_file"),
                Err(e) => bail!(
                    "status_callbacks.key_file: cannot read {}: {e}",
                    path.display()
                ),
            },
            (None, None) => (None, ""),
        };
        if let Some(key) = &key
            && key.chars().count() < MIN_KEY_CHARS
        {
            bail!(
                "{name}: must be at least {MIN_KEY_CHARS} characters (it keys an HMAC-SHA256 \
                 signature)"
            );
        }
        Ok(StatusCallbackSettings {
            key: key.map(Secret::new),
            give_up_after: self.give_up_after,
            timeout: self.timeout,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_defaults_have_no_key_and_bounded_times() {
        let settings = StatusCallbacksConfig::default().validate().unwrap();
        assert_eq!(settings, StatusCallbackSettings::default());
        assert_eq!(settings.give_up_after, Duration::from_secs(86_400));
    }

    #[test]
    fn each_bound_is_refused_by_name() {
        let refused = |config: StatusCallbacksConfig| config.validate().unwrap_err().to_string();
        let base = StatusCallbacksConfig::default();
        assert!(
            refused(StatusCallbacksConfig {
                give_up_after: Duration::from_millis(500),
                ..base.clone()
            })
            .starts_with("status_callbacks.give_up_after: must be between 1s and 7days")
        );
        assert!(
            refused(StatusCallbacksConfig {
                timeout: Duration::from_secs(61),
                ..base.clone()
            })
            .starts_with("status_callbacks.timeout:")
        );
        assert!(
            refused(StatusCallbacksConfig {
                key: Some("short".into()),
                ..base.clone()
            })
            .starts_with("status_callbacks.key: must be at least 16 characters")
        );
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("key");
        std::fs::write(&file, "0123456789abcdef\n").unwrap();
        let from_file = StatusCallbacksConfig {
            key_file: Some(file.clone()),
            ..base.clone()
        }
        .validate()
        .unwrap();
        assert_eq!(
            from_file.key.as_ref().map(Secret::expose),
            Some("0123456789abcdef")
        );
        assert!(
            refused(StatusCallbacksConfig {
                key_file: Some(file),
                key: Some("0123456789abcdef".into()),
                ..base
            })
            .contains("not both")
        );
    }
}
