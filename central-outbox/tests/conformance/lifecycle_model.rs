//! A model-based test of the notification lifecycle: a seeded generator drives a store through
//! random sequences of what happens to notifications in production — submits (keyed or not, of
//! every priority, to a consolidating list, with arbitrary Unicode up to the size limits, older
//! or newer by the site's clock, some in one batch), resubmits, clears, claims (by a live node,
//! or by one that dies at once so its claim expires), digest claims, relay outcomes (accepted,
//! 4xx, 5xx, dropped after DATA) also from stale attempts, operator retry and discard, and
//! leader changes — and checks each answer against a small reference model.
//!
//! The model keeps what the store must: each row's status, who holds it, and the ending a
//! supersede or clear recorded for it while it was being delivered. It checks:
//! - every claim hands out only rows that are waiting, due and not being delivered, as many as
//!   were asked for up to what is claimable, and never a row whose condition was superseded or
//!   cleared before the claim (nothing is mailed after that unless its attempt was under way);
//! - an outcome applies exactly when its attempt still holds the row under the leader's epoch;
//! - every status, after every step, is the one the model derives (a supersede or clear ends
//!   Parked rows too, so an operator's retry cannot mail a state the condition has left), and
//!   each ending's history entry names who or what ended it;
//! - when the run ends and the relay accepts everything, every notification is in a final
//!   status, Parked (for an operator), or held by a deposed leader's claim (due again when that
//!   claim expires): nothing is left waiting for ever.
//!
//! `make test` runs a few fixed seeds. `OUTBOX_MODEL_SEED=<n>` replays one seed;
//! `OUTBOX_MODEL_SOAK_SECS=<s>` (`make soak`) runs random seeds for that long, each printed
//! before it starts so a failure can be replayed. The relay's timing is not modelled here: a slow
//! relay is a claim whose outcome comes late (or after the claim expired), which the model does
//! model; the dispatcher's own handling of slow relays is the e2e suite's.

use std::collections::{BTreeSet, HashMap};
use std::time::{Duration, Instant};

use central_outbox::domain::channel::{ListInput, NotificationList};
use central_outbox::domain::consolidation::Consolidation;
use central_outbox::domain::delivery::{AttemptOutcome, Delivered, DeliveryError};
use central_outbox::domain::history::{Actor, HistoryEvent, OperatorAction};
use central_outbox::domain::retry::{Backoff, RetryPolicy};
use central_outbox::domain::serve_order::ClaimLanes;
use central_outbox::domain::status::Status;
use central_outbox::domain::{
    ConditionKey, NotificationContent, NotificationId, NotificationType, Priority, SiteId,
    Submission,
};
use central_outbox::records::{
    AttemptRecord, ClaimedNotification, InsertOutcome, LeaseEpoch, NewNotification,
};
use central_outbox::store::OutboxStore;
use chrono::{DateTime, Utc};
use outbox_domain::ScriptOrigin;
use outbox_domain::limits::{MAX_BODY_BYTES, MAX_SUBJECT_CHARS};

use crate::poll::Asks;

const LEASE: &str = "dispatcher";
/// Two dispatcher nodes take turns holding the lease.
const NODES: [&str; 2] = ["node-a", "node-b"];
const PLAIN: &str = "ops";
/// More than 2 arrivals a second are held, digests of at most 3.
const FLOOD: &str = "flood";
const KEYS: [&str; 3] = ["tank4.level", "pump7.trip", "door.open"];
/// A live node's claim: it outlasts any run (a soak's too: a deposed node's claims must not
/// expire into a later case), so it is "being delivered" until its outcome.
const LIVE_CLAIM: Duration = Duration::from_secs(30 * 24 * 3600);
/// A node that dies as it claims: its claim has expired by the next step.
const DEAD_CLAIM: Duration = Duration::from_millis(1);
/// The stores keep milliseconds: an expiry has passed for them once the clock has left its
/// millisecond, so the model waits this much beyond it.
const STORE_TICK: Duration = Duration::from_millis(2);
const MAX_RETRIES: i64 = 2;
/// The seeds `make test` runs: two plain draws, and one whose batch holds two rows of one
/// condition at the same site time (the later in the batch wins).
const DEFAULT_SEEDS: [u64; 3] = [1, 20_261_128, 16_026_282_969_113_962_710];

/// How a run is sized: the seeds to run and the steps of each.
struct Plan {
    seeds: Vec<u64>,
    steps: usize,
    /// Keep drawing new random seeds until this instant (a soak).
    soak_until: Option<Instant>,
}

