//! The notifier alerts on itself (`[self_alerts]`), end to end: a site-forwarder process killed
//! is mailed to the alert list as offline after `site_offline_after`, and "recovered" once it
//! reports again; a relay refusing mail makes the email channel failing, which the webhook list
//! (never the failing email one) hears about, and "recovered" once the relay accepts again; the
//! heartbeat URL is called while a node dispatches, by the dispatching node only, and by the
//! next one when it stops. Each alert is one row from the reserved source `_central` with its
//! condition key, delivered once.

use std::path::Path;
use std::time::Duration;

use central_outbox::config::{Config as CentralConfig, ListConfig, SelfAlertsConfig};
use metrics_endpoint::sample;
use outbox_proto::v1;
use outbox_tests::smtp_sink::{Behaviour, SmtpSink};
use outbox_tests::webhook_server::WebhookServer;
use serde_json::Value;

use crate::harness::{Central, Db, central_config, eventually, free_addr, smtp_sink, submit};
use crate::site_health::spawn_reporting_site;

/// The lists the alerts go to, and who is on the email one.
const ALERT_LIST: &str = "outbox-ops";
const ALERT_HOOKS: &str = "outbox-hooks";
const ON_CALL: &str = "oncall@plant.example.test";

/// Checks often and recovers at the first clear check: the tests wait on what arrives, so
/// short intervals only make them quicker.
fn quick_self_alerts() -> SelfAlertsConfig {
    SelfAlertsConfig {
        email_list: Some(ALERT_LIST.into()),
        check_interval: Duration::from_millis(200),
        recover_after: Duration::ZERO,
        ..SelfAlertsConfig::default()
    }
}

fn with_alert_list(config: &mut CentralConfig) {
    config
        .lists
        .push(ListConfig::email(ALERT_LIST, vec![ON_CALL.into()]));
}

/// The mails whose subject is `subject`.
fn mails(sink: &SmtpSink, subject: &str) -> usize {
    sink.messages()
        .iter()
        .filter(|m| m.subject().as_deref() == Some(subject))
        .count()
}

/// The POSTs to `path` whose JSON subject is `subject`, as documents.
fn posts(hooks: &WebhookServer, path: &str, subject: &str) -> Vec<Value> {
    hooks
        .requests()
        .iter()
        .filter(|r| r.path == path)
        .filter_map(|r| r.json())
        .filter(|doc| doc["subject"] == subject)
        .collect()
}

/// Central's rows of condition `key`: (list, subject, status), oldest first.
fn central_rows(db: &Path, key: &str) -> Vec<(String, String, String)> {
    Db::open(db)
        .query(
            "SELECT ListName, Subject, Status FROM Notifications \
             WHERE SourceSiteId = '_central' AND ConditionKey = ?1 ORDER BY CreatedAt, Id",
            &[key],
        )
        .iter()
        .map(|row| {
            (
                row.get(0).unwrap(),
                row.get(1).unwrap(),
                row.get(2).unwrap(),
            )
        })
        .collect()
}

