//! Operating central from the outside, the way an operator does: the real `grpcurl` binary and
//! the real `outboxctl` binary against an in-process central with a real SMTP sink. Rows are
//! parked by an SMTP sink answering 550 (or by a list nobody configured), then found, inspected,
//! retried and discarded; every answer is parsed and checked against what central stored.
//!
//! grpcurl is installed by `make tools` (which `make test` runs) into target/tools/venv, or found
//! through `OUTBOX_GRPCURL`. Its absence fails the test: a silently skipped check is no check.
//! The confirmation prompt needs a terminal; util-linux `script` provides a pseudo-terminal.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use outbox_proto::v1;
use outbox_tests::oauth_server::OAuthServer;
use outbox_tests::smtp_sink::{AuthRequirement, Behaviour, SinkOptions, SmtpSink};
use outbox_tests::webhook_server::WebhookServer;
use serde_json::Value;
use tokio::io::AsyncWriteExt;

use crate::harness::{
    Central, DEADLINE, Db, LIST, RECIPIENTS, binary, central_config, free_addr, smtp_sink, submit,
    wait_for_status,
};

/// The operator every outboxctl run acts as: outboxctl's `--actor` defaults to `$USER`.
const OPERATOR: &str = "ops-jane";

/// What a finished command printed and how it exited.
pub(crate) struct Run {
    what: String,
    pub(crate) code: Option<i32>,
    pub(crate) stdout: String,
    pub(crate) stderr: String,
}

impl Run {
    /// Asserts success and parses stdout as one JSON document.
    pub(crate) fn json(&self) -> Value {
        assert_eq!(
            self.code,
            Some(0),
            "{} failed:\n{}{}",
            self.what,
            self.stdout,
            self.stderr
        );
        serde_json::from_str(&self.stdout).unwrap_or_else(|e| {
            panic!(
                "{}: stdout is not one JSON document ({e}):\n{}",
                self.what, self.stdout
            )
        })
    }

    /// Asserts success and returns stdout.
    fn text(&self) -> &str {
        assert_eq!(
            self.code,
            Some(0),
            "{} failed:\n{}{}",
            self.what,
            self.stdout,
            self.stderr
        );
        &self.stdout
    }

    /// Asserts the failure shape outboxctl promises: exit `code`, nothing on stdout, exactly one
    /// `outboxctl: ...` line on stderr. Returns that line.
    fn error_line(&self, code: i32) -> &str {
        assert_eq!(
            self.code,
            Some(code),
            "{}: wrong exit status; stdout:\n{}\nstderr:\n{}",
            self.what,
            self.stdout,
            self.stderr
        );
        assert_eq!(
            self.stdout, "",
            "{}: an error must print nothing on stdout",
            self.what
        );
        let lines: Vec<&str> = self.stderr.lines().collect();
        assert_eq!(
            lines.len(),
            1,
            "{}: want one stderr line, got:\n{}",
            self.what,
            self.stderr
        );
        assert!(
            lines[0].starts_with("outboxctl: "),
            "{}: {}",
            self.what,
            lines[0]
        );
        lines[0]
    }
}

pub(crate) async fn run(
    program: &Path,
    args: &[&str],
    env: &[(&str, &str)],
    stdin: Option<&str>,
) -> Run {
    let what = format!(
        "{} {}",
        program.file_name().unwrap().to_string_lossy(),
        args.join(" ")
    );
    let mut command = tokio::process::Command::new(program);
    command
        .args(args)
        // Nothing from the developer's shell may steer the command under test.
        .env_remove("OUTBOX_ADDR")
        .env_remove("OUTBOX_TOKEN")
        .env_remove("OUTBOX_TOKEN_FILE")
        .env_remove("OUTBOX_CA")
        .env_remove("OUTBOX_CERT")
        .env_remove("OUTBOX_KEY")
        .env_remove("OUTBOX_SMTP_PASSWORD")
        .env_remove("OUTBOX_SMTP_OAUTH_CLIENT_SECRET")
        .env_remove("OUTBOX_WEBHOOK_SECRET")
        .env("USER", OPERATOR)
        .envs(env.iter().copied())
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let mut child = command.spawn().unwrap_or_else(|e| panic!("{what}: {e}"));
    if let Some(input) = stdin {
        let mut pipe = child.stdin.take().unwrap();
        // A command refused before it reads stdin may already be gone: that is its answer.
        match pipe.write_all(input.as_bytes()).await {
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {}
            written => written.unwrap(),
        }
        drop(pipe);
    }
    let output = tokio::time::timeout(DEADLINE, child.wait_with_output())
        .await
        .unwrap_or_else(|_| panic!("{what}: still running after {DEADLINE:?}"))
        .unwrap();
    Run {
        what,
        code: output.status.code(),
        stdout: String::from_utf8(output.stdout).unwrap(),
        stderr: String::from_utf8(output.stderr).unwrap(),
    }
}

/// `outboxctl --addr <central> ARGS...` with stdin closed (so never a terminal).
async fn outboxctl(addr: SocketAddr, args: &[&str]) -> Run {
    outboxctl_with(addr, args, &[], None).await
}

async fn outboxctl_with(
    addr: SocketAddr,
    args: &[&str],
    env: &[(&str, &str)],
    stdin: Option<&str>,
) -> Run {
    let addr = format!("http://{addr}");
    let mut all = vec!["--addr", addr.as_str()];
    all.extend_from_slice(args);
    run(&binary("outboxctl"), &all, env, stdin).await
}

/// The grpcurl the tests drive: `$OUTBOX_GRPCURL`, or the one `make tools` installs.
pub(crate) fn grpcurl_path() -> PathBuf {
    if let Some(path) = std::env::var_os("OUTBOX_GRPCURL") {
        return PathBuf::from(path);
    }
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let path = workspace.join("target/tools/venv/bin/grpcurl");
    assert!(
        path.exists(),
        "grpcurl is not installed at {}: run `make tools` (`make test` does it first), \
         or point OUTBOX_GRPCURL at a grpcurl binary",
        path.display()
    );
    path
}

