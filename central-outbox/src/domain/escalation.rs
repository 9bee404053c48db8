//! Escalation until someone answers: a list's policy (who is paged after whom, how long each
//! page waits for an acknowledgement, how often the whole callout repeats), an incident's place
//! in it, and the one rule that says which page is due when.
//!
//! A notification of a list with a policy, at one of the policy's priorities, opens an incident
//! (a keyed one joins the open incident of its condition key, list and site instead). The
//! notification itself is the incident's first page: **step 1**, whose list is the list it was
//! sent to. The policy's further steps each page their lists after the previous page's wait ran
//! out without an acknowledgement. After the last step's wait the callout repeats from
//! `repeat_from_step`, `repeat` more times; after the last wait of the last round the incident is
//! exhausted (still open to an acknowledgement, with nobody left to page).
//!
//! ```text
//! round 0:  step 1 (the alarm, its own list) --wait--> step 2 --wait--> step 3 --wait-->
//! round 1:  step k (repeat_from_step) --wait--> ... step 3 --wait--> ... exhausted
//! ```
//!
//! Times are the store's clock, and the schedule lives in rows, never in memory. A page due at
//! `due` that fires within [`LATE_AFTER`] of it counts the next wait from `due`, so the cadence
//! holds; one that fires later (the dispatcher was down) counts from when it fired, so after an
//! outage an incident advances one page, not one per wait it missed, and its history says how
//! late the page was.
//!
//! An open incident keeps the policy it opened under (a snapshot): an edit of the list's policy
//! applies to incidents opened after it.

use std::fmt;
use std::time::Duration;

use chrono::{DateTime, Utc};

use super::history::Actor;
use super::{ContentError, ListName, Priority};

/// Limits of a policy, with why.
pub mod limits {
    use std::time::Duration;

    /// Steps after the alarm's own page: a callout of nine pages is already long; more would
    /// be a list of lists, not an escalation.
    pub const MAX_STEPS: usize = 8;
    /// Lists one step pages at once.
    pub const MAX_LISTS_PER_STEP: usize = 8;
    /// Rounds after the first (the issue's "repeated R times").
    pub const MAX_REPEAT: u32 = 9;
    /// A page waits at least this long for an acknowledgement (shorter waits page the next
    /// person before the first could read the mail), and at most a day.
    pub const MIN_WAIT: Duration = Duration::from_secs(1);
    pub const MAX_WAIT: Duration = Duration::from_secs(24 * 3600);
    /// The acknowledgement reminder: at least a minute, at most a week.
    pub const MIN_REMINDER: Duration = Duration::from_secs(60);
    pub const MAX_REMINDER: Duration = Duration::from_secs(7 * 24 * 3600);
}

/// A page that fires this much after its due time or more is late: the next wait counts from
/// when it fired, and its history says how late it was. Well over the escalation clock's own
/// error (it reads the next due time at least once a second) and well under any sensible wait.
pub const LATE_AFTER: Duration = Duration::from_secs(10);

/// The priorities a policy applies to when it names none: the alarms somebody must take.
pub const DEFAULT_PRIORITIES: [Priority; 2] = [Priority::Critical, Priority::High];

/// One step after the alarm's own page: notify these lists, then wait for an acknowledgement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EscalationStep {
    pub notify: Vec<ListName>,
    pub wait: Duration,
}

/// A policy as the config file, the admin API or the console give it, before checking.
#[derive(Debug, Clone, Default)]
pub struct PolicyInput {
    /// Empty: [`DEFAULT_PRIORITIES`].
    pub priorities: Vec<Priority>,
    /// How long the alarm's own page (step 1) waits.
    pub acknowledge_within: Duration,
    /// Steps 2, 3, ...: list names and the wait after each.
    pub steps: Vec<(Vec<String>, Duration)>,
    pub repeat: u32,
    /// `None`: 1 (the alarm's own list is paged again).
    pub repeat_from_step: Option<u32>,
    /// `None`: true.
    pub escalate_on_park: Option<bool>,
    pub acknowledgement_reminder: Option<Duration>,
    /// `None`: false.
    pub notify_acknowledgement: Option<bool>,
}