impl Plan {
    fn from_env(default_seeds: &[u64], steps: usize) -> Self {
        let var = |name: &str| std::env::var(name).ok().and_then(|v| v.parse::<u64>().ok());
        let steps = var("OUTBOX_MODEL_STEPS").map_or(steps, |s| s as usize);
        if let Some(seed) = var("OUTBOX_MODEL_SEED") {
            return Self {
                seeds: vec![seed],
                steps,
                soak_until: None,
            };
        }
        if let Some(secs) = var("OUTBOX_MODEL_SOAK_SECS") {
            return Self {
                seeds: Vec::new(),
                steps,
                soak_until: Some(Instant::now() + Duration::from_secs(secs)),
            };
        }
        Self {
            seeds: default_seeds.to_vec(),
            steps,
            soak_until: None,
        }
    }
}

/// Runs the model against `store`: the fixed seeds, one replayed seed, or a soak (module docs).
/// Each case uses sites of its own, so the cases share one store without touching each other.
pub(crate) async fn the_lifecycle_matches_its_model<S: OutboxStore>(store: &S) {
    let plan = Plan::from_env(&DEFAULT_SEEDS, 120);
    flood_list(store).await;
    let mut lease = Lease::take(store).await;
    let mut cases = 0u64;
    let mut seeds = plan.seeds.clone().into_iter();
    loop {
        let seed = match plan.soak_until {
            Some(until) if Instant::now() >= until => break,
            Some(_) => fastrand::u64(..),
            None => match seeds.next() {
                Some(seed) => seed,
                None => break,
            },
        };
        eprintln!(
            "lifecycle model: case {cases}, seed {seed}, {} steps (replay: OUTBOX_MODEL_SEED={seed})",
            plan.steps
        );
        let mut case = Case::new(seed, cases, lease);
        for step in 0..plan.steps {
            case.await_lapses().await;
            case.step(store, step).await;
        }
        case.drain(store).await;
        eprintln!("lifecycle model: case {cases} ended {}", case.summary());
        lease = case.lease;
        cases += 1;
    }
    eprintln!("lifecycle model: {cases} cases passed");
}

async fn flood_list<S: OutboxStore>(store: &S) {
    let list = NotificationList::parse(ListInput {
        name: FLOOD.into(),
        recipients: vec!["ops@plant.test".into()],
        consolidation: Some(Consolidation::parse(2, Duration::from_secs(1), 3).unwrap()),
        ..Default::default()
    })
    .unwrap();
    store.upsert_list(list).await.unwrap();
}

/// Which node holds the lease, at which epoch.
#[derive(Debug, Clone, Copy)]
struct Lease {
    node: usize,
    epoch: LeaseEpoch,
}

impl Lease {
    async fn take<S: OutboxStore>(store: &S) -> Self {
        let epoch = store
            .acquire_lease(LEASE, NODES[0], LIVE_CLAIM)
            .await
            .unwrap()
            .expect("the lease is free");
        Self { node: 0, epoch }
    }
}

/// A claim the model knows of: the attempt it started, whether its node is alive, and under
/// which epoch.
#[derive(Debug, Clone)]
struct Claim {
    claimed: ClaimedNotification,
    live: bool,
}

#[derive(Debug)]
struct Row {
    new: NewNotification,
    site: String,
    list: &'static str,
    key: Option<&'static str>,
    site_ms: i64,
    status: Status,
    retry_count: u32,
    /// The row's latest claim (a dead node's too, until the row is claimed again or ends).
    claim: Option<Claim>,
    /// A supersede (by that id) or clear (by that actor) that came while a live claim held it.
    pending_end: Option<(Status, String)>,
    /// Stored yet: the rows of a batch arrive one after another, in batch order.
    arrived: bool,
}

impl Row {
    fn id(&self) -> NotificationId {
        self.new.submission.id
    }

    fn waiting(&self) -> bool {
        matches!(
            self.status,
            Status::Pending | Status::Retrying | Status::Held
        )
    }

    /// Being delivered: claimed by a node that is alive (whether or not it still holds the lease).
    fn held_by_live_claim(&self) -> bool {
        self.waiting() && self.claim.as_ref().is_some_and(|c| c.live)
    }
}

/// Relay answers an attempt can get.
#[derive(Debug, Clone, Copy)]
enum Relay {
    Accept,
    /// 451: try again later.
    Transient,
    /// 550: never.
    Permanent,
    /// The connection dropped after DATA: unknown, so transient.
    DroppedAfterData,
}

