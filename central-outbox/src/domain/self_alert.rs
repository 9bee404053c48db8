//! Central's alerts about itself (`[self_alerts]`): the conditions it watches, the condition key
//! each is raised under, the rule that turns a series of observations into one alert per episode
//! and one recovery, where each goes, and what it says. Plain logic: `crate::self_alerts`
//! gathers the observations and stores the notifications through the ordinary ingest path.
//!
//! Invariants:
//! - One alert per episode. A condition observed active again and again raises once; it
//!   recovers once it has been observed clear for `recover_after`, without being observed
//!   active in between, so a condition that flickers does not send an alert/recovered pair at
//!   every check. An observation that cannot tell (a figure that could not be read, too little
//!   history yet) changes nothing.
//! - The same episode is the same row. Each notification's id is a name-based UUID of its list,
//!   its condition key, the episode's start and whether it raises or recovers; its content is
//!   built from those and the observation alone. Two replicas noticing the same episode, or a
//!   node restarted in the middle of one, store it once (the second is a DUPLICATE).
//! - The latest state wins. An episode's alert and its recovery carry the condition key, and the
//!   recovery's site time is later than the alert's (a new episode's later than the last
//!   recovery's), so the store's supersede rule drops an alert still waiting when its recovery
//!   arrives, and the recovery is delivered.
//! - An alert about a failing channel never goes through that channel ([`Routes::lists_for`]).

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

use chrono::{DateTime, Utc};
use sha2::{Digest, Sha256};

use super::delivery::AttemptOutcome;
use super::{ConditionKey, ListName, NotificationId, NotificationType, SiteId};
use outbox_domain::limits::{MAX_CONDITION_KEY_CHARS, MAX_SUBJECT_CHARS};

/// The subject of an alert starts with this, the subject of a recovery with [`RECOVERED`]: how
/// the stored rows are read back after a restart (`Tracker::adopt`), and what a mail filter
/// can match.
pub const RAISED: &str = "[outbox ALERT] ";
pub const RECOVERED: &str = "[outbox RECOVERED] ";

/// What the notifications' `source_script` says.
pub const SCRIPT: &str = "self-alerts";

/// Longest title (the part of the subject after the prefix), in characters: well inside the
/// subject limit, and a title that long is already a poor subject line.
const MAX_TITLE_CHARS: usize = 200;

/// The conditions central watches in itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ConditionKind {
    /// A site node's latest health report is `site_offline_after` old.
    SiteOffline,
    /// A channel's latest attempts all failed transiently, or a notification of it has waited
    /// too long.
    ChannelFailing,
    /// The Parked count rose by many within a window.
    ParkedRising,
    /// Notifications held by flood consolidation past their window's end plus a grace.
    HeldOverdue,
    /// A supervised task of the dispatching node restarted repeatedly.
    TaskRestarting,
    /// No node holds the dispatcher lease.
    NoLeader,
    /// A certificate of `[tls]` expires soon.
    CertificateExpiring,
}

impl ConditionKind {
    pub const ALL: [Self; 7] = [
        Self::SiteOffline,
        Self::ChannelFailing,
        Self::ParkedRising,
        Self::HeldOverdue,
        Self::TaskRestarting,
        Self::NoLeader,
        Self::CertificateExpiring,
    ];

    /// The name in metrics' `condition` label and in a webhook's `type_data`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::SiteOffline => "site_offline",
            Self::ChannelFailing => "channel_failing",
            Self::ParkedRising => "parked_rising",
            Self::HeldOverdue => "held_overdue",
            Self::TaskRestarting => "task_restarting",
            Self::NoLeader => "no_leader",
            Self::CertificateExpiring => "certificate_expiring",
        }
    }

    /// The condition keys of this kind are this, or start with it and a '/'.
    fn key_prefix(self) -> &'static str {
        match self {
            Self::SiteOffline => "outbox/site-offline",
            Self::ChannelFailing => "outbox/channel-failing",
            Self::ParkedRising => "outbox/parked-rising",
            Self::HeldOverdue => "outbox/held-overdue",
            Self::TaskRestarting => "outbox/task-restarting",
            Self::NoLeader => "outbox/no-leader",
            Self::CertificateExpiring => "outbox/certificate-expiring",
        }
    }

    /// The kind a condition key belongs to.
    pub fn of_key(key: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|kind| {
            let prefix = kind.key_prefix();
            key == prefix
                || key
                    .strip_prefix(prefix)
                    .is_some_and(|rest| rest.starts_with('/'))
        })
    }

    /// Watched by every replica, not only by the lease holder: with no leader there is no
    /// lease holder to notice.
    pub fn watched_by_every_replica(self) -> bool {
        self == Self::NoLeader
    }
}

/// One condition: its kind, the key its notifications carry, and its title.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Condition {
    pub kind: ConditionKind,
    pub key: ConditionKey,
    /// What the subject says after the prefix, e.g. "site north offline".
    pub title: String,
    /// The channel a [`ConditionKind::ChannelFailing`] is about.
    channel: Option<NotificationType>,
}