/// A list's escalation policy, checked. See the module docs for how it runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EscalationPolicy {
    /// Most urgent first, each once; never Low.
    priorities: Vec<Priority>,
    acknowledge_within: Duration,
    steps: Vec<EscalationStep>,
    repeat: u32,
    repeat_from_step: u32,
    escalate_on_park: bool,
    acknowledgement_reminder: Option<Duration>,
    notify_acknowledgement: bool,
}

/// Where a page stands in its policy: which round (0 is the first pass) and which step (1 is
/// the alarm's own list).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PagePlace {
    pub round: u32,
    pub step: u32,
}

impl PagePlace {
    /// The alarm itself.
    pub const FIRST: PagePlace = PagePlace { round: 0, step: 1 };
}

impl fmt::Display for PagePlace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "step {} of round {}", self.step, self.round + 1)
    }
}

/// Whom a step pages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StepTargets<'a> {
    /// Step 1: the list the alarm was sent to.
    AlarmList,
    Lists(&'a [ListName]),
}

/// What an incident waits for next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    Page(PagePlace),
    /// Nobody is left to page: at the due time the incident is exhausted.
    Exhaust,
}

/// The next thing due for an open incident, and when.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Scheduled {
    pub next: Next,
    pub due_at: DateTime<Utc>,
}

fn within(
    field: &'static str,
    what: &str,
    value: Duration,
    min: Duration,
    max: Duration,
) -> Result<(), ContentError> {
    if value < min || value > max {
        return Err(ContentError::new(
            field,
            format!(
                "{what}{} is out of range: must be between {} and {}",
                humantime::format_duration(value),
                humantime::format_duration(min),
                humantime::format_duration(max)
            ),
        ));
    }
    if value.subsec_nanos() != 0 {
        return Err(ContentError::new(
            field,
            format!("{what}must be a whole number of seconds"),
        ));
    }
    Ok(())
}