struct Case {
    rng: fastrand::Rng,
    seed: u64,
    sites: [String; 2],
    rows: Vec<Row>,
    by_id: HashMap<NotificationId, usize>,
    lease: Lease,
    /// Claims that no longer hold their row (it was claimed again or ended): their outcomes
    /// must be refused.
    stale: Vec<ClaimedNotification>,
    policy: RetryPolicy,
    /// When every dead node's claim and every retry delay the case has started is over: the
    /// model counts those rows claimable, so the next step waits for this (and only then).
    lapses_at: Option<Instant>,
    /// What happened so far, for the failure message.
    log: Vec<String>,
}

impl Case {
    fn new(seed: u64, number: u64, lease: Lease) -> Self {
        Self {
            rng: fastrand::Rng::with_seed(seed),
            seed,
            sites: [format!("m{number}-north"), format!("m{number}-south")],
            rows: Vec::new(),
            by_id: HashMap::new(),
            lease,
            stale: Vec::new(),
            policy: RetryPolicy::clamped(MAX_RETRIES, Duration::from_millis(1), Backoff::Fixed).0,
            lapses_at: None,
            log: Vec::new(),
        }
    }

    /// Something the case started (a dead node's claim, a retry delay) lapses after `wait`.
    fn lapses_after(&mut self, wait: Duration) {
        let at = Instant::now() + wait + STORE_TICK;
        self.lapses_at = Some(self.lapses_at.map_or(at, |later| later.max(at)));
    }

    /// Waits until whatever the case started has lapsed by the stores' clock.
    async fn await_lapses(&mut self) {
        if let Some(at) = self.lapses_at.take() {
            tokio::time::sleep_until(at.into()).await;
        }
    }

    /// How the case's rows ended, and how many endings came while a row was being delivered.
    fn summary(&self) -> String {
        let mut counts: std::collections::BTreeMap<String, usize> = Default::default();
        for row in &self.rows {
            *counts.entry(format!("{:?}", row.status)).or_default() += 1;
            if row.pending_end.is_some() {
                *counts.entry("ended while delivered".into()).or_default() += 1;
            }
        }
        *counts.entry("stale attempts".into()).or_default() += self.stale.len();
        format!("{counts:?}")
    }

    /// The failure context: the seed and the last steps.
    fn ctx(&self) -> String {
        let tail: Vec<&str> = self
            .log
            .iter()
            .rev()
            .take(12)
            .rev()
            .map(String::as_str)
            .collect();
        format!(
            "seed {} (replay: OUTBOX_MODEL_SEED={}); last steps:\n  {}",
            self.seed,
            self.seed,
            tail.join("\n  ")
        )
    }

    async fn step<S: OutboxStore>(&mut self, store: &S, step: usize) {
        match self.rng.u32(0..100) {
            0..=29 => self.submit(store, 1).await,
            30..=35 => {
                let n = self.rng.usize(2..=4);
                self.submit(store, n).await
            }
            36..=38 => self.resubmit(store).await,
            39..=46 => self.clear(store).await,
            47..=64 => self.claim(store).await,
            65..=68 => self.claim_digest(store).await,
            69..=88 => self.outcome(store).await,
            89..=93 => self.operator(store).await,
            94..=95 => self.leader_change(store).await,
            _ => self.deposed_claim(store).await,
        }
        if step % 20 == 19 {
            self.check_all(store).await;
        }
    }

    // ----- submits -----

    fn new_row(&mut self) -> (NewNotification, usize) {
        let site_index = self.rng.usize(0..2);
        let list = if self.rng.u32(0..10) < 3 {
            FLOOD
        } else {
            PLAIN
        };
        let key = (self.rng.u32(0..10) < 7).then(|| KEYS[self.rng.usize(0..KEYS.len())]);
        let priority = [
            Priority::Critical,
            Priority::High,
            Priority::Normal,
            Priority::Low,
        ][self.rng.usize(0..4)];
        // Few distinct site times, so ties and late older rows both happen.
        let base = Utc::now().timestamp_millis() / 1000 * 1000;
        let site_ms = base + 1000 * self.rng.i64(-3..=3);
        let subject = self.text(MAX_SUBJECT_CHARS);
        let body = if self.rng.u32(0..25) == 0 {
            // At the body's byte limit, in multi-byte characters.
            "é".repeat(MAX_BODY_BYTES / "é".len())
        } else {
            self.text(200)
        };
        let content = NotificationContent::parse(
            NotificationType::Email,
            list.into(),
            subject,
            body,
            "".into(),
        )
        .expect("valid content");
        let origin = ScriptOrigin::parse("node-1".into(), "model.py".into(), None, None).unwrap();
        let site = SiteId::parse(self.sites[site_index].clone()).unwrap();
        let at = DateTime::from_timestamp_millis(site_ms).unwrap();
        let new = NewNotification::new(Submission {
            id: NotificationId::generate(),
            content,
            provenance: origin.at_site(site, at),
            priority,
            condition_key: key.map(|k| ConditionKey::parse(k.into(), "condition_key").unwrap()),
            cleared_at_site: None,
            deliver_after: None,
        });
        let row = Row {
            new: new.clone(),
            site: self.sites[site_index].clone(),
            list,
            key,
            site_ms,
            status: Status::Pending,
            retry_count: 0,
            claim: None,
            pending_end: None,
            arrived: false,
        };
        self.rows.push(row);
        let index = self.rows.len() - 1;
        self.by_id.insert(new.submission.id, index);
        (new, index)
    }

