//! The admin API against a running central: operator Retry and Discard leading to real delivery
//! (or not), their history, the errors every other status gets, the retention purge as the
//! service runs it, `/metrics` agreeing with GetKpis, and a list's flood consolidation settings
//! as the config file, the gRPC API, `outboxctl` and `grpcurl` set and show them.

use std::net::SocketAddr;
use std::time::Duration;

use central_outbox::config::{Config as CentralConfig, Overrides};
use outbox_proto::time::to_duration;
use outbox_proto::v1;
use outbox_tests::smtp_sink::Behaviour;
use serde_json::{Value, json};
use tonic::Code;

use crate::harness::{
    Central, Db, LIST, binary, central_config, eventually, free_addr, ingest_one, smtp_sink,
    wait_for_status,
};
use crate::operations::{Run, grpcurl_path, run};

/// A request carrying the operator's name, as outboxctl and UI backends send it.
fn as_operator<T>(message: T, who: &str) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request
        .metadata_mut()
        .insert("x-outbox-actor", who.parse().unwrap());
    request
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_of_a_parked_notification_delivers_it_and_discard_keeps_it() {
    let dir = tempfile::tempdir().unwrap();
    let sink = smtp_sink().await;
    sink.set_behaviour(Behaviour::RejectRcpt {
        code: 550,
        text: "5.1.1 mailbox unavailable".into(),
    });
    let central = Central::start(central_config(dir.path(), Some(sink.addr()))).await;
    let retried = ingest_one(&central, "Tank 4 high level").await;
    let discarded = ingest_one(&central, "Tank 5 high level").await;
    for id in [&retried, &discarded] {
        let (_, _, error) = wait_for_status(&central.db, id, "Parked").await;
        assert!(
            error.unwrap().contains("550"),
            "the reply is kept in LastError"
        );
    }
    assert!(sink.messages().is_empty());

    // The relay is fixed; an operator retries one and discards the other.
    sink.set_behaviour(Behaviour::Accept);
    let mut outbox = central.outbox().await;
    let view = outbox
        .retry_notification(as_operator(
            v1::RetryNotificationRequest {
                notification_id: retried.clone(),
            },
            "ann",
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(view.status(), v1::NotificationStatus::Pending);
    assert_eq!(view.retry_count, 0);
    assert_eq!(view.last_error, "");
    assert!(
        view.next_attempt_at.is_some(),
        "a retried row is due at once"
    );
    let view = outbox
        .discard_notification(as_operator(
            v1::DiscardNotificationRequest {
                notification_id: discarded.clone(),
            },
            "bob",
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(view.status(), v1::NotificationStatus::Discarded);

    wait_for_status(&central.db, &retried, "Delivered").await;
    let mail = sink.wait_for_messages(1, Duration::from_secs(30)).await;
    assert_eq!(mail.len(), 1);
    assert_eq!(mail[0].subject().as_deref(), Some("Tank 4 high level"));

    // The history tells the story, oldest first, with who acted.
    let detail = outbox
        .get_notification_detail(v1::GetNotificationDetailRequest {
            notification_id: retried.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    let story: Vec<(v1::HistoryEntryKind, v1::AttemptOutcome, String)> = detail
        .history
        .iter()
        .map(|e| (e.kind(), e.outcome(), e.actor.clone()))
        .collect();
    use v1::AttemptOutcome as O;
    use v1::HistoryEntryKind as K;
    assert_eq!(
        story,
        vec![
            (K::DeliveryAttempt, O::PermanentFailure, String::new()),
            (K::OperatorRetry, O::Unspecified, "ann".into()),
            (K::DeliveryAttempt, O::Delivered, String::new()),
        ]
    );
    assert!(detail.history[0].error.contains("550"));
    assert_eq!(detail.body, "body");
    assert!(detail.resolved_targets.contains("alice@plant.example.test"));
    let detail = outbox
        .get_notification_detail(v1::GetNotificationDetailRequest {
            notification_id: discarded.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    let last = detail.history.last().unwrap();
    assert_eq!(
        (last.kind(), last.actor.as_str()),
        (K::OperatorDiscard, "bob")
    );

    // From any status but Parked both actions are refused with FAILED_PRECONDITION naming the
    // status, and change nothing.
    for (id, status) in [(&retried, "DELIVERED"), (&discarded, "DISCARDED")] {
        let before = Db::open(&central.db).attempts(id).len();
        let retry = outbox
            .retry_notification(v1::RetryNotificationRequest {
                notification_id: id.clone(),
            })
            .await
            .unwrap_err();
        assert_eq!(retry.code(), Code::FailedPrecondition);
        assert!(retry.message().contains(status), "{}", retry.message());
        let discard = outbox
            .discard_notification(v1::DiscardNotificationRequest {
                notification_id: id.clone(),
            })
            .await
            .unwrap_err();
        assert_eq!(discard.code(), Code::FailedPrecondition);
        assert_eq!(Db::open(&central.db).attempts(id).len(), before);
    }
    let unknown = outbox
        .retry_notification(v1::RetryNotificationRequest {
            notification_id: uuid::Uuid::new_v4().to_string(),
        })
        .await
        .unwrap_err();
    assert_eq!(unknown.code(), Code::NotFound);
    let invalid = outbox
        .discard_notification(v1::DiscardNotificationRequest {
            notification_id: "tank-4".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(invalid.code(), Code::InvalidArgument);
    assert!(invalid.message().starts_with("notification_id"));
    assert_eq!(sink.messages().len(), 1, "the discarded one was never sent");
    central.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bulk_retry_by_filter_and_bad_requests() {
    let dir = tempfile::tempdir().unwrap();
    let sink = smtp_sink().await;
    sink.set_behaviour(Behaviour::RejectMail {
        code: 554,
        text: "5.7.1 relay denied".into(),
    });
    let central = Central::start(central_config(dir.path(), Some(sink.addr()))).await;
    let mut ids = Vec::new();
    for i in 0..5 {
        ids.push(ingest_one(&central, &format!("Pump {i} tripped")).await);
    }
    let other = ingest_one(&central, "Tank overflow").await;
    for id in ids.iter().chain([&other]) {
        wait_for_status(&central.db, id, "Parked").await;
    }
    sink.set_behaviour(Behaviour::Accept);
    let mut outbox = central.outbox().await;

    let response = outbox
        .retry_notifications(as_operator(
            v1::BulkActionRequest {
                selector: Some(v1::bulk_action_request::Selector::Filter(
                    v1::NotificationFilter {
                        subject_contains: "pump".into(),
                        ..Default::default()
                    },
                )),
                limit: 0,
                parked_before: None,
                dry_run: false,
            },
            "ann",
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(response.changed, 5);
    assert!(!response.more_matching);
    let mut changed = response.changed_ids.clone();
    changed.sort();
    let mut expected = ids.clone();
    expected.sort();
    assert_eq!(changed, expected);
    for id in &ids {
        wait_for_status(&central.db, id, "Delivered").await;
    }
    assert_eq!(Db::open(&central.db).row(&other).unwrap().0, "Parked");

    // By ids: the delivered ones are skipped with the reason, the parked one is discarded.
    let response = outbox
        .discard_notifications(v1::BulkActionRequest {
            selector: Some(v1::bulk_action_request::Selector::Ids(
                v1::NotificationIds {
                    notification_ids: vec![ids[0].clone(), other.clone()],
                },
            )),
            limit: 0,
            parked_before: None,
            dry_run: false,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(response.changed_ids, vec![other.clone()]);
    assert_eq!(response.skipped.len(), 1);
    assert_eq!(response.skipped[0].notification_id, ids[0]);
    assert!(response.skipped[0].reason.contains("DELIVERED"));

    // Bad requests name the field and change nothing.
    type Case = (v1::BulkActionRequest, &'static str);
    let cases: Vec<Case> = vec![
        (
            v1::BulkActionRequest {
                selector: None,
                limit: 0,
                parked_before: None,
                dry_run: false,
            },
            "selector",
        ),
        (
            v1::BulkActionRequest {
                selector: Some(v1::bulk_action_request::Selector::Filter(
                    v1::NotificationFilter {
                        statuses: vec![v1::NotificationStatus::Delivered.into()],
                        ..Default::default()
                    },
                )),
                limit: 0,
                parked_before: None,
                dry_run: false,
            },
            "filter.statuses",
        ),
        (
            v1::BulkActionRequest {
                selector: Some(v1::bulk_action_request::Selector::Ids(
                    v1::NotificationIds {
                        notification_ids: vec![ids[1].clone(), "nope".into()],
                    },
                )),
                limit: 0,
                parked_before: None,
                dry_run: false,
            },
            "ids.notification_ids",
        ),
        (
            v1::BulkActionRequest {
                selector: Some(v1::bulk_action_request::Selector::Ids(
                    v1::NotificationIds {
                        notification_ids: vec![ids[1].clone(); 1001],
                    },
                )),
                limit: 0,
                parked_before: None,
                dry_run: false,
            },
            "ids.notification_ids",
        ),
    ];
    for (request, field) in cases {
        let status = outbox.retry_notifications(request).await.unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument);
        assert!(status.message().starts_with(field), "{}", status.message());
    }
    let query = outbox
        .query_notifications(v1::QueryNotificationsRequest {
            page_token: "garbage".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert!(query.message().starts_with("page_token"));
    central.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_queue_depth_matches_get_kpis() {
    let dir = tempfile::tempdir().unwrap();
    let sink = smtp_sink().await;
    // Transient failures with a long retry delay keep rows in the queue while the test looks.
    sink.set_behaviour(Behaviour::RejectMail {
        code: 451,
        text: "4.3.0 try again later".into(),
    });
    let mut config = central_config(dir.path(), Some(sink.addr()));
    if let Some(smtp) = config.smtp.as_mut() {
        smtp.retry_delay = Duration::from_secs(3600);
    }
    let metrics_addr = free_addr().await;
    config.metrics_listen = Some(metrics_addr);
    let central = Central::start(config).await;
    let mut ids = Vec::new();
    for i in 0..4 {
        ids.push(ingest_one(&central, &format!("Feeder {i} overload")).await);
    }
    for id in &ids {
        wait_for_status(&central.db, id, "Retrying").await;
    }

    let kpis = central
        .outbox()
        .await
        .get_kpis(v1::GetKpisRequest::default())
        .await
        .unwrap()
        .into_inner();
    let global = kpis.global.unwrap();
    assert_eq!(global.queue_depth, 4);
    assert!(global.oldest_retry_wait_age_seconds.is_some());
    assert_eq!(global.oldest_pending_age_seconds, None);
    assert_eq!(kpis.sites.len(), 1);
    assert_eq!(kpis.sites[0].source_site_id, "site-a");

    // The KPI gauges are refreshed at scrape time, but a scrape waits for the KPI query only so
    // long (on a cold MS SQL connection it can take longer): it shows the figures once read.
    let scrape = eventually("a scrape shows the KPIs GetKpis answered", || async move {
        let scrape = metrics_endpoint::get(metrics_addr, "/metrics")
            .await
            .unwrap();
        assert_eq!(scrape.status, 200);
        (metrics_endpoint::sample(&scrape.body, "outbox_queue_depth") == Some(4.0))
            .then_some(scrape)
    })
    .await;
    let sample = |series: &str| metrics_endpoint::sample(&scrape.body, series);
    assert_eq!(
        sample("outbox_queue_depth"),
        Some(global.queue_depth as f64)
    );
    assert_eq!(sample("outbox_parked"), Some(global.parked_count as f64));
    assert_eq!(
        sample("outbox_by_site_queue_depth{site=\"site-a\"}"),
        Some(4.0)
    );
    assert_eq!(
        sample("outbox_ingest_total{outcome=\"accepted\"}"),
        Some(4.0)
    );
    assert_eq!(sample("outbox_dispatcher_leader"), Some(1.0));
    let transient =
        sample("outbox_delivery_attempts_total{channel=\"Email\",outcome=\"TransientFailure\"}");
    assert_eq!(transient, Some(4.0));
    central.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_purge_removes_terminal_rows_past_retention_and_keeps_live_ones() {
    let dir = tempfile::tempdir().unwrap();
    let sink = smtp_sink().await;
    let config = central_config(dir.path(), Some(sink.addr()));
    let central = Central::start(config.clone()).await;
    let delivered = ingest_one(&central, "Delivered long ago").await;
    wait_for_status(&central.db, &delivered, "Delivered").await;
    sink.set_behaviour(Behaviour::RejectMail {
        code: 550,
        text: "5.1.1 no such user".into(),
    });
    let parked = ingest_one(&central, "Parked and never looked at").await;
    wait_for_status(&central.db, &parked, "Parked").await;
    // The live row's retries wait an hour, set before it is sent so that it stays Retrying
    // (with the test's short delay it could be retried to Parked between two looks at a slow
    // database): an operator's change, stored, so the restart below keeps it (the file only
    // seeds what the database lacks).
    let mut outbox = central.outbox().await;
    let smtp = outbox
        .get_smtp_config(v1::GetSmtpConfigRequest {})
        .await
        .unwrap()
        .into_inner();
    outbox
        .upsert_smtp_config(v1::UpsertSmtpConfigRequest {
            host: smtp.host,
            port: smtp.port,
            tls_mode: smtp.tls_mode,
            from_address: smtp.from_address,
            max_retries: smtp.max_retries,
            timeout: smtp.timeout,
            overall_timeout: smtp.overall_timeout,
            retry_delay: Some(to_duration(Duration::from_secs(3600))),
            ..Default::default()
        })
        .await
        .unwrap();
    sink.set_behaviour(Behaviour::RejectMail {
        code: 451,
        text: "4.3.0 try again later".into(),
    });
    let live = ingest_one(&central, "Still retrying").await;
    wait_for_status(&central.db, &live, "Retrying").await;
    central.stop().await;

    // Restart with a retention shorter than the resolved rows' age: the new leader purges once.
    let mut config = config;
    let metrics_addr = free_addr().await;
    config.metrics_listen = Some(metrics_addr);
    config.retention.terminal_retention = Duration::from_millis(1);
    let central = Central::start(config).await;
    let db = Db::open(&central.db);
    eventually("the delivered and parked rows are purged", || {
        let gone = db.row(&delivered).is_none() && db.row(&parked).is_none();
        async move { gone.then_some(()) }
    })
    .await;
    // The Parked row (unresolved operator work) is counted apart, not gone without a trace.
    // (Counted once the pass ends, just after its last delete.)
    let scrape = eventually("the purge pass is counted", || async move {
        let scrape = metrics_endpoint::get(metrics_addr, "/metrics").await.ok()?;
        let purged = metrics_endpoint::sample(&scrape.body, "outbox_purged_notifications_total");
        (purged == Some(2.0)).then_some(scrape.body)
    })
    .await;
    assert_eq!(
        metrics_endpoint::sample(&scrape, "outbox_purged_parked_notifications_total"),
        Some(1.0)
    );
    assert!(
        db.attempts(&delivered).is_empty(),
        "its history went with it"
    );
    assert_eq!(
        db.row(&live).unwrap().0,
        "Retrying",
        "live rows are never purged"
    );
    assert!(!db.attempts(&live).is_empty());
    central.stop().await;
}

/// A row changed behind the service's back so that its content no longer validates (a hand
/// edit, a restore of old data) is not delivered: retried by an operator, it is parked with the
/// reason in LastError and on its attempt row, the same on every backend. On SQLite, where
/// timestamps are stored as integers, an impossible timestamp is an error naming the column,
/// never a made-up 1970 date.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_damaged_in_the_database_is_parked_with_its_reason() {
    let dir = tempfile::tempdir().unwrap();
    let sink = smtp_sink().await;
    sink.set_behaviour(Behaviour::RejectMail {
        code: 550,
        text: "5.1.1 no such user".into(),
    });
    let central = Central::start(central_config(dir.path(), Some(sink.addr()))).await;
    let id = ingest_one(&central, "Damaged later").await;
    wait_for_status(&central.db, &id, "Parked").await;
    sink.set_behaviour(Behaviour::Accept);

    let db = Db::open(&central.db);
    let bad_list = "ops\u{7}";
    assert_eq!(
        db.execute(
            "UPDATE Notifications SET ListName = ?2 WHERE NotificationId = ?1",
            &[&id, bad_list]
        ),
        1
    );
    let mut outbox = central.outbox().await;
    outbox
        .retry_notification(as_operator(
            v1::RetryNotificationRequest {
                notification_id: id.clone(),
            },
            "ann",
        ))
        .await
        .unwrap();
    let error = eventually("the damaged row is parked again", || {
        // Retry cleared LastError; it is set again only by the new attempt.
        let parked = db
            .row(&id)
            .filter(|(status, _, _)| status == "Parked")
            .and_then(|(_, _, error)| error);
        async move { parked }
    })
    .await;
    assert!(
        error.starts_with("stored row is invalid: list_name"),
        "{error}"
    );
    let attempts = db.attempts(&id);
    let last = attempts.last().unwrap();
    assert_eq!(
        (last.1.as_str(), last.2.as_deref()),
        ("PermanentFailure", Some(error.as_str())),
        "the history says why: {attempts:?}"
    );
    assert!(sink.messages().is_empty(), "nothing was sent");

    if matches!(db, Db::Sqlite(_)) {
        db.execute(
            "UPDATE Notifications SET CreatedAt = ?2 WHERE NotificationId = ?1",
            &[&id, &i64::MAX.to_string()],
        );
        let status = outbox
            .get_notification_status(v1::GetNotificationStatusRequest {
                notification_id: id.clone(),
            })
            .await
            .unwrap_err();
        assert_eq!(status.code(), Code::Internal, "{status:?}");
        assert!(
            status.message().contains("CreatedAt"),
            "the error names the column: {status:?}"
        );
    }
    central.stop().await;
}

/// A list's consolidation as the API carries it.
fn consolidation(threshold: u32, window: Duration, max_per_digest: u32) -> v1::ListConsolidation {
    v1::ListConsolidation {
        threshold,
        window: Some(to_duration(window)),
        max_per_digest,
    }
}

fn email_list(name: &str, recipient: &str) -> v1::NotificationList {
    v1::NotificationList {
        name: name.into(),
        r#type: v1::NotificationType::Email.into(),
        recipients: vec![recipient.into()],
        ..Default::default()
    }
}

async fn get_list(central: &Central, name: &str) -> v1::NotificationList {
    central
        .outbox()
        .await
        .get_notification_list(v1::GetNotificationListRequest { name: name.into() })
        .await
        .unwrap()
        .into_inner()
}

#[tokio::test]
async fn list_consolidation_from_the_config_file_and_the_api_round_trips_and_is_checked() {
    let dir = tempfile::tempdir().unwrap();
    // The operator's form: an inline table in the file central reads at start.
    let file = dir.path().join("central.toml");
    std::fs::write(
        &file,
        "[[lists]]\nname = 'flooded'\nrecipients = ['carol@plant.example.test']\n\
         consolidation = { threshold = 20, window = '1m', max_per_digest = 100 }\n",
    )
    .unwrap();
    let from_file = CentralConfig::load(Some(&file), Overrides::default()).unwrap();
    let mut config = central_config(dir.path(), None);
    config.lists.extend(from_file.lists);
    let central = Central::start(config).await;

    let seeded = get_list(&central, "flooded").await;
    assert_eq!(
        seeded.consolidation,
        Some(consolidation(20, Duration::from_secs(60), 100)),
        "stored at start-up as the file says"
    );
    assert_eq!(
        get_list(&central, LIST).await.consolidation,
        None,
        "a list without the table has none"
    );

    // Upserted through the API, it reads back as sent.
    let mut outbox = central.outbox().await;
    let bursty = v1::NotificationList {
        consolidation: Some(consolidation(5, Duration::from_secs(30), 10)),
        ..email_list("bursty", "dave@plant.example.test")
    };
    let stored = outbox
        .upsert_notification_list(v1::UpsertNotificationListRequest {
            list: Some(bursty.clone()),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(stored.consolidation, bursty.consolidation);
    let before = get_list(&central, "bursty").await;
    assert_eq!(before.consolidation, bursty.consolidation);
    assert_eq!(before.recipients, bursty.recipients);

    // Out-of-range settings are INVALID_ARGUMENT naming the field, and change nothing (not
    // even the recipients sent with them).
    let minute = Duration::from_secs(60);
    for (bad, field) in [
        (
            consolidation(0, minute, 100),
            "list.consolidation.threshold",
        ),
        (
            consolidation(5, Duration::from_millis(1500), 100),
            "list.consolidation.window",
        ),
        (
            consolidation(5, minute, 1),
            "list.consolidation.max_per_digest",
        ),
        (
            consolidation(0, Duration::from_millis(1500), 1),
            "list.consolidation.threshold",
        ),
        (
            v1::ListConsolidation {
                window: None,
                ..consolidation(5, minute, 10)
            },
            "list.consolidation.window",
        ),
    ] {
        let refused = outbox
            .upsert_notification_list(v1::UpsertNotificationListRequest {
                list: Some(v1::NotificationList {
                    consolidation: Some(bad),
                    ..email_list("bursty", "eve@plant.example.test")
                }),
            })
            .await
            .unwrap_err();
        assert_eq!(refused.code(), Code::InvalidArgument, "{bad:?}");
        assert!(
            refused.message().starts_with(field),
            "{bad:?}: {}",
            refused.message()
        );
        assert_eq!(get_list(&central, "bursty").await, before, "{bad:?}");
    }

    // Upsert replaces the list: without consolidation, it has none.
    let plain = outbox
        .upsert_notification_list(v1::UpsertNotificationListRequest {
            list: Some(email_list("bursty", "dave@plant.example.test")),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(plain.consolidation, None);
    assert_eq!(get_list(&central, "bursty").await.consolidation, None);
    central.stop().await;
}

/// `outboxctl --addr <central> ARGS...`, stdin closed.
async fn outboxctl(addr: SocketAddr, args: &[&str]) -> Run {
    let addr = format!("http://{addr}");
    let mut all = vec!["--addr", addr.as_str()];
    all.extend_from_slice(args);
    run(&binary("outboxctl"), &all, &[], None).await
}

/// The one `outboxctl: ...` line of a failed run that exited with `code` and printed nothing.
fn error_line(run: &Run, code: i32) -> &str {
    assert_eq!(run.code, Some(code), "{}{}", run.stdout, run.stderr);
    assert_eq!(run.stdout, "");
    let line = run.stderr.trim_end();
    assert!(
        line.starts_with("outboxctl: ") && !line.contains('\n'),
        "{}",
        run.stderr
    );
    line
}

#[tokio::test]
async fn outboxctl_and_grpcurl_set_and_show_a_lists_consolidation() {
    // Resolved first: a missing grpcurl should fail before any set-up work.
    grpcurl_path();
    let dir = tempfile::tempdir().unwrap();
    let central = Central::start(central_config(dir.path(), None)).await;
    let addr = central.addr;
    let set = |extra: &'static [&'static str]| {
        let mut args = vec![
            "lists",
            "set",
            "night-shift",
            "--recipient",
            "carol@plant.example.test",
        ];
        args.extend_from_slice(extra);
        args
    };
    let flags: &[&str] = &[
        "--consolidate-threshold",
        "20",
        "--consolidate-window",
        "60s",
        "--consolidate-max-per-digest",
        "100",
    ];
    let want = json!({"threshold": 20, "window": "60s", "max_per_digest": 100});

    let mut args = vec!["--json"];
    args.extend(set(flags));
    let stored = outboxctl(addr, &args).await.json();
    assert_eq!(stored["consolidation"], want);

    let table = outboxctl(addr, &["lists", "ls"]).await;
    assert_eq!(table.code, Some(0), "{}", table.stderr);
    let row = |name: &str| -> String {
        table
            .stdout
            .lines()
            .find(|l| l.starts_with(&format!("{name} ")))
            .unwrap_or_else(|| panic!("no {name} row:\n{}", table.stdout))
            .to_owned()
    };
    assert!(
        table
            .stdout
            .lines()
            .next()
            .unwrap()
            .contains(" CONSOLIDATION "),
        "{}",
        table.stdout
    );
    assert!(
        row("night-shift").contains(" more than 20 in 1m -> digests of at most 100 "),
        "{}",
        table.stdout
    );
    assert!(!row(LIST).contains("more than"), "{}", table.stdout);
    let listed = outboxctl(addr, &["--json", "lists", "ls"]).await.json();
    let by_name = |name: &str| -> Value {
        listed["lists"]
            .as_array()
            .unwrap()
            .iter()
            .find(|l| l["name"] == name)
            .cloned()
            .unwrap()
    };
    assert_eq!(by_name("night-shift")["consolidation"], want);
    assert_eq!(by_name(LIST)["consolidation"], Value::Null);
    let shown = outboxctl(addr, &["lists", "show", "night-shift"]).await;
    assert!(
        shown.stdout.lines().any(|l| l.starts_with("consolidation ")
            && l.ends_with("  more than 20 in 1m -> digests of at most 100")),
        "{}",
        shown.stdout
    );

    // Part of the flags: refused before anything is sent (exit 2, one line); the list stays.
    let partial = outboxctl(addr, &set(&["--consolidate-threshold", "5"])).await;
    let line = error_line(&partial, 2);
    assert!(
        line.contains("--consolidate-window and --consolidate-max-per-digest"),
        "{line}"
    );
    // Central's limits: INVALID_ARGUMENT naming the field; the list stays.
    let bad = outboxctl(
        addr,
        &set(&[
            "--consolidate-threshold",
            "20",
            "--consolidate-window",
            "1500ms",
            "--consolidate-max-per-digest",
            "100",
        ]),
    )
    .await;
    let line = error_line(&bad, 1);
    assert!(
        line.contains("list.consolidation.window") && line.ends_with("(INVALID_ARGUMENT)"),
        "{line}"
    );
    let kept = outboxctl(addr, &["--json", "lists", "show", "night-shift"])
        .await
        .json();
    assert_eq!(kept, stored, "refused requests change nothing");

    // `lists set` replaces the list: without the flags, consolidation is off.
    let mut args = vec!["--json"];
    args.extend(set(&[]));
    let plain = outboxctl(addr, &args).await.json();
    assert_eq!(plain["consolidation"], Value::Null);

    // The grpcurl form docs/operations.md shows (proto field names; grpcurl answers in
    // lowerCamelCase).
    let upserted = run(
        &grpcurl_path(),
        &[
            "-plaintext",
            "-d",
            r#"{"list": {"name": "night-shift", "type": "NOTIFICATION_TYPE_EMAIL",
                "recipients": ["carol@plant.example.test"],
                "consolidation": {"threshold": 20, "window": "60s", "max_per_digest": 100}}}"#,
            &addr.to_string(),
            "outbox.v1.NotificationOutbox/UpsertNotificationList",
        ],
        &[],
        None,
    )
    .await
    .json();
    assert_eq!(
        upserted["consolidation"],
        json!({"threshold": 20, "window": "60s", "maxPerDigest": 100})
    );
    let shown = outboxctl(addr, &["--json", "lists", "show", "night-shift"])
        .await
        .json();
    assert_eq!(shown["consolidation"], want);
    central.stop().await;
}
