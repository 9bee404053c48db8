//! The console's sessions: who is logged in behind a cookie, until when, and the CSRF token
//! every change they post must carry.
//!
//! Sessions live in this process's memory (per replica: a restart or another replica means
//! logging in again). The cookie holds 32 random bytes from the operating system's generator
//! (`ring::rand::SystemRandom`); the table is keyed by the SHA-256 of that value, so the table
//! never holds a usable cookie and a lookup's timing says nothing about a guessed one. A session
//! ends after `idle_timeout` without use or `lifetime` after its login, whichever comes first;
//! the pages' automatic refreshes read it without counting as use, so a page left open does not
//! keep its session alive forever.
//!
//! Each session has its own CSRF token, compared in constant time. The login form, posted
//! before there is a session, is protected the same way by a one-off token in a short cookie.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use ring::rand::{SecureRandom, SystemRandom};
use sha2::{Digest, Sha256};

use crate::auth::ConsoleCaller;

/// The session cookie's name.
pub(crate) const SESSION_COOKIE: &str = "outbox_console";
/// The cookie pairing the login form with its post (see [`login_nonce`]).
pub(crate) const LOGIN_COOKIE: &str = "outbox_console_login";

/// Most sessions kept at once. Each is a few hundred bytes; the cap bounds what a flood of
/// logins can take, and past it the least recently used session goes first.
const MAX_SESSIONS: usize = 10_000;

/// The operating system's generator could not be read: no secret can be made.
#[derive(Debug, thiserror::Error)]
#[error("the system's random number generator failed")]
pub(crate) struct NoRandomness;

/// 32 random bytes as URL-safe base64: a session id, a CSRF token or a login nonce.
pub(crate) fn random_token(rng: &SystemRandom) -> Result<String, NoRandomness> {
    let mut bytes = [0u8; 32];
    rng.fill(&mut bytes).map_err(|_| NoRandomness)?;
    Ok(URL_SAFE_NO_PAD.encode(bytes))
}

/// A one-off token for the login form, set both as [`LOGIN_COOKIE`] and as the form's hidden
/// `csrf` field; a post whose two copies differ did not come from that form.
pub(crate) fn login_nonce(rng: &SystemRandom) -> Result<String, NoRandomness> {
    random_token(rng)
}

/// Equal in time independent of where the inputs differ (for secrets of public length).
pub(crate) fn same_secret(a: &str, b: &str) -> bool {
    a.len() == b.len()
        && a.bytes()
            .zip(b.bytes())
            .fold(0u8, |acc, (x, y)| acc | (x ^ y))
            == 0
}

/// A one-shot message shown on the next page the operator opens (after a redirect).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Flash {
    pub ok: bool,
    pub text: String,
}

impl Flash {
    pub(crate) fn notice(text: impl Into<String>) -> Self {
        Self {
            ok: true,
            text: text.into(),
        }
    }

    pub(crate) fn error(text: impl Into<String>) -> Self {
        Self {
            ok: false,
            text: text.into(),
        }
    }
}

struct Session {
    caller: ConsoleCaller,
    csrf: String,
    created: Instant,
    last_used: Instant,
    flash: Option<Flash>,
}

/// A live session as a request sees it.
#[derive(Debug, Clone)]
pub(crate) struct ActiveSession {
    /// The cookie value, to act on the session again (flash, logout).
    pub id: String,
    pub caller: ConsoleCaller,
    pub csrf: String,
    /// The pending flash message, taken by this request (only on use, not on a refresh).
    pub flash: Option<Flash>,
}

impl ActiveSession {
    /// Whether `presented` (the form's `csrf` field) is this session's token.
    pub(crate) fn csrf_matches(&self, presented: Option<&str>) -> bool {
        presented.is_some_and(|p| same_secret(p, &self.csrf))
    }
}

/// What a cookie leads to.
#[derive(Debug)]
pub(crate) enum Lookup {
    Active(ActiveSession),
    /// It was a session that has ended (idle or too old): "log in again".
    Expired,
    /// No cookie, or one this process never issued (or forgot at a restart).
    Unknown,
}

/// How a request uses its session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Use {
    /// An operator's request: resets the idle clock and takes the flash message.
    Active,
    /// A page's automatic refresh: neither.
    Refresh,
}

/// Every session of this process.
pub(crate) struct Sessions {
    by_digest: Mutex<HashMap<[u8; 32], Session>>,
    idle_timeout: Duration,
    lifetime: Duration,
    rng: SystemRandom,
}

fn digest(id: &str) -> [u8; 32] {
    Sha256::digest(id.as_bytes()).into()
}

