//! Behaviours of the operator side of a store: filtered queries and their paging, Retry and
//! Discard, KPIs, and list/SMTP configuration.

use std::collections::HashSet;
use std::time::Duration;

use central_outbox::domain::channel::{
    DeliveryPolicy, EmailAddress, ListInput, ListTargets, NotificationList, OAuthClientCredentials,
    RateLimit, Secret, SmtpAuth, SmtpSettings, TlsMode,
};
use central_outbox::domain::history::{ActionRefusal, Actor, HistoryEvent, OperatorAction};
use central_outbox::domain::kpi::{KpiParams, KpiValues};
use central_outbox::domain::query::{Cursor, NotificationFilter, PageRequest};
use central_outbox::domain::retry::Backoff;
use central_outbox::domain::serve_order::ClaimLanes;
use central_outbox::domain::status::Status;
use central_outbox::domain::webhook::WebhookFormat;
use central_outbox::domain::{ListName, NotificationId, NotificationType};
use central_outbox::records::NotificationState;
use central_outbox::store::OutboxStore;
use chrono::{DateTime, Utc};

use crate::seed::{self, End, Rows, Seeded, Spec};

/// Every row matching `filter`, following page tokens, checking the order on the way.
async fn query_all<S: OutboxStore>(
    store: &S,
    filter: &NotificationFilter,
    page_size: usize,
) -> Vec<NotificationState> {
    let mut rows: Vec<NotificationState> = Vec::new();
    let mut after: Option<Cursor> = None;
    loop {
        let page = store
            .query(PageRequest {
                filter: filter.clone(),
                after,
                size: page_size,
            })
            .await
            .expect("query");
        assert!(page.rows.len() <= page_size);
        rows.extend(page.rows);
        match page.next {
            Some(next) => after = Some(next),
            None => break,
        }
    }
    for pair in rows.windows(2) {
        let (a, b) = (pair[0].cursor(), pair[1].cursor());
        assert!(
            (a.created_at, a.row_id) > (b.created_at, b.row_id),
            "rows must come newest first without ties"
        );
    }
    rows
}

fn ids(rows: &[NotificationState]) -> Vec<NotificationId> {
    rows.iter().map(|r| r.id).collect()
}

/// A varied table: three sites, two lists, both types, every status, mixed-case keywords.
fn varied_specs() -> Vec<Spec> {
    let mut specs = Vec::new();
    let sites = ["north", "south", "east"];
    let lists = ["ops", "maintenance"];
    let ends = [
        End::Pending,
        End::Retrying(3600),
        End::Delivered,
        End::Parked,
        End::Discarded,
    ];
    for i in 0..40 {
        let subject = match i % 4 {
            0 => format!("Tank {i} HIGH level"),
            1 => format!("pump {i} tripped"),
            2 => format!("Tank {i} low level"),
            _ => format!("100% load on feeder {i}"),
        };
        let mut spec = Spec::new(sites[i % 3], lists[i % 2], &subject, ends[i % 5]);
        if i % 7 == 0 {
            spec = spec.webhook();
        }
        specs.push(spec);
    }
    specs
}

