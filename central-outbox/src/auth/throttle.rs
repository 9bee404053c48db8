//! Failed logins, counted per client address: a bearer token the admin API does not know (or
//! a malformed `authorization` header), and a console login with a token that is not accepted.
//!
//! Tokens are meant to be long and random, and such a token cannot be guessed at any rate; but
//! operators choose them, and without a limit anybody who reaches the port can try tokens as
//! fast as the network carries them and fill the log doing so. So, per client:
//!
//! - the [`MAX_FAILURES`]th failure within [`WINDOW`] blocks it for [`BLOCK`]: every attempt
//!   from it that presents a token (API call or console login) is refused, a good token too,
//!   with how long to wait (`retry-after`), so an attacker learns nothing more by trying and a
//!   person is told plainly when to come back;
//! - a client is an IPv4 address, or an IPv6 /64 (one host or site usually holds a whole /64,
//!   so counting per IPv6 address would give it 2^64 fresh starts);
//! - the API and the console count together, so alternating does not double the rate.
//!
//! Only a presented credential that fails counts: a call without one is not a guess, and a
//! client certificate is verified by TLS, not guessed, so neither is counted nor refused here.
//! Behind a proxy every client has the proxy's address and shares one count: a guesser there
//! blocks everyone behind it for [`BLOCK`], which the log and the metrics make plain.
//!
//! Invariants: the table holds at most [`MAX_CLIENTS`] entries (about 100 bytes each, so
//! under half a MiB); every failure is logged with the client's address and counted
//! (`outbox_auth_failures_total{via}`), and every refused attempt is counted
//! (`outbox_auth_throttled_total{via}`), as is every entry pushed out of a full table
//! (`outbox_auth_throttle_evictions_total`).

use std::collections::HashMap;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

/// Failures within [`WINDOW`] that block a client: ten mistyped or stale tokens in five minutes
/// is more than a person makes, while a script with a wrong token reaches it at once (and is
/// failing anyway).
pub const MAX_FAILURES: u32 = 10;
/// The span failures are counted over, from the first of them.
pub const WINDOW: Duration = Duration::from_secs(5 * 60);
/// How long a blocked client is refused: with [`MAX_FAILURES`], at most about 40 guesses an
/// hour from one client (under a thousand a day), against the moments it costs someone
/// who mistyped.
pub const BLOCK: Duration = Duration::from_secs(15 * 60);
/// Clients tracked at once. Ample for the operators and scripts of a plant; past it, entries
/// with nothing left to count go first, then the unblocked one that failed longest ago (a
/// spread-out guesser with more addresses than this gets at most [`MAX_FAILURES`] tries per
/// address per [`WINDOW`] anyway).
pub const MAX_CLIENTS: usize = 4096;

/// Where an attempt was made, for the log and the metrics' `via` label.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Via {
    /// A bearer token on the admin API.
    Api,
    /// The console's login form.
    Console,
    /// An acknowledgement link: a token that does not verify, or a wrong PIN.
    AckLink,
}

impl Via {
    fn as_str(self) -> &'static str {
        match self {
            Self::Api => "api",
            Self::Console => "console",
            Self::AckLink => "ack_link",
        }
    }
}

/// An attempt refused because its client is blocked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Throttled {
    /// The client as counted (an address, or an IPv6 /64).
    pub client: String,
    /// Until the block ends.
    pub retry_after: Duration,
}

impl Throttled {
    /// Whole seconds to wait, rounded up (what `retry-after` says).
    pub fn retry_after_secs(&self) -> u64 {
        let secs = self.retry_after.as_secs();
        if self.retry_after.subsec_nanos() > 0 {
            secs + 1
        } else {
            secs.max(1)
        }
    }
}

impl fmt::Display for Throttled {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "too many failed logins from {}: every attempt from there is refused (a good token \
             too) for {} s more; try again after that",
            self.client,
            self.retry_after_secs()
        )
    }
}

/// The unit failures are counted by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Client {
    V4(Ipv4Addr),
    /// The first 64 bits of an IPv6 address.
    V6Net([u16; 4]),
    /// No address known (an in-process caller without a connection): one shared count.
    Unknown,
}

impl Client {
    fn of(addr: Option<IpAddr>) -> Self {
        match addr {
            Some(IpAddr::V4(v4)) => Self::V4(v4),
            Some(IpAddr::V6(v6)) => match v6.to_ipv4_mapped() {
                Some(v4) => Self::V4(v4),
                None => {
                    let s = v6.segments();
                    Self::V6Net([s[0], s[1], s[2], s[3]])
                }
            },
            None => Self::Unknown,
        }
    }
}

impl fmt::Display for Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::V4(v4) => write!(f, "{v4}"),
            Self::V6Net([a, b, c, d]) => write!(f, "{a:x}:{b:x}:{c:x}:{d:x}::/64"),
            Self::Unknown => f.write_str("an unknown address"),
        }
    }
}