async fn scrape(metrics: std::net::SocketAddr, series: &str) -> Option<f64> {
    let reply = metrics_endpoint::get(metrics, "/metrics").await.ok()?;
    sample(&reply.body, series)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_site_killed_is_mailed_as_offline_and_recovered_when_it_reports_again() {
    let dir = tempfile::tempdir().unwrap();
    let sink = smtp_sink().await;
    let mut config = central_config(dir.path(), Some(sink.addr()));
    config.site_offline_after = Duration::from_secs(3);
    config.self_alerts = Some(quick_self_alerts());
    with_alert_list(&mut config);
    let metrics = free_addr().await;
    config.metrics_listen = Some(metrics);
    let central = Central::start(config).await;
    let raised = "outbox_self_alerts_raised_total{condition=\"site_offline\"}";
    assert_eq!(scrape(metrics, raised).await, Some(0.0), "exported at zero");

    let (site, _) = spawn_reporting_site(dir.path(), "north", central.addr).await;
    let outbox = central.outbox().await;
    eventually("the site reports, online", || {
        let mut outbox = outbox.clone();
        async move {
            let nodes = outbox
                .list_site_health(v1::ListSiteHealthRequest {})
                .await
                .ok()?
                .into_inner()
                .nodes;
            nodes
                .iter()
                .any(|n| n.site_id == "north" && n.online)
                .then_some(())
        }
    })
    .await;

    site.kill9().await;
    let alert = "[outbox ALERT] site north offline";
    eventually(
        "the alert list is mailed that the site is offline",
        || async { (mails(&sink, alert) > 0).then_some(()) },
    )
    .await;
    let mail = sink
        .messages()
        .into_iter()
        .find(|m| m.subject().as_deref() == Some(alert))
        .unwrap();
    assert_eq!(mail.rcpt_to, vec![ON_CALL.to_string()]);
    let text = mail.body_text();
    assert!(text.contains("no health report from site north"), "{text}");
    assert!(text.contains("outbox/site-offline/north/north"), "{text}");
    // One row from central itself, delivered (its outcome is recorded just after the relay
    // took the mail).
    let key = "outbox/site-offline/north/north";
    let delivered = vec![(
        ALERT_LIST.to_string(),
        alert.to_string(),
        "Delivered".to_string(),
    )];
    eventually("the alert's row is delivered", || async {
        (central_rows(&central.db, key) == delivered).then_some(())
    })
    .await;

    // The site comes back (its buffer as it left it): recovered.
    let (site, _) = spawn_reporting_site(dir.path(), "north", central.addr).await;
    let recovered = "[outbox RECOVERED] site north offline";
    eventually(
        "the alert list is mailed that the site recovered",
        || async { (mails(&sink, recovered) > 0).then_some(()) },
    )
    .await;
    eventually("the recovery row is delivered", || async {
        let rows = central_rows(&central.db, key);
        (rows.len() == 2 && rows[1].2 == "Delivered").then_some(rows)
    })
    .await;
    // Once each: however many checks saw it offline, and then online.
    assert_eq!((mails(&sink, alert), mails(&sink, recovered)), (1, 1));
    let recovered_total = "outbox_self_alerts_recovered_total{condition=\"site_offline\"}";
    assert_eq!(scrape(metrics, raised).await, Some(1.0));
    assert_eq!(scrape(metrics, recovered_total).await, Some(1.0));
    assert_eq!(
        scrape(
            metrics,
            "outbox_self_alerts_active{condition=\"site_offline\"}"
        )
        .await,
        Some(0.0)
    );
    site.kill9().await;
    central.stop().await;
}

/// A supervised task whose first starts fail (debug builds' `test_faults`) restarts below the
/// budget that takes a node out: the alert list hears it is restarting repeatedly, and, a whole
/// window without a restart later, that it recovered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_restarting_repeatedly_is_alerted_and_recovers_once_it_runs() {
    let dir = tempfile::tempdir().unwrap();
    let sink = smtp_sink().await;
    let mut config = central_config(dir.path(), Some(sink.addr()));
    config.test_faults = Some("purge=3".into());
    config.self_alerts = Some(SelfAlertsConfig {
        task_restarts: 3,
        task_restart_window: Duration::from_secs(10),
        ..quick_self_alerts()
    });
    with_alert_list(&mut config);
    let central = Central::start(config).await;
    let alert = "[outbox ALERT] task purge restarting repeatedly";
    let recovered = "[outbox RECOVERED] task purge restarting repeatedly";
    eventually(
        "the alert list hears the purge task keeps restarting",
        || async { (mails(&sink, alert) > 0).then_some(()) },
    )
    .await;
    eventually("and that it recovered", || async {
        (mails(&sink, recovered) > 0).then_some(())
    })
    .await;
    assert_eq!((mails(&sink, alert), mails(&sink, recovered)), (1, 1));
    let text = sink
        .messages()
        .into_iter()
        .find(|m| m.subject().as_deref() == Some(alert))
        .unwrap()
        .body_text();
    assert!(text.contains("restarted 3 times"), "{text}");
    central.stop().await;
}