impl Condition {
    fn new(kind: ConditionKind, suffix: Option<&str>, title: String) -> Self {
        let prefix = kind.key_prefix();
        let mut key = match suffix {
            Some(suffix) => format!("{prefix}/{suffix}"),
            None => prefix.to_owned(),
        };
        // Keys allow ASCII letters, digits and . _ - : /; the parts come from checked ids, but
        // a task name or a subject might not keep to that.
        key = key
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | ':' | '/') {
                    c
                } else {
                    '-'
                }
            })
            .collect();
        // Two 64-character ids do not fit a key: such a key is the prefix and a hash of the
        // rest, still one per condition (the title names it in full).
        if key.chars().count() > MAX_CONDITION_KEY_CHARS {
            key = format!("{prefix}/{}", short_hash(&key));
        }
        let key = match ConditionKey::parse(key, "condition_key") {
            Ok(key) => key,
            // Unreachable by the construction above; a fixed key keeps the alert going out.
            Err(_) => ConditionKey::parse(prefix.to_owned(), "condition_key")
                .unwrap_or_else(|_| unreachable_key()),
        };
        Self {
            kind,
            key,
            title: clean_title(&title),
            channel: None,
        }
    }

    /// A site node is offline (`site` alone when the node is named after its site).
    pub fn site_offline(site: &SiteId, node: &SiteId) -> Self {
        let title = if site == node {
            format!("site {site} offline")
        } else {
            format!("site {site} node {node} offline")
        };
        Self::new(
            ConditionKind::SiteOffline,
            Some(&format!("{site}/{node}")),
            title,
        )
    }

    /// A channel is failing.
    pub fn channel_failing(channel: NotificationType) -> Self {
        Self {
            channel: Some(channel),
            ..Self::new(
                ConditionKind::ChannelFailing,
                Some(&channel.as_str().to_ascii_lowercase()),
                format!("channel {channel} failing"),
            )
        }
    }

    pub fn parked_rising() -> Self {
        Self::new(
            ConditionKind::ParkedRising,
            None,
            "parked notifications rising".into(),
        )
    }

    pub fn held_overdue() -> Self {
        Self::new(
            ConditionKind::HeldOverdue,
            None,
            "notifications held past their consolidation window".into(),
        )
    }

    pub fn task_restarting(task: &str) -> Self {
        Self::new(
            ConditionKind::TaskRestarting,
            Some(task),
            format!("task {task} restarting repeatedly"),
        )
    }

    pub fn no_leader() -> Self {
        Self::new(ConditionKind::NoLeader, None, "no dispatcher leader".into())
    }

    /// A certificate configured as `tls.<key>` with this subject and SHA-256 fingerprint (hex)
    /// expires soon. One condition per certificate: a renewed one is another.
    pub fn certificate_expiring(key: &str, subject: &str, fingerprint: &str) -> Self {
        let short: String = fingerprint.chars().take(16).collect();
        Self::new(
            ConditionKind::CertificateExpiring,
            Some(&short),
            format!("TLS certificate {subject} (tls.{key}) expiring"),
        )
    }

    /// The condition a stored self-alert row is about, and whether the row raised it (`true`)
    /// or said it recovered: read from its condition key and subject. `None` for a row that is
    /// neither (not written by this module).
    pub fn from_stored(key: &str, subject: &str) -> Option<(Self, bool)> {
        let kind = ConditionKind::of_key(key)?;
        let (title, raised) = match (
            subject.strip_prefix(RAISED),
            subject.strip_prefix(RECOVERED),
        ) {
            (Some(title), _) => (title, true),
            (None, Some(title)) => (title, false),
            (None, None) => return None,
        };
        let channel = match kind {
            ConditionKind::ChannelFailing => [NotificationType::Email, NotificationType::Webhook]
                .into_iter()
                .find(|c| key.ends_with(&format!("/{}", c.as_str().to_ascii_lowercase()))),
            _ => None,
        };
        let key = ConditionKey::parse(key.to_owned(), "condition_key").ok()?;
        Some((
            Self {
                kind,
                key,
                title: clean_title(title),
                channel,
            },
            raised,
        ))
    }

    /// The channel a failing-channel condition is about.
    pub fn channel(&self) -> Option<NotificationType> {
        self.channel
    }
}

/// Never used: [`Condition::new`]'s keys always parse. Kept total so no panic path exists.
fn unreachable_key() -> ConditionKey {
    match ConditionKey::parse("outbox".to_owned(), "condition_key") {
        Ok(key) => key,
        Err(_) => unreachable!("\"outbox\" is a valid condition key"),
    }
}

/// A title: one line, no control characters, at most [`MAX_TITLE_CHARS`].
fn clean_title(title: &str) -> String {
    title
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .take(MAX_TITLE_CHARS)
        .collect()
}

/// 32 hex digits of SHA-256: short, and still one per text.
fn short_hash(text: &str) -> String {
    Sha256::digest(text.as_bytes())
        .iter()
        .take(16)
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// What one observation of a condition found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reading {
    /// The condition holds, since `since` (as far as can be told), and `detail` says how.
    Active {
        since: DateTime<Utc>,
        detail: String,
    },
    Clear,
    /// Cannot tell now: changes nothing.
    Unknown,
}

impl Reading {
    /// Active if either is (both details, when both are), clear only if both are.
    pub fn either(self, other: Reading) -> Reading {
        match (self, other) {
            (
                Reading::Active { since, detail },
                Reading::Active {
                    since: since2,
                    detail: detail2,
                },
            ) => Reading::Active {
                since: since.min(since2),
                detail: format!("{detail}\n{detail2}"),
            },
            (active @ Reading::Active { .. }, _) | (_, active @ Reading::Active { .. }) => active,
            (Reading::Clear, Reading::Clear) => Reading::Clear,
            _ => Reading::Unknown,
        }
    }
}

