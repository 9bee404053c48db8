//! A model-based search for dead ends in escalation: a seeded generator drives a store through
//! random sequences of what happens to incidents — alarms of every priority (keyed or not, from
//! two sites), acknowledgements by each means, clears, claims of what is due, relay outcomes
//! (delivered, 4xx, 5xx), operators discarding parked alarms, and turns of the escalation clock —
//! and checks every answer against a small reference model.
//!
//! The policy's waits are ten minutes, so in a run no page comes due by time: only a parked page
//! (the policy escalates at once) moves an incident on, which the model knows exactly. It checks:
//! - each incident's status and page count, after every step, are the model's;
//! - an acknowledgement answers as the model says (first, again, late) and stops exactly the
//!   page notifications not yet claimed; a claim never hands out a page notification of an
//!   incident that was acknowledged, cleared or discarded before it, nor one the model does not
//!   hold as due;
//! - a turn of the clock fires exactly the pages (and exhaustions) the model has due;
//! - no incident is ever left waiting for nothing: an Open one always has its next page or its
//!   exhaustion due at a time, the others nothing (no reminder in this policy).
//!
//! `make test` runs a few fixed seeds; `OUTBOX_ESCALATION_SEED=<n>` replays one.

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use central_outbox::domain::escalation::{
    AckMeans, AckResult, Acknowledgement, EscalationPolicy, IncidentId, IncidentStatus, PolicyInput,
};
use central_outbox::domain::history::{Actor, OperatorAction};
use central_outbox::domain::serve_order::ClaimLanes;
use central_outbox::domain::status::Status;
use central_outbox::domain::{ConditionKey, NotificationId, NotificationType, Priority, SiteId};
use central_outbox::records::{ClaimedNotification, IncidentQuery, LeaseEpoch};
use central_outbox::store::OutboxStore;

use crate::escalation::list;
use crate::seed::{self, End, LEASE, Spec};

const ALARMS: &str = "ops";
const SUPERVISORS: &str = "sup";
const SITES: [&str; 2] = ["north", "south"];
const KEYS: [&str; 2] = ["tank4.level", "pump7.trip"];
const STEPS: usize = 120;
const DEFAULT_SEEDS: [u64; 3] = [7, 20_261_202, 9_876_543_210];
/// Step 1 the alarm, step 2 the supervisors, then once more from step 1.
const STEP_COUNT: u32 = 2;
const REPEAT: u32 = 1;

/// An incident as the model knows it.
#[derive(Debug, Clone)]
struct Incident {
    id: IncidentId,
    site: &'static str,
    key: Option<&'static str>,
    status: IncidentStatus,
    /// Pages fired, the alarm included.
    pages: u32,
    /// The place of the last page fired: (round, step).
    place: (u32, u32),
    /// A page parked: the next page (or exhaustion) is due now.
    due_now: bool,
    /// Who acknowledged first.
    acked_by: Option<String>,
}

impl Incident {
    /// The place after the last page, `None` for exhaustion.
    fn following(&self) -> Option<(u32, u32)> {
        let (round, step) = self.place;
        if step < STEP_COUNT {
            Some((round, step + 1))
        } else if round < REPEAT {
            Some((round + 1, 1))
        } else {
            None
        }
    }
}

/// A page notification (page 2, 3, ...) as the model knows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PageState {
    /// Waiting and due: the next claim takes it.
    Due,
    /// Waiting out a retry (ten minutes).
    Retrying,
    Claimed,
    /// Claimed when its incident ended: it ends so unless its attempt delivers it.
    ClaimedEnding(Status),
    Final(Status),
}

#[derive(Debug, Clone)]
struct PageRow {
    incident: usize,
    page_no: u32,
    state: PageState,
    /// The claim of its attempt under way, to answer it with.
    claim: Option<ClaimedNotification>,
}

struct Case {
    rng: fastrand::Rng,
    seed: u64,
    epoch: LeaseEpoch,
    incidents: Vec<Incident>,
    pages: HashMap<NotificationId, PageRow>,
    /// Each escalating alarm's incident, and whether it is the incident's page 1 (or a joined
    /// notification of its condition).
    alarm_incident: HashMap<NotificationId, (usize, bool)>,
    /// Alarms claimed and not yet answered.
    claimed_alarms: HashMap<NotificationId, (ClaimedNotification, Option<usize>)>,
    /// Alarms an operator may discard (Parked), with their incident.
    parked_alarms: Vec<(NotificationId, Option<usize>)>,
    log: Vec<String>,
}