async fn grpcurl(args: &[&str]) -> Run {
    run(&grpcurl_path(), args, &[], None).await
}

/// Submits one notification as `site` would, to `list`; returns its id.
async fn send(central: &Central, site: &str, list: &str, subject: &str) -> String {
    let mut msg = submit(subject, "Level 97% at 10:42.");
    msg.source_site_id = site.into();
    msg.list_name = list.into();
    let id = msg.notification_id.clone();
    central
        .ingest()
        .await
        .submit_notification(msg)
        .await
        .unwrap();
    id
}

/// Submits one webhook notification to `list`, as a site would; returns its id.
async fn send_webhook(central: &Central, list: &str, subject: &str) -> String {
    let msg = v1::NotificationSubmit {
        r#type: v1::NotificationType::Webhook.into(),
        list_name: list.into(),
        ..submit(subject, "Level 97% at 10:42.")
    };
    let id = msg.notification_id.clone();
    central
        .ingest()
        .await
        .submit_notification(msg)
        .await
        .unwrap();
    id
}

/// An SMTP sink that refuses every recipient permanently: each delivery attempt parks.
async fn rejecting_sink() -> SmtpSink {
    let sink = smtp_sink().await;
    sink.set_behaviour(reject_550());
    sink
}

fn reject_550() -> Behaviour {
    Behaviour::RejectRcpt {
        code: 550,
        text: "5.1.1 mailbox unavailable".into(),
    }
}

/// Central with a delivered-KPI window long enough that a slow test run cannot age rows out of it.
async fn start_central(dir: &Path, sink: &SmtpSink) -> Central {
    let mut config = central_config(dir, Some(sink.addr()));
    config.kpis.delivered_kpi_window = Duration::from_secs(3600);
    Central::start(config).await
}

fn ids(notifications: &Value) -> Vec<String> {
    notifications
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["notification_id"].as_str().unwrap().to_owned())
        .collect()
}

fn strings(value: &Value) -> Vec<String> {
    value
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_str().unwrap().to_owned())
        .collect()
}

fn owned(items: &[&String]) -> Vec<String> {
    items.iter().map(|s| (*s).clone()).collect()
}

fn set(items: &[&String]) -> HashSet<String> {
    items.iter().map(|s| (*s).clone()).collect()
}

/// The row's status as central stored it.
fn status_of(db: &Path, id: &str) -> String {
    Db::open(db).row(id).unwrap().0
}