pub(crate) async fn query_filters_match_exactly<S: OutboxStore + Rows>(store: &S) {
    let seeded = seed::seed(store, &varied_specs()).await;
    let states = seed::states(store, &seeded).await;
    let facts: Vec<(&Seeded, &NotificationState)> = seeded.iter().zip(&states).collect();

    // A created-at boundary that splits the table: the creation time of the 25th oldest row.
    let mut created: Vec<DateTime<Utc>> = states.iter().map(|s| s.created_at).collect();
    created.sort();
    let boundary = created[created.len() / 2];
    let far_future = Utc::now() + chrono::Duration::days(1);

    type Expect = Box<dyn Fn(&Seeded, &NotificationState) -> bool>;
    let cases: Vec<(&str, NotificationFilter, Expect)> = vec![
        (
            "no filter",
            NotificationFilter::default(),
            Box::new(|_, _| true),
        ),
        (
            "statuses parked+retrying",
            NotificationFilter {
                statuses: vec![Status::Parked, Status::Retrying],
                ..Default::default()
            },
            Box::new(|s, _| matches!(s.spec.end, End::Parked | End::Retrying(_))),
        ),
        (
            "type webhook",
            NotificationFilter {
                kind: Some(NotificationType::Webhook),
                ..Default::default()
            },
            Box::new(|s, _| s.spec.kind == NotificationType::Webhook),
        ),
        (
            "site south",
            NotificationFilter {
                source_site_id: Some("south".into()),
                ..Default::default()
            },
            Box::new(|s, _| s.spec.site == "south"),
        ),
        (
            "list maintenance",
            NotificationFilter {
                list_name: Some("maintenance".into()),
                ..Default::default()
            },
            Box::new(|s, _| s.spec.list == "maintenance"),
        ),
        (
            "created from boundary",
            NotificationFilter {
                created_from: Some(boundary),
                ..Default::default()
            },
            Box::new(move |_, st| st.created_at >= boundary),
        ),
        (
            "created before boundary",
            NotificationFilter {
                created_to: Some(boundary),
                ..Default::default()
            },
            Box::new(move |_, st| st.created_at < boundary),
        ),
        (
            // Everything live is "stuck" against a cutoff in the future.
            "stuck only",
            NotificationFilter {
                stuck_before: Some(far_future),
                ..Default::default()
            },
            Box::new(|s, _| matches!(s.spec.end, End::Pending | End::Retrying(_))),
        ),
        (
            "stuck only, nothing old enough",
            NotificationFilter {
                stuck_before: Some(created[0]),
                ..Default::default()
            },
            Box::new(|_, _| false),
        ),
        (
            "keyword, any case",
            NotificationFilter {
                subject_contains: Some("tank".into()),
                ..Default::default()
            },
            Box::new(|s, _| s.spec.subject.to_lowercase().contains("tank")),
        ),
        (
            "keyword with a LIKE wildcard is literal",
            NotificationFilter {
                subject_contains: Some("100%".into()),
                ..Default::default()
            },
            Box::new(|s, _| s.spec.subject.contains("100%")),
        ),
        (
            "keyword underscore is literal",
            NotificationFilter {
                subject_contains: Some("_".into()),
                ..Default::default()
            },
            Box::new(|_, _| false),
        ),
        (
            "combination",
            NotificationFilter {
                statuses: vec![Status::Pending, Status::Parked, Status::Delivered],
                kind: Some(NotificationType::Email),
                source_site_id: Some("north".into()),
                list_name: Some("ops".into()),
                created_to: Some(far_future),
                subject_contains: Some("LEVEL".into()),
                ..Default::default()
            },
            Box::new(|s, _| {
                matches!(s.spec.end, End::Pending | End::Parked | End::Delivered)
                    && s.spec.kind == NotificationType::Email
                    && s.spec.site == "north"
                    && s.spec.list == "ops"
                    && s.spec.subject.to_lowercase().contains("level")
            }),
        ),
    ];
    for (name, filter, expect) in cases {
        let mut expected: Vec<(DateTime<Utc>, i64, NotificationId)> = facts
            .iter()
            .filter(|(s, st)| expect(s, st))
            .map(|(_, st)| (st.created_at, st.row_id, st.id))
            .collect();
        expected.sort_by_key(|e| std::cmp::Reverse((e.0, e.1)));
        let expected: Vec<NotificationId> = expected.into_iter().map(|e| e.2).collect();
        for page_size in [3, 500] {
            let got = ids(&query_all(store, &filter, page_size).await);
            assert_eq!(got, expected, "filter {name:?}, page size {page_size}");
        }
    }
}