fn policy() -> EscalationPolicy {
    EscalationPolicy::parse(PolicyInput {
        acknowledge_within: Duration::from_secs(600),
        steps: vec![(vec![SUPERVISORS.into()], Duration::from_secs(600))],
        repeat: REPEAT,
        ..PolicyInput::default()
    })
    .unwrap()
}

pub(crate) async fn escalation_matches_its_model<S: OutboxStore>(store: &S) {
    store
        .upsert_list(list(ALARMS, Some(policy())))
        .await
        .unwrap();
    store.upsert_list(list(SUPERVISORS, None)).await.unwrap();
    let seeds: Vec<u64> = match std::env::var("OUTBOX_ESCALATION_SEED") {
        Ok(seed) => vec![seed.parse().expect("OUTBOX_ESCALATION_SEED is a number")],
        Err(_) => DEFAULT_SEEDS.to_vec(),
    };
    let epoch = seed::lease(store).await;
    let mut case = Case {
        rng: fastrand::Rng::new(),
        seed: 0,
        epoch,
        incidents: Vec::new(),
        pages: HashMap::new(),
        alarm_incident: HashMap::new(),
        claimed_alarms: HashMap::new(),
        parked_alarms: Vec::new(),
        log: Vec::new(),
    };
    for seed in seeds {
        case.rng = fastrand::Rng::with_seed(seed);
        case.seed = seed;
        for step in 0..STEPS {
            case.step(store, step).await;
            case.check(store).await;
        }
        // Everything claimed is answered, and the clock runs: still no dead end.
        case.answer_all(store).await;
        case.turn(store).await;
        case.check(store).await;
        // The next seed starts from incidents that wait for nothing.
        for i in 0..case.incidents.len() {
            case.drain_incident(store, i).await;
        }
        case.check(store).await;
    }
}

impl Case {
    fn ctx(&self) -> String {
        let tail: Vec<&String> = self.log.iter().rev().take(12).collect();
        format!(
            "seed {} (OUTBOX_ESCALATION_SEED={}), last steps {tail:?}",
            self.seed, self.seed
        )
    }

    async fn step<S: OutboxStore>(&mut self, store: &S, step: usize) {
        match self.rng.u32(0..100) {
            0..=29 => self.alarm(store).await,
            30..=44 => self.claim(store).await,
            45..=64 => self.outcome(store).await,
            65..=74 => self.acknowledge(store).await,
            75..=82 => self.turn(store).await,
            83..=90 => self.clear(store).await,
            _ => self.discard(store).await,
        }
        let _ = step;
    }

    /// A new alarm: its priority decides whether it escalates; a keyed one joins its
    /// condition's incident while that is not final.
    async fn alarm<S: OutboxStore>(&mut self, store: &S) {
        let site = SITES[self.rng.usize(..SITES.len())];
        let key = if self.rng.bool() {
            Some(KEYS[self.rng.usize(..KEYS.len())])
        } else {
            None
        };
        let priority = Priority::ALL[self.rng.usize(..Priority::ALL.len())];
        let mut spec = Spec::new(site, ALARMS, "alarm", End::Pending).priority(priority);
        if let Some(key) = key {
            spec = spec.condition_key(key);
        }
        let row = seed::submission(&spec);
        store.submit(vec![row.clone()]).await.unwrap();
        self.log.push(format!("alarm {site} {key:?} {priority:?}"));
        if !matches!(priority, Priority::Critical | Priority::High) {
            return;
        }
        let joined = key.and_then(|key| {
            self.incidents
                .iter()
                .position(|i| i.site == site && i.key == Some(key) && !i.status.is_final())
        });
        if let Some(joined) = joined {
            self.alarm_incident
                .insert(row.submission.id, (joined, false));
            return;
        }
        // The store numbers it: the newest incident.
        let newest = store
            .incidents(IncidentQuery {
                limit: 1,
                ..IncidentQuery::default()
            })
            .await
            .unwrap();
        let id =
            newest.incidents.first().map(|i| i.id).unwrap_or_else(|| {
                panic!("{}: an escalating alarm opened no incident", self.ctx())
            });
        assert!(
            self.incidents.iter().all(|i| i.id != id),
            "{}: the alarm opened no new incident",
            self.ctx()
        );
        self.alarm_incident
            .insert(row.submission.id, (self.incidents.len(), true));
        self.incidents.push(Incident {
            id,
            site,
            key,
            status: IncidentStatus::Open,
            pages: 1,
            place: (0, 1),
            due_now: false,
            acked_by: None,
        });
    }

