//! Building a store's contents through the store's capabilities: rows put in, and delivery
//! outcomes driven the way the dispatcher drives them (lease, claim, record), so every row
//! reaches its status by the real path.
//!
//! [`Rows`] is how a behaviour puts rows in and looks at them besides the calls it checks: the
//! SQL backends do it through their ingest and admin capabilities; the memory store, which
//! keeps only the dispatch capability, through its test methods. The dispatch behaviours need
//! nothing more, so they run against every store that has [`Rows`].

use std::time::Duration;

use central_outbox::domain::delivery::{AttemptOutcome, Delivered, DeliveryError};
use central_outbox::domain::history::{Actor, OperatorAction};
use central_outbox::domain::retry::{Backoff, RetryPolicy};
use central_outbox::domain::serve_order::ClaimLanes;
use central_outbox::domain::status::Status;
use central_outbox::domain::{
    ConditionKey, NotificationContent, NotificationId, NotificationType, Priority, SiteId,
    Submission,
};
use central_outbox::records::{
    AttemptRecord, ClaimedNotification, InsertOutcome, LeaseEpoch, NewNotification,
    NotificationDetail, NotificationState,
};
use central_outbox::store::mssql::MsSqlStore;
use central_outbox::store::sqlite::SqliteStore;
use central_outbox::store::{AdminStore, DispatchStore, IngestStore};
use central_outbox::testing::MemoryStore;
use chrono::{DateTime, Utc};
use outbox_domain::ScriptOrigin;
use std::future::Future;

pub(crate) const LEASE: &str = "dispatcher";

/// Putting rows into a store and looking at them, for the behaviours (module docs).
pub(crate) trait Rows: DispatchStore {
    /// Stores new rows, in order; each is accepted, as a submit of new ids is.
    fn put(&self, rows: Vec<NewNotification>) -> impl Future<Output = ()>;

    /// A row's state as `AdminStore::state` shows it, if stored.
    fn row_state(&self, id: NotificationId) -> impl Future<Output = Option<NotificationState>>;

    /// A row with its history as `AdminStore::detail` shows it, if stored.
    fn row_detail(&self, id: NotificationId) -> impl Future<Output = Option<NotificationDetail>>;

    /// An operator discards these rows, each Parked.
    fn discard(&self, ids: Vec<NotificationId>) -> impl Future<Output = ()>;
}

/// [`Rows`] through a store's ingest and admin capabilities.
macro_rules! rows_through_ingest_and_admin {
    ($($store:ty),+) => {$(
        impl Rows for $store {
            async fn put(&self, rows: Vec<NewNotification>) {
                let outcomes = self.submit(rows).await.expect("submit");
                assert!(outcomes.iter().all(|o| *o == InsertOutcome::Accepted));
            }

            async fn row_state(&self, id: NotificationId) -> Option<NotificationState> {
                self.state(id).await.expect("state")
            }

            async fn row_detail(&self, id: NotificationId) -> Option<NotificationDetail> {
                self.detail(id).await.expect("detail")
            }

            async fn discard(&self, ids: Vec<NotificationId>) {
                let results = self
                    .act_on_ids(OperatorAction::Discard, ids, Actor::new("seeder"))
                    .await
                    .expect("discard");
                assert!(results.iter().all(Result::is_ok));
            }
        }
    )+};
}

rows_through_ingest_and_admin!(SqliteStore, MsSqlStore);

impl Rows for MemoryStore {
    async fn put(&self, rows: Vec<NewNotification>) {
        for row in rows {
            self.add(row);
        }
    }

    async fn row_state(&self, id: NotificationId) -> Option<NotificationState> {
        self.state(id)
    }

    async fn row_detail(&self, id: NotificationId) -> Option<NotificationDetail> {
        self.detail(id)
    }

    async fn discard(&self, ids: Vec<NotificationId>) {
        let results = MemoryStore::discard(self, &ids, &Actor::new("seeder"));
        assert!(results.iter().all(Result::is_ok));
    }
}

/// What the test decides about one notification before it exists.
#[derive(Debug, Clone)]
pub(crate) struct Spec {
    pub site: &'static str,
    pub list: &'static str,
    pub kind: NotificationType,
    pub subject: String,
    pub priority: Priority,
    pub condition_key: Option<ConditionKey>,
    /// Where delivery should leave it.
    pub end: End,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum End {
    Pending,
    /// A transient failure whose next attempt is this far from the attempt (negative: overdue).
    Retrying(i64),
    Delivered,
    Parked,
    /// Parked, then discarded by an operator.
    Discarded,
}

impl Spec {
    pub(crate) fn new(site: &'static str, list: &'static str, subject: &str, end: End) -> Self {
        Self {
            site,
            list,
            kind: NotificationType::Email,
            subject: subject.to_owned(),
            priority: Priority::Normal,
            condition_key: None,
            end,
        }
    }

    pub(crate) fn condition_key(mut self, key: &str) -> Self {
        self.condition_key = Some(ConditionKey::parse(key.into(), "condition_key").expect("key"));
        self
    }

    pub(crate) fn priority(mut self, priority: Priority) -> Self {
        self.priority = priority;
        self
    }

    pub(crate) fn webhook(mut self) -> Self {
        self.kind = NotificationType::Webhook;
        self
    }