impl Sessions {
    pub(crate) fn new(idle_timeout: Duration, lifetime: Duration) -> Self {
        Self {
            by_digest: Mutex::new(HashMap::new()),
            idle_timeout,
            lifetime,
            rng: SystemRandom::new(),
        }
    }

    pub(crate) fn rng(&self) -> &SystemRandom {
        &self.rng
    }

    fn expired(&self, session: &Session, now: Instant) -> bool {
        now.saturating_duration_since(session.last_used) >= self.idle_timeout
            || now.saturating_duration_since(session.created) >= self.lifetime
    }

    /// The table; a panic elsewhere while it was held leaves it usable (every change to it is
    /// a single insert or remove).
    fn table(&self) -> std::sync::MutexGuard<'_, HashMap<[u8; 32], Session>> {
        self.by_digest
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// A new session for `caller`; returns the cookie value.
    pub(crate) fn create(
        &self,
        caller: ConsoleCaller,
        now: Instant,
    ) -> Result<String, NoRandomness> {
        let id = random_token(&self.rng)?;
        let csrf = random_token(&self.rng)?;
        let mut table = self.table();
        table.retain(|_, s| !self.expired(s, now));
        if table.len() >= MAX_SESSIONS
            && let Some(oldest) = table
                .iter()
                .min_by_key(|(_, s)| s.last_used)
                .map(|(key, _)| *key)
        {
            table.remove(&oldest);
        }
        table.insert(
            digest(&id),
            Session {
                caller,
                csrf,
                created: now,
                last_used: now,
                flash: None,
            },
        );
        Ok(id)
    }

    /// The session behind cookie value `id`, at `now`.
    pub(crate) fn lookup(&self, id: &str, now: Instant, usage: Use) -> Lookup {
        let key = digest(id);
        let mut table = self.table();
        let Some(session) = table.get_mut(&key) else {
            return Lookup::Unknown;
        };
        if self.expired(session, now) {
            table.remove(&key);
            return Lookup::Expired;
        }
        let flash = match usage {
            Use::Active => {
                session.last_used = now;
                session.flash.take()
            }
            Use::Refresh => None,
        };
        Lookup::Active(ActiveSession {
            id: id.to_owned(),
            caller: session.caller.clone(),
            csrf: session.csrf.clone(),
            flash,
        })
    }

    /// Leaves `flash` for the session's next page.
    pub(crate) fn set_flash(&self, id: &str, flash: Flash) {
        if let Some(session) = self.table().get_mut(&digest(id)) {
            session.flash = Some(flash);
        }
    }

    /// Ends the session (logout).
    pub(crate) fn end(&self, id: &str) {
        self.table().remove(&digest(id));
    }
}

/// The value of cookie `name` in a `Cookie` request header.
pub(crate) fn cookie<'a>(header: &'a str, name: &str) -> Option<&'a str> {
    header
        .split(';')
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(key, _)| *key == name)
        .map(|(_, value)| value.trim())
}