pub(crate) async fn pagination_neither_skips_nor_repeats_under_inserts<S>(store: &S)
where
    S: OutboxStore + Rows + Clone,
{
    let specs: Vec<Spec> = (0..300)
        .map(|i| Spec::new("north", "ops", &format!("before {i}"), End::Pending))
        .collect();
    let before: HashSet<NotificationId> = seed::seed(store, &specs)
        .await
        .into_iter()
        .map(|s| s.id)
        .collect();

    // Rows arrive between every two pages (inserted between the reads rather than by a
    // concurrent task, which on a busy machine could finish before inserting anything).
    let mut seen = Vec::new();
    let mut after = None;
    let mut inserted = 0;
    loop {
        let page = store
            .query(PageRequest {
                filter: NotificationFilter::default(),
                after,
                size: 7,
            })
            .await
            .expect("query");
        let spec = Spec::new("north", "ops", &format!("during {inserted}"), End::Pending);
        store
            .submit(vec![seed::submission(&spec)])
            .await
            .expect("insert");
        inserted += 1;
        seen.extend(page.rows);
        match page.next {
            Some(next) => after = Some(next),
            None => break,
        }
    }
    assert!(inserted > 40, "rows were inserted between the pages");

    let unique: HashSet<NotificationId> = seen.iter().map(|s| s.id).collect();
    assert_eq!(unique.len(), seen.len(), "a row appeared twice");
    let missing = before.difference(&unique).count();
    assert_eq!(
        missing, 0,
        "{missing} rows present before paging were skipped"
    );
}

pub(crate) async fn retry_and_discard_apply_only_to_parked<S: OutboxStore + Rows>(store: &S) {
    let specs = [
        Spec::new("north", "ops", "parked one", End::Parked),
        Spec::new("north", "ops", "parked two", End::Parked),
        Spec::new("north", "ops", "delivered", End::Delivered),
        Spec::new("north", "ops", "retrying", End::Retrying(3600)),
        Spec::new("north", "ops", "discarded", End::Discarded),
        Spec::new("north", "ops", "pending", End::Pending),
    ];
    let seeded = seed::seed(store, &specs).await;
    let id = |subject: &str| seed::id_of(&seeded, subject);
    let actor = Actor::new("ann");

    // Every status other than Parked is refused, naming the status, and nothing changes.
    for action in [OperatorAction::Retry, OperatorAction::Discard] {
        for (subject, status) in [
            ("delivered", Status::Delivered),
            ("retrying", Status::Retrying),
            ("discarded", Status::Discarded),
            ("pending", Status::Pending),
        ] {
            let before = store.detail(id(subject)).await.unwrap().unwrap();
            let result = store
                .act_on_ids(action, vec![id(subject)], actor.clone())
                .await
                .unwrap();
            assert_eq!(result, vec![Err(ActionRefusal::WrongStatus(status))]);
            assert_eq!(store.detail(id(subject)).await.unwrap().unwrap(), before);
        }
        let unknown = NotificationId::generate();
        let result = store
            .act_on_ids(action, vec![unknown], actor.clone())
            .await
            .unwrap();
        assert_eq!(result, vec![Err(ActionRefusal::NotFound)]);
    }

    // Retry: Parked -> Pending with the delivery facts reset, and due again.
    let retried = store
        .act_on_ids(OperatorAction::Retry, vec![id("parked one")], actor.clone())
        .await
        .unwrap()
        .pop()
        .unwrap()
        .expect("retried");
    assert_eq!(retried.status, Status::Pending);
    assert_eq!(retried.retry_count, 0);
    // Due from now on (claimed below), in order with every other due row.
    assert!(retried.next_attempt_at.is_some());
    assert_eq!(retried.last_error, None);
    assert_eq!(retried.resolved_at, None);
    let epoch = seed::lease(store).await;
    let claimed = store
        .claim_due(
            seed::LEASE,
            epoch,
            NotificationType::Email,
            ClaimLanes::in_turn(10),
            Duration::from_secs(60),
        )
        .await
        .unwrap();
    let claimed_ids: Vec<NotificationId> = claimed.iter().map(|c| c.id).collect();
    assert!(
        claimed_ids.contains(&id("parked one")),
        "a retried row is due again"
    );
    assert!(
        !claimed_ids.contains(&id("parked two")),
        "a parked row is not due"
    );

    // Discard: Parked -> Discarded, kept.
    let discarded = store
        .act_on_ids(
            OperatorAction::Discard,
            vec![id("parked two")],
            Actor::new("bob"),
        )
        .await
        .unwrap()
        .pop()
        .unwrap()
        .expect("discarded");
    assert_eq!(discarded.status, Status::Discarded);
    assert!(discarded.resolved_at.is_some());
    assert_eq!(discarded.last_error.as_deref(), Some("550 no such user"));

    // Each history is in order: the failed attempt, the operator action (with who), and for the
    // retried row the new InFlight attempt.
    let history = store
        .detail(id("parked one"))
        .await
        .unwrap()
        .unwrap()
        .history;
    let sequence: Vec<u32> = history.iter().map(|e| e.sequence).collect();
    assert_eq!(sequence, vec![1, 2, 3]);
    assert!(matches!(
        history[0].event,
        HistoryEvent::Attempt {
            outcome: central_outbox::domain::delivery::AttemptOutcome::PermanentFailure,
            ..
        }
    ));
    assert_eq!(history[0].error.as_deref(), Some("550 no such user"));
    assert_eq!(
        history[1].event,
        HistoryEvent::Operator {
            action: OperatorAction::Retry,
            actor: "ann".into()
        }
    );
    assert!(matches!(
        history[2].event,
        HistoryEvent::Attempt {
            outcome: central_outbox::domain::delivery::AttemptOutcome::InFlight,
            ..
        }
    ));
    let history = store
        .detail(id("parked two"))
        .await
        .unwrap()
        .unwrap()
        .history;
    assert_eq!(
        history.last().map(|e| &e.event),
        Some(&HistoryEvent::Operator {
            action: OperatorAction::Discard,
            actor: "bob".into()
        })
    );

    // A bulk call by ids answers per id, in order.
    let results = store
        .act_on_ids(
            OperatorAction::Discard,
            vec![id("delivered"), id("parked two"), id("parked one")],
            actor,
        )
        .await
        .unwrap();
    assert_eq!(
        results
            .iter()
            .map(|r| r.as_ref().err().copied())
            .collect::<Vec<_>>(),
        vec![
            Some(ActionRefusal::WrongStatus(Status::Delivered)),
            Some(ActionRefusal::WrongStatus(Status::Discarded)),
            Some(ActionRefusal::WrongStatus(Status::Pending)),
        ]
    );
}