    /// Claims everything due: the page notifications handed out are exactly those the model
    /// has due (none of an ended incident), alarms whatever the store has due.
    async fn claim<S: OutboxStore>(&mut self, store: &S) {
        let claimed = store
            .claim_due(
                LEASE,
                self.epoch,
                NotificationType::Email,
                ClaimLanes::in_turn(1000),
                Duration::from_secs(30 * 24 * 3600),
            )
            .await
            .unwrap();
        let mut pages = BTreeSet::new();
        for c in claimed {
            if let Some(page) = self.pages.get_mut(&c.id) {
                assert_eq!(
                    page.state,
                    PageState::Due,
                    "{}: claimed {page:?}",
                    self.log.len()
                );
                pages.insert(c.id);
                page.state = PageState::Claimed;
                page.claim = Some(c);
            } else {
                let incident = self.alarm_incident.get(&c.id).map(|(i, _)| *i);
                self.claimed_alarms.insert(c.id, (c, incident));
            }
        }
        let due: BTreeSet<NotificationId> = self
            .pages
            .iter()
            .filter(|(id, _)| !pages.contains(id))
            .filter(|(_, p)| p.state == PageState::Due)
            .map(|(id, _)| *id)
            .collect();
        assert!(
            due.is_empty(),
            "{}: due pages not claimed: {due:?}",
            self.ctx()
        );
        self.log.push(format!("claim ({} pages)", pages.len()));
    }

    /// Answers one claimed row as the relay would: delivered, 4xx or 5xx.
    async fn outcome<S: OutboxStore>(&mut self, store: &S) {
        let claimed_pages: Vec<NotificationId> = self
            .pages
            .iter()
            .filter(|(_, p)| matches!(p.state, PageState::Claimed | PageState::ClaimedEnding(_)))
            .map(|(id, _)| *id)
            .collect();
        let alarms: Vec<NotificationId> = self.claimed_alarms.keys().copied().collect();
        let end = match self.rng.u32(0..3) {
            0 => End::Delivered,
            1 => End::Retrying(600),
            _ => End::Parked,
        };
        if !claimed_pages.is_empty() && (alarms.is_empty() || self.rng.bool()) {
            let id = claimed_pages[self.rng.usize(..claimed_pages.len())];
            self.answer_page(store, id, end).await;
        } else if !alarms.is_empty() {
            let id = alarms[self.rng.usize(..alarms.len())];
            self.answer_alarm(store, id, end).await;
        }
    }

    async fn answer_page<S: OutboxStore>(&mut self, store: &S, id: NotificationId, end: End) {
        let claim = self.pages.get_mut(&id).unwrap().claim.take().unwrap();
        seed::record(store, &claim, end).await;
        let page = self.pages.get_mut(&id).unwrap();
        let expected = match (page.state, end) {
            (_, End::Delivered) => PageState::Final(Status::Delivered),
            (PageState::ClaimedEnding(status), _) => PageState::Final(status),
            (_, End::Retrying(_)) => PageState::Retrying,
            _ => PageState::Final(Status::Parked),
        };
        page.state = expected;
        let (incident, page_no) = (page.incident, page.page_no);
        self.log
            .push(format!("page {page_no} of incident {incident}: {end:?}"));
        if expected == PageState::Final(Status::Parked) {
            self.parked(incident, page_no);
        }
    }

    async fn answer_alarm<S: OutboxStore>(&mut self, store: &S, id: NotificationId, end: End) {
        let (claim, incident) = self.claimed_alarms.remove(&id).unwrap();
        seed::record(store, &claim, end).await;
        let status = store.state(id).await.unwrap().unwrap().status;
        self.log.push(format!(
            "alarm of incident {incident:?}: {end:?} -> {status}"
        ));
        if status == Status::Parked {
            self.parked_alarms.push((id, incident));
            // Only the alarm itself is page 1; a joined notification is no page.
            if let Some((incident, true)) = self.alarm_incident.get(&id).copied() {
                self.parked(incident, 1);
            }
        }
    }

    /// Page `page_no` of `incident` parked: with the policy escalating on a park, the next page
    /// is due now if it was the latest page and the incident is open.
    fn parked(&mut self, incident: usize, page_no: u32) {
        let i = &mut self.incidents[incident];
        if i.status == IncidentStatus::Open && i.pages == page_no {
            i.due_now = true;
        }
    }