/// A `Set-Cookie` value: never readable by scripts, never sent with another site's requests,
/// and over TLS never sent in clear. `max_age` of `Some(0)` deletes the cookie; `None` makes
/// it last until the browser closes (the server decides when the session ends).
pub(crate) fn set_cookie(
    name: &str,
    value: &str,
    path: &str,
    secure: bool,
    max_age: Option<u64>,
) -> String {
    let mut cookie = format!("{name}={value}; HttpOnly; SameSite=Strict; Path={path}");
    if let Some(age) = max_age {
        cookie.push_str(&format!("; Max-Age={age}"));
    }
    if secure {
        cookie.push_str("; Secure");
    }
    cookie
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use crate::auth::{AuthConfig, Authenticator, TokenConfig, token_digest};

    fn ann() -> ConsoleCaller {
        Authenticator::from_config(&AuthConfig {
            tokens: vec![TokenConfig {
                name: "ann".into(),
                role: crate::auth::Role::Operator,
                sha256: token_digest("ann-secret"),
            }],
            ..Default::default()
        })
        .unwrap()
        .login("ann-secret", None)
        .unwrap()
    }

    const IDLE: Duration = Duration::from_secs(30 * 60);
    const LIFETIME: Duration = Duration::from_secs(12 * 3600);

    fn active(lookup: Lookup) -> ActiveSession {
        match lookup {
            Lookup::Active(session) => session,
            other => panic!("expected an active session, got {other:?}"),
        }
    }

    #[test]
    fn a_session_is_found_by_its_cookie_only() {
        let sessions = Sessions::new(IDLE, LIFETIME);
        let now = Instant::now();
        let id = sessions.create(ann(), now).unwrap();
        let other = sessions.create(ann(), now).unwrap();
        assert_ne!(id, other);
        // 32 bytes in unpadded base64.
        assert_eq!(URL_SAFE_NO_PAD.decode(&id).unwrap().len(), 32);
        let session = active(sessions.lookup(&id, now, Use::Active));
        assert_eq!(session.caller.name(), "ann");
        assert!(matches!(
            sessions.lookup("guess", now, Use::Active),
            Lookup::Unknown
        ));
        assert_ne!(
            session.csrf,
            active(sessions.lookup(&other, now, Use::Active)).csrf,
            "each session has its own CSRF token"
        );
    }

    #[test]
    fn a_session_ends_when_idle_but_refreshes_do_not_keep_it() {
        let sessions = Sessions::new(IDLE, LIFETIME);
        let start = Instant::now();
        let id = sessions.create(ann(), start).unwrap();
        // Used just before the idle timeout: the clock starts again.
        let used = start + IDLE - Duration::from_secs(1);
        active(sessions.lookup(&id, used, Use::Active));
        // Refreshes read it without resetting the clock.
        active(sessions.lookup(&id, used + IDLE / 2, Use::Refresh));
        assert!(matches!(
            sessions.lookup(&id, used + IDLE, Use::Refresh),
            Lookup::Expired
        ));
        // Ended for good: the next look finds nothing.
        assert!(matches!(
            sessions.lookup(&id, used, Use::Active),
            Lookup::Unknown
        ));
    }

    #[test]
    fn a_session_ends_at_its_lifetime_however_busy() {
        let sessions = Sessions::new(IDLE, LIFETIME);
        let start = Instant::now();
        let id = sessions.create(ann(), start).unwrap();
        let mut now = start;
        while now + IDLE / 2 < start + LIFETIME {
            now += IDLE / 2;
            active(sessions.lookup(&id, now, Use::Active));
        }
        assert!(matches!(
            sessions.lookup(&id, start + LIFETIME, Use::Active),
            Lookup::Expired
        ));
    }

    #[test]
    fn the_csrf_token_must_match_exactly() {
        let sessions = Sessions::new(IDLE, LIFETIME);
        let now = Instant::now();
        let id = sessions.create(ann(), now).unwrap();
        let session = active(sessions.lookup(&id, now, Use::Active));
        assert!(session.csrf_matches(Some(&session.csrf.clone())));
        assert!(!session.csrf_matches(None));
        assert!(!session.csrf_matches(Some("")));
        let mut wrong = session.csrf.clone();
        let last = wrong.pop().unwrap();
        assert!(
            !session.csrf_matches(Some(&wrong)),
            "a prefix is not the token"
        );
        wrong.push(if last == 'A' { 'B' } else { 'A' });
        assert!(!session.csrf_matches(Some(&wrong)), "one character off");
    }

    #[test]
    fn a_flash_is_shown_once_and_not_taken_by_a_refresh() {
        let sessions = Sessions::new(IDLE, LIFETIME);
        let now = Instant::now();
        let id = sessions.create(ann(), now).unwrap();
        sessions.set_flash(&id, Flash::notice("retried"));
        assert_eq!(active(sessions.lookup(&id, now, Use::Refresh)).flash, None);
        assert_eq!(
            active(sessions.lookup(&id, now, Use::Active)).flash,
            Some(Flash::notice("retried"))
        );
        assert_eq!(active(sessions.lookup(&id, now, Use::Active)).flash, None);
    }

    #[test]
    fn logout_ends_the_session() {
        let sessions = Sessions::new(IDLE, LIFETIME);
        let now = Instant::now();
        let id = sessions.create(ann(), now).unwrap();
        sessions.end(&id);
        assert!(matches!(
            sessions.lookup(&id, now, Use::Active),
            Lookup::Unknown
        ));
    }

    #[test]
    fn cookies_are_read_by_name_and_written_locked_down() {
        assert_eq!(
            cookie("a=1; outbox_console=abc; b=2", SESSION_COOKIE),
            Some("abc")
        );
        assert_eq!(cookie("outbox_console_login=x", SESSION_COOKIE), None);
        assert_eq!(
            set_cookie(SESSION_COOKIE, "abc", "/", false, None),
            "outbox_console=abc; HttpOnly; SameSite=Strict; Path=/"
        );
        assert_eq!(
            set_cookie(SESSION_COOKIE, "", "/", true, Some(0)),
            "outbox_console=; HttpOnly; SameSite=Strict; Path=/; Max-Age=0; Secure"
        );
    }
}