    /// Text of 1 to `max` characters drawn from many scripts (and emoji, combining marks,
    /// right-to-left letters), sometimes exactly `max`.
    fn text(&mut self, max: usize) -> String {
        const ALPHABET: &[char] = &[
            'a', 'Z', '7', ' ', '%', 'é', 'ß', 'Ω', 'ж', 'א', 'ع', '漢', '字', 'ひ', '한', '🚨',
            '🔥', '👩', '\u{200d}', '\u{0301}', '𝄞', '∑', '€', '"', '\'', '<', '&',
        ];
        let len = if self.rng.bool() {
            max
        } else {
            self.rng.usize(1..=max)
        };
        // Starting with a letter: a subject must have something to show.
        std::iter::once('x')
            .chain((1..len).map(|_| ALPHABET[self.rng.usize(0..ALPHABET.len())]))
            .collect()
    }

    async fn submit<S: OutboxStore>(&mut self, store: &S, n: usize) {
        let made: Vec<(NewNotification, usize)> = (0..n).map(|_| self.new_row()).collect();
        let batch: Vec<NewNotification> = made.iter().map(|(new, _)| new.clone()).collect();
        self.log.push(format!(
            "submit {}",
            made.iter()
                .map(|(_, i)| self.describe(*i))
                .collect::<Vec<_>>()
                .join(", ")
        ));
        let outcomes = store.submit(batch).await.unwrap();
        assert!(
            outcomes.iter().all(|o| *o == InsertOutcome::Accepted),
            "{outcomes:?}; {}",
            self.ctx()
        );
        for (_, index) in &made {
            self.arrive(*index);
        }
        for (_, index) in &made {
            // Whether a flood row was held depends on its window, which the store's clock
            // decides: the model learns it, and checks it is one of the two.
            if self.rows[*index].list == FLOOD && self.rows[*index].status == Status::Pending {
                let stored = self.stored_status(store, *index).await;
                assert!(
                    matches!(stored, Status::Pending | Status::Held),
                    "flood row stored {stored:?}; {}",
                    self.ctx()
                );
                self.rows[*index].status = stored;
            }
        }
        self.check_rows_of_keys(store, &made.iter().map(|(_, i)| *i).collect::<Vec<_>>())
            .await;
    }

    /// Applies the arrival of row `index` to the model: stale on arrival if a newer row of its
    /// condition exists; otherwise it ends (or marks, if being delivered) the older ones.
    fn arrive(&mut self, index: usize) {
        self.rows[index].arrived = true;
        let Some(key) = self.rows[index].key else {
            return;
        };
        let (site, list, site_ms) = {
            let r = &self.rows[index];
            (r.site.clone(), r.list, r.site_ms)
        };
        let same_condition =
            |r: &Row| r.arrived && r.site == site && r.list == list && r.key == Some(key);
        let newest_later = self
            .rows
            .iter()
            .enumerate()
            .filter(|(i, r)| *i != index && same_condition(r) && r.site_ms > site_ms)
            // The newest by site time, then the latest to arrive.
            .max_by_key(|(i, r)| (r.site_ms, *i))
            .map(|(_, r)| r.id());
        if let Some(newer) = newest_later {
            let row = &mut self.rows[index];
            row.status = Status::Superseded;
            self.log
                .push(format!("  stale on arrival, superseded by {newer}"));
            return;
        }
        let by = self.rows[index].id();
        for (i, row) in self.rows.iter_mut().enumerate() {
            if i == index
                || !same_condition(row)
                || row.site_ms > site_ms
                || !(row.waiting() || row.status == Status::Parked)
            {
                continue;
            }
            if row.held_by_live_claim() {
                row.pending_end = Some((Status::Superseded, by.to_string()));
            } else {
                row.status = Status::Superseded;
                // A dead node's claim no longer holds it.
                self.stale.extend(row.claim.take().map(|c| c.claimed));
            }
        }
    }