pub(crate) async fn bulk_by_filter_changes_exactly_the_matching_parked_rows<
    S: OutboxStore + Rows,
>(
    store: &S,
) {
    let mut specs = Vec::new();
    for i in 0..5 {
        specs.push(Spec::new(
            "north",
            "ops",
            &format!("north parked {i}"),
            End::Parked,
        ));
    }
    for i in 0..3 {
        specs.push(Spec::new(
            "south",
            "ops",
            &format!("south parked {i}"),
            End::Parked,
        ));
    }
    specs.push(Spec::new("north", "ops", "north delivered", End::Delivered));
    specs.push(Spec::new(
        "north",
        "ops",
        "north retrying",
        End::Retrying(3600),
    ));
    specs.push(Spec::new(
        "north",
        "maintenance",
        "north other list",
        End::Parked,
    ));
    let seeded = seed::seed(store, &specs).await;
    let filter = NotificationFilter {
        source_site_id: Some("north".into()),
        list_name: Some("ops".into()),
        ..Default::default()
    };
    let actor = Actor::new("ann");

    let first = store
        .act_on_filter(OperatorAction::Retry, filter.clone(), 3, actor.clone())
        .await
        .unwrap();
    assert_eq!(first.changed.len(), 3);
    assert!(first.more_matching);
    let second = store
        .act_on_filter(OperatorAction::Retry, filter.clone(), 3, actor.clone())
        .await
        .unwrap();
    assert_eq!(second.changed.len(), 2);
    assert!(!second.more_matching);
    let third = store
        .act_on_filter(OperatorAction::Retry, filter, 3, actor)
        .await
        .unwrap();
    assert!(third.changed.is_empty() && !third.more_matching);

    let changed: HashSet<NotificationId> =
        first.changed.into_iter().chain(second.changed).collect();
    for s in &seeded {
        let state = store.state(s.id).await.unwrap().unwrap();
        let targeted = s.spec.site == "north" && s.spec.list == "ops" && s.spec.end == End::Parked;
        assert_eq!(changed.contains(&s.id), targeted, "{}", s.spec.subject);
        let expected = if targeted {
            Status::Pending
        } else {
            s.spec.status()
        };
        assert_eq!(state.status, expected, "{}", s.spec.subject);
    }
}