#[tokio::test]
async fn grpcurl_lists_the_services_and_drives_the_admin_api() {
    // Resolved first: a missing grpcurl should fail before any set-up work.
    grpcurl_path();
    let dir = tempfile::tempdir().unwrap();
    let sink = rejecting_sink().await;
    let central = start_central(dir.path(), &sink).await;
    let a = send(&central, "site-a", LIST, "Tank 4 high level").await;
    let b = send(&central, "site-b", LIST, "Pump 2 tripped").await;
    wait_for_status(&central.db, &a, "Parked").await;
    wait_for_status(&central.db, &b, "Parked").await;
    let addr = central.addr.to_string();

    let listed = grpcurl(&["-plaintext", &addr, "list"]).await;
    let services: Vec<&str> = listed.text().lines().collect();
    for service in [
        "outbox.v1.NotificationOutbox",
        "outbox.v1.NotificationIngest",
        "grpc.health.v1.Health",
    ] {
        assert!(services.contains(&service), "{service} not in {services:?}");
    }
    assert!(
        !services.contains(&"outbox.v1.SiteNotify"),
        "central must not advertise the site's API: {services:?}"
    );

    // grpcurl prints proto3 JSON: lowerCamelCase names, enum names, 64-bit integers as strings.
    let parked = grpcurl(&[
        "-plaintext",
        "-d",
        r#"{"filter":{"statuses":["NOTIFICATION_STATUS_PARKED"]},"page_size":10}"#,
        &addr,
        "outbox.v1.NotificationOutbox/QueryNotifications",
    ])
    .await
    .json();
    let rows = parked["notifications"].as_array().unwrap();
    let found: Vec<&str> = rows
        .iter()
        .map(|r| r["notificationId"].as_str().unwrap())
        .collect();
    assert_eq!(found, [b.as_str(), a.as_str()], "newest first");
    for row in rows {
        assert_eq!(row["status"], "NOTIFICATION_STATUS_PARKED");
        assert!(row["lastError"].as_str().unwrap().contains("550"), "{row}");
    }

    let kpis = grpcurl(&[
        "-plaintext",
        "-emit-defaults",
        &addr,
        "outbox.v1.NotificationOutbox/GetKpis",
    ])
    .await
    .json();
    assert_eq!(kpis["global"]["parkedCount"], "2", "{kpis}");
    assert_eq!(kpis["global"]["queueDepth"], "0", "{kpis}");
    let sites: Vec<(&str, &str)> = kpis["sites"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["sourceSiteId"].as_str().unwrap(),
                s["kpis"]["parkedCount"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(sites, [("site-a", "1"), ("site-b", "1")]);

    // The relay is fixed; the operator retries one row, naming themselves in the header.
    sink.set_behaviour(Behaviour::Accept);
    let retried = grpcurl(&[
        "-plaintext",
        "-H",
        "x-outbox-actor: grpcurl-jane",
        "-d",
        &format!(r#"{{"notification_id":"{a}"}}"#),
        &addr,
        "outbox.v1.NotificationOutbox/RetryNotification",
    ])
    .await
    .json();
    assert_eq!(retried["notificationId"], a.as_str());
    assert_eq!(retried["status"], "NOTIFICATION_STATUS_PENDING");
    assert!(
        retried.get("lastError").is_none(),
        "a retry clears LastError: {retried}"
    );
    wait_for_status(&central.db, &a, "Delivered").await;
    let mails = sink.wait_for_messages(1, DEADLINE).await;
    assert_eq!(mails[0].subject().as_deref(), Some("Tank 4 high level"));
    assert_eq!(
        status_of(&central.db, &b),
        "Parked",
        "only the named row moved"
    );

    let detail = grpcurl(&[
        "-plaintext",
        "-d",
        &format!(r#"{{"notification_id":"{a}"}}"#),
        &addr,
        "outbox.v1.NotificationOutbox/GetNotificationDetail",
    ])
    .await
    .json();
    let kinds: Vec<(&str, &str)> = detail["history"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| {
            (
                h["kind"].as_str().unwrap(),
                h["actor"].as_str().unwrap_or(""),
            )
        })
        .collect();
    assert_eq!(
        kinds,
        [
            ("HISTORY_ENTRY_KIND_DELIVERY_ATTEMPT", ""),
            ("HISTORY_ENTRY_KIND_OPERATOR_RETRY", "grpcurl-jane"),
            ("HISTORY_ENTRY_KIND_DELIVERY_ATTEMPT", ""),
        ]
    );

    let kpis = grpcurl(&[
        "-plaintext",
        "-emit-defaults",
        &addr,
        "outbox.v1.NotificationOutbox/GetKpis",
    ])
    .await
    .json();
    assert_eq!(kpis["global"]["parkedCount"], "1", "{kpis}");
    assert_eq!(kpis["global"]["deliveredRecently"], "1", "{kpis}");
    central.stop().await;
}

#[tokio::test]
async fn outboxctl_lists_filters_pages_and_shows_notifications() {
    let dir = tempfile::tempdir().unwrap();
    let sink = smtp_sink().await;
    let central = start_central(dir.path(), &sink).await;
    let addr = central.addr;
    let delivered = send(&central, "site-a", LIST, "Compressor restarted").await;
    wait_for_status(&central.db, &delivered, "Delivered").await;
    sink.set_behaviour(reject_550());
    let tank4 = send(&central, "site-a", LIST, "Tank 4 high level").await;
    wait_for_status(&central.db, &tank4, "Parked").await;
    let pump = send(&central, "site-b", LIST, "Pump 2 tripped").await;
    wait_for_status(&central.db, &pump, "Parked").await;
    let tank7 = send(
        &central,
        "site-b",
        "nobody-configured-this",
        "TANK 7 low level",
    )
    .await;
    wait_for_status(&central.db, &tank7, "Parked").await;
    let newest_first = [&tank7, &pump, &tank4, &delivered];

    let all = outboxctl(addr, &["--json", "list"]).await.json();
    assert_eq!(ids(&all["notifications"]), owned(&newest_first));
    assert_eq!(all["next_page_token"], "");
    let first = &all["notifications"][0];
    assert_eq!(first["status"], "parked");
    assert_eq!(first["type"], "email");
    assert_eq!(first["source_site_id"], "site-b");
    assert_eq!(first["list_name"], "nobody-configured-this");
    assert_eq!(first["subject"], "TANK 7 low level");
    assert_eq!(
        first["last_error"],
        "unknown notification list \"nobody-configured-this\""
    );
    assert!(first["created_at"].as_str().unwrap().ends_with('Z'));

    // Each filter flag, checked against the rows set up above.
    let cases: [(&[&str], Vec<&String>); 10] = [
        (&["--status", "parked"], vec![&tank7, &pump, &tank4]),
        (&["--status", "DELIVERED"], vec![&delivered]),
        (
            &["--status", "delivered", "--status", "Parked"],
            newest_first.to_vec(),
        ),
        (&["--site", "site-b"], vec![&tank7, &pump]),
        (&["--list", LIST, "--status", "parked"], vec![&pump, &tank4]),
        (&["--subject", "tank"], vec![&tank7, &tank4]),
        (&["--type", "email"], newest_first.to_vec()),
        (&["--type", "webhook"], vec![]),
        (&["--since", "1h"], newest_first.to_vec()),
        (&["--until", "1h"], vec![]),
    ];
    for (flags, want) in cases {
        let mut args = vec!["list", "--json"];
        args.extend_from_slice(flags);
        let got = outboxctl(addr, &args).await.json();
        assert_eq!(ids(&got["notifications"]), owned(&want), "list {flags:?}");
    }
    let future = (chrono::Utc::now() + chrono::Duration::hours(1)).to_rfc3339();
    let none = outboxctl(addr, &["list", "--json", "--since", &future])
        .await
        .json();
    assert!(ids(&none["notifications"]).is_empty());

    // --limit follows page tokens across pages of 2 and stops at 3 rows; the token it prints
    // continues exactly after them.
    let limited = outboxctl(
        addr,
        &["list", "--json", "--limit", "3", "--page-size", "2"],
    )
    .await
    .json();
    assert_eq!(ids(&limited["notifications"]), owned(&newest_first[..3]));
    let token = limited["next_page_token"].as_str().unwrap();
    assert!(!token.is_empty());
    let rest = outboxctl(addr, &["list", "--json", "--page-token", token])
        .await
        .json();
    assert_eq!(ids(&rest["notifications"]), owned(&[&delivered]));
    assert_eq!(rest["next_page_token"], "");

    let all_pages = outboxctl(
        addr,
        &["list", "--json", "--limit", "0", "--page-size", "1"],
    )
    .await
    .json();
    assert_eq!(
        ids(&all_pages["notifications"]),
        owned(&newest_first),
        "--limit 0: every page"
    );
    assert_eq!(all_pages["next_page_token"], "");

    // The table: a header and one line per notification, newest first.
    let table = outboxctl(addr, &["list"]).await;
    let lines: Vec<&str> = table.text().lines().collect();
    assert_eq!(lines.len(), 5, "{}", table.stdout);
    assert!(
        lines[0].starts_with("ID") && lines[0].contains("STATUS"),
        "{}",
        lines[0]
    );
    for (line, id) in lines[1..].iter().zip(newest_first) {
        assert!(line.starts_with(id.as_str()), "{line}");
    }
    assert!(lines[1].contains("parked") && lines[4].contains("delivered"));

    let status = outboxctl(addr, &["--json", "status", &delivered])
        .await
        .json();
    assert_eq!(status["notification_id"], delivered.as_str());
    assert_eq!(status["status"], "delivered");
    assert_eq!(status["retry_count"], 0);
    assert!(status["delivered_at"].is_string());

    let shown = outboxctl(addr, &["--json", "show", &pump]).await.json();
    assert_eq!(shown["notification"]["status"], "parked");
    assert_eq!(shown["notification"]["subject"], "Pump 2 tripped");
    assert_eq!(shown["body"], "Level 97% at 10:42.");
    assert_eq!(shown["source_script"], "level_alarm.py");
    let history = shown["history"].as_array().unwrap();
    assert_eq!(history.len(), 1, "{shown}");
    assert_eq!(history[0]["sequence"], 1);
    assert_eq!(history[0]["kind"], "delivery_attempt");
    assert_eq!(history[0]["outcome"], "permanent_failure");
    assert!(history[0]["error"].as_str().unwrap().contains("550"));
    let shown_text = outboxctl(addr, &["show", &pump]).await;
    assert!(
        shown_text.text().contains("history:"),
        "{}",
        shown_text.stdout
    );
    assert!(shown_text.text().contains("permanent_failure"));

    let kpis = outboxctl(addr, &["kpis", "--json"]).await.json();
    assert_eq!(kpis["global"]["parked_count"], 3, "{kpis}");
    assert_eq!(kpis["global"]["queue_depth"], 0);
    assert_eq!(kpis["global"]["delivered_recently"], 1);
    assert_eq!(kpis["global"]["oldest_pending_age_seconds"], Value::Null);
    let sites: Vec<(&str, u64, u64)> = kpis["sites"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["source_site_id"].as_str().unwrap(),
                s["kpis"]["parked_count"].as_u64().unwrap(),
                s["kpis"]["delivered_recently"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(sites, [("site-a", 1, 1), ("site-b", 2, 0)]);
    assert_eq!(kpis["delivered_kpi_window"], "3600s");
    let kpi_table = outboxctl(addr, &["kpis"]).await;
    assert!(kpi_table.text().contains("site-b"), "{}", kpi_table.stdout);
    central.stop().await;
}

#[tokio::test]
async fn outboxctl_retries_and_discards_singly_by_ids_and_by_filter() {
    let dir = tempfile::tempdir().unwrap();
    let sink = rejecting_sink().await;
    let central = start_central(dir.path(), &sink).await;
    let addr = central.addr;
    let mut rows = Vec::new();
    for site in ["site-a", "site-b", "site-c"] {
        for n in 1..=3 {
            rows.push(send(&central, site, LIST, &format!("{site} alarm {n}")).await);
        }
    }
    for id in &rows {
        wait_for_status(&central.db, id, "Parked").await;
    }
    let [a1, a2, a3, b1, b2, b3, c1, c2, c3] = <[String; 9]>::try_from(rows).unwrap();
    sink.set_behaviour(Behaviour::Accept);

    // One id: the single RPC. The answer is the row right after the change.
    let retried = outboxctl(addr, &["--json", "retry", &a1]).await.json();
    assert_eq!(retried["notification_id"], a1.as_str());
    assert_eq!(retried["status"], "pending");
    assert_eq!(retried["retry_count"], 0);
    assert_eq!(retried["last_error"], "");
    wait_for_status(&central.db, &a1, "Delivered").await;
    let detail = outboxctl(addr, &["--json", "show", &a1]).await.json();
    let history: Vec<(&str, &str)> = detail["history"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| (h["kind"].as_str().unwrap(), h["actor"].as_str().unwrap()))
        .collect();
    assert_eq!(
        history,
        [
            ("delivery_attempt", ""),
            ("operator_retry", OPERATOR),
            ("delivery_attempt", ""),
        ],
        "the retry is audited under $USER"
    );
    assert_eq!(detail["history"][2]["outcome"], "delivered");

    let discarded = outboxctl(addr, &["--json", "--actor", "night-shift", "discard", &a2])
        .await
        .json();
    assert_eq!(discarded["status"], "discarded");
    assert_eq!(status_of(&central.db, &a2), "Discarded");
    let detail = outboxctl(addr, &["--json", "show", &a2]).await.json();
    let last = detail["history"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()
        .clone();
    assert_eq!(last["kind"], "operator_discard");
    assert_eq!(last["actor"], "night-shift", "--actor overrides $USER");

    // Several ids: one bulk call; ids that are not Parked are reported, not fatal.
    let bulk = outboxctl(addr, &["--json", "retry", &a3, &b1]).await.json();
    assert_eq!(bulk["changed"], 2, "{bulk}");
    assert_eq!(
        strings(&bulk["changed_ids"])
            .into_iter()
            .collect::<HashSet<_>>(),
        set(&[&a3, &b1])
    );
    assert_eq!(bulk["skipped"], serde_json::json!([]));
    wait_for_status(&central.db, &a3, "Delivered").await;
    wait_for_status(&central.db, &b1, "Delivered").await;

    let bulk = outboxctl(addr, &["--json", "discard", &a2, &b2])
        .await
        .json();
    assert_eq!(bulk["changed"], 1, "{bulk}");
    assert_eq!(strings(&bulk["changed_ids"]), owned(&[&b2]));
    let skipped = bulk["skipped"].as_array().unwrap();
    assert_eq!(skipped.len(), 1);
    assert_eq!(skipped[0]["notification_id"], a2.as_str());
    assert!(
        skipped[0]["reason"].as_str().unwrap().contains("DISCARDED"),
        "{bulk}"
    );
    assert_eq!(status_of(&central.db, &b2), "Discarded");

    // By filter without --yes and without a terminal to ask on: refused, nothing changes.
    let refused = outboxctl(addr, &["retry", "--all-parked", "--site", "site-c"]).await;
    let line = refused.error_line(2);
    assert!(line.contains("--yes"), "{line}");
    for id in [&c1, &c2, &c3] {
        assert_eq!(status_of(&central.db, id), "Parked");
    }

    // By filter with --yes, one row per call: outboxctl keeps calling while more match.
    let by_filter = outboxctl(
        addr,
        &[
            "--json",
            "retry",
            "--all-parked",
            "--site",
            "site-c",
            "--list",
            LIST,
            "--batch-size",
            "1",
            "--yes",
        ],
    )
    .await
    .json();
    assert_eq!(by_filter["changed"], 3, "{by_filter}");
    assert_eq!(
        strings(&by_filter["changed_ids"])
            .into_iter()
            .collect::<HashSet<_>>(),
        set(&[&c1, &c2, &c3])
    );
    assert_eq!(by_filter["more_matching"], false);
    for id in [&c1, &c2, &c3] {
        wait_for_status(&central.db, id, "Delivered").await;
    }
    assert_eq!(
        status_of(&central.db, &b3),
        "Parked",
        "other sites untouched"
    );

    let by_filter = outboxctl(
        addr,
        &[
            "--json",
            "discard",
            "--all-parked",
            "--site",
            "site-b",
            "--yes",
        ],
    )
    .await
    .json();
    assert_eq!(by_filter["changed"], 1, "{by_filter}");
    assert_eq!(strings(&by_filter["changed_ids"]), owned(&[&b3]));
    assert_eq!(status_of(&central.db, &b3), "Discarded");

    // Nothing is parked any more; the KPIs agree.
    let kpis = outboxctl(addr, &["--json", "kpis"]).await.json();
    assert_eq!(kpis["global"]["parked_count"], 0, "{kpis}");
    assert_eq!(kpis["global"]["delivered_recently"], 6, "{kpis}");
    let human = outboxctl(addr, &["discard", "--all-parked", "--yes"]).await;
    assert_eq!(human.text(), "discarded 0 notifications\n");
    central.stop().await;
}

/// Runs outboxctl on a pseudo-terminal (util-linux `script`), typing `typed` at it: the only way
/// to see the confirmation prompt an operator sees.
async fn outboxctl_on_a_terminal(addr: SocketAddr, args: &str, typed: &str) -> Run {
    let command = format!(
        "{} --addr http://{addr} {args}",
        binary("outboxctl").display()
    );
    // -e: exit with outboxctl's status; -q: no "Script started" banner; /dev/null: no log file.
    run(
        Path::new("script"),
        &["-qec", &command, "/dev/null"],
        &[],
        Some(typed),
    )
    .await
}

#[tokio::test]
async fn bulk_by_filter_asks_for_confirmation_on_a_terminal() {
    let dir = tempfile::tempdir().unwrap();
    let sink = rejecting_sink().await;
    let central = start_central(dir.path(), &sink).await;
    let addr = central.addr;
    let parked = [
        send(&central, "site-b", LIST, "Pump 2 tripped").await,
        send(&central, "site-b", LIST, "Pump 3 tripped").await,
    ];
    let other = send(&central, "site-a", LIST, "Tank 4 high level").await;
    for id in parked.iter().chain([&other]) {
        wait_for_status(&central.db, id, "Parked").await;
    }
    sink.set_behaviour(Behaviour::Accept);

    let declined = outboxctl_on_a_terminal(addr, "retry --all-parked --site site-b", "n\n").await;
    assert_eq!(declined.code, Some(1), "{}", declined.stdout);
    assert!(
        declined
            .stdout
            .contains("Retry 2 parked notifications with site site-b? [y/N]"),
        "the prompt counts what matches: {}",
        declined.stdout
    );
    assert!(declined.stdout.contains("aborted: nothing was changed"));
    for id in &parked {
        assert_eq!(status_of(&central.db, id), "Parked");
    }

    let confirmed = outboxctl_on_a_terminal(addr, "retry --all-parked --site site-b", "y\n").await;
    assert_eq!(confirmed.code, Some(0), "{}", confirmed.stdout);
    assert!(
        confirmed.stdout.contains("retried 2 notifications"),
        "{}",
        confirmed.stdout
    );
    for id in &parked {
        wait_for_status(&central.db, id, "Delivered").await;
    }
    assert_eq!(
        status_of(&central.db, &other),
        "Parked",
        "site-a was not selected"
    );
    central.stop().await;
}

#[tokio::test]
async fn outboxctl_errors_are_one_line_with_a_nonzero_exit() {
    let dir = tempfile::tempdir().unwrap();
    let sink = smtp_sink().await;
    let central = start_central(dir.path(), &sink).await;
    let addr = central.addr;
    let delivered = send(&central, "site-a", LIST, "Tank 4 high level").await;
    wait_for_status(&central.db, &delivered, "Delivered").await;

    let unknown = uuid::Uuid::now_v7().to_string();
    for args in [
        vec!["status", unknown.as_str()],
        vec!["--json", "show", unknown.as_str()],
        vec!["retry", unknown.as_str()],
    ] {
        let failed = outboxctl(addr, &args).await;
        let line = failed.error_line(1);
        assert!(
            line.contains(&unknown) && line.ends_with("(NOT_FOUND)"),
            "{line}"
        );
    }

    for verb in ["retry", "discard"] {
        let failed = outboxctl(addr, &["--json", verb, &delivered]).await;
        let line = failed.error_line(1);
        assert!(
            line.contains(&delivered)
                && line.contains("DELIVERED")
                && line.ends_with("(FAILED_PRECONDITION)"),
            "{line}"
        );
    }
    assert_eq!(status_of(&central.db, &delivered), "Delivered");

    let failed = outboxctl(addr, &["show", "not-a-uuid"]).await;
    let line = failed.error_line(1);
    assert!(line.ends_with("(INVALID_ARGUMENT)"), "{line}");

    let failed = outboxctl(addr, &["list", "--status", "bogus"]).await;
    let line = failed.error_line(2);
    assert!(line.contains("bogus") && line.contains("parked"), "{line}");

    let failed = outboxctl(addr, &["list", "--since", "last tuesday"]).await;
    failed.error_line(2);

    // A port nothing listens on: refused at once, reported as such, no panic.
    let dead = free_addr().await;
    let failed = outboxctl(dead, &["--timeout", "2s", "--json", "kpis"]).await;
    let line = failed.error_line(1);
    assert!(
        line.starts_with(&format!("outboxctl: cannot reach central at http://{dead}")),
        "{line}"
    );
    central.stop().await;
}

#[tokio::test]
async fn outboxctl_manages_lists_and_smtp_without_revealing_the_password() {
    let dir = tempfile::tempdir().unwrap();
    let sink = smtp_sink().await;
    let central = start_central(dir.path(), &sink).await;
    let addr = central.addr;

    // The configured list, as central seeded it at start-up.
    let lists = outboxctl(addr, &["--json", "lists", "ls"]).await.json();
    let names: Vec<&str> = lists["lists"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, [LIST]);
    assert_eq!(strings(&lists["lists"][0]["recipients"]), RECIPIENTS);
    assert_eq!(lists["lists"][0]["type"], "email");

    let set_list = outboxctl(
        addr,
        &[
            "--json",
            "lists",
            "set",
            "night-shift",
            "--type",
            "email",
            "--recipient",
            "carol@plant.example.test",
            "--recipient",
            "dave@plant.example.test",
        ],
    )
    .await
    .json();
    assert_eq!(set_list["name"], "night-shift");
    assert_eq!(
        strings(&set_list["recipients"]),
        ["carol@plant.example.test", "dave@plant.example.test"]
    );
    assert!(set_list["updated_at"].is_string());
    let shown = outboxctl(addr, &["--json", "lists", "show", "night-shift"])
        .await
        .json();
    assert_eq!(shown["recipients"], set_list["recipients"]);
    let lists = outboxctl(addr, &["--json", "lists", "ls"]).await.json();
    let names: Vec<&str> = lists["lists"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["night-shift", LIST], "by name");

    // A notification to the new list is delivered to its recipients.
    let id = send(&central, "site-a", "night-shift", "Boiler pressure low").await;
    wait_for_status(&central.db, &id, "Delivered").await;
    let mails = sink.wait_for_messages(1, DEADLINE).await;
    let mut rcpt = mails[0].rcpt_to.clone();
    rcpt.sort();
    assert_eq!(
        rcpt,
        ["carol@plant.example.test", "dave@plant.example.test"]
    );

    let removed = outboxctl(addr, &["--json", "lists", "rm", "night-shift"])
        .await
        .json();
    assert_eq!(removed["deleted"], true);
    let gone = outboxctl(addr, &["lists", "show", "night-shift"]).await;
    assert!(gone.error_line(1).ends_with("(NOT_FOUND)"));
    let bad = outboxctl(
        addr,
        &["lists", "set", "x", "--recipient", "not-an-address"],
    )
    .await;
    assert!(bad.error_line(1).ends_with("(INVALID_ARGUMENT)"));

    // SMTP: the settings central was started with.
    let smtp = outboxctl(addr, &["--json", "smtp", "show"]).await.json();
    assert_eq!(smtp["host"], sink.addr().ip().to_string());
    assert_eq!(smtp["port"], sink.addr().port());
    assert_eq!(smtp["tls_mode"], "none");
    assert_eq!(smtp["password_set"], false);

    // The password goes in through stdin and never comes back out.
    const SECRET: &str = "s3cret-Pa55word";
    let port = sink.addr().port().to_string();
    let set_smtp = outboxctl_with(
        addr,
        &[
            "--json",
            "smtp",
            "set",
            "--host",
            "127.0.0.1",
            "--port",
            &port,
            "--tls",
            "none",
            "--from",
            "outbox@plant.example.test",
            "--username",
            "relay-user",
            "--password-stdin",
            "--max-retries",
            "3",
            "--retry-delay",
            "2s",
            "--timeout",
            "20s",
        ],
        &[],
        Some(&format!("{SECRET}\n")),
    )
    .await;
    let stored = set_smtp.json();
    assert!(!set_smtp.stdout.contains(SECRET));
    assert_eq!(stored["username"], "relay-user");
    assert_eq!(stored["password_set"], true);
    assert_eq!(stored["max_retries"], 3);
    assert_eq!(stored["retry_delay"], "2s");
    assert_eq!(stored["timeout"], "20s");
    assert!(stored.get("password").is_none(), "{stored}");
    for args in [&["--json", "smtp", "show"][..], &["smtp", "show"][..]] {
        let shown = outboxctl(addr, args).await;
        assert!(
            !shown.text().contains(SECRET),
            "{args:?} printed the password"
        );
        assert!(!shown.stderr.contains(SECRET));
    }
    let human = outboxctl(addr, &["smtp", "show"]).await;
    assert!(
        human
            .text()
            .lines()
            .any(|l| l.starts_with("password") && l.ends_with(" set")),
        "{}",
        human.stdout
    );

    // From the environment too, for automation that cannot pipe stdin.
    let from_env = outboxctl_with(
        addr,
        &[
            "--json",
            "smtp",
            "set",
            "--host",
            "127.0.0.1",
            "--port",
            &port,
            "--tls",
            "none",
            "--from",
            "outbox@plant.example.test",
            "--username",
            "other-user",
        ],
        &[("OUTBOX_SMTP_PASSWORD", "env-Secret-9")],
        None,
    )
    .await;
    assert_eq!(from_env.json()["password_set"], true);
    assert!(!from_env.stdout.contains("env-Secret-9"));

    let deleted = outboxctl(addr, &["--json", "smtp", "rm"]).await.json();
    assert_eq!(deleted["deleted"], true);
    let gone = outboxctl(addr, &["smtp", "show"]).await;
    assert!(gone.error_line(1).ends_with("(NOT_FOUND)"));
    central.stop().await;
}

/// Asserts that neither stdout nor stderr of `run` contains `secret`.
fn assert_not_printed(run: &Run, secret: &str) {
    assert!(
        !run.stdout.contains(secret) && !run.stderr.contains(secret),
        "{} printed a secret:\n{}{}",
        run.what,
        run.stdout,
        run.stderr
    );
}

#[tokio::test]
async fn outboxctl_sets_webhook_lists_and_xoauth2_smtp_without_revealing_secrets() {
    const HOOK_SECRET: &str = "hook-Signing-Key-0123456789";
    const SMTP_USER: &str = "outbox@plant.example.test";
    const OAUTH_CLIENT: &str = "outbox-client";
    const OAUTH_SECRET: &str = "oauth-Client-Secret-42";
    let dir = tempfile::tempdir().unwrap();
    let oauth = OAuthServer::start(OAUTH_CLIENT, OAUTH_SECRET, 3600)
        .await
        .unwrap();
    // The relay takes only XOAUTH2 with a token the OAuth server issued: mail gets through only
    // once outboxctl has configured the client and its secret correctly.
    let sink = SmtpSink::start_with(SinkOptions {
        auth: Some(AuthRequirement::xoauth2(SMTP_USER, oauth.token_check())),
    })
    .await
    .unwrap();
    let hooks = WebhookServer::start().await.unwrap();
    let central = start_central(dir.path(), &sink).await;
    let addr = central.addr;
    let endpoint = hooks.url("/alarms");

    // A webhook list, its signing secret on stdin.
    let set_list = outboxctl_with(
        addr,
        &[
            "--json",
            "lists",
            "set",
            "alarms-hook",
            "--type",
            "webhook",
            "--endpoint",
            &endpoint,
            "--webhook-format",
            "slack",
            "--webhook-secret-stdin",
        ],
        &[],
        Some(&format!("{HOOK_SECRET}\n")),
    )
    .await;
    let stored = set_list.json();
    assert_not_printed(&set_list, HOOK_SECRET);
    assert_eq!(stored["type"], "webhook");
    assert_eq!(strings(&stored["endpoints"]), [endpoint.as_str()]);
    assert_eq!(stored["recipients"], serde_json::json!([]));
    assert_eq!(stored["webhook_format"], "slack");
    assert_eq!(stored["webhook_secret_set"], true);
    assert!(stored.get("webhook_secret").is_none(), "{stored}");

    let shown = outboxctl(addr, &["--json", "lists", "show", "alarms-hook"]).await;
    assert_not_printed(&shown, HOOK_SECRET);
    assert_eq!(shown.json(), stored);
    let human = outboxctl(addr, &["lists", "show", "alarms-hook"]).await;
    assert_not_printed(&human, HOOK_SECRET);
    let text = human.text();
    for (key, value) in [
        ("type", "webhook"),
        ("endpoints", endpoint.as_str()),
        ("format", "slack"),
        ("webhook secret", "set"),
    ] {
        assert!(
            text.lines()
                .any(|l| l.starts_with(key) && l.ends_with(&format!("  {value}"))),
            "{key} {value} not in:\n{text}"
        );
    }
    let listed = outboxctl(addr, &["lists", "ls"]).await;
    assert_not_printed(&listed, HOOK_SECRET);
    let row = listed
        .text()
        .lines()
        .find(|l| l.starts_with("alarms-hook "))
        .unwrap_or_else(|| panic!("no alarms-hook row:\n{}", listed.stdout));
    let cells: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(cells[1..4], ["webhook", "slack", "set"], "{row}");
    assert_eq!(cells.last(), Some(&endpoint.as_str()), "{row}");

    // The secret central stored is the one read from stdin: it signs the delivery.
    let id = send_webhook(&central, "alarms-hook", "Tank 4 high level").await;
    wait_for_status(&central.db, &id, "Delivered").await;
    let posts = hooks.wait_for_requests(1, DEADLINE).await;
    assert_eq!(posts[0].path, "/alarms");
    assert!(
        posts[0].signature_valid(HOOK_SECRET.as_bytes()),
        "{:?}",
        posts[0].headers
    );

    // Without a secret flag the stored secret is kept; --clear-webhook-secret removes it, even
    // with the environment variable set.
    let kept = outboxctl(
        addr,
        &[
            "--json",
            "lists",
            "set",
            "alarms-hook",
            "--type",
            "webhook",
            "--endpoint",
            &endpoint,
        ],
    )
    .await
    .json();
    assert_eq!(kept["webhook_secret_set"], true, "{kept}");
    assert_eq!(
        kept["webhook_format"], "generic",
        "the format is replaced too"
    );
    let cleared = outboxctl_with(
        addr,
        &[
            "--json",
            "lists",
            "set",
            "alarms-hook",
            "--type",
            "webhook",
            "--endpoint",
            &endpoint,
            "--clear-webhook-secret",
        ],
        &[("OUTBOX_WEBHOOK_SECRET", HOOK_SECRET)],
        None,
    )
    .await
    .json();
    assert_eq!(cleared["webhook_secret_set"], false, "{cleared}");

    // Central judges the secret (16 characters at least) and says so without echoing it.
    let short = outboxctl_with(
        addr,
        &[
            "lists",
            "set",
            "alarms-hook",
            "--type",
            "webhook",
            "--endpoint",
            &endpoint,
            "--webhook-secret-stdin",
        ],
        &[],
        Some("tiny-Secret\n"),
    )
    .await;
    let line = short.error_line(1);
    assert!(
        line.contains("webhook_secret") && line.ends_with("(INVALID_ARGUMENT)"),
        "{line}"
    );
    assert_not_printed(&short, "tiny-Secret");
    // Flags of the other channel are refused before anything is sent.
    let mixed = outboxctl(
        addr,
        &[
            "lists",
            "set",
            "ops-2",
            "--recipient",
            "a@plant.example.test",
            "--endpoint",
            &endpoint,
        ],
    )
    .await;
    assert!(mixed.error_line(2).contains("--type webhook"));

    // SMTP with XOAUTH2: the client secret from the environment, exponential backoff, a rate.
    let port = sink.addr().port().to_string();
    let token_url = oauth.url();
    let smtp_flags = [
        "smtp",
        "set",
        "--host",
        "127.0.0.1",
        "--port",
        &port,
        "--tls",
        "none",
        "--from",
        "outbox@plant.example.test",
        "--auth",
        "xoauth2",
        "--username",
        SMTP_USER,
        "--oauth-token-url",
        &token_url,
        "--oauth-client-id",
        OAUTH_CLIENT,
        "--oauth-scope",
        "smtp.send",
        "--backoff",
        "exponential",
        "--retry-delay",
        "1s",
        "--max-retry-delay",
        "1h",
        "--overall-timeout",
        "2m",
    ];
    let mut args = vec!["--json"];
    args.extend_from_slice(&smtp_flags);
    args.extend(["--rate-limit-per-second", "10", "--rate-limit-burst", "10"]);
    let set_smtp = outboxctl_with(
        addr,
        &args,
        &[
            ("OUTBOX_SMTP_OAUTH_CLIENT_SECRET", OAUTH_SECRET),
            // Not XOAUTH2's secret: never sent, so never stored.
            ("OUTBOX_SMTP_PASSWORD", "unused-Password-1"),
        ],
        None,
    )
    .await;
    let stored = set_smtp.json();
    assert_not_printed(&set_smtp, OAUTH_SECRET);
    assert_eq!(stored["auth_mechanism"], "xoauth2", "{stored}");
    assert_eq!(stored["username"], SMTP_USER);
    assert_eq!(stored["password_set"], false);
    assert_eq!(stored["oauth_token_url"], token_url.as_str());
    assert_eq!(stored["oauth_client_id"], OAUTH_CLIENT);
    assert_eq!(stored["oauth_scope"], "smtp.send");
    assert_eq!(stored["oauth_client_secret_set"], true);
    assert!(stored.get("oauth_client_secret").is_none(), "{stored}");
    assert_eq!(stored["backoff"], "exponential");
    assert_eq!(stored["retry_delay"], "1s");
    assert_eq!(stored["max_retry_delay"], "3600s");
    assert_eq!(stored["rate_limit_per_second"], 10.0);
    assert_eq!(stored["rate_limit_burst"], 10);
    assert_eq!(stored["overall_timeout"], "120s");

    let shown = outboxctl(addr, &["--json", "smtp", "show"]).await;
    assert_not_printed(&shown, OAUTH_SECRET);
    assert_eq!(shown.json(), stored);
    let human = outboxctl(addr, &["smtp", "show"]).await;
    assert_not_printed(&human, OAUTH_SECRET);
    let text = human.text();
    for (key, value) in [
        ("auth", "xoauth2"),
        ("oauth client id", OAUTH_CLIENT),
        ("oauth client secret", "set"),
        ("backoff", "exponential"),
        ("max retry delay", "1h"),
        ("rate limit", "10/s, burst 10"),
        ("overall timeout", "2m"),
    ] {
        assert!(
            text.lines()
                .any(|l| l.starts_with(key) && l.ends_with(&format!("  {value}"))),
            "{key} {value} not in:\n{text}"
        );
    }

    // Central fetches a token as the configured client and the XOAUTH2 relay takes the mail.
    let id = send(&central, "site-a", LIST, "Boiler pressure low").await;
    wait_for_status(&central.db, &id, "Delivered").await;
    let mails = sink.wait_for_messages(1, DEADLINE).await;
    assert_eq!(mails[0].authenticated_as.as_deref(), Some(SMTP_USER));
    let token_requests = oauth.requests();
    assert_eq!(token_requests[0].client_id.as_deref(), Some(OAUTH_CLIENT));
    assert_eq!(token_requests[0].scope.as_deref(), Some("smtp.send"));
    assert_eq!(token_requests[0].status, 200);

    // Usage errors: one line, exit 2, nothing sent.
    let mut burst_only = smtp_flags.to_vec();
    burst_only.extend(["--rate-limit-burst", "5"]);
    let failed = outboxctl(addr, &burst_only).await;
    let line = failed.error_line(2);
    assert!(line.contains("--rate-limit-per-second"), "{line}");
    let mut both_on_stdin = smtp_flags.to_vec();
    both_on_stdin.extend(["--password-stdin", "--oauth-client-secret-stdin"]);
    let failed = outboxctl_with(addr, &both_on_stdin, &[], Some("x\n")).await;
    let line = failed.error_line(2);
    assert!(line.contains("read only once"), "{line}");
    let after = outboxctl(addr, &["--json", "smtp", "show"]).await.json();
    assert_eq!(after, stored, "a refused command changes nothing");
    central.stop().await;
}