    async fn resubmit<S: OutboxStore>(&mut self, store: &S) {
        if self.rows.is_empty() {
            return;
        }
        let index = self.rng.usize(0..self.rows.len());
        self.log.push(format!("resubmit {}", self.describe(index)));
        let outcomes = store
            .submit(vec![self.rows[index].new.clone()])
            .await
            .unwrap();
        assert_eq!(outcomes, [InsertOutcome::Duplicate], "{}", self.ctx());
        self.check_row(store, index).await;
    }

    // ----- clears -----

    async fn clear<S: OutboxStore>(&mut self, store: &S) {
        let site = self.sites[self.rng.usize(0..2)].clone();
        let key = KEYS[self.rng.usize(0..KEYS.len())];
        let actor = format!("site {site}");
        self.log.push(format!("clear {site}/{key}"));
        let mut expected = BTreeSet::new();
        let mut touched = Vec::new();
        for (i, row) in self.rows.iter_mut().enumerate() {
            if row.site != site
                || row.key != Some(key)
                || !(row.waiting() || row.status == Status::Parked)
            {
                continue;
            }
            touched.push(i);
            if row.held_by_live_claim() {
                row.pending_end = Some((Status::Cleared, actor.clone()));
            } else {
                row.status = Status::Cleared;
                self.stale.extend(row.claim.take().map(|c| c.claimed));
                expected.insert(row.id());
            }
        }
        let cleared: BTreeSet<NotificationId> = store
            .clear_condition(
                &SiteId::parse(site).unwrap(),
                &ConditionKey::parse(key.into(), "condition_key").unwrap(),
                Actor::new(&actor),
            )
            .await
            .unwrap()
            .into_iter()
            .collect();
        assert_eq!(cleared, expected, "{}", self.ctx());
        for i in touched {
            self.check_row(store, i).await;
        }
    }

    // ----- claims -----

    /// Rows a claim may take now: waiting (not Held), not being delivered by a live node, due.
    fn claimable(&self) -> BTreeSet<NotificationId> {
        self.rows
            .iter()
            .filter(|r| matches!(r.status, Status::Pending | Status::Retrying))
            .filter(|r| !r.held_by_live_claim())
            .map(Row::id)
            .collect()
    }

    /// A claim of `rows` (each must be claimable, or Held for a digest) by the leader.
    fn take(&mut self, claimed: Vec<ClaimedNotification>, live: bool, held: bool) {
        for c in claimed {
            let index = *self
                .by_id
                .get(&c.id)
                .unwrap_or_else(|| panic!("claimed {} from another case; {}", c.id, self.ctx()));
            let row = &mut self.rows[index];
            let ok = if held {
                row.status == Status::Held && !row.held_by_live_claim()
            } else {
                matches!(row.status, Status::Pending | Status::Retrying)
                    && !row.held_by_live_claim()
            };
            let status = row.status;
            let describe = self.describe(index);
            assert!(
                ok,
                "claimed {describe} ({status:?}, pending end {:?}); {}",
                self.rows[index].pending_end,
                self.ctx()
            );
            assert_eq!(self.rows[index].pending_end, None, "{}", self.ctx());
            let row = &mut self.rows[index];
            if let Some(old) = row.claim.take() {
                self.stale.push(old.claimed);
            }
            row.claim = Some(Claim { claimed: c, live });
        }
    }

    async fn claim<S: OutboxStore>(&mut self, store: &S) {
        let wanted = self.rng.usize(1..=6);
        let longest = self.rng.usize(0..=wanted);
        let lanes = ClaimLanes {
            in_turn: wanted - longest,
            longest_waiting: longest,
        };
        let live = self.rng.u32(0..5) != 0;
        self.log.push(format!(
            "claim {wanted} ({}), {}",
            if live { "live" } else { "node dies" },
            self.claimable().len()
        ));
        let claimable = self.claimable();
        let claimed = store
            .claim_due(
                LEASE,
                self.lease.epoch,
                NotificationType::Email,
                lanes,
                if live { LIVE_CLAIM } else { DEAD_CLAIM },
            )
            .await
            .unwrap();
        if !live {
            self.lapses_after(DEAD_CLAIM);
        }
        assert_eq!(
            claimed.len(),
            wanted.min(claimable.len()),
            "claimed {:?} of {claimable:?}; {}",
            claimed.iter().map(|c| c.id).collect::<Vec<_>>(),
            self.ctx()
        );
        self.take(claimed, live, false);
    }