/// A dry run (`count_on_filter`) counts exactly the Parked rows the same bulk action would change,
/// up to the limit and saying whether more match, and changes nothing.
pub(crate) async fn a_dry_run_counts_what_a_bulk_action_would_change<S: OutboxStore + Rows>(
    store: &S,
) {
    let mut specs = Vec::new();
    for i in 0..5 {
        specs.push(Spec::new(
            "north",
            "ops",
            &format!("north parked {i}"),
            End::Parked,
        ));
    }
    specs.push(Spec::new("south", "ops", "south parked", End::Parked));
    specs.push(Spec::new("north", "ops", "north pending", End::Pending));
    specs.push(Spec::new("north", "ops", "north delivered", End::Delivered));
    specs.push(Spec::new("north", "ops", "north discarded", End::Discarded));
    let seeded = seed::seed(store, &specs).await;
    let filter = NotificationFilter {
        source_site_id: Some("north".into()),
        ..Default::default()
    };

    let all = store.count_on_filter(filter.clone(), 1000).await.unwrap();
    assert_eq!((all.matching, all.more_matching), (5, false));
    let exact = store.count_on_filter(filter.clone(), 5).await.unwrap();
    assert_eq!((exact.matching, exact.more_matching), (5, false));
    let capped = store.count_on_filter(filter.clone(), 3).await.unwrap();
    assert_eq!((capped.matching, capped.more_matching), (3, true));
    // Like the action, the count looks at Parked rows only, whatever statuses the filter names.
    let pending = NotificationFilter {
        statuses: vec![Status::Pending],
        ..filter.clone()
    };
    assert_eq!(
        store.count_on_filter(pending, 1000).await.unwrap().matching,
        5
    );
    let nothing = NotificationFilter {
        subject_contains: Some("no such subject".into()),
        ..filter.clone()
    };
    assert_eq!(
        store.count_on_filter(nothing, 1000).await.unwrap(),
        Default::default()
    );
    for s in &seeded {
        let state = store.state(s.id).await.unwrap().unwrap();
        assert_eq!(
            state.status,
            s.spec.status(),
            "{}: a count changes nothing",
            s.spec.subject
        );
    }

    // The count agrees with what the action then does.
    let acted = store
        .act_on_filter(
            OperatorAction::Discard,
            filter.clone(),
            3,
            Actor::new("ann"),
        )
        .await
        .unwrap();
    assert_eq!(acted.changed.len(), capped.matching);
    let left = store.count_on_filter(filter, 1000).await.unwrap();
    assert_eq!((left.matching, left.more_matching), (2, false));
}