/// A condition and what was observed of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Observation {
    pub condition: Condition,
    pub reading: Reading,
}

/// What to send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Transition {
    /// The condition began at `since` (the alert's site time).
    Raise {
        condition: Condition,
        since: DateTime<Utc>,
        detail: String,
    },
    /// The episode that began at `since` is over, as observed at `at` (the recovery's site
    /// time, later than `since`).
    Recover {
        condition: Condition,
        since: DateTime<Utc>,
        at: DateTime<Utc>,
    },
}

impl Transition {
    pub fn condition(&self) -> &Condition {
        match self {
            Self::Raise { condition, .. } | Self::Recover { condition, .. } => condition,
        }
    }

    pub fn is_raise(&self) -> bool {
        matches!(self, Self::Raise { .. })
    }

    /// The site time of the notification: the episode's start for an alert, the observation of
    /// the recovery for a recovery.
    pub fn site_time(&self) -> DateTime<Utc> {
        match self {
            Self::Raise { since, .. } => *since,
            Self::Recover { at, .. } => *at,
        }
    }

    fn episode(&self) -> DateTime<Utc> {
        match self {
            Self::Raise { since, .. } | Self::Recover { since, .. } => *since,
        }
    }

    /// The notification's id for `list`: a name-based UUID (version 8, from SHA-256) of the
    /// phase, the list, the condition key and the episode's start, so the same episode's same
    /// notification is one row however often, and by whichever replica, it is stored.
    pub fn notification_id(&self, list: &ListName) -> NotificationId {
        let phase = if self.is_raise() {
            "raised"
        } else {
            "recovered"
        };
        let name = format!(
            "outbox self-alert\0{phase}\0{}\0{}\0{}",
            list.as_str(),
            self.condition().key.as_str(),
            self.episode().timestamp_millis()
        );
        let digest = Sha256::digest(name.as_bytes());
        let mut bytes = [0u8; 16];
        bytes.copy_from_slice(&digest[..16]);
        NotificationId::from_uuid(uuid::Builder::from_custom_bytes(bytes).into_uuid())
    }

    pub fn subject(&self) -> String {
        let prefix = if self.is_raise() { RAISED } else { RECOVERED };
        let subject = format!("{prefix}{}", self.condition().title);
        subject.chars().take(MAX_SUBJECT_CHARS).collect()
    }

    pub fn body(&self) -> String {
        let condition = self.condition();
        let head = match self {
            Self::Raise { since, detail, .. } => {
                format!("{detail}\n\nSince: {}", time_text(*since))
            }
            Self::Recover { since, .. } => format!(
                "Cleared: {}. The condition began at {}.",
                condition.title,
                time_text(*since)
            ),
        };
        format!(
            "{head}\nCondition key: {}\n\nSent by central-outbox about itself ([self_alerts]). {}",
            condition.key,
            if self.is_raise() {
                "It is not repeated while the condition lasts; a notification with the same \
                 condition key says when it has cleared."
            } else {
                "A new alert follows if the condition comes back."
            }
        )
    }

    /// The `type_data` JSON: the same facts for a machine (a webhook receiver).
    pub fn type_data(&self) -> String {
        let condition = self.condition();
        serde_json::json!({
            "outbox_self_alert": {
                "condition": condition.kind.as_str(),
                "key": condition.key.as_str(),
                "state": if self.is_raise() { "raised" } else { "recovered" },
                "since": self.episode().to_rfc3339(),
            }
        })
        .to_string()
    }
}

/// A time as the messages show it, to the second.
fn time_text(at: DateTime<Utc>) -> String {
    at.format("%Y-%m-%d %H:%M:%S UTC").to_string()
}

/// To whole milliseconds, what both stores keep of a time: an episode's start read back from a
/// stored row is then the one its id was made from.
pub fn to_millis(at: DateTime<Utc>) -> DateTime<Utc> {
    DateTime::from_timestamp_millis(at.timestamp_millis()).unwrap_or(at)
}

/// What the tracker knows of one condition.
#[derive(Debug, Clone)]
struct Tracked {
    condition: Condition,
    /// The start of the episode under way, while raised.
    raised: Option<DateTime<Utc>>,
    /// While raised: since when it has been observed clear without a break.
    clear_from: Option<DateTime<Utc>>,
    /// The site time of the condition's latest notification, so the next one is later.
    last_site_time: Option<DateTime<Utc>>,
}

/// The conditions raised and the rule between observations and notifications (module docs).
#[derive(Debug, Clone)]
pub struct Tracker {
    recover_after: Duration,
    by_key: BTreeMap<String, Tracked>,
}

impl Tracker {
    pub fn new(recover_after: Duration) -> Self {
        Self {
            recover_after,
            by_key: BTreeMap::new(),
        }
    }