    async fn claim_digest<S: OutboxStore>(&mut self, store: &S) {
        let live = self.rng.u32(0..5) != 0;
        self.log.push("claim a digest".into());
        let claimed = store
            .claim_digest(
                LEASE,
                self.lease.epoch,
                NotificationType::Email,
                NotificationId::generate(),
                if live { LIVE_CLAIM } else { DEAD_CLAIM },
            )
            .await
            .unwrap();
        if !live {
            self.lapses_after(DEAD_CLAIM);
        }
        self.take(claimed, live, true);
    }

    /// A deposed leader claims: it gets nothing.
    async fn deposed_claim<S: OutboxStore>(&mut self, store: &S) {
        let old = LeaseEpoch(self.lease.epoch.0 - 1);
        self.log.push("claim under a deposed epoch".into());
        let claimed = store
            .claim_due(
                LEASE,
                old,
                NotificationType::Email,
                ClaimLanes::in_turn(10),
                LIVE_CLAIM,
            )
            .await
            .unwrap();
        assert!(claimed.is_empty(), "{}", self.ctx());
    }

    // ----- outcomes -----

    async fn outcome<S: OutboxStore>(&mut self, store: &S) {
        let holding: Vec<usize> = (0..self.rows.len())
            .filter(|i| self.rows[*i].claim.is_some())
            .collect();
        // Now and then a stale attempt answers (a slow relay, or a node that was deposed).
        let from_stale = !self.stale.is_empty() && self.rng.u32(0..5) == 0;
        if holding.is_empty() && !from_stale {
            return;
        }
        let relay = [
            Relay::Accept,
            Relay::Transient,
            Relay::Permanent,
            Relay::DroppedAfterData,
        ][self.rng.usize(0..4)];
        if from_stale {
            let claimed = self.stale[self.rng.usize(0..self.stale.len())].clone();
            self.log
                .push(format!("stale attempt of {} answers {relay:?}", claimed.id));
            let applied = store
                .record_outcome(LEASE, self.record(&claimed, relay))
                .await
                .unwrap();
            assert!(
                !applied,
                "a stale attempt's outcome applied; {}",
                self.ctx()
            );
            let index = self.by_id[&claimed.id];
            self.check_row(store, index).await;
            return;
        }
        let index = holding[self.rng.usize(0..holding.len())];
        let claim = self.rows[index].claim.clone().unwrap();
        let row = &self.rows[index];
        // It still holds the row (else it would be stale) if the row is waiting; and the lease
        // must still be at its epoch.
        let applies = row.waiting() && claim.claimed.epoch == self.lease.epoch;
        self.log.push(format!(
            "attempt of {} answers {relay:?} (applies: {applies})",
            self.describe(index)
        ));
        let record = self.record(&claim.claimed, relay);
        let transition = record.transition.clone();
        let applied = store.record_outcome(LEASE, record).await.unwrap();
        assert_eq!(applied, applies, "{}", self.ctx());
        if let Some(next) = transition.next_attempt_at.filter(|_| applied) {
            self.lapses_after((next - Utc::now()).to_std().unwrap_or_default());
        }
        let row = &mut self.rows[index];
        if applied {
            row.claim = None;
            row.retry_count = transition.retry_count;
            row.status = match (&row.pending_end, transition.status, row.status) {
                (_, Status::Delivered, _) => Status::Delivered,
                (Some((end, _)), _, _) => *end,
                (None, Status::Retrying, Status::Held) => Status::Held,
                (None, status, _) => status,
            };
        } else if !row.waiting() {
            // An ended row's claim is history.
            let old = row.claim.take().unwrap();
            self.stale.push(old.claimed);
        } else {
            // Deposed: the row stays claimed by the deposed node until its claim expires.
            let old = row.claim.clone().unwrap();
            self.stale.push(old.claimed);
        }
        self.check_row(store, index).await;
    }