/// Central with both alert lists, an SMTP relay `sink` that keeps retrying refused mail
/// quickly, and `tune` applied to the self-alerts.
async fn relay_case(
    dir: &Path,
    sink: &SmtpSink,
    hooks: &WebhookServer,
    tune: impl FnOnce(&mut SelfAlertsConfig),
) -> Central {
    let mut config = central_config(dir, Some(sink.addr()));
    if let Some(smtp) = &mut config.smtp {
        // Refused mail keeps being retried, so it is delivered once the relay heals.
        smtp.max_retries = 1000;
        smtp.retry_delay = Duration::from_millis(200);
    }
    with_alert_list(&mut config);
    config.lists.push(ListConfig::webhook(
        ALERT_HOOKS,
        vec![hooks.url("/alerts")],
        central_outbox::config::WebhookFormatKind::Generic,
    ));
    let mut self_alerts = SelfAlertsConfig {
        webhook_list: Some(ALERT_HOOKS.into()),
        ..quick_self_alerts()
    };
    tune(&mut self_alerts);
    config.self_alerts = Some(self_alerts);
    Central::start(config).await
}

/// The relay refuses every mail with a 4xx until healed; an alarm to the ops list is retried
/// meanwhile. The webhook list hears "channel Email failing" and, after the relay accepts
/// again and the alarm is delivered, "recovered"; the email alert list hears of neither.
async fn relay_refusing_then_healed(tune: impl FnOnce(&mut SelfAlertsConfig)) {
    let dir = tempfile::tempdir().unwrap();
    let sink = smtp_sink().await;
    let hooks = WebhookServer::start().await.unwrap();
    let central = relay_case(dir.path(), &sink, &hooks, tune).await;
    sink.set_behaviour(Behaviour::RejectMail {
        code: 451,
        text: "4.3.0 try again later".into(),
    });
    let alarm = submit("Tank 4 high level", "Level 97%");
    let id = alarm.notification_id.clone();
    let ack = central
        .ingest()
        .await
        .submit_notification(alarm)
        .await
        .unwrap()
        .into_inner();
    assert_eq!(ack.outcome(), v1::SubmitOutcome::Accepted);

    let alert = "[outbox ALERT] channel Email failing";
    let raised = eventually(
        "the webhook list hears the email channel is failing",
        || async { posts(&hooks, "/alerts", alert).into_iter().next() },
    )
    .await;
    assert_eq!(raised["source"]["site_id"], "_central");
    assert_eq!(raised["source"]["script"], "self-alerts");
    assert_eq!(raised["list_name"], ALERT_HOOKS);
    let facts = &raised["type_data"]["outbox_self_alert"];
    assert_eq!(facts["condition"], "channel_failing");
    assert_eq!(facts["key"], "outbox/channel-failing/email");
    assert_eq!(facts["state"], "raised");
    let db = Db::open(&central.db);
    assert_eq!(
        db.row(&id).map(|(status, _, _)| status),
        Some("Retrying".to_string()),
        "the alarm is still waiting for the relay"
    );

    sink.set_behaviour(Behaviour::Accept);
    let recovered = "[outbox RECOVERED] channel Email failing";
    eventually(
        "the webhook list hears the email channel recovered",
        || async { posts(&hooks, "/alerts", recovered).into_iter().next() },
    )
    .await;
    // Its outcome is recorded just after the relay took it.
    eventually("the alarm is delivered", || async {
        let status = db.row(&id).map(|(status, _, _)| status);
        (status.as_deref() == Some("Delivered")).then_some(())
    })
    .await;
    let rows = central_rows(&central.db, "outbox/channel-failing/email");
    let lists: Vec<&str> = rows.iter().map(|(list, _, _)| list.as_str()).collect();
    assert_eq!(
        lists,
        [ALERT_HOOKS, ALERT_HOOKS],
        "never through the failing channel: {rows:?}"
    );
    assert_eq!(mails(&sink, alert) + mails(&sink, recovered), 0);
    assert_eq!(
        (
            posts(&hooks, "/alerts", alert).len(),
            posts(&hooks, "/alerts", recovered).len()
        ),
        (1, 1),
        "one alert and one recovery"
    );
    central.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_refusing_in_a_row_is_alerted_through_the_webhook_list_and_recovers() {
    relay_refusing_then_healed(|s| {
        s.channel_failures = 3;
        // Long: only the streak of failures can raise it here.
        s.channel_max_wait = Duration::from_secs(3600);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_notification_waiting_too_long_makes_its_channel_failing() {
    relay_refusing_then_healed(|s| {
        // Out of reach: only the alarm's wait can raise it here.
        s.channel_failures = 1000;
        s.channel_max_wait = Duration::from_secs(2);
    })
    .await;
}

/// Central with a heartbeat to `path` on `hooks` every second, on the database in `dir`.
fn beating(dir: &Path, hooks: &WebhookServer, path: &str) -> CentralConfig {
    let mut config = central_config(dir, None);
    config.self_alerts = Some(SelfAlertsConfig {
        heartbeat_url: Some(hooks.url(path)),
        heartbeat_interval: Duration::from_secs(1),
        ..SelfAlertsConfig::default()
    });
    config
}

fn calls(hooks: &WebhookServer, path: &str) -> usize {
    hooks.requests().iter().filter(|r| r.path == path).count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_heartbeat_is_called_by_the_dispatching_node_and_by_the_next_when_it_stops() {
    let dir = tempfile::tempdir().unwrap();
    let hooks = WebhookServer::start().await.unwrap();
    let first = Central::start(beating(dir.path(), &hooks, "/beat-a")).await;
    eventually("the dispatching node calls the heartbeat", || async {
        (calls(&hooks, "/beat-a") > 0).then_some(())
    })
    .await;
    let beat = hooks
        .requests()
        .into_iter()
        .find(|r| r.path == "/beat-a")
        .unwrap();
    assert!(beat.body.is_empty());
    assert!(
        beat.header("user-agent")
            .is_some_and(|a| a.starts_with("central-outbox/")),
        "{:?}",
        beat.headers
    );

    // A second replica on the same database does not dispatch, and does not call: checked
    // after the first has called twice more with the second running.
    let second = Central::start(beating(dir.path(), &hooks, "/beat-b")).await;
    let before = calls(&hooks, "/beat-a");
    eventually("two more heartbeats from the dispatching node", || async {
        (calls(&hooks, "/beat-a") >= before + 2).then_some(())
    })
    .await;
    assert_eq!(
        calls(&hooks, "/beat-b"),
        0,
        "only the dispatching node calls"
    );

    // The dispatching node stops (its lease released): the other takes over, and the
    // watchdog keeps hearing from the cluster.
    first.stop().await;
    eventually("the next dispatching node calls the heartbeat", || async {
        (calls(&hooks, "/beat-b") > 0).then_some(())
    })
    .await;
    second.stop().await;
}

#[tokio::test]
async fn no_site_can_speak_as_central() {
    let dir = tempfile::tempdir().unwrap();
    let central = Central::start(central_config(dir.path(), None)).await;
    let mut ingest = central.ingest().await;
    let refused = ingest
        .submit_notification(v1::NotificationSubmit {
            source_site_id: "_central".into(),
            condition_key: "outbox/no-leader".into(),
            ..submit("[outbox RECOVERED] no dispatcher leader", "all is well")
        })
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::InvalidArgument, "{refused:?}");
    assert!(
        refused
            .message()
            .starts_with("source_site_id: \"_central\" is reserved"),
        "{}",
        refused.message()
    );
    let refused = ingest
        .clear_condition(v1::ClearConditionRequest {
            condition_key: "outbox/no-leader".into(),
            source_site_id: "_central".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::InvalidArgument, "{refused:?}");
    let refused = ingest
        .report_site_health(v1::SiteHealthReport {
            site_id: "_central".into(),
            node_name: "_central".into(),
            role: v1::NodeRole::Active.into(),
            version: "0.0.0".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::InvalidArgument, "{refused:?}");
    assert_eq!(
        Db::open(&central.db).count("SELECT COUNT(*) FROM Notifications"),
        0
    );
    central.stop().await;
}