    /// Takes up what the condition's latest stored notification says: raised (an episode that
    /// began at `site_time` is under way) or recovered. What a node does when it starts
    /// watching, so a restart neither repeats an alert nor forgets to recover it.
    pub fn adopt(&mut self, condition: Condition, raised: bool, site_time: DateTime<Utc>) {
        let site_time = to_millis(site_time);
        self.by_key.insert(
            condition.key.as_str().to_owned(),
            Tracked {
                condition,
                raised: raised.then_some(site_time),
                clear_from: None,
                last_site_time: Some(site_time),
            },
        );
    }

    /// Whether anything is known of the condition keyed `key` (observed or adopted).
    pub fn knows(&self, key: &ConditionKey) -> bool {
        self.by_key.contains_key(key.as_str())
    }

    /// Forgets every condition `drop` says, raised or not (a node that stopped dispatching
    /// forgets what only the dispatching node watches; it reads it back when it dispatches
    /// again).
    pub fn forget(&mut self, drop: impl Fn(ConditionKind) -> bool) {
        self.by_key.retain(|_, t| !drop(t.condition.kind));
    }

    /// Conditions raised now, per kind (every kind present, at zero when none).
    pub fn raised_counts(&self) -> BTreeMap<ConditionKind, usize> {
        let mut counts: BTreeMap<ConditionKind, usize> =
            ConditionKind::ALL.into_iter().map(|k| (k, 0)).collect();
        for tracked in self.by_key.values().filter(|t| t.raised.is_some()) {
            *counts.entry(tracked.condition.kind).or_default() += 1;
        }
        counts
    }

    /// The keys of the conditions raised now.
    pub fn raised_keys(&self) -> std::collections::BTreeSet<&str> {
        self.by_key
            .iter()
            .filter(|(_, t)| t.raised.is_some())
            .map(|(key, _)| key.as_str())
            .collect()
    }

    /// What `observations` made at `now` call for. Of the kinds in `complete`, every
    /// condition was observed: one raised but not among them has gone (a node no longer
    /// reported, a certificate no longer served) and counts as clear. Nothing changes until
    /// [`Self::applied`] is told a transition was stored.
    pub fn plan(
        &mut self,
        now: DateTime<Utc>,
        observations: Vec<Observation>,
        complete: &[ConditionKind],
    ) -> Vec<Transition> {
        let mut transitions = Vec::new();
        let mut seen = std::collections::BTreeSet::new();
        for Observation { condition, reading } in observations {
            seen.insert(condition.key.as_str().to_owned());
            if reading == Reading::Unknown {
                // Nothing learnt, not even that the condition exists.
                continue;
            }
            let tracked = self
                .by_key
                .entry(condition.key.as_str().to_owned())
                .or_insert_with(|| Tracked {
                    condition: condition.clone(),
                    raised: None,
                    clear_from: None,
                    last_site_time: None,
                });
            if let Some(t) = Self::next(tracked, now, condition, reading, self.recover_after) {
                transitions.push(t);
            }
        }
        let gone: Vec<String> = self
            .by_key
            .iter()
            .filter(|(key, t)| {
                t.raised.is_some() && complete.contains(&t.condition.kind) && !seen.contains(*key)
            })
            .map(|(key, _)| key.clone())
            .collect();
        for key in gone {
            if let Some(tracked) = self.by_key.get_mut(&key) {
                let condition = tracked.condition.clone();
                if let Some(t) =
                    Self::next(tracked, now, condition, Reading::Clear, self.recover_after)
                {
                    transitions.push(t);
                }
            }
        }
        transitions
    }

    fn next(
        tracked: &mut Tracked,
        now: DateTime<Utc>,
        observed: Condition,
        reading: Reading,
        recover_after: Duration,
    ) -> Option<Transition> {
        match reading {
            Reading::Active { since, detail } => {
                tracked.clear_from = None;
                if tracked.raised.is_some() {
                    return None;
                }
                let since = after(to_millis(since.min(now)), tracked.last_site_time);
                Some(Transition::Raise {
                    condition: observed,
                    since,
                    detail,
                })
            }
            Reading::Clear => {
                let since = tracked.raised?;
                let clear_from = *tracked.clear_from.get_or_insert(now);
                let held = (now - clear_from).to_std().unwrap_or(Duration::ZERO);
                (held >= recover_after).then(|| Transition::Recover {
                    // The title it was raised with (a site's node may have been renamed).
                    condition: tracked.condition.clone(),
                    since,
                    at: after(to_millis(now), Some(since)),
                })
            }
            Reading::Unknown => None,
        }
    }

    /// `transition` was stored: the condition is raised, or recovered, from now on.
    pub fn applied(&mut self, transition: &Transition) {
        let condition = transition.condition();
        let tracked = self
            .by_key
            .entry(condition.key.as_str().to_owned())
            .or_insert_with(|| Tracked {
                condition: condition.clone(),
                raised: None,
                clear_from: None,
                last_site_time: None,
            });
        match transition {
            Transition::Raise {
                condition, since, ..
            } => {
                tracked.condition = condition.clone();
                tracked.raised = Some(*since);
                tracked.last_site_time = Some(*since);
            }
            Transition::Recover { at, .. } => {
                tracked.raised = None;
                tracked.last_site_time = Some(*at);
            }
        }
        tracked.clear_from = None;
    }
}

/// `at`, or a millisecond after `previous` when it is not later: a condition's notifications
/// have strictly increasing site times, so the newest state is the one that wins.
fn after(at: DateTime<Utc>, previous: Option<DateTime<Utc>>) -> DateTime<Utc> {
    match previous {
        Some(previous) if at <= previous => previous + chrono::Duration::milliseconds(1),
        _ => at,
    }
}