    fn record(&self, claimed: &ClaimedNotification, relay: Relay) -> AttemptRecord {
        let result: Result<Delivered, DeliveryError> = match relay {
            Relay::Accept => Ok(Delivered {
                resolved_targets: vec!["ops@plant.test".into()],
            }),
            Relay::Transient => Err(DeliveryError::transient("451 4.3.0 try again later")),
            Relay::Permanent => Err(DeliveryError::permanent("550 5.1.1 no such user")),
            Relay::DroppedAfterData => Err(DeliveryError::transient(
                "the connection dropped after DATA; the relay may have taken it",
            )),
        };
        let transition = self
            .policy
            .transition(claimed.retry_count, &result, Utc::now(), 0.5);
        AttemptRecord {
            row_id: claimed.row_id,
            id: claimed.id,
            attempt_no: claimed.attempt_no,
            epoch: claimed.epoch,
            outcome: AttemptOutcome::of(&result),
            error: result.as_ref().err().map(|e| e.message().to_owned()),
            duration: Duration::from_millis(5),
            transition,
            provider: None,
        }
    }

    // ----- operators and leaders -----

    async fn operator<S: OutboxStore>(&mut self, store: &S) {
        if self.rows.is_empty() {
            return;
        }
        // Mostly a Parked row (what operators act on), sometimes any row (refused).
        let parked: Vec<usize> = (0..self.rows.len())
            .filter(|i| self.rows[*i].status == Status::Parked)
            .collect();
        let index = if !parked.is_empty() && self.rng.u32(0..4) != 0 {
            parked[self.rng.usize(0..parked.len())]
        } else {
            self.rng.usize(0..self.rows.len())
        };
        let action = if self.rng.bool() {
            OperatorAction::Retry
        } else {
            OperatorAction::Discard
        };
        self.log
            .push(format!("operator {action:?} {}", self.describe(index)));
        let results = store
            .act_on_ids(
                action,
                vec![self.rows[index].id()],
                Actor::new("operator ana"),
            )
            .await
            .unwrap();
        let row = &mut self.rows[index];
        let applies = row.status == Status::Parked;
        assert_eq!(results.len(), 1);
        assert_eq!(
            results[0].is_ok(),
            applies,
            "{:?}; {}",
            results[0],
            self.ctx()
        );
        if applies {
            let row = &mut self.rows[index];
            match action {
                OperatorAction::Retry => {
                    row.status = Status::Pending;
                    row.retry_count = 0;
                }
                OperatorAction::Discard => row.status = Status::Discarded,
            }
        }
        self.check_row(store, index).await;
    }

    /// The leader steps down and the other node takes the lease: the old epoch's claims are
    /// left to expire, and their outcomes are refused.
    async fn leader_change<S: OutboxStore>(&mut self, store: &S) {
        let old = self.lease;
        self.log
            .push(format!("leader change from {}", NODES[old.node]));
        assert!(
            store
                .release_lease(LEASE, NODES[old.node], old.epoch)
                .await
                .unwrap(),
            "{}",
            self.ctx()
        );
        let node = 1 - old.node;
        let epoch = store
            .acquire_lease(LEASE, NODES[node], LIVE_CLAIM)
            .await
            .unwrap()
            .expect("a released lease is free");
        assert!(epoch.0 > old.epoch.0, "{}", self.ctx());
        self.lease = Lease { node, epoch };
    }

    // ----- checks -----

    fn describe(&self, index: usize) -> String {
        let r = &self.rows[index];
        format!(
            "{} [{} {} {} t{:+}]",
            r.id(),
            r.site,
            r.list,
            r.key.unwrap_or("-"),
            (r.site_ms / 1000) % 100
        )
    }

