//! `[acknowledgement]`: whether the messages of escalating incidents carry an acknowledgement
//! link, where it points, how long it works, whether it needs a PIN, and which listener serves
//! it. Off unless `link_base_url` is set.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::bail;
use serde::{Deserialize, Serialize};

use crate::secrets::Keyring;

/// Shortest and longest link lifetime: long enough to read a message that waited in a phone's
/// queue, short enough that an old message forwarded around is no longer a key.
const MIN_LIFETIME: Duration = Duration::from_secs(5 * 60);
const MAX_LIFETIME: Duration = Duration::from_secs(30 * 24 * 3600);
/// PIN length bounds, in characters.
const MIN_PIN_CHARS: usize = 4;
const MAX_PIN_CHARS: usize = 64;

/// `[acknowledgement]` as written.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AcknowledgementConfig {
    /// Where recipients reach central's acknowledgement page, e.g.
    /// `https://outbox.plant.example` (a path is kept: a proxy may serve it below one, and must
    /// then pass `/ack/...` on). Unset (the default): messages carry no link, only the
    /// incident number and how to acknowledge it in the console or with `outboxctl`.
    pub link_base_url: Option<String>,
    /// How long a link works after its message was sent (default 24 hours).
    #[serde(with = "humantime_serde")]
    pub link_lifetime: Duration,
    /// A PIN every acknowledgement by link must carry (the shift's, given out by phone or on
    /// the control room wall), 4 to 64 characters; unset: none. Prefer `pin_file` or
    /// `OUTBOX_CENTRAL_ACKNOWLEDGEMENT__PIN` to writing it here.
    pub pin: Option<String>,
    /// A file holding the PIN (surrounding whitespace ignored).
    pub pin_file: Option<PathBuf>,
    /// A listener serving the acknowledgement page alone (no console), e.g. for a reverse proxy
    /// that exposes only it; unset: the console's listener serves it (`console.listen`).
    pub listen: Option<SocketAddr>,
}

impl Default for AcknowledgementConfig {
    fn default() -> Self {
        Self {
            link_base_url: None,
            link_lifetime: Duration::from_secs(24 * 3600),
            pin: None,
            pin_file: None,
            listen: None,
        }
    }
}

impl std::fmt::Debug for AcknowledgementConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AcknowledgementConfig")
            .field("link_base_url", &self.link_base_url)
            .field("link_lifetime", &self.link_lifetime)
            .field("pin", &self.pin.as_ref().map(|_| "***"))
            .field("pin_file", &self.pin_file)
            .field("listen", &self.listen)
            .finish()
    }
}

/// `[acknowledgement]` checked: links are on.
#[derive(Clone, PartialEq, Eq)]
pub struct AckLinkSettings {
    pub base_url: String,
    pub lifetime: Duration,
    pub pin: Option<String>,
    /// The page's own listener; `None`: the console's.
    pub listen: Option<SocketAddr>,
}

impl std::fmt::Debug for AckLinkSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AckLinkSettings")
            .field("base_url", &self.base_url)
            .field("lifetime", &self.lifetime)
            .field("pin", &self.pin.as_ref().map(|_| "***"))
            .field("listen", &self.listen)
            .finish()
    }
}

impl AcknowledgementConfig {
    /// `None` when links are off. `console_listen` is the console's address, if it is on;
    /// links are signed with keys derived from `secrets`, so a current key is required.
    pub fn validate(
        &self,
        console_listen: Option<SocketAddr>,
        secrets: &Keyring,
    ) -> anyhow::Result<Option<AckLinkSettings>> {
        let Some(base_url) = &self.link_base_url else {
            for (key, set) in [
                ("pin", self.pin.is_some()),
                ("pin_file", self.pin_file.is_some()),
                ("listen", self.listen.is_some()),
            ] {
                if set {
                    bail!(
                        "acknowledgement.{key}: applies to acknowledgement links, which are off; \
                         set acknowledgement.link_base_url to turn them on"
                    );
                }
            }
            return Ok(None);
        };
        check_base_url(base_url)?;
        if !(MIN_LIFETIME..=MAX_LIFETIME).contains(&self.link_lifetime) {
            bail!(
                "acknowledgement.link_lifetime: must be between {} and {}",
                humantime::format_duration(MIN_LIFETIME),
                humantime::format_duration(MAX_LIFETIME)
            );
        }
        if !secrets.can_seal() {
            bail!(
                "acknowledgement.link_base_url: links are signed with a key derived from the \
                 [secrets] key, and none is configured; set secrets.key_file (or \
                 OUTBOX_CENTRAL_SECRETS__KEY) to a 32-byte key in base64, e.g. from `openssl \
                 rand -base64 32`"
            );
        }
        if self.listen.is_none() && console_listen.is_none() {
            bail!(
                "acknowledgement.link_base_url: no listener serves the links; set \
                 acknowledgement.listen, or console.listen to serve them with the console"
            );
        }
        let pin = self.pin()?;
        Ok(Some(AckLinkSettings {
            base_url: base_url.trim_end_matches('/').to_owned(),
            lifetime: self.link_lifetime,
            pin,
            listen: self.listen,
        }))
    }