/// The lists the alerts go to: at most one per channel.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Routes {
    pub email: Option<ListName>,
    pub webhook: Option<ListName>,
}

/// Where one notification goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    pub kind: NotificationType,
    pub list: ListName,
}

impl Routes {
    fn configured(&self) -> Vec<Route> {
        [
            (NotificationType::Email, &self.email),
            (NotificationType::Webhook, &self.webhook),
        ]
        .into_iter()
        .filter_map(|(kind, list)| {
            list.as_ref().map(|list| Route {
                kind,
                list: list.clone(),
            })
        })
        .collect()
    }

    pub fn is_empty(&self) -> bool {
        self.configured().is_empty()
    }

    /// The lists a notification about `condition` goes to, and whether that is the route the
    /// rule wants. Every configured list, except that one about a failing channel goes only
    /// through the other channels' lists; with none, it goes to the failing channel's own
    /// list (it is stored, and shown, and goes out if the channel heals before it is
    /// superseded), and the answer is `false`: it could not be routed around the failure.
    pub fn lists_for(&self, condition: &Condition) -> (Vec<Route>, bool) {
        let all = self.configured();
        let Some(failing) = condition.channel() else {
            return (all, true);
        };
        let others: Vec<Route> = all.iter().filter(|r| r.kind != failing).cloned().collect();
        if others.is_empty() {
            (all, false)
        } else {
            (others, true)
        }
    }
}

/// A count sampled over time, and how much it rose within the last `window` (the Parked count,
/// a task's restarts).
#[derive(Debug, Clone)]
pub struct RiseWindow {
    window: Duration,
    samples: VecDeque<(DateTime<Utc>, u64)>,
    first: Option<DateTime<Utc>>,
}

/// What a [`RiseWindow`] says after a sample.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rise {
    /// The latest value less the lowest within the window.
    pub by: u64,
    /// Whether the samples span a whole window: only then does a small rise mean the count
    /// stopped rising, rather than that it has not been watched for long.
    pub covered: bool,
}

impl RiseWindow {
    pub fn new(window: Duration) -> Self {
        Self {
            window,
            samples: VecDeque::new(),
            first: None,
        }
    }

    /// Adds `value` sampled at `at` and says how much it rose within the window.
    pub fn record(&mut self, at: DateTime<Utc>, value: u64) -> Rise {
        let window = chrono::Duration::from_std(self.window).unwrap_or(chrono::Duration::MAX);
        let start = at
            .checked_sub_signed(window)
            .unwrap_or(DateTime::<Utc>::MIN_UTC);
        self.samples.push_back((at, value));
        while self.samples.front().is_some_and(|(t, _)| *t < start) {
            self.samples.pop_front();
        }
        let first = *self.first.get_or_insert(at);
        let lowest = self.samples.iter().map(|(_, v)| *v).min().unwrap_or(value);
        Rise {
            by: value.saturating_sub(lowest),
            covered: first <= start,
        }
    }
}

/// A channel's latest attempts: how many failed transiently in a row, since when, and when the
/// latest answer came. Kept by the metrics as attempts finish (`Metrics::attempt_finished`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ChannelStreak {
    pub consecutive_failures: u64,
    pub first_failure_at: Option<DateTime<Utc>>,
    pub last_outcome_at: Option<DateTime<Utc>>,
}

impl ChannelStreak {
    /// One attempt finished: a delivery ends a streak, a transient failure extends it. A
    /// permanent failure is an answer about one notification (a refused address, an unknown
    /// list), not about the channel, and an attempt never sent says nothing of the channel:
    /// neither changes the streak.
    pub fn record(&mut self, outcome: AttemptOutcome, at: DateTime<Utc>) {
        match outcome {
            AttemptOutcome::Delivered => {
                self.consecutive_failures = 0;
                self.first_failure_at = None;
            }
            AttemptOutcome::TransientFailure => {
                if self.consecutive_failures == 0 {
                    self.first_failure_at = Some(at);
                }
                self.consecutive_failures += 1;
            }
            AttemptOutcome::PermanentFailure
            | AttemptOutcome::NotSent
            | AttemptOutcome::InFlight => return,
        }
        self.last_outcome_at = Some(at);
    }