impl EscalationPolicy {
    /// Checks a policy. Errors name the field (`escalation.priorities`,
    /// `escalation.acknowledge_within`, `escalation.steps` with the step's number,
    /// `escalation.repeat`, `escalation.repeat_from_step`,
    /// `escalation.acknowledgement_reminder`) and the limit.
    pub fn parse(input: PolicyInput) -> Result<Self, ContentError> {
        let mut priorities = if input.priorities.is_empty() {
            DEFAULT_PRIORITIES.to_vec()
        } else {
            input.priorities
        };
        if priorities.contains(&Priority::Low) {
            return Err(ContentError::new(
                "escalation.priorities",
                "low never escalates: name critical, high or normal",
            ));
        }
        priorities.sort_by_key(|p| p.rank());
        priorities.dedup();
        within(
            "escalation.acknowledge_within",
            "",
            input.acknowledge_within,
            limits::MIN_WAIT,
            limits::MAX_WAIT,
        )?;
        if input.steps.len() > limits::MAX_STEPS {
            return Err(ContentError::new(
                "escalation.steps",
                format!(
                    "{} given, at most {} allowed (after the alarm's own page)",
                    input.steps.len(),
                    limits::MAX_STEPS
                ),
            ));
        }
        let mut steps = Vec::with_capacity(input.steps.len());
        for (i, (names, wait)) in input.steps.into_iter().enumerate() {
            // Step 1 is the alarm's own page; the first step given is step 2.
            let number = i + 2;
            if names.is_empty() || names.len() > limits::MAX_LISTS_PER_STEP {
                return Err(ContentError::new(
                    "escalation.steps",
                    format!(
                        "step {number}: names {} lists, must name 1 to {}",
                        names.len(),
                        limits::MAX_LISTS_PER_STEP
                    ),
                ));
            }
            let mut notify = Vec::with_capacity(names.len());
            for name in names {
                let list = ListName::parse(name).map_err(|e| {
                    ContentError::new("escalation.steps", format!("step {number}: {}", e.problem))
                })?;
                if notify.contains(&list) {
                    return Err(ContentError::new(
                        "escalation.steps",
                        format!("step {number}: names list {list} twice"),
                    ));
                }
                notify.push(list);
            }
            within(
                "escalation.steps",
                &format!("step {number}: wait "),
                wait,
                limits::MIN_WAIT,
                limits::MAX_WAIT,
            )?;
            steps.push(EscalationStep { notify, wait });
        }
        if input.repeat > limits::MAX_REPEAT {
            return Err(ContentError::new(
                "escalation.repeat",
                format!("must be between 0 and {}", limits::MAX_REPEAT),
            ));
        }
        let step_count = 1 + steps.len() as u32;
        let repeat_from_step = input.repeat_from_step.unwrap_or(1);
        if !(1..=step_count).contains(&repeat_from_step) {
            return Err(ContentError::new(
                "escalation.repeat_from_step",
                format!("must be a step of the policy, 1 to {step_count}"),
            ));
        }
        if let Some(reminder) = input.acknowledgement_reminder {
            within(
                "escalation.acknowledgement_reminder",
                "",
                reminder,
                limits::MIN_REMINDER,
                limits::MAX_REMINDER,
            )?;
        }
        Ok(Self {
            priorities,
            acknowledge_within: input.acknowledge_within,
            steps,
            repeat: input.repeat,
            repeat_from_step,
            escalate_on_park: input.escalate_on_park.unwrap_or(true),
            acknowledgement_reminder: input.acknowledgement_reminder,
            notify_acknowledgement: input.notify_acknowledgement.unwrap_or(false),
        })
    }

    /// The policy as input again (what the stores and the admin API write out); parsing it
    /// gives this policy back.
    pub fn to_input(&self) -> PolicyInput {
        PolicyInput {
            priorities: self.priorities.clone(),
            acknowledge_within: self.acknowledge_within,
            steps: self
                .steps
                .iter()
                .map(|s| {
                    (
                        s.notify.iter().map(|l| l.as_str().to_owned()).collect(),
                        s.wait,
                    )
                })
                .collect(),
            repeat: self.repeat,
            repeat_from_step: Some(self.repeat_from_step),
            escalate_on_park: Some(self.escalate_on_park),
            acknowledgement_reminder: self.acknowledgement_reminder,
            notify_acknowledgement: Some(self.notify_acknowledgement),
        }
    }

    pub fn priorities(&self) -> &[Priority] {
        &self.priorities
    }

    /// Whether a notification of `priority` opens an incident under this policy.
    pub fn applies_to(&self, priority: Priority) -> bool {
        self.priorities.contains(&priority)
    }

    pub fn acknowledge_within(&self) -> Duration {
        self.acknowledge_within
    }

    /// Steps 2, 3, ... (step 1 is the alarm's own page).
    pub fn steps(&self) -> &[EscalationStep] {
        &self.steps
    }

    pub fn repeat(&self) -> u32 {
        self.repeat
    }

    pub fn repeat_from_step(&self) -> u32 {
        self.repeat_from_step
    }

    /// Whether a page whose delivery parks moves the incident to its next page at once.
    pub fn escalate_on_park(&self) -> bool {
        self.escalate_on_park
    }

    /// How long after an acknowledgement an incident whose condition is not cleared pages
    /// again from step 1; `None`: never.
    pub fn acknowledgement_reminder(&self) -> Option<Duration> {
        self.acknowledgement_reminder
    }