/// The KPI figures for `rows`, computed here from their states by the definitions in the
/// contract, not by the store.
fn expected_kpis(rows: &[&NotificationState], p: &KpiParams) -> KpiValues {
    let stuck_before = p.now - chrono::Duration::from_std(p.stuck_age_threshold).unwrap();
    let delivered_since = p.now - chrono::Duration::from_std(p.delivered_window).unwrap();
    let live = |s: &&&NotificationState| matches!(s.status, Status::Pending | Status::Retrying);
    let age =
        |created: Option<DateTime<Utc>>| created.map(|c| (p.now - c).to_std().unwrap_or_default());
    KpiValues {
        queue_depth: rows.iter().filter(live).count() as u64,
        stuck_count: rows
            .iter()
            .filter(live)
            .filter(|s| s.created_at < stuck_before)
            .count() as u64,
        parked_count: rows.iter().filter(|s| s.status == Status::Parked).count() as u64,
        delivered_recently: rows
            .iter()
            .filter(|s| s.status == Status::Delivered)
            .filter(|s| s.delivered_at.is_some_and(|d| d >= delivered_since))
            .count() as u64,
        oldest_pending_age: age(rows
            .iter()
            .filter(|s| {
                s.status == Status::Pending
                    || (s.status == Status::Retrying
                        && s.next_attempt_at.is_none_or(|n| n <= p.now))
            })
            .map(|s| s.created_at)
            .min()),
        oldest_retry_wait_age: age(rows
            .iter()
            .filter(|s| {
                s.status == Status::Retrying && s.next_attempt_at.is_some_and(|n| n > p.now)
            })
            .map(|s| s.created_at)
            .min()),
    }
}

pub(crate) async fn kpis_match_an_independent_count<S: OutboxStore + Rows>(store: &S) {
    let ends = [
        End::Pending,
        End::Retrying(3600),
        End::Retrying(-5),
        End::Delivered,
        End::Parked,
        End::Discarded,
    ];
    let specs: Vec<Spec> = (0..36)
        .map(|i| {
            let site = ["north", "south", "east"][i % 3];
            Spec::new(
                site,
                "ops",
                &format!("kpi row {i}"),
                ends[(i / 3) % ends.len()],
            )
        })
        .collect();
    let seeded = seed::seed(store, &specs).await;
    let states = seed::states(store, &seeded).await;
    let newest = states.iter().map(|s| s.created_at).max().unwrap();
    let oldest = states.iter().map(|s| s.created_at).min().unwrap();

    // Several points of view: now, and later (so everything live is stuck and nothing was
    // delivered recently), with thresholds that split the rows.
    let views = [
        KpiParams {
            now: newest + chrono::Duration::seconds(1),
            stuck_age_threshold: Duration::from_secs(600),
            delivered_window: Duration::from_secs(60),
        },
        KpiParams {
            now: newest + chrono::Duration::minutes(30),
            stuck_age_threshold: Duration::from_secs(600),
            delivered_window: Duration::from_secs(60),
        },
        KpiParams {
            now: newest + chrono::Duration::hours(2),
            stuck_age_threshold: (newest + chrono::Duration::hours(2) - oldest)
                .to_std()
                .unwrap(),
            delivered_window: Duration::from_secs(3 * 3600),
        },
    ];
    for params in views {
        let kpis = store.kpis(params).await.unwrap();
        let all: Vec<&NotificationState> = states.iter().collect();
        assert_eq!(
            kpis.global,
            expected_kpis(&all, &params),
            "global at {params:?}"
        );
        let mut expected_sites = Vec::new();
        for site in ["east", "north", "south"] {
            let rows: Vec<&NotificationState> =
                states.iter().filter(|s| s.source_site_id == site).collect();
            let values = expected_kpis(&rows, &params);
            if values != KpiValues::default() {
                expected_sites.push((site.to_owned(), values));
            }
        }
        assert_eq!(kpis.sites, expected_sites, "per site at {params:?}");
    }
    // Sanity of the seeding itself: every figure is exercised.
    let first = store.kpis(views[0]).await.unwrap().global;
    assert!(first.queue_depth > 0 && first.parked_count > 0 && first.delivered_recently > 0);
    assert!(first.oldest_pending_age.is_some() && first.oldest_retry_wait_age.is_some());
}

fn email_list(name: &str, recipients: &[&str]) -> NotificationList {
    NotificationList::parse(ListInput {
        name: name.into(),
        recipients: recipients.iter().map(|r| r.to_string()).collect(),
        ..Default::default()
    })
    .unwrap()
}