    async fn acknowledge<S: OutboxStore>(&mut self, store: &S) {
        if self.incidents.is_empty() {
            return;
        }
        let index = self.rng.usize(..self.incidents.len());
        let means = AckMeans::ALL[self.rng.usize(..AckMeans::ALL.len())];
        let who = format!("op{}", self.rng.u32(0..3));
        let answer = store
            .acknowledge_incident(
                self.incidents[index].id,
                Acknowledgement::new(Actor::new(&who), means, None),
            )
            .await
            .unwrap();
        self.log.push(format!("ack {index} by {who}: {answer:?}"));
        let status = self.incidents[index].status;
        match status {
            IncidentStatus::Open | IncidentStatus::Exhausted => {
                let incident = &mut self.incidents[index];
                incident.status = IncidentStatus::Acknowledged;
                incident.acked_by = Some(who);
                incident.due_now = false;
                let stopped = self.end_pages(index, Status::Acknowledged);
                assert_eq!(
                    answer,
                    AckResult::Acknowledged { stopped },
                    "{}",
                    self.ctx()
                );
            }
            IncidentStatus::Acknowledged => {
                let AckResult::AlreadyAcknowledged { by, .. } = &answer else {
                    panic!("{}: {answer:?}", self.ctx());
                };
                assert_eq!(
                    Some(by),
                    self.incidents[index].acked_by.as_ref(),
                    "{}",
                    self.ctx()
                );
            }
            IncidentStatus::Cleared | IncidentStatus::Discarded => {
                assert!(
                    matches!(answer, AckResult::AlreadyEnded { status: ended, .. } if ended == status),
                    "{}: {answer:?}",
                    self.ctx()
                );
            }
        }
    }

    /// Ends `incident`'s page notifications as `status`: the waiting ones now (returned as a
    /// count), the claimed ones when their attempt ends undelivered.
    fn end_pages(&mut self, incident: usize, status: Status) -> u32 {
        let mut stopped = 0;
        for page in self.pages.values_mut().filter(|p| p.incident == incident) {
            match page.state {
                PageState::Due | PageState::Retrying => {
                    page.state = PageState::Final(status);
                    stopped += 1;
                }
                PageState::Claimed => page.state = PageState::ClaimedEnding(status),
                PageState::ClaimedEnding(_) | PageState::Final(_) => {}
            }
        }
        stopped
    }

    async fn clear<S: OutboxStore>(&mut self, store: &S) {
        let site = SITES[self.rng.usize(..SITES.len())];
        let key = KEYS[self.rng.usize(..KEYS.len())];
        store
            .clear_condition(
                &SiteId::parse(site.into()).unwrap(),
                &ConditionKey::parse(key.into(), "condition_key").unwrap(),
                Actor::new("site"),
            )
            .await
            .unwrap();
        self.log.push(format!("clear {site} {key}"));
        for index in 0..self.incidents.len() {
            let i = &self.incidents[index];
            if i.site == site && i.key == Some(key) && !i.status.is_final() {
                self.incidents[index].status = IncidentStatus::Cleared;
                self.incidents[index].due_now = false;
                self.end_pages(index, Status::Cleared);
            }
        }
    }

    /// Acknowledges `index` if it still takes an acknowledgement, so nothing of it is due.
    async fn drain_incident<S: OutboxStore>(&mut self, store: &S, index: usize) {
        let i = &self.incidents[index];
        if !matches!(i.status, IncidentStatus::Open | IncidentStatus::Exhausted) {
            return;
        }
        let answer = store
            .acknowledge_incident(
                i.id,
                Acknowledgement::new(Actor::new("drain"), AckMeans::Api, None),
            )
            .await
            .unwrap();
        if matches!(i.status, IncidentStatus::Open | IncidentStatus::Exhausted) {
            assert!(
                matches!(answer, AckResult::Acknowledged { .. }),
                "{}: {answer:?}",
                self.ctx()
            );
            self.incidents[index].status = IncidentStatus::Acknowledged;
            self.incidents[index].acked_by = Some("drain".into());
            self.end_pages(index, Status::Acknowledged);
        }
    }