    /// Whether the first acknowledgement is announced to every list the incident reached (its
    /// messages delivered, or being delivered): "acknowledged by X", so nobody else gets up.
    pub fn notify_acknowledgement(&self) -> bool {
        self.notify_acknowledgement
    }

    /// Steps in one round, the alarm's own page included.
    pub fn step_count(&self) -> u32 {
        1 + self.steps.len() as u32
    }

    /// Whom `step` pages. A step past the policy's last (a damaged snapshot) pages nobody.
    pub fn targets(&self, step: u32) -> StepTargets<'_> {
        match step {
            1 => StepTargets::AlarmList,
            n => StepTargets::Lists(
                self.steps
                    .get(n as usize - 2)
                    .map_or(&[][..], |s| &s.notify[..]),
            ),
        }
    }

    /// How long `step`'s page waits for an acknowledgement.
    pub fn wait_after(&self, step: u32) -> Duration {
        match step {
            1 => self.acknowledge_within,
            n => self
                .steps
                .get(n as usize - 2)
                .map_or(self.acknowledge_within, |s| s.wait),
        }
    }

    /// The page after `page`, or `None` when it was the last of the last round.
    pub fn following(&self, page: PagePlace) -> Option<PagePlace> {
        if page.step < self.step_count() {
            Some(PagePlace {
                round: page.round,
                step: page.step + 1,
            })
        } else if page.round < self.repeat {
            Some(PagePlace {
                round: page.round + 1,
                step: self.repeat_from_step,
            })
        } else {
            None
        }
    }

    /// `page` fired at `fired_at` (the schedule's time, see [`schedule_time`]): what the
    /// incident waits for next, and until when.
    pub fn after(&self, page: PagePlace, fired_at: DateTime<Utc>) -> Scheduled {
        Scheduled {
            next: self.following(page).map_or(Next::Exhaust, Next::Page),
            due_at: fired_at + self.wait_after(page.step),
        }
    }

    /// Every page an incident opened at `opened_at` fires if nobody acknowledges it and every
    /// page fires on time, and when the incident is exhausted: the whole callout, as the
    /// console and the docs show it.
    pub fn timeline(
        &self,
        opened_at: DateTime<Utc>,
    ) -> (Vec<(PagePlace, DateTime<Utc>)>, DateTime<Utc>) {
        let mut pages = vec![(PagePlace::FIRST, opened_at)];
        let mut scheduled = self.after(PagePlace::FIRST, opened_at);
        while let Next::Page(page) = scheduled.next {
            pages.push((page, scheduled.due_at));
            scheduled = self.after(page, scheduled.due_at);
        }
        (pages, scheduled.due_at)
    }
}

/// The time a page due at `due_at` and firing at `now` counts its wait from, and how late it
/// is if it is late: on time (under [`LATE_AFTER`] after its due time, or early) the due time,
/// late the firing time.
pub fn schedule_time(
    due_at: DateTime<Utc>,
    now: DateTime<Utc>,
) -> (DateTime<Utc>, Option<Duration>) {
    let behind = (now - due_at).to_std().unwrap_or_default();
    if behind >= LATE_AFTER {
        (now, Some(behind))
    } else {
        (due_at, None)
    }
}

/// Where an incident is in its life.
///
/// ```text
/// Open --acknowledged--> Acknowledged --reminder (not cleared)--> Open
/// Open --no page left--> Exhausted --acknowledged--> Acknowledged
/// Open / Acknowledged / Exhausted --condition cleared--> Cleared
/// Open / Acknowledged / Exhausted --alarm discarded--> Discarded
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IncidentStatus {
    Open,
    Acknowledged,
    /// Every page went out and nobody acknowledged; an acknowledgement is still taken.
    Exhausted,
    /// Final: its condition was cleared.
    Cleared,
    /// Final: an operator discarded its alarm.
    Discarded,
}

