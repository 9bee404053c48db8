//! The SMTP relays an email channel can use besides its own: its *fallback relays*, in the order
//! the admin gave them, for when the first relay (the settings' `host`, `port` and `tls`) is
//! down ([`super::failover`] decides when).
//!
//! A fallback relay is reached without authentication: the credentials in the settings were
//! given for the first relay and go only to it (the same rule as a stored password's, which a
//! change of host drops). What a plant keeps as its second way out is usually such a relay:
//! its own mail gateway or a local MTA that accepts mail from central's address.
//!
//! One text form, `host:port tls` (`tls` one of `none`, `starttls`, `tls`; an IPv6 address in
//! brackets, `[::1]:25 none`, kept without them), is what the console's field, `outboxctl --fallback-relay`, the stores' column
//! and the logs use; the config file and the admin API carry the three fields apart. Every way
//! in goes through [`SmtpRelay::new`].

use std::fmt;

use super::ContentError;
use super::channel::TlsMode;

/// Most fallback relays one channel may have: a second and a third way out, and room for one
/// more. More would only lengthen the time a channel spends finding one that works.
pub const MAX_FALLBACK_RELAYS: usize = 4;

/// One fallback relay, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SmtpRelay {
    host: String,
    port: u16,
    tls: TlsMode,
}

impl SmtpRelay {
    /// Checks a relay's fields. Errors name the field `fallback_relays` and say which relay
    /// (`position`, from 1 in the admin's order) and what is wrong with which part.
    pub fn new(position: usize, host: &str, port: u32, tls: TlsMode) -> Result<Self, ContentError> {
        if host.is_empty() {
            return Err(refused(position, "host must not be empty"));
        }
        if host.len() > 253 || host.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(refused(
                position,
                format!("{host:?} is not a host name or address"),
            ));
        }
        let port = u16::try_from(port)
            .ok()
            .filter(|p| *p != 0)
            .ok_or_else(|| refused(position, "port must be between 1 and 65535"))?;
        Ok(Self {
            host: host.to_owned(),
            port,
            tls,
        })
    }

    /// Parses the text form `host:port tls` of the relay at `position`: one space between
    /// the two, nothing around them (so the host is checked as [`Self::new`] checks it,
    /// whitespace included).
    pub fn parse(position: usize, text: &str) -> Result<Self, ContentError> {
        let mut parts = text.split(' ');
        let (Some(address), Some(tls), None) = (parts.next(), parts.next(), parts.next()) else {
            return Err(refused(
                position,
                format!("{text:?} is not `host:port tls` (tls one of none, starttls, tls)"),
            ));
        };
        let tls = TlsMode::parse(tls).ok_or_else(|| {
            refused(
                position,
                format!("{tls:?} is not a TLS mode (none, starttls or tls)"),
            )
        })?;
        let Some((host, port)) = address.rsplit_once(':') else {
            return Err(refused(
                position,
                format!("{address:?} has no port (host:port)"),
            ));
        };
        let host = match host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
            Some(bare) => bare,
            None if host.contains(':') => {
                return Err(refused(
                    position,
                    format!("{address:?}: an IPv6 address goes in brackets, [::1]:25"),
                ));
            }
            None => host,
        };
        let port = port
            .parse::<u32>()
            .map_err(|_| refused(position, format!("{port:?} is not a port number")))?;
        Self::new(position, host, port, tls)
    }

    /// Parses a list of text forms typed in one field (the console's, the stores' column),
    /// one per line or separated by commas: each entry trimmed, blank ones skipped.
    pub fn parse_list(text: &str) -> Result<Vec<Self>, ContentError> {
        Self::parse_each(
            text.split([',', '\n'])
                .map(str::trim)
                .filter(|entry| !entry.is_empty()),
        )
    }

    /// Parses text forms given one by one (the config file's list), as they are.
    pub fn parse_each<'a>(
        entries: impl IntoIterator<Item = &'a str>,
    ) -> Result<Vec<Self>, ContentError> {
        let relays = entries
            .into_iter()
            .enumerate()
            .map(|(i, entry)| Self::parse(i + 1, entry))
            .collect::<Result<Vec<_>, _>>()?;
        check_count(relays.len())?;
        Ok(relays)
    }

    /// The list's text form, the one [`Self::parse_list`] reads.
    pub fn list_text(relays: &[Self]) -> String {
        relays
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    }

    pub fn host(&self) -> &str {
        &self.host
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn tls(&self) -> TlsMode {
        self.tls
    }
}