    async fn stored_status<S: OutboxStore>(&self, store: &S, index: usize) -> Status {
        store
            .state(self.rows[index].id())
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("{} is not stored; {}", self.describe(index), self.ctx()))
            .status
    }

    async fn check_row<S: OutboxStore>(&self, store: &S, index: usize) {
        let stored = self.stored_status(store, index).await;
        let row = &self.rows[index];
        assert_eq!(
            stored,
            row.status,
            "{} (pending end {:?}); {}",
            self.describe(index),
            row.pending_end,
            self.ctx()
        );
    }

    /// The rows of the conditions `indexes` belong to (a submit can end any of them).
    async fn check_rows_of_keys<S: OutboxStore>(&self, store: &S, indexes: &[usize]) {
        let conditions: BTreeSet<(String, &str, Option<&str>)> = indexes
            .iter()
            .map(|i| {
                let r = &self.rows[*i];
                (r.site.clone(), r.list, r.key)
            })
            .collect();
        for (i, r) in self.rows.iter().enumerate() {
            if indexes.contains(&i)
                || (r.key.is_some() && conditions.contains(&(r.site.clone(), r.list, r.key)))
            {
                self.check_row(store, i).await;
            }
        }
    }

    async fn check_all<S: OutboxStore>(&self, store: &S) {
        for i in 0..self.rows.len() {
            self.check_row(store, i).await;
        }
    }

    /// The end of a run: the relay accepts everything and the leader keeps claiming until
    /// nothing is due; then every row must be final, Parked, or held by a deposed node's claim
    /// (due again when it expires), exactly as the model says, with its history telling why.
    async fn drain<S: OutboxStore>(&mut self, store: &S) {
        self.log.push("drain".into());
        // Held rows wait for their window's end.
        let mut asks = Asks::within(Duration::from_secs(60));
        loop {
            asks.next().await;
            // Outcomes for the leader's own live claims.
            let mine: Vec<usize> = (0..self.rows.len())
                .filter(|i| {
                    self.rows[*i]
                        .claim
                        .as_ref()
                        .is_some_and(|c| c.live && c.claimed.epoch == self.lease.epoch)
                        && self.rows[*i].waiting()
                })
                .collect();
            for index in mine {
                let claimed = self.rows[index].claim.clone().unwrap().claimed;
                let applied = store
                    .record_outcome(LEASE, self.record(&claimed, Relay::Accept))
                    .await
                    .unwrap();
                assert!(applied, "{}", self.ctx());
                let row = &mut self.rows[index];
                row.claim = None;
                row.status = Status::Delivered;
            }
            let claimable = self.claimable();
            let claimed = store
                .claim_due(
                    LEASE,
                    self.lease.epoch,
                    NotificationType::Email,
                    ClaimLanes::in_turn(50),
                    LIVE_CLAIM,
                )
                .await
                .unwrap();
            assert_eq!(claimed.len(), claimable.len().min(50), "{}", self.ctx());
            self.take(claimed, true, false);
            let digest = store
                .claim_digest(
                    LEASE,
                    self.lease.epoch,
                    NotificationType::Email,
                    NotificationId::generate(),
                    LIVE_CLAIM,
                )
                .await
                .unwrap();
            self.take(digest, true, true);
            let busy = self.rows.iter().any(|r| {
                r.waiting()
                    && !r
                        .claim
                        .as_ref()
                        .is_some_and(|c| c.live && c.claimed.epoch != self.lease.epoch)
            });
            if !busy {
                break;
            }
            assert!(
                !asks.overdue(),
                "rows still waiting after the drain: {:?}; {}",
                self.rows
                    .iter()
                    .filter(|r| r.waiting())
                    .map(|r| (r.id(), r.status))
                    .collect::<Vec<_>>(),
                self.ctx()
            );
        }
        self.check_all(store).await;
        for (index, row) in self.rows.iter().enumerate() {
            let detail = store.detail(row.id()).await.unwrap().unwrap();
            let last = detail.history.last().map(|e| &e.event);
            match row.status {
                Status::Superseded => {
                    let Some(HistoryEvent::Superseded { by }) = last else {
                        panic!("{} ends {last:?}; {}", self.describe(index), self.ctx());
                    };
                    // By a row of its condition no older by the site's clock.
                    let newer = &self.rows[self.by_id[by]];
                    assert!(
                        newer.site == row.site
                            && newer.list == row.list
                            && newer.key == row.key
                            && newer.site_ms >= row.site_ms,
                        "{} superseded by {}; {}",
                        self.describe(index),
                        self.describe(self.by_id[by]),
                        self.ctx()
                    );
                }
                Status::Cleared => assert!(
                    matches!(last, Some(HistoryEvent::Cleared { .. })),
                    "{} ends {last:?}; {}",
                    self.describe(index),
                    self.ctx()
                ),
                Status::Discarded => assert!(
                    matches!(
                        last,
                        Some(HistoryEvent::Operator {
                            action: OperatorAction::Discard,
                            ..
                        })
                    ),
                    "{} ends {last:?}; {}",
                    self.describe(index),
                    self.ctx()
                ),
                Status::Delivered => assert!(
                    detail.history.iter().any(|e| matches!(
                        e.event,
                        HistoryEvent::Attempt {
                            outcome: AttemptOutcome::Delivered,
                            ..
                        }
                    )),
                    "{} delivered without a delivered attempt; {}",
                    self.describe(index),
                    self.ctx()
                ),
                Status::Parked => {}
                waiting => assert!(
                    row.held_by_live_claim(),
                    "{} left {waiting:?}; {}",
                    self.describe(index),
                    self.ctx()
                ),
            }
        }
    }
}