    pub(crate) fn status(&self) -> Status {
        match self.end {
            End::Pending => Status::Pending,
            End::Retrying(_) => Status::Retrying,
            End::Delivered => Status::Delivered,
            End::Parked => Status::Parked,
            End::Discarded => Status::Discarded,
        }
    }
}

pub(crate) fn submission(spec: &Spec) -> NewNotification {
    let content = NotificationContent::parse(
        spec.kind,
        spec.list.to_owned(),
        spec.subject.clone(),
        format!("body of {}", spec.subject),
        String::new(),
    )
    .expect("valid content");
    let origin =
        ScriptOrigin::parse("node-1".into(), "seed.py".into(), None, None).expect("valid origin");
    NewNotification::new(Submission {
        id: NotificationId::generate(),
        content,
        provenance: origin.at_site(SiteId::parse(spec.site.into()).expect("site"), Utc::now()),
        priority: spec.priority,
        condition_key: spec.condition_key.clone(),
        cleared_at_site: None,
        deliver_after: None,
    })
}

/// A seeded row: the spec it was built from and its id.
#[derive(Debug, Clone)]
pub(crate) struct Seeded {
    pub spec: Spec,
    pub id: NotificationId,
}

/// The id of the row seeded with `subject`.
pub(crate) fn id_of(seeded: &[Seeded], subject: &str) -> NotificationId {
    seeded
        .iter()
        .find(|s| s.spec.subject == subject)
        .map(|s| s.id)
        .expect("seeded")
}

/// Takes the dispatcher lease for a test "node".
pub(crate) async fn lease<S: DispatchStore>(store: &S) -> LeaseEpoch {
    store
        .acquire_lease(LEASE, "conformance", Duration::from_secs(600))
        .await
        .expect("lease")
        .expect("the lease is free")
}

/// Inserts the specs and drives each to its end status through the dispatcher's path. Call it
/// once per store: its claim must see only the rows it just submitted. Rows that should stay
/// Pending are submitted last, after the claim, so they are created after the others.
pub(crate) async fn seed<S: Rows>(store: &S, specs: &[Spec]) -> Vec<Seeded> {
    let (pending, attempted): (Vec<&Spec>, Vec<&Spec>) =
        specs.iter().partition(|s| s.end == End::Pending);
    let mut seeded = submit(store, &attempted).await;
    if !seeded.is_empty() {
        let epoch = lease(store).await;
        let mut claimed = Vec::new();
        for kind in [NotificationType::Email, NotificationType::Webhook] {
            let of_kind = seeded.iter().filter(|s| s.spec.kind == kind).count();
            claimed.extend(
                store
                    .claim_due(
                        LEASE,
                        epoch,
                        kind,
                        ClaimLanes::in_turn(of_kind),
                        Duration::from_secs(60),
                    )
                    .await
                    .expect("claim"),
            );
        }
        assert_eq!(
            claimed.len(),
            seeded.len(),
            "the seeded rows must be the only due rows"
        );
        for claim in &claimed {
            let row = seeded
                .iter()
                .find(|s| s.id == claim.id)
                .expect("claimed a seeded row");
            record(store, claim, row.spec.end).await;
        }
        let discard: Vec<NotificationId> = seeded
            .iter()
            .filter(|s| s.spec.end == End::Discarded)
            .map(|s| s.id)
            .collect();
        if !discard.is_empty() {
            store.discard(discard).await;
        }
    }
    seeded.extend(submit(store, &pending).await);
    seeded
}

async fn submit<S: Rows>(store: &S, specs: &[&Spec]) -> Vec<Seeded> {
    if specs.is_empty() {
        return Vec::new();
    }
    let batch: Vec<NewNotification> = specs.iter().map(|s| submission(s)).collect();
    let ids: Vec<NotificationId> = batch.iter().map(|n| n.submission.id).collect();
    store.put(batch).await;
    specs
        .iter()
        .zip(ids)
        .map(|(spec, id)| Seeded {
            spec: (*spec).clone(),
            id,
        })
        .collect()
}

/// Records `end` as the outcome of `claim`, as the dispatcher would.
pub(crate) async fn record<S: DispatchStore>(store: &S, claim: &ClaimedNotification, end: End) {
    let now = Utc::now();
    let (result, at): (Result<Delivered, DeliveryError>, DateTime<Utc>) = match end {
        End::Delivered => (
            Ok(Delivered {
                resolved_targets: vec!["a@plant.test".into()],
            }),
            now,
        ),
        End::Parked | End::Discarded => (Err(DeliveryError::permanent("550 no such user")), now),
        End::Retrying(offset_secs) => (
            Err(DeliveryError::transient("451 try again later")),
            // The policy schedules `delay` (1 s) after the attempt; shifting the attempt's
            // instant puts the next attempt where the spec wants it.
            now + chrono::Duration::seconds(offset_secs) - chrono::Duration::seconds(1),
        ),
        End::Pending => unreachable!("pending rows are not recorded"),
    };
    let policy = RetryPolicy::clamped(5, Duration::from_secs(1), Backoff::Fixed).0;
    let transition = policy.transition(claim.retry_count, &result, at, 0.5);
    let applied = store
        .record_outcome(
            LEASE,
            AttemptRecord {
                row_id: claim.row_id,
                id: claim.id,
                attempt_no: claim.attempt_no,
                epoch: claim.epoch,
                outcome: AttemptOutcome::of(&result),
                error: result.as_ref().err().map(|e| e.message().to_owned()),
                duration: Duration::from_millis(12),
                transition,
                provider: None,
            },
        )
        .await
        .expect("record");
    assert!(applied, "the seeding claim still holds");
}

/// The current state of every seeded row.
pub(crate) async fn states<S: Rows>(store: &S, seeded: &[Seeded]) -> Vec<NotificationState> {
    let mut states = Vec::with_capacity(seeded.len());
    for s in seeded {
        states.push(store.row_state(s.id).await.expect("stored"));
    }
    states
}