    fn pin(&self) -> anyhow::Result<Option<String>> {
        let (key, pin) = match (&self.pin, &self.pin_file) {
            (Some(_), Some(_)) => {
                bail!("acknowledgement.pin: set pin or pin_file, not both")
            }
            (Some(pin), None) => ("acknowledgement.pin", pin.trim().to_owned()),
            (None, Some(path)) => {
                let text = std::fs::read_to_string(path).map_err(|e| {
                    anyhow::anyhow!(
                        "acknowledgement.pin_file: cannot read {}: {e}",
                        path.display()
                    )
                })?;
                ("acknowledgement.pin_file", text.trim().to_owned())
            }
            (None, None) => return Ok(None),
        };
        let chars = pin.chars().count();
        if !(MIN_PIN_CHARS..=MAX_PIN_CHARS).contains(&chars) || pin.chars().any(char::is_control) {
            bail!(
                "{key}: must be {MIN_PIN_CHARS} to {MAX_PIN_CHARS} characters without control \
                 characters (it has {chars})"
            );
        }
        Ok(Some(pin))
    }
}

/// An absolute http(s) URL with a host and neither query nor fragment: the links are made by
/// appending `/ack/...` to it.
fn check_base_url(text: &str) -> anyhow::Result<()> {
    let url = url::Url::parse(text).map_err(|e| {
        anyhow::anyhow!("acknowledgement.link_base_url: {text:?} is not a URL: {e}")
    })?;
    if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
        bail!("acknowledgement.link_base_url: {text:?} must be an http or https URL with a host");
    }
    if url.query().is_some() || url.fragment().is_some() || !url.username().is_empty() {
        bail!(
            "acknowledgement.link_base_url: {text:?} must not carry a query, a fragment or a \
             user name (links are made by appending /ack/... to it)"
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn on(base: &str) -> AcknowledgementConfig {
        AcknowledgementConfig {
            link_base_url: Some(base.into()),
            ..Default::default()
        }
    }

    fn console() -> Option<SocketAddr> {
        Some("127.0.0.1:8080".parse().unwrap())
    }

    fn keyring() -> Keyring {
        Keyring::ephemeral().unwrap()
    }

    fn error(
        config: &AcknowledgementConfig,
        console: Option<SocketAddr>,
        keys: &Keyring,
    ) -> String {
        format!("{:#}", config.validate(console, keys).unwrap_err())
    }

    #[test]
    fn links_are_off_by_default_and_their_options_need_them_on() {
        assert_eq!(
            AcknowledgementConfig::default()
                .validate(None, &Keyring::none())
                .unwrap(),
            None
        );
        let pin_only = AcknowledgementConfig {
            pin: Some("4711".into()),
            ..Default::default()
        };
        let e = error(&pin_only, console(), &keyring());
        assert!(
            e.contains("acknowledgement.pin") && e.contains("link_base_url"),
            "{e}"
        );
    }

    #[test]
    fn links_need_a_key_a_listener_and_a_plain_base_url() {
        let settings = on("https://outbox.plant.example/")
            .validate(console(), &keyring())
            .unwrap()
            .unwrap();
        assert_eq!(settings.base_url, "https://outbox.plant.example");
        assert_eq!(settings.lifetime, Duration::from_secs(86_400));
        let e = error(
            &on("https://outbox.plant.example"),
            console(),
            &Keyring::none(),
        );
        assert!(e.contains("[secrets] key"), "{e}");
        let e = error(&on("https://outbox.plant.example"), None, &keyring());
        assert!(
            e.contains("acknowledgement.listen") && e.contains("console.listen"),
            "{e}"
        );
        for bad in [
            "outbox.plant.example",
            "ftp://outbox.plant.example",
            "https://outbox.plant.example/?x=1",
            "https://outbox.plant.example/#top",
            "https://user@outbox.plant.example",
        ] {
            let e = error(&on(bad), console(), &keyring());
            assert!(e.starts_with("acknowledgement.link_base_url"), "{bad}: {e}");
        }
        let short = AcknowledgementConfig {
            link_lifetime: Duration::from_secs(60),
            ..on("https://outbox.plant.example")
        };
        let e = error(&short, console(), &keyring());
        assert!(e.contains("acknowledgement.link_lifetime"), "{e}");
    }

    #[test]
    fn the_pin_comes_from_the_file_or_the_setting_within_its_bounds() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("pin");
        std::fs::write(&file, "  2468\n").unwrap();
        let from_file = AcknowledgementConfig {
            pin_file: Some(file.clone()),
            ..on("https://outbox.plant.example")
        };
        let settings = from_file.validate(console(), &keyring()).unwrap().unwrap();
        assert_eq!(settings.pin.as_deref(), Some("2468"));
        assert!(!format!("{settings:?}").contains("2468"));
        let both = AcknowledgementConfig {
            pin: Some("1357".into()),
            ..from_file
        };
        assert!(error(&both, console(), &keyring()).contains("not both"));
        for bad in ["123", &"9".repeat(65), "12\u{7}4"] {
            let config = AcknowledgementConfig {
                pin: Some(bad.into()),
                ..on("https://outbox.plant.example")
            };
            let e = error(&config, console(), &keyring());
            assert!(e.starts_with("acknowledgement.pin:"), "{e}");
        }
        let missing = AcknowledgementConfig {
            pin_file: Some(dir.path().join("absent")),
            ..on("https://outbox.plant.example")
        };
        assert!(error(&missing, console(), &keyring()).starts_with("acknowledgement.pin_file"));
    }
}