/// One client's count.
#[derive(Debug, Clone, Copy)]
struct Entry {
    /// Failures since `window_start`.
    failures: u32,
    window_start: Instant,
    last_failure: Instant,
    blocked_until: Option<Instant>,
}

impl Entry {
    fn blocked_at(&self, now: Instant) -> Option<Duration> {
        self.blocked_until
            .filter(|until| *until > now)
            .map(|until| until - now)
    }

    /// Nothing left to count: not blocked, and its window has passed.
    fn spent(&self, now: Instant) -> bool {
        self.blocked_at(now).is_none() && now.saturating_duration_since(self.window_start) >= WINDOW
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ViaLabels {
    via: &'static str,
}

/// Every client's failed logins; shared by the admin API and the console (one per
/// `Authenticator` and its clones).
#[derive(Debug, Default)]
pub struct FailedLogins {
    table: Mutex<HashMap<Client, Entry>>,
    failures: Family<ViaLabels, Counter>,
    throttled: Family<ViaLabels, Counter>,
    evictions: Counter,
}

impl FailedLogins {
    pub fn new() -> Self {
        let logins = Self::default();
        // Known series start at 0, so rate() sees the first failure.
        for via in [Via::Api, Via::Console, Via::AckLink] {
            let labels = ViaLabels { via: via.as_str() };
            logins.failures.get_or_create_owned(&labels);
            logins.throttled.get_or_create_owned(&labels);
        }
        logins
    }

    /// Adds the counters to `/metrics`.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "outbox_auth_failures",
            "Failed logins: bearer tokens the admin API does not accept (via=api) and refused \
             console logins (via=console), acknowledgement links that do not verify or carry a wrong \
             PIN (via=ack_link)",
            self.failures.clone(),
        );
        registry.register(
            "outbox_auth_throttled",
            "Login attempts refused because their client had too many failed logins",
            self.throttled.clone(),
        );
        registry.register(
            "outbox_auth_throttle_evictions",
            "Clients dropped from the full failed-login table before their count ran out",
            self.evictions.clone(),
        );
    }

    /// The table; a panic elsewhere while it was held leaves it usable (each change is a
    /// single insert, update or remove).
    fn table(&self) -> std::sync::MutexGuard<'_, HashMap<Client, Entry>> {
        self.table.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether an attempt from `addr` may be checked at all: refused (and counted) while its
    /// client is blocked.
    pub fn check(&self, addr: Option<IpAddr>, via: Via, now: Instant) -> Result<(), Throttled> {
        let client = Client::of(addr);
        let blocked = self.table().get(&client).and_then(|e| e.blocked_at(now));
        match blocked {
            None => Ok(()),
            Some(retry_after) => {
                self.throttled
                    .get_or_create(&ViaLabels { via: via.as_str() })
                    .inc();
                tracing::debug!(
                    client = %client,
                    via = via.as_str(),
                    "login attempt refused: too many failed logins"
                );
                Err(Throttled {
                    client: client.to_string(),
                    retry_after,
                })
            }
        }
    }

    /// Records a failed login from `addr` (`why`, for the log), and blocks its client if this
    /// was one too many.
    pub fn failed(&self, addr: Option<IpAddr>, via: Via, why: &str, now: Instant) {
        self.failures
            .get_or_create(&ViaLabels { via: via.as_str() })
            .inc();
        let client = Client::of(addr);
        let shown = addr.map_or_else(|| "unknown".to_owned(), |a| a.to_string());
        tracing::info!(client = %shown, via = via.as_str(), why, "failed login");
        let mut table = self.table();
        if !table.contains_key(&client) && table.len() >= MAX_CLIENTS {
            self.make_room(&mut table, now);
        }
        let entry = table.entry(client).or_insert(Entry {
            failures: 0,
            window_start: now,
            last_failure: now,
            blocked_until: None,
        });
        if now.saturating_duration_since(entry.window_start) >= WINDOW {
            entry.failures = 0;
            entry.window_start = now;
        }
        entry.failures += 1;
        entry.last_failure = now;
        if entry.failures >= MAX_FAILURES && entry.blocked_at(now).is_none() {
            entry.blocked_until = Some(now + BLOCK);
            entry.failures = 0;
            entry.window_start = now;
            tracing::warn!(
                client = %client,
                failures = MAX_FAILURES,
                window_secs = WINDOW.as_secs(),
                blocked_secs = BLOCK.as_secs(),
                "too many failed logins: every login attempt from this client is refused for a \
                 while (a proxy in front of central makes all its clients one)"
            );
        }
    }

    /// Frees an entry in a full table: every spent one, else the unblocked one that failed
    /// longest ago (a blocked one only when every client is blocked).
    fn make_room(&self, table: &mut HashMap<Client, Entry>, now: Instant) {
        table.retain(|_, entry| !entry.spent(now));
        if table.len() < MAX_CLIENTS {
            return;
        }
        let oldest = table
            .iter()
            .min_by_key(|(_, entry)| (entry.blocked_at(now).is_some(), entry.last_failure))
            .map(|(client, _)| *client);
        if let Some(oldest) = oldest {
            table.remove(&oldest);
            self.evictions.inc();
        }
    }