    /// Whether the channel is failing by its streak at `now`: at least `failures` transient
    /// failures in a row, the latest within `quiet_after` (an idle channel is not failing: its
    /// waiting rows are judged by their age instead). Clear after a delivery or once idle for
    /// `quiet_after`; unknown in between, and before any attempt of a node watching for less
    /// than `quiet_after` (since `watching_since`).
    pub fn reading(
        &self,
        channel: NotificationType,
        now: DateTime<Utc>,
        failures: u32,
        quiet_after: Duration,
        watching_since: DateTime<Utc>,
    ) -> Reading {
        let quiet =
            |since: DateTime<Utc>| (now - since).to_std().unwrap_or(Duration::ZERO) >= quiet_after;
        match self.last_outcome_at {
            None if quiet(watching_since) => Reading::Clear,
            None => Reading::Unknown,
            Some(last) if quiet(last) => Reading::Clear,
            Some(_) if self.consecutive_failures == 0 => Reading::Clear,
            Some(last) if self.consecutive_failures >= u64::from(failures) => Reading::Active {
                since: self.first_failure_at.unwrap_or(last),
                detail: format!(
                    "The last {} {channel} delivery attempts all failed transiently (the relay \
                     or endpoint refused, timed out or could not be reached); notifications on \
                     this channel are being retried and are not reaching people.",
                    self.consecutive_failures
                ),
            },
            Some(_) => Reading::Unknown,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(secs: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_700_000_000 + secs, 0).unwrap()
    }

    fn site(id: &str) -> SiteId {
        SiteId::parse(id.into()).unwrap()
    }

    fn active(condition: &Condition, since: i64) -> Observation {
        Observation {
            condition: condition.clone(),
            reading: Reading::Active {
                since: t(since),
                detail: "detail".into(),
            },
        }
    }

    fn clear(condition: &Condition) -> Observation {
        Observation {
            condition: condition.clone(),
            reading: Reading::Clear,
        }
    }

    fn unknown(condition: &Condition) -> Observation {
        Observation {
            condition: condition.clone(),
            reading: Reading::Unknown,
        }
    }

    /// Plans at `now` and applies what it planned, as the service does after storing.
    fn step(tracker: &mut Tracker, now: i64, observations: Vec<Observation>) -> Vec<Transition> {
        let planned = tracker.plan(t(now), observations, &[]);
        for transition in &planned {
            tracker.applied(transition);
        }
        planned
    }

    #[test]
    fn an_episode_raises_once_and_recovers_once_after_the_hold() {
        let offline = Condition::site_offline(&site("north"), &site("north-a"));
        let mut tracker = Tracker::new(Duration::from_secs(30));
        let raised = step(&mut tracker, 10, vec![active(&offline, 5)]);
        assert_eq!(raised.len(), 1);
        let Transition::Raise { since, .. } = &raised[0] else {
            panic!("{raised:?}");
        };
        assert_eq!(*since, t(5), "the episode began when the node went offline");
        // Still offline at every check: nothing more.
        for now in [20, 30, 40] {
            assert!(step(&mut tracker, now, vec![active(&offline, 5)]).is_empty());
        }
        assert_eq!(tracker.raised_counts()[&ConditionKind::SiteOffline], 1);
        // Clear, but not yet for the hold.
        assert!(step(&mut tracker, 50, vec![clear(&offline)]).is_empty());
        assert!(step(&mut tracker, 70, vec![clear(&offline)]).is_empty());
        // An unknown reading in between changes nothing.
        assert!(step(&mut tracker, 75, vec![unknown(&offline)]).is_empty());
        let unseen = Condition::site_offline(&site("south"), &site("south"));
        assert!(step(&mut tracker, 75, vec![unknown(&unseen)]).is_empty());
        assert!(
            !tracker.knows(&unseen.key),
            "an unknown reading teaches nothing"
        );
        let recovered = step(&mut tracker, 80, vec![clear(&offline)]);
        assert_eq!(
            recovered,
            vec![Transition::Recover {
                condition: offline.clone(),
                since: t(5),
                at: t(80)
            }]
        );
        assert_eq!(tracker.raised_counts()[&ConditionKind::SiteOffline], 0);
        // Clear from then on: nothing.
        assert!(step(&mut tracker, 200, vec![clear(&offline)]).is_empty());
    }

    #[test]
    fn a_flicker_within_the_hold_sends_nothing() {
        let failing = Condition::channel_failing(NotificationType::Email);
        let mut tracker = Tracker::new(Duration::from_secs(60));
        assert_eq!(step(&mut tracker, 0, vec![active(&failing, 0)]).len(), 1);
        let mut sent = 0;
        // Clear and active by turns, each clear spell shorter than the hold.
        for round in 0..10 {
            let base = 10 + round * 40;
            sent += step(&mut tracker, base, vec![clear(&failing)]).len();
            sent += step(&mut tracker, base + 30, vec![clear(&failing)]).len();
            sent += step(&mut tracker, base + 35, vec![active(&failing, base + 35)]).len();
        }
        assert_eq!(sent, 0, "no alert/recovered pairs while it flickers");
        assert_eq!(tracker.raised_counts()[&ConditionKind::ChannelFailing], 1);
    }

    #[test]
    fn a_new_episode_after_a_recovery_is_a_new_alert_with_later_site_times() {
        let failing = Condition::channel_failing(NotificationType::Webhook);
        let mut tracker = Tracker::new(Duration::ZERO);
        let first = step(&mut tracker, 10, vec![active(&failing, 10)]);
        let recovered = step(&mut tracker, 20, vec![clear(&failing)]);
        // The next episode's observed start is before the recovery's site time (a row that
        // had been waiting since before): its alert still comes after the recovery.
        let second = step(&mut tracker, 30, vec![active(&failing, 15)]);
        let times: Vec<_> = [&first[0], &recovered[0], &second[0]]
            .iter()
            .map(|t| t.site_time())
            .collect();
        assert!(times.windows(2).all(|w| w[0] < w[1]), "{times:?}");
        let list = ListName::parse("ops".into()).unwrap();
        assert_ne!(
            first[0].notification_id(&list),
            second[0].notification_id(&list)
        );
    }

    #[test]
    fn planning_without_applying_changes_nothing() {
        let gone = Condition::no_leader();
        let mut tracker = Tracker::new(Duration::ZERO);
        // The store refused the alert: it is planned again at the next check.
        assert_eq!(tracker.plan(t(0), vec![active(&gone, 0)], &[]).len(), 1);
        assert_eq!(tracker.plan(t(5), vec![active(&gone, 0)], &[]).len(), 1);
    }

    #[test]
    fn a_restarted_watcher_takes_up_the_stored_state() {
        let offline = Condition::site_offline(&site("north"), &site("north"));
        let mut tracker = Tracker::new(Duration::ZERO);
        tracker.adopt(offline.clone(), true, t(5));
        assert!(tracker.knows(&offline.key));
        // Still offline: not raised again.
        assert!(step(&mut tracker, 10, vec![active(&offline, 5)]).is_empty());
        let recovered = step(&mut tracker, 20, vec![clear(&offline)]);
        let Transition::Recover { since, .. } = recovered[0] else {
            panic!("{recovered:?}");
        };
        assert_eq!(since, t(5), "the stored episode's start");

        // Adopted as recovered: a clear observation sends nothing.
        let mut tracker = Tracker::new(Duration::ZERO);
        tracker.adopt(offline.clone(), false, t(5));
        assert!(step(&mut tracker, 10, vec![clear(&offline)]).is_empty());
    }

    #[test]
    fn a_raised_condition_missing_from_a_complete_observation_has_cleared() {
        let offline = Condition::site_offline(&site("north"), &site("north"));
        let mut tracker = Tracker::new(Duration::ZERO);
        step(&mut tracker, 0, vec![active(&offline, 0)]);
        // Not complete: kept.
        assert!(tracker.plan(t(10), Vec::new(), &[]).is_empty());
        let planned = tracker.plan(t(10), Vec::new(), &[ConditionKind::SiteOffline]);
        assert!(matches!(planned[..], [Transition::Recover { .. }]));
        // Forgotten kinds are gone, whatever their state.
        tracker.forget(|kind| !kind.watched_by_every_replica());
        assert!(!tracker.knows(&offline.key));
    }

    #[test]
    fn ids_are_one_per_phase_list_key_and_episode_and_content_is_deterministic() {
        let failing = Condition::channel_failing(NotificationType::Email);
        let raise = Transition::Raise {
            condition: failing.clone(),
            since: t(5),
            detail: "x".into(),
        };
        let recover = Transition::Recover {
            condition: failing.clone(),
            since: t(5),
            at: t(9),
        };
        let ops = ListName::parse("ops".into()).unwrap();
        let hooks = ListName::parse("hooks".into()).unwrap();
        let ids = [
            raise.notification_id(&ops),
            raise.notification_id(&hooks),
            recover.notification_id(&ops),
        ];
        assert_ne!(ids[0], ids[1]);
        assert_ne!(ids[0], ids[2]);
        assert_eq!(ids[0], raise.clone().notification_id(&ops));
        assert_eq!(ids[0].as_uuid().get_version_num(), 8);
        // The recovery observed later by another replica is the same notification.
        let later = Transition::Recover {
            condition: failing,
            since: t(5),
            at: t(12),
        };
        assert_eq!(later.notification_id(&ops), ids[2]);
        assert_eq!(later.body(), recover.body());
        assert_eq!(later.subject(), recover.subject());
        assert_eq!(later.type_data(), recover.type_data());
        assert!(raise.subject().starts_with(RAISED));
        assert!(recover.subject().starts_with(RECOVERED));
        assert!(raise.body().contains("outbox/channel-failing/email"));
    }

    #[test]
    fn stored_rows_are_read_back_as_their_condition() {
        let offline = Condition::site_offline(&site("north"), &site("north-a"));
        let raise = Transition::Raise {
            condition: offline.clone(),
            since: t(0),
            detail: String::new(),
        };
        let (read, raised) =
            Condition::from_stored(offline.key.as_str(), &raise.subject()).unwrap();
        assert_eq!((read, raised), (offline, true));
        let failing = Condition::channel_failing(NotificationType::Webhook);
        let recover = Transition::Recover {
            condition: failing.clone(),
            since: t(0),
            at: t(1),
        };
        let (read, raised) =
            Condition::from_stored(failing.key.as_str(), &recover.subject()).unwrap();
        assert_eq!(read.channel(), Some(NotificationType::Webhook));
        assert!(!raised);
        assert_eq!(read, failing);
        assert_eq!(
            Condition::from_stored("tank4.level", "[outbox ALERT] x"),
            None
        );
        assert_eq!(Condition::from_stored("outbox/no-leader", "hello"), None);
        assert_eq!(ConditionKind::of_key("outbox/no-leaderX"), None);
    }

    #[test]
    fn keys_are_valid_and_bounded_whatever_the_names() {
        let long = "a".repeat(64);
        let offline = Condition::site_offline(&site(&long), &site(&long));
        assert!(offline.key.as_str().chars().count() <= MAX_CONDITION_KEY_CHARS);
        assert!(offline.key.as_str().starts_with("outbox/site-offline/"));
        assert_eq!(
            ConditionKind::of_key(offline.key.as_str()),
            Some(ConditionKind::SiteOffline)
        );
        let other = Condition::site_offline(&site(&long), &site(&"b".repeat(64)));
        assert_ne!(offline.key, other.key);
        let task = Condition::task_restarting("channel email (x)");
        assert_eq!(
            task.key.as_str(),
            "outbox/task-restarting/channel-email--x-"
        );
        let cert = Condition::certificate_expiring("cert", "central\nevil", &"ab".repeat(32));
        assert_eq!(
            cert.key.as_str(),
            "outbox/certificate-expiring/abababababababab"
        );
        assert!(!cert.title.contains('\n'));
        for kind in ConditionKind::ALL {
            assert_eq!(ConditionKind::of_key(kind.key_prefix()), Some(kind));
        }
    }

    #[test]
    fn a_failing_channel_is_reported_through_the_other_one() {
        let ops = ListName::parse("ops".into()).unwrap();
        let hooks = ListName::parse("hooks".into()).unwrap();
        let both = Routes {
            email: Some(ops.clone()),
            webhook: Some(hooks.clone()),
        };
        let (routes, routed) = both.lists_for(&Condition::channel_failing(NotificationType::Email));
        assert!(routed);
        assert_eq!(
            routes,
            vec![Route {
                kind: NotificationType::Webhook,
                list: hooks.clone()
            }]
        );
        let (routes, routed) = both.lists_for(&Condition::no_leader());
        assert!(routed);
        assert_eq!(routes.len(), 2);
        // No other channel: stored on the failing one's list, and said to be unroutable.
        let email_only = Routes {
            email: Some(ops.clone()),
            webhook: None,
        };
        let (routes, routed) =
            email_only.lists_for(&Condition::channel_failing(NotificationType::Email));
        assert!(!routed);
        assert_eq!(routes[0].list, ops);
        let (_, routed) =
            email_only.lists_for(&Condition::channel_failing(NotificationType::Webhook));
        assert!(routed);
    }

    #[test]
    fn a_rise_counts_within_the_window_and_is_trusted_once_covered() {
        let mut parked = RiseWindow::new(Duration::from_secs(60));
        assert_eq!(
            parked.record(t(0), 100),
            Rise {
                by: 0,
                covered: false
            }
        );
        assert_eq!(
            parked.record(t(30), 104),
            Rise {
                by: 4,
                covered: false
            }
        );
        assert_eq!(
            parked.record(t(59), 112),
            Rise {
                by: 12,
                covered: false
            }
        );
        // The sample at 0 has left the window; 104 is the lowest within it.
        assert_eq!(
            parked.record(t(61), 112),
            Rise {
                by: 8,
                covered: true
            }
        );
        // Operators retried rows: the count fell, and a rise is counted from the low point.
        assert_eq!(
            parked.record(t(70), 50),
            Rise {
                by: 0,
                covered: true
            }
        );
        assert_eq!(
            parked.record(t(80), 53),
            Rise {
                by: 3,
                covered: true
            }
        );
        assert_eq!(
            parked.record(t(200), 53),
            Rise {
                by: 0,
                covered: true
            }
        );
    }

    #[test]
    fn a_streak_of_transient_failures_makes_a_channel_failing_until_a_delivery() {
        let email = NotificationType::Email;
        let quiet = Duration::from_secs(600);
        let mut streak = ChannelStreak::default();
        // A node just started, nothing attempted: cannot tell yet; later, idle is clear.
        assert_eq!(
            streak.reading(email, t(10), 3, quiet, t(0)),
            Reading::Unknown
        );
        assert_eq!(
            streak.reading(email, t(700), 3, quiet, t(0)),
            Reading::Clear
        );
        streak.record(AttemptOutcome::TransientFailure, t(1));
        streak.record(AttemptOutcome::TransientFailure, t(2));
        assert_eq!(
            streak.reading(email, t(3), 3, quiet, t(0)),
            Reading::Unknown
        );
        // A refused address and an unsent attempt say nothing about the relay.
        streak.record(AttemptOutcome::PermanentFailure, t(3));
        streak.record(AttemptOutcome::NotSent, t(3));
        streak.record(AttemptOutcome::TransientFailure, t(4));
        let Reading::Active { since, detail } = streak.reading(email, t(5), 3, quiet, t(0)) else {
            panic!("three in a row");
        };
        assert_eq!(since, t(1));
        assert!(detail.contains("last 3 Email"), "{detail}");
        // Idle for the quiet time: its waiting rows are judged by their age instead.
        assert_eq!(
            streak.reading(email, t(700), 3, quiet, t(0)),
            Reading::Clear
        );
        streak.record(AttemptOutcome::Delivered, t(6));
        assert_eq!(streak.reading(email, t(7), 3, quiet, t(0)), Reading::Clear);
        assert_eq!(streak.consecutive_failures, 0);
    }

    #[test]
    fn readings_combine_active_first() {
        let a = || Reading::Active {
            since: t(5),
            detail: "a".into(),
        };
        let b = Reading::Active {
            since: t(3),
            detail: "b".into(),
        };
        assert_eq!(
            a().either(b),
            Reading::Active {
                since: t(3),
                detail: "a\nb".into()
            }
        );
        assert_eq!(a().either(Reading::Unknown), a());
        assert_eq!(Reading::Clear.either(a()), a());
        assert_eq!(Reading::Clear.either(Reading::Clear), Reading::Clear);
        assert_eq!(Reading::Clear.either(Reading::Unknown), Reading::Unknown);
    }
}