impl IncidentStatus {
    pub const ALL: [IncidentStatus; 5] = [
        Self::Open,
        Self::Acknowledged,
        Self::Exhausted,
        Self::Cleared,
        Self::Discarded,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Open => "Open",
            Self::Acknowledged => "Acknowledged",
            Self::Exhausted => "Exhausted",
            Self::Cleared => "Cleared",
            Self::Discarded => "Discarded",
        }
    }

    pub fn from_db(text: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|s| s.as_str() == text)
    }

    /// Cleared and Discarded: nothing reopens it; an acknowledgement is recorded, late.
    pub fn is_final(self) -> bool {
        matches!(self, Self::Cleared | Self::Discarded)
    }

    /// Whether an acknowledgement now is the first: the incident is still waiting for one.
    pub fn takes_acknowledgement(self) -> bool {
        matches!(self, Self::Open | Self::Exhausted)
    }
}

impl fmt::Display for IncidentStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How an acknowledgement reached central.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AckMeans {
    /// The link in a page (mail or webhook message), POSTed from its page.
    Link,
    /// The web console.
    Console,
    /// `NotificationOutbox/AcknowledgeIncident` (grpcurl, `outboxctl`).
    Api,
    /// `SiteNotify/Acknowledge` at the plant, forwarded by the site.
    Site,
}

impl AckMeans {
    pub const ALL: [AckMeans; 4] = [Self::Link, Self::Console, Self::Api, Self::Site];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Link => "link",
            Self::Console => "console",
            Self::Api => "api",
            Self::Site => "site",
        }
    }

    pub fn from_db(text: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|m| m.as_str() == text)
    }
}

/// Longest address recorded with an acknowledgement, in characters (an IPv6 address with a
/// port is under 50; the rest is a label).
pub const MAX_FROM_CHARS: usize = 128;

/// The number operators see and type for an incident.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct IncidentId(pub i64);

impl fmt::Display for IncidentId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// The incident a notification belongs to, as its delivery names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IncidentRef {
    pub id: IncidentId,
    /// 1: the alarm; 2, 3, ...: a page's message; `None`: a joined notification.
    pub page_no: Option<u32>,
}

impl IncidentRef {
    /// The lines a message of the incident ends with: what it is and how to stop it, with its
    /// acknowledgement link (URL and expiry) first where the message carries one.
    pub fn footer(&self, link: Option<(&str, DateTime<Utc>)>) -> String {
        let what = match self.page_no {
            Some(1) | None => format!("This alarm escalates as incident {}", self.id),
            Some(page) => format!(
                "Escalation: page {page} of incident {}, sent because nobody has acknowledged it",
                self.id
            ),
        };
        let other_ways = format!(
            "`outboxctl ack {}`, or the console's Incidents page",
            self.id
        );
        match link {
            None => format!("{what}. Acknowledge it to stop the escalation: {other_ways}."),
            Some((url, expires)) => format!(
                "{what}. Acknowledge it to stop the escalation:\n{url}\n(the link works until \
                 {} UTC), or {other_ways}.",
                expires.format("%Y-%m-%d %H:%M")
            ),
        }
    }
}

/// The lines a digest holding alarms of `incidents` ends with: which incidents, and how to stop
/// them all at once, with the digest's link (URL, expiry, and how many of them it covers) where
/// the message carries one.
pub fn digest_footer(
    incidents: &[IncidentId],
    link: Option<(&str, DateTime<Utc>, usize)>,
) -> String {
    let numbers = incidents
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ");
    let what = match incidents {
        [one] => format!("This digest holds an alarm of escalating incident {one}"),
        _ => format!("This digest holds alarms of escalating incidents {numbers}"),
    };
    let other_ways = "`outboxctl ack N` for each, or the console's Incidents page";
    match link {
        None => format!("{what}. Acknowledge them to stop their escalation: {other_ways}."),
        Some((url, expires, covered)) => {
            let covers = if covered < incidents.len() {
                format!("; it covers the first {covered}")
            } else {
                String::new()
            };
            format!(
                "{what}. Acknowledge them all at once to stop their escalation:\n{url}\n(the \
                 link works until {} UTC{covers}), or {other_ways}.",
                expires.format("%Y-%m-%d %H:%M")
            )
        }
    }
}