    /// An operator discards a parked alarm: its incident, if it is the alarm or a joined
    /// notification of one that is not final, ends Discarded.
    async fn discard<S: OutboxStore>(&mut self, store: &S) {
        if self.parked_alarms.is_empty() {
            return;
        }
        let (id, incident) = self
            .parked_alarms
            .swap_remove(self.rng.usize(..self.parked_alarms.len()));
        let result = store
            .act_on_ids(OperatorAction::Discard, vec![id], Actor::new("operator"))
            .await
            .unwrap();
        self.log.push(format!(
            "discard alarm of {incident:?}: {:?}",
            result[0].is_ok()
        ));
        // A clear may have ended it since it parked: then nothing is discarded.
        if result[0].is_err() {
            return;
        }
        if let Some(index) = incident
            && !self.incidents[index].status.is_final()
        {
            self.incidents[index].status = IncidentStatus::Discarded;
            self.incidents[index].due_now = false;
            self.end_pages(index, Status::Discarded);
        }
    }

    /// A turn of the clock: exactly the incidents due now fire their next page (storing one
    /// notification to its list) or are exhausted.
    async fn turn<S: OutboxStore>(&mut self, store: &S) {
        let turn = store.escalate_due(LEASE, self.epoch, 1000).await.unwrap();
        assert!(turn.held, "{}", self.ctx());
        let mut pages = 0;
        let mut exhausted = 0;
        for index in 0..self.incidents.len() {
            let i = &self.incidents[index];
            if !(i.due_now && i.status == IncidentStatus::Open) {
                continue;
            }
            match i.following() {
                Some(place) => {
                    pages += 1;
                    let page_no = i.pages + 1;
                    let detail = store.incident(i.id).await.unwrap().unwrap();
                    let message = detail
                        .messages
                        .iter()
                        .find(|m| m.page_no == Some(page_no))
                        .unwrap_or_else(|| panic!("{}: page {page_no} stored nothing", self.ctx()));
                    self.pages.insert(
                        message.id,
                        PageRow {
                            incident: index,
                            page_no,
                            state: PageState::Due,
                            claim: None,
                        },
                    );
                    let i = &mut self.incidents[index];
                    i.pages = page_no;
                    i.place = place;
                    i.due_now = false;
                }
                None => {
                    exhausted += 1;
                    let i = &mut self.incidents[index];
                    i.status = IncidentStatus::Exhausted;
                    i.due_now = false;
                }
            }
        }
        // A page of step 1 (a repeat) pages the alarm's own list: its message is a page too.
        assert_eq!(
            (turn.pages, turn.exhausted),
            (pages, exhausted),
            "{}: {turn:?}",
            self.ctx()
        );
        self.log
            .push(format!("turn: {pages} pages, {exhausted} exhausted"));
    }

    async fn answer_all<S: OutboxStore>(&mut self, store: &S) {
        let pages: Vec<NotificationId> = self
            .pages
            .iter()
            .filter(|(_, p)| matches!(p.state, PageState::Claimed | PageState::ClaimedEnding(_)))
            .map(|(id, _)| *id)
            .collect();
        for id in pages {
            self.answer_page(store, id, End::Delivered).await;
        }
        let alarms: Vec<NotificationId> = self.claimed_alarms.keys().copied().collect();
        for id in alarms {
            self.answer_alarm(store, id, End::Delivered).await;
        }
    }

    /// Every incident and page notification as the model has it, and no dead end.
    async fn check<S: OutboxStore>(&self, store: &S) {
        for (index, model) in self.incidents.iter().enumerate() {
            let detail = store.incident(model.id).await.unwrap().unwrap();
            let stored = &detail.incident;
            assert_eq!(
                (stored.status, stored.page_count),
                (model.status, model.pages),
                "{}: incident {index} ({:?})",
                self.ctx(),
                detail.history
            );
            match stored.status {
                IncidentStatus::Open => assert!(
                    stored.next.is_some(),
                    "{}: incident {index} is open with nothing due: a dead end",
                    self.ctx()
                ),
                _ => assert!(
                    stored.next.is_none(),
                    "{}: incident {index} is {} with something due",
                    self.ctx(),
                    stored.status
                ),
            }
            for message in detail.messages.iter().filter(|m| m.page_no > Some(1)) {
                let Some(page) = self.pages.get(&message.id) else {
                    panic!("{}: a page the model did not fire: {message:?}", self.ctx());
                };
                let expected = match page.state {
                    PageState::Due => Status::Pending,
                    PageState::Retrying => Status::Retrying,
                    PageState::Claimed | PageState::ClaimedEnding(_) => Status::Pending,
                    PageState::Final(status) => status,
                };
                assert_eq!(
                    message.status,
                    expected,
                    "{}: {message:?} ({page:?})",
                    self.ctx()
                );
            }
        }
    }
}