    #[cfg(test)]
    fn tracked(&self) -> usize {
        self.table().len()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn v4(last: u8) -> Option<IpAddr> {
        Some(IpAddr::from([10, 0, 0, last]))
    }

    fn fail_times(logins: &FailedLogins, addr: Option<IpAddr>, n: u32, now: Instant) {
        for _ in 0..n {
            logins.failed(addr, Via::Api, "test", now);
        }
    }

    #[test]
    fn the_last_failure_allowed_blocks_its_client_for_the_block_time_only() {
        let logins = FailedLogins::new();
        let start = Instant::now();
        fail_times(&logins, v4(1), MAX_FAILURES - 1, start);
        assert_eq!(logins.check(v4(1), Via::Api, start), Ok(()));
        logins.failed(v4(1), Via::Console, "test", start);
        let refused = logins.check(v4(1), Via::Api, start).unwrap_err();
        assert_eq!(refused.retry_after, BLOCK);
        assert_eq!(refused.retry_after_secs(), BLOCK.as_secs());
        assert!(refused.to_string().contains("10.0.0.1"), "{refused}");
        // Counted together whichever way they came; others are not held back.
        assert_eq!(logins.check(v4(2), Via::Console, start), Ok(()));
        let later = start + BLOCK - Duration::from_millis(1500);
        assert_eq!(
            logins
                .check(v4(1), Via::Console, later)
                .unwrap_err()
                .retry_after_secs(),
            2
        );
        assert_eq!(logins.check(v4(1), Via::Api, start + BLOCK), Ok(()));
        // After the block, a fresh count.
        fail_times(&logins, v4(1), MAX_FAILURES - 1, start + BLOCK);
        assert_eq!(logins.check(v4(1), Via::Api, start + BLOCK), Ok(()));
    }

    #[test]
    fn failures_older_than_the_window_no_longer_count() {
        let logins = FailedLogins::new();
        let start = Instant::now();
        fail_times(&logins, v4(1), MAX_FAILURES - 1, start);
        let next_window = start + WINDOW;
        fail_times(&logins, v4(1), MAX_FAILURES - 1, next_window);
        assert_eq!(logins.check(v4(1), Via::Api, next_window), Ok(()));
        logins.failed(v4(1), Via::Api, "test", next_window);
        assert!(logins.check(v4(1), Via::Api, next_window).is_err());
    }

    #[test]
    fn an_ipv6_client_is_its_slash_64_and_a_mapped_ipv4_its_address() {
        let logins = FailedLogins::new();
        let now = Instant::now();
        for i in 0..MAX_FAILURES {
            let addr: IpAddr = format!("2001:db8:1:2::{:x}", i + 1).parse().unwrap();
            logins.failed(Some(addr), Via::Api, "test", now);
        }
        let other_host: IpAddr = "2001:db8:1:2:ffff::9".parse().unwrap();
        let refused = logins.check(Some(other_host), Via::Api, now).unwrap_err();
        assert_eq!(refused.client, "2001:db8:1:2::/64");
        let other_net: IpAddr = "2001:db8:1:3::1".parse().unwrap();
        assert_eq!(logins.check(Some(other_net), Via::Api, now), Ok(()));
        fail_times(&logins, v4(7), MAX_FAILURES, now);
        let mapped: IpAddr = "::ffff:10.0.0.7".parse().unwrap();
        assert!(logins.check(Some(mapped), Via::Api, now).is_err());
    }

    #[test]
    fn the_table_stays_bounded_keeping_live_counts_first() {
        let logins = FailedLogins::new();
        let start = Instant::now();
        let blocked = Some(IpAddr::from([192, 168, 0, 1]));
        fail_times(&logins, blocked, MAX_FAILURES, start);
        // A crowd of one-off failures, long ago: spent by the time the table fills.
        for i in 0..MAX_CLIENTS - 1 {
            let addr = IpAddr::from(Ipv4Addr::from(0x0a00_0000 + i as u32));
            logins.failed(Some(addr), Via::Api, "test", start);
        }
        assert_eq!(logins.tracked(), MAX_CLIENTS);
        let later = start + WINDOW;
        logins.failed(Some(IpAddr::from([172, 16, 0, 1])), Via::Api, "test", later);
        // The spent ones went; the blocked one stayed.
        assert_eq!(logins.tracked(), 2);
        assert!(logins.check(blocked, Via::Api, later).is_err());
        assert_eq!(logins.evictions.get(), 0);
        // Full of live counts: an unblocked one goes, and it is counted; the blocked one stays.
        for i in 0..MAX_CLIENTS as u32 {
            let addr = IpAddr::from(Ipv4Addr::from(0x0b00_0000 + i));
            logins.failed(Some(addr), Via::Api, "test", later);
        }
        assert_eq!(logins.tracked(), MAX_CLIENTS);
        assert_eq!(logins.evictions.get(), 2);
        assert!(logins.check(blocked, Via::Api, later).is_err());
    }
}