/// Who acknowledged, how, and from where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Acknowledgement {
    /// The authenticated caller, the link's recipient, or the site (`site <id>`).
    pub actor: Actor,
    pub means: AckMeans,
    /// The address it came from (a link's client, a caller's peer), where there is one; cut to
    /// [`MAX_FROM_CHARS`].
    from: Option<String>,
}

impl Acknowledgement {
    pub fn new(actor: Actor, means: AckMeans, from: Option<&str>) -> Self {
        let from = from
            .map(|f| {
                f.chars()
                    .filter(|c| !c.is_control())
                    .take(MAX_FROM_CHARS)
                    .collect::<String>()
            })
            .filter(|f| !f.is_empty());
        Self { actor, means, from }
    }

    pub fn from(&self) -> Option<&str> {
        self.from.as_deref()
    }
}

/// What an acknowledgement did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AckResult {
    /// The first: the escalation stopped; `stopped` step notifications not yet handed to the
    /// relay ended.
    Acknowledged { stopped: u32 },
    /// Somebody was first; recorded as a duplicate.
    AlreadyAcknowledged {
        by: String,
        means: AckMeans,
        at: DateTime<Utc>,
    },
    /// The incident had ended (cleared or discarded); recorded as late, nothing reopened.
    AlreadyEnded {
        status: IncidentStatus,
        at: DateTime<Utc>,
    },
    /// No such incident.
    NotFound,
}

/// One entry of an incident's history, as stored (`IncidentHistory.Kind`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IncidentEvent {
    /// The alarm opened it (step 1).
    Opened,
    /// A keyed notification of the same condition joined it.
    Joined,
    /// A step paged its lists.
    Paged,
    /// A step's list could not be paged (it no longer exists, or is of no channel).
    Skipped,
    /// A page's delivery parked and the policy escalates at once.
    Escalated,
    Acknowledged,
    /// An acknowledgement after the first.
    AcknowledgedAgain,
    /// An acknowledgement after the incident ended.
    AcknowledgedLate,
    /// The reminder: acknowledged, not cleared, paging again from step 1.
    Reminded,
    Exhausted,
    Cleared,
    Discarded,
}