fn refused(position: usize, problem: impl fmt::Display) -> ContentError {
    ContentError::new("fallback_relays", format!("relay {position}: {problem}"))
}

/// Refuses more than [`MAX_FALLBACK_RELAYS`].
pub fn check_count(count: usize) -> Result<(), ContentError> {
    if count > MAX_FALLBACK_RELAYS {
        return Err(ContentError::new(
            "fallback_relays",
            format!("at most {MAX_FALLBACK_RELAYS} relays, not {count}"),
        ));
    }
    Ok(())
}

/// `host:port`, with an IPv6 address in brackets.
pub fn address(host: &str, port: u16) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

impl fmt::Display for SmtpRelay {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {}",
            address(&self.host, self.port),
            self.tls.as_str()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_text_form_reads_back_what_it_wrote() {
        let relays = SmtpRelay::parse_list(
            "smtp2.plant.test:25 starttls,\n [::1]:2525 none, 10.0.0.5:465 tls",
        )
        .unwrap();
        assert_eq!(relays.len(), 3);
        assert_eq!(relays[1].host(), "::1");
        assert_eq!(relays[1].port(), 2525);
        assert_eq!(relays[2].tls(), TlsMode::Implicit);
        let text = SmtpRelay::list_text(&relays);
        assert_eq!(
            text,
            "smtp2.plant.test:25 starttls, [::1]:2525 none, 10.0.0.5:465 tls"
        );
        assert_eq!(SmtpRelay::parse_list(&text).unwrap(), relays);
        assert_eq!(SmtpRelay::parse_list(" , ").unwrap(), vec![]);
        // The API's way in takes the address bare; the text form brackets it.
        let bare = SmtpRelay::new(1, "::1", 25, TlsMode::None).unwrap();
        assert_eq!(bare.to_string(), "[::1]:25 none");
        assert_eq!(SmtpRelay::parse(1, &bare.to_string()).unwrap(), bare);
    }

    #[test]
    fn a_bad_relay_is_refused_naming_its_place_and_what_is_wrong() {
        for (text, says) in [
            ("smtp2.plant.test:25", "is not `host:port tls`"),
            ("smtp2.plant.test starttls", "has no port"),
            (
                "smtp2.plant.test:0 none",
                "port must be between 1 and 65535",
            ),
            (
                "smtp2.plant.test:70000 none",
                "port must be between 1 and 65535",
            ),
            ("smtp2.plant.test:x none", "is not a port number"),
            ("smtp2.plant.test:25 ssl", "is not a TLS mode"),
            (":25 none", "host must not be empty"),
            ("::1:25 none", "goes in brackets"),
            ("a:25 none extra", "is not `host:port tls`"),
            ("a:25  none", "is not `host:port tls`"),
        ] {
            let err = SmtpRelay::parse_list(&format!("ok.test:25 none, {text}")).unwrap_err();
            assert_eq!(err.field, "fallback_relays", "{text}");
            assert!(
                err.problem.starts_with("relay 2: "),
                "{text}: {}",
                err.problem
            );
            assert!(err.problem.contains(says), "{text}: {}", err.problem);
        }
        let five = ["r.test:25 none"; MAX_FALLBACK_RELAYS + 1].join(",");
        let err = SmtpRelay::parse_list(&five).unwrap_err();
        assert_eq!(err.field, "fallback_relays");
    }
}