pub(crate) async fn lists_and_smtp_settings_round_trip<S: OutboxStore>(store: &S) {
    let ops = email_list("ops", &["b@plant.test", "a@plant.test"]);
    let shift = email_list("shift", &["c@plant.test"]);
    let hooks = NotificationList::parse(ListInput {
        name: "hooks".into(),
        kind: Some(NotificationType::Webhook),
        endpoints: vec![
            "https://hooks.plant.test/teams".into(),
            "http://127.0.0.1:9/local".into(),
        ],
        webhook_format: Some(WebhookFormat::Teams),
        webhook_secret: Some("0123456789abcdef-signing".into()),
        ..Default::default()
    })
    .unwrap();
    for list in [&ops, &shift, &hooks] {
        store.upsert_list(list.clone()).await.unwrap();
    }
    let names: Vec<String> = store
        .lists()
        .await
        .unwrap()
        .into_iter()
        .map(|l| l.value.name.as_str().to_owned())
        .collect();
    assert_eq!(names, ["hooks", "ops", "shift"]);
    let stored = store.list(&ops.name).await.unwrap().unwrap().value;
    assert_eq!(stored.target_names(), ["a@plant.test", "b@plant.test"]);
    // A webhook list keeps its endpoints, format and secret.
    let stored = store.list(&hooks.name).await.unwrap().unwrap().value;
    let ListTargets::Webhook(target) = &stored.targets else {
        panic!("a webhook list came back as {stored:?}");
    };
    assert_eq!(target.format, WebhookFormat::Teams);
    assert_eq!(
        target.secret.as_ref().map(Secret::expose),
        Some("0123456789abcdef-signing")
    );
    assert_eq!(stored.target_names().len(), 2);

    // Upsert replaces the recipients as a whole.
    let replaced = email_list("ops", &["z@plant.test"]);
    store.upsert_list(replaced.clone()).await.unwrap();
    assert_eq!(
        store.list(&ops.name).await.unwrap().unwrap().value,
        replaced
    );

    assert!(store.delete_list(&ops.name).await.unwrap());
    assert!(!store.delete_list(&ops.name).await.unwrap());
    assert!(store.list(&ops.name).await.unwrap().is_none());
    assert!(
        store
            .list(&ListName::parse("shift".into()).unwrap())
            .await
            .unwrap()
            .is_some()
    );

    assert!(store.smtp_settings().await.unwrap().is_none());
    let password = SmtpSettings {
        host: "relay.plant.test".into(),
        port: 587,
        tls: TlsMode::StartTls,
        auth: SmtpAuth::Password {
            username: "outbox".into(),
            password: Secret::new("s3cret".into()),
        },
        from_address: EmailAddress::parse("outbox@plant.test", "from_address").unwrap(),
        timeout: Duration::from_secs(20),
        overall_timeout: Duration::from_secs(90),
        fallback_relays: vec![],
        policy: DeliveryPolicy {
            max_retries: 7,
            retry_delay: Duration::from_secs(90),
            backoff: Backoff::Fixed,
            max_concurrent_connections: 3,
            rate_limit: None,
        },
    };
    let xoauth2 = SmtpSettings {
        auth: SmtpAuth::XOAuth2 {
            username: "outbox@plant.test".into(),
            oauth: OAuthClientCredentials {
                token_url: "https://login.plant.test/token".into(),
                client_id: "outbox".into(),
                client_secret: Secret::new("client-s3cret".into()),
                scope: "https://outlook.office365.com/.default".into(),
            },
        },
        policy: DeliveryPolicy {
            backoff: Backoff::Exponential {
                cap: Duration::from_secs(1800),
            },
            rate_limit: Some(RateLimit::parse(Some(2.5), Some(5)).unwrap().unwrap()),
            ..password.policy.clone()
        },
        ..password.clone()
    };
    for settings in [password, xoauth2] {
        store.put_smtp_settings(settings.clone()).await.unwrap();
        assert_eq!(
            store.smtp_settings().await.unwrap().unwrap().value,
            settings
        );
    }
    assert!(store.delete_smtp_settings().await.unwrap());
    assert!(!store.delete_smtp_settings().await.unwrap());
    assert!(store.smtp_settings().await.unwrap().is_none());
}