impl IncidentEvent {
    pub const ALL: [IncidentEvent; 12] = [
        Self::Opened,
        Self::Joined,
        Self::Paged,
        Self::Skipped,
        Self::Escalated,
        Self::Acknowledged,
        Self::AcknowledgedAgain,
        Self::AcknowledgedLate,
        Self::Reminded,
        Self::Exhausted,
        Self::Cleared,
        Self::Discarded,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Opened => "Opened",
            Self::Joined => "Joined",
            Self::Paged => "Paged",
            Self::Skipped => "Skipped",
            Self::Escalated => "Escalated",
            Self::Acknowledged => "Acknowledged",
            Self::AcknowledgedAgain => "AcknowledgedAgain",
            Self::AcknowledgedLate => "AcknowledgedLate",
            Self::Reminded => "Reminded",
            Self::Exhausted => "Exhausted",
            Self::Cleared => "Cleared",
            Self::Discarded => "Discarded",
        }
    }

    pub fn from_db(text: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|e| e.as_str() == text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(n: u64) -> Duration {
        Duration::from_secs(n)
    }

    fn input(steps: &[(&[&str], u64)]) -> PolicyInput {
        PolicyInput {
            acknowledge_within: secs(600),
            steps: steps
                .iter()
                .map(|(lists, wait)| (lists.iter().map(|l| (*l).to_owned()).collect(), secs(*wait)))
                .collect(),
            ..PolicyInput::default()
        }
    }

    fn at(s: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_800_000_000 + s, 0).unwrap()
    }

    #[test]
    fn defaults_are_critical_and_high_escalate_on_park_and_repeat_from_the_alarm() {
        let policy = EscalationPolicy::parse(input(&[(&["supervisors"], 900)])).unwrap();
        assert_eq!(policy.priorities(), &[Priority::Critical, Priority::High]);
        assert!(policy.applies_to(Priority::High));
        assert!(!policy.applies_to(Priority::Normal));
        assert!(policy.escalate_on_park());
        assert_eq!(policy.repeat_from_step(), 1);
        assert_eq!(policy.acknowledgement_reminder(), None);
        assert_eq!(EscalationPolicy::parse(policy.to_input()).unwrap(), policy);
    }

    #[test]
    fn each_bad_field_is_named_with_its_limit() {
        let refused = |change: &dyn Fn(&mut PolicyInput)| {
            let mut bad = input(&[(&["supervisors"], 900)]);
            change(&mut bad);
            EscalationPolicy::parse(bad).unwrap_err()
        };
        let e = refused(&|p| p.priorities = vec![Priority::Low]);
        assert_eq!(e.field, "escalation.priorities");
        let e = refused(&|p| p.acknowledge_within = Duration::ZERO);
        assert_eq!(e.field, "escalation.acknowledge_within");
        assert!(e.problem.contains("between 1s and 1day"), "{}", e.problem);
        let e = refused(&|p| p.acknowledge_within = Duration::from_millis(1500));
        assert!(
            e.problem.contains("whole number of seconds"),
            "{}",
            e.problem
        );
        let e = refused(&|p| p.steps[0].1 = secs(90_000));
        assert_eq!(e.field, "escalation.steps");
        assert!(e.problem.starts_with("step 2: wait"), "{}", e.problem);
        let e = refused(&|p| p.steps.push((vec![], secs(60))));
        assert!(
            e.problem.starts_with("step 3: names 0 lists"),
            "{}",
            e.problem
        );
        let e = refused(&|p| p.steps[0].0.push("supervisors".into()));
        assert!(e.problem.contains("twice"), "{}", e.problem);
        let e = refused(&|p| p.steps[0].0[0] = String::new());
        assert!(e.problem.starts_with("step 2: "), "{}", e.problem);
        let e = refused(&|p| p.steps = vec![(vec!["a".into()], secs(60)); limits::MAX_STEPS + 1]);
        assert!(e.problem.contains("at most 8"), "{}", e.problem);
        let e = refused(&|p| p.repeat = limits::MAX_REPEAT + 1);
        assert_eq!(e.field, "escalation.repeat");
        let e = refused(&|p| p.repeat_from_step = Some(3));
        assert_eq!(e.field, "escalation.repeat_from_step");
        assert!(e.problem.contains("1 to 2"), "{}", e.problem);
        let e = refused(&|p| p.repeat_from_step = Some(0));
        assert_eq!(e.field, "escalation.repeat_from_step");
        let e = refused(&|p| p.acknowledgement_reminder = Some(secs(59)));
        assert_eq!(e.field, "escalation.acknowledgement_reminder");
    }

    #[test]
    fn priorities_are_kept_most_urgent_first_once_each() {
        let mut given = input(&[]);
        given.priorities = vec![Priority::Normal, Priority::Critical, Priority::Normal];
        let policy = EscalationPolicy::parse(given).unwrap();
        assert_eq!(policy.priorities(), &[Priority::Critical, Priority::Normal]);
    }

    #[test]
    fn the_callout_runs_its_steps_then_repeats_from_the_chosen_step_then_exhausts() {
        let mut given = input(&[(&["supervisors"], 900), (&["manager", "pager"], 300)]);
        given.repeat = 2;
        given.repeat_from_step = Some(2);
        let policy = EscalationPolicy::parse(given).unwrap();
        let (pages, exhausted) = policy.timeline(at(0));
        let got: Vec<(u32, u32, i64)> = pages
            .iter()
            .map(|(p, t)| (p.round, p.step, (*t - at(0)).num_seconds()))
            .collect();
        assert_eq!(
            got,
            vec![
                (0, 1, 0),
                (0, 2, 600),
                (0, 3, 1500),
                (1, 2, 1800),
                (1, 3, 2700),
                (2, 2, 3000),
                (2, 3, 3900),
            ]
        );
        assert_eq!((exhausted - at(0)).num_seconds(), 4200);
        assert_eq!(
            policy.targets(3),
            StepTargets::Lists(&[
                ListName::parse("manager".into()).unwrap(),
                ListName::parse("pager".into()).unwrap()
            ])
        );
        assert_eq!(policy.targets(1), StepTargets::AlarmList);
    }

    #[test]
    fn a_policy_of_the_alarm_alone_exhausts_after_its_wait_or_repeats_it() {
        let policy = EscalationPolicy::parse(input(&[])).unwrap();
        assert_eq!(
            policy.after(PagePlace::FIRST, at(0)),
            Scheduled {
                next: Next::Exhaust,
                due_at: at(600)
            }
        );
        let mut again = input(&[]);
        again.repeat = 1;
        let policy = EscalationPolicy::parse(again).unwrap();
        assert_eq!(
            policy.after(PagePlace::FIRST, at(0)).next,
            Next::Page(PagePlace { round: 1, step: 1 })
        );
    }

    #[test]
    fn a_page_on_time_keeps_the_cadence_and_a_late_one_counts_from_when_it_fired() {
        assert_eq!(schedule_time(at(100), at(100)), (at(100), None));
        assert_eq!(schedule_time(at(100), at(109)), (at(100), None));
        // Early (another replica's clock): still the due time.
        assert_eq!(schedule_time(at(100), at(95)), (at(100), None));
        assert_eq!(schedule_time(at(100), at(110)), (at(110), Some(secs(10))));
        assert_eq!(
            schedule_time(at(100), at(4000)),
            (at(4000), Some(secs(3900)))
        );
    }

    #[test]
    fn an_outage_advances_an_incident_one_page_not_one_per_missed_wait() {
        let policy = EscalationPolicy::parse(input(&[(&["b"], 60), (&["c"], 60)])).unwrap();
        // Step 2 was due at 600; the dispatcher came back at 3600.
        let (from, late) = schedule_time(at(600), at(3600));
        assert_eq!(late, Some(secs(3000)));
        let next = policy.after(PagePlace { round: 0, step: 2 }, from);
        assert_eq!(next.next, Next::Page(PagePlace { round: 0, step: 3 }));
        assert_eq!(next.due_at, at(3660));
    }

    #[test]
    fn names_round_trip() {
        for s in IncidentStatus::ALL {
            assert_eq!(IncidentStatus::from_db(s.as_str()), Some(s));
        }
        for m in AckMeans::ALL {
            assert_eq!(AckMeans::from_db(m.as_str()), Some(m));
        }
        for e in IncidentEvent::ALL {
            assert_eq!(IncidentEvent::from_db(e.as_str()), Some(e));
        }
        assert!(IncidentStatus::Exhausted.takes_acknowledgement());
        assert!(!IncidentStatus::Acknowledged.takes_acknowledgement());
        assert!(IncidentStatus::Cleared.is_final());
    }

    #[test]
    fn an_acknowledgements_address_is_bounded_and_never_empty() {
        let ack = Acknowledgement::new(Actor::new("ann"), AckMeans::Link, Some(&"x".repeat(300)));
        assert_eq!(ack.from().unwrap().len(), MAX_FROM_CHARS);
        let ack = Acknowledgement::new(Actor::new("ann"), AckMeans::Api, Some("\n"));
        assert_eq!(ack.from(), None);
    }
}
