//! The operations pack in `deploy/`: the systemd units pass `systemd-analyze verify` and keep
//! the settings an operator relies on, the sysusers file creates the users they run as, the
//! Prometheus alert rules pass `promtool check rules` and their unit tests
//! (`promtool test rules`), the Grafana dashboard is importable, and every metric the rules and
//! the dashboard's queries name is one that a real central and a real site-forwarder export.
//!
//! `systemd-analyze`, `systemd-sysusers` and `promtool` come from Debian packages that
//! `make tools` installs (`make test` runs it first); without them these tests fail saying so.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use central_outbox::config::{ListConfig, SelfAlertsConfig, WebhookFormatKind};
use metrics_endpoint::sample;
use outbox_proto::v1;
use outbox_proto::v1::site_notify_client::SiteNotifyClient;
use outbox_tests::webhook_server::WebhookServer;
use serde_json::Value;

use crate::harness::{
    Central, LIST, Process, binary, central_config, channel, eventually, free_addr, ingest_submit,
    send_request, smtp_sink, submit, wait_until_serving,
};

/// The workspace root, where `deploy/` is.
fn workspace() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the tests crate lies in the workspace")
}

fn deploy(path: &str) -> PathBuf {
    workspace().join("deploy").join(path)
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// `name` on the PATH, or a failure that says how to install it.
fn system_tool(name: &str) -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file())
        .unwrap_or_else(|| {
            panic!(
                "`{name}` is not on the PATH: run `make tools` (`make test` does it first), which \
                 installs the Debian packages the tests need"
            )
        })
}

/// Runs `program args...`, returning its output whatever its exit status.
fn run(program: &Path, args: &[&std::ffi::OsStr]) -> Output {
    Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", program.display()))
}

fn text(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

// ---- systemd ----

/// The units in deploy/systemd and the binary each one starts.
const UNITS: [(&str, &str); 2] = [
    ("central-outbox.service", "central-outbox"),
    ("site-forwarder.service", "site-forwarder"),
];

/// Where the units expect the binaries to be installed (deploy/systemd/README.md).
const INSTALLED_BIN: &str = "/usr/local/bin";

/// The unit's `Key=value` settings, in file order (comments and section headers left out).
fn settings(unit: &str) -> Vec<(String, String)> {
    unit.lines()
        .map(str::trim)
        .filter(|line| !line.is_empty() && !line.starts_with(['#', ';', '[']))
        .filter_map(|line| line.split_once('='))
        .map(|(key, value)| (key.trim().to_owned(), value.trim().to_owned()))
        .collect()
}

fn setting<'a>(settings: &'a [(String, String)], key: &str) -> Vec<&'a str> {
    settings
        .iter()
        .filter(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
        .collect()
}

/// `systemd-analyze verify` checks that ExecStart's program exists and is executable, so each
/// unit is verified as a copy whose ExecStart names the binary built from these sources instead
/// of the installed path; everything else is verified as shipped. `verify` exits 0 on unknown
/// keys and unparsable values (it only warns, and the setting is then ignored at run time, e.g.
/// a misspelled hardening option), so any output at all fails the test. It does not resolve
/// `User=` (that happens when the unit starts), so the users come from the sysusers file, which
/// the next test checks.
#[test]
fn the_systemd_units_pass_systemd_analyze_verify_and_keep_their_settings() {
    let analyze = system_tool("systemd-analyze");
    let dir = tempfile::tempdir().unwrap();
    let mut rendered = Vec::new();
    for (unit, program) in UNITS {
        let shipped = read(&deploy(&format!("systemd/{unit}")));
        let installed = format!("ExecStart={INSTALLED_BIN}/{program} ");
        assert_eq!(
            shipped.matches(&installed).count(),
            1,
            "{unit}: one ExecStart, running {INSTALLED_BIN}/{program}"
        );
        let built = binary(program);
        let copy = shipped.replace(&installed, &format!("ExecStart={} ", built.display()));
        let path = dir.path().join(unit);
        std::fs::write(&path, copy).unwrap();
        rendered.push(path);

        let set = settings(&shipped);
        let one = |key: &str| -> &str {
            match setting(&set, key).as_slice() {
                [value] => value,
                other => panic!("{unit}: {key}= set {} times: {other:?}", other.len()),
            }
        };
        let exec = one("ExecStart");
        assert!(
            exec.contains(" --config /etc/outbox/"),
            "{unit}: the configuration file is named on the command line: {exec}"
        );
        let user = one("User");
        assert!(
            user.starts_with("outbox-"),
            "{unit}: runs as its own user, not {user}"
        );
        assert_eq!(one("ProtectSystem"), "strict", "{unit}");
        assert_eq!(one("NoNewPrivileges"), "yes", "{unit}");
        assert_eq!(one("Restart"), "on-failure", "{unit}");
        assert!(!one("RestartSec").is_empty(), "{unit}: a restart delay");
        assert_eq!(one("CapabilityBoundingSet"), "", "{unit}: no capabilities");
        // The only writable place: the state directory, also the working directory, so the
        // configs' default relative database/buffer paths land in it.
        let state = one("StateDirectory");
        assert_eq!(
            one("WorkingDirectory"),
            format!("/var/lib/{state}"),
            "{unit}"
        );
        assert!(setting(&set, "ReadWritePaths").is_empty(), "{unit}");
        let stop = one("TimeoutStopSec");
        assert!(
            stop.ends_with('s') && stop.trim_end_matches('s').parse::<u32>().unwrap() >= 30,
            "{unit}: TimeoutStopSec={stop} leaves the graceful stop room (see the unit's comment)"
        );
    }

    let mut args: Vec<&std::ffi::OsStr> = vec!["verify".as_ref()];
    args.extend(rendered.iter().map(|p| p.as_os_str()));
    let output = run(&analyze, &args);
    let said = text(&output);
    assert!(
        output.status.success() && said.trim().is_empty(),
        "systemd-analyze verify ({}) must pass without a word:\n{said}",
        output.status
    );
}

/// deploy/systemd/outbox.sysusers creates, in a scratch root, the user each unit runs as, with
/// the unit's state directory as its home.
#[test]
fn the_sysusers_file_creates_each_units_user() {
    let sysusers = system_tool("systemd-sysusers");
    let root = tempfile::tempdir().unwrap();
    std::fs::create_dir(root.path().join("etc")).unwrap();
    let file = deploy("systemd/outbox.sysusers");
    let output = run(
        &sysusers,
        &[
            format!("--root={}", root.path().display()).as_ref(),
            file.as_os_str(),
        ],
    );
    assert!(output.status.success(), "{}", text(&output));
    let passwd = read(&root.path().join("etc/passwd"));
    for (unit, _) in UNITS {
        let set = settings(&read(&deploy(&format!("systemd/{unit}"))));
        let user = setting(&set, "User")[0];
        assert_eq!(setting(&set, "Group"), [user], "{unit}: its own group");
        let state = setting(&set, "StateDirectory")[0];
        let entry = passwd
            .lines()
            .find(|line| line.starts_with(&format!("{user}:")))
            .unwrap_or_else(|| panic!("{unit}: no {user} in\n{passwd}"));
        let fields: Vec<&str> = entry.split(':').collect();
        assert_eq!(fields[5], format!("/var/lib/{state}"), "{entry}");
        assert_ne!(fields[2], "0", "{entry}: not root");
    }
}

// ---- Prometheus ----

fn alerts() -> PathBuf {
    deploy("prometheus/alerts.yml")
}

/// The expressions of the rule file's rules. Rule files are YAML; this reads the one shape
/// alerts.yml uses, `expr: |` followed by the expression's lines indented deeper (or a one-line
/// `expr: ...`), and the test checks it found as many as promtool counts, so a rule written
/// another way fails the test instead of going unchecked.
fn rule_expressions(rules: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut lines = rules.lines().peekable();
    while let Some(line) = lines.next() {
        let Some(after) = line.trim_start().strip_prefix("expr:") else {
            continue;
        };
        let indent = line.len() - line.trim_start().len();
        let after = after.trim();
        if after.starts_with(['|', '>']) {
            let mut expr = String::new();
            while let Some(next) = lines.peek() {
                let deeper = next.len() - next.trim_start().len() > indent;
                if !(deeper || next.trim().is_empty()) {
                    break;
                }
                expr.push_str(next.trim());
                expr.push('\n');
                lines.next();
            }
            found.push(expr.trim().to_owned());
        } else {
            found.push(after.trim_matches(['"', '\'']).to_owned());
        }
    }
    found
}

/// `promtool check rules` on `file`: the number of rules it found, after asserting it passed.
fn promtool_check_rules(promtool: &Path, file: &Path) -> usize {
    let output = run(
        promtool,
        &["check".as_ref(), "rules".as_ref(), file.as_os_str()],
    );
    let said = text(&output);
    assert!(output.status.success(), "promtool check rules:\n{said}");
    said.lines()
        .find_map(|line| {
            line.trim()
                .strip_prefix("SUCCESS: ")?
                .strip_suffix(" rules found")?
                .parse()
                .ok()
        })
        .unwrap_or_else(|| panic!("no rule count in promtool's answer:\n{said}"))
}

#[test]
fn the_alert_rules_pass_promtool_check_and_their_unit_tests() {
    let promtool = system_tool("promtool");
    let rules = promtool_check_rules(&promtool, &alerts());
    let expressions = rule_expressions(&read(&alerts()));
    assert_eq!(
        expressions.len(),
        rules,
        "every rule's expression is read by this test: {expressions:#?}"
    );
    let alerts_named = read(&alerts()).matches("- alert: ").count();
    assert_eq!(alerts_named, rules, "every rule is an alert");

    let tests = deploy("prometheus/alerts_test.yml");
    let output = run(
        &promtool,
        &["test".as_ref(), "rules".as_ref(), tests.as_os_str()],
    );
    let said = text(&output);
    assert!(
        output.status.success() && said.contains("SUCCESS"),
        "promtool test rules:\n{said}"
    );
    // Each alert has a test that shows it firing (and, by the expected lists around it, quiet).
    let test_file = read(&tests);
    for line in read(&alerts()).lines() {
        if let Some(name) = line.trim().strip_prefix("- alert: ") {
            assert!(
                test_file.contains(&format!("alertname: {name}\n")),
                "{name} has no test in alerts_test.yml"
            );
        }
    }
}

// ---- Grafana ----

fn dashboard() -> Value {
    let path = deploy("grafana/outbox-dashboard.json");
    serde_json::from_str(&read(&path)).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Every `expr` in the dashboard (panel targets, rows' nested panels, anywhere).
fn dashboard_expressions(value: &Value, found: &mut Vec<String>) {
    match value {
        Value::Object(map) => {
            for (key, value) in map {
                match (key.as_str(), value) {
                    ("expr", Value::String(expr)) => found.push(expr.clone()),
                    _ => dashboard_expressions(value, found),
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|v| dashboard_expressions(v, found)),
        _ => {}
    }
}

/// Grafana's own variables in a query, each replaced by a duration so promtool can parse it.
const GRAFANA_RANGES: [&str; 3] = ["$__rate_interval", "$__interval", "$__range"];

/// The dashboard imports anywhere: its Prometheus is a datasource variable that every query
/// uses, and it has no other variable (whose query the metric check would have to read). Its
/// queries are valid PromQL: each goes into a recording rule for `promtool check rules`.
#[test]
fn the_dashboard_is_importable_and_its_queries_are_valid_promql() {
    let dashboard = dashboard();
    let variables = dashboard["templating"]["list"].as_array().unwrap();
    assert_eq!(variables.len(), 1, "only the datasource variable");
    assert_eq!(variables[0]["type"], "datasource");
    assert_eq!(variables[0]["query"], "prometheus");
    let variable = format!("${{{}}}", variables[0]["name"].as_str().unwrap());
    let panels = dashboard["panels"].as_array().unwrap();
    let mut queried = 0;
    for panel in panels.iter().filter(|p| p["type"] != "row") {
        let title = &panel["title"];
        assert_eq!(panel["datasource"]["uid"], variable.as_str(), "{title}");
        let targets = panel["targets"].as_array().unwrap();
        assert!(!targets.is_empty(), "{title}: no query");
        for target in targets {
            assert_eq!(target["datasource"]["uid"], variable.as_str(), "{title}");
            queried += 1;
        }
    }
    let mut expressions = Vec::new();
    dashboard_expressions(&dashboard, &mut expressions);
    assert_eq!(expressions.len(), queried, "every expr is a panel target's");

    let promtool = system_tool("promtool");
    let mut rules = String::from("groups:\n  - name: dashboard\n    rules:\n");
    for (n, expr) in expressions.iter().enumerate() {
        let mut expr = expr.clone();
        for range in GRAFANA_RANGES {
            expr = expr.replace(range, "5m");
        }
        assert!(!expr.contains('$'), "an unknown Grafana variable in {expr}");
        rules.push_str(&format!(
            "      - record: dashboard:query_{n}\n        expr: {}\n",
            serde_json::to_string(&expr).unwrap()
        ));
    }
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("dashboard-queries.yml");
    std::fs::write(&file, rules).unwrap();
    assert_eq!(promtool_check_rules(&promtool, &file), expressions.len());
}

// ---- the metrics the rules and the dashboard name ----

/// PromQL's aggregation operators, binary-operator keywords and grouping modifiers: the words
/// of an expression that are not metric names.
const PROMQL_WORDS: [&str; 25] = [
    "sum",
    "min",
    "max",
    "avg",
    "group",
    "stddev",
    "stdvar",
    "count",
    "count_values",
    "bottomk",
    "topk",
    "quantile",
    "and",
    "or",
    "unless",
    "bool",
    "offset",
    "inf",
    "nan",
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
];

/// Modifiers followed by a parenthesised list of label names (skipped with them).
const LABEL_LISTS: [&str; 6] = [
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
];

/// The metric names a PromQL expression reads, by a simple rule: outside string literals,
/// label matchers (`{...}`), ranges (`[...]`), numbers and durations, every identifier is a metric
/// name unless it is followed by `(` (a function, or an aggregation written `sum(...)`), is one
/// of [`PROMQL_WORDS`], is inside the label list after one of [`LABEL_LISTS`], or is a Grafana
/// variable (`$name`, `${name}`). Enough for the expressions in deploy/, which the tests above
/// also have promtool parse.
fn metric_names(expr: &str) -> BTreeSet<String> {
    let chars: Vec<char> = expr.chars().collect();
    let ident_start = |c: char| c.is_ascii_alphabetic() || c == '_' || c == ':';
    let ident_char = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == ':';
    // The index just past the `close` matching the opener at `i`, skipping string literals.
    let skip_to = |mut i: usize, close: char| {
        i += 1;
        while i < chars.len() && chars[i] != close {
            if matches!(chars[i], '"' | '\'' | '`') {
                let quote = chars[i];
                i += 1;
                while i < chars.len() && chars[i] != quote {
                    i += if chars[i] == '\\' { 2 } else { 1 };
                }
            }
            i += 1;
        }
        i + 1
    };
    let mut names = BTreeSet::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        match c {
            '"' | '\'' | '`' => {
                // A string literal on its own (e.g. label_replace's arguments).
                i += 1;
                while i < chars.len() && chars[i] != c {
                    i += if chars[i] == '\\' { 2 } else { 1 };
                }
                i += 1;
            }
            '{' => i = skip_to(i, '}'),
            '[' => i = skip_to(i, ']'),
            '$' => {
                i += 1;
                if chars.get(i) == Some(&'{') {
                    i = skip_to(i, '}');
                } else {
                    while i < chars.len() && ident_char(chars[i]) {
                        i += 1;
                    }
                }
            }
            c if c.is_ascii_digit() || c == '.' => {
                while i < chars.len() && (ident_char(chars[i]) || chars[i] == '.') {
                    i += 1;
                }
            }
            c if ident_start(c) => {
                let start = i;
                while i < chars.len() && ident_char(chars[i]) {
                    i += 1;
                }
                let word: String = chars[start..i].iter().collect();
                let mut next = i;
                while next < chars.len() && chars[next].is_whitespace() {
                    next += 1;
                }
                let opens = chars.get(next) == Some(&'(');
                if LABEL_LISTS.contains(&word.as_str()) {
                    if opens {
                        i = skip_to(next, ')');
                    }
                } else if !opens && !PROMQL_WORDS.contains(&word.as_str()) {
                    names.insert(word);
                }
            }
            _ => i += 1,
        }
    }
    names
}

#[test]
fn metric_names_are_read_out_of_promql_by_the_documented_rule() {
    let names = |expr: &str| metric_names(expr).into_iter().collect::<Vec<_>>();
    assert_eq!(
        names(
            "histogram_quantile(0.99, sum by (le, channel) \
             (rate(outbox_delivery_duration_seconds_bucket{channel=\"Email\"}[$__rate_interval])))"
        ),
        ["outbox_delivery_duration_seconds_bucket"]
    );
    assert_eq!(
        names(
            "max without (instance) (outbox_site_health_online) == 0\n\
             unless on (site) (max by (site) (outbox_site_health_online) == 0)"
        ),
        ["outbox_site_health_online"]
    );
    assert_eq!(
        names("sum(x_total offset 5m) / ignoring(a) group_left (b) y > bool 0.5 or absent(up)"),
        ["up", "x_total", "y"]
    );
    assert_eq!(names("max(a{l=\"b}c\"}[5m:1m]) and ${ds} > 1e3"), ["a"]);
}

/// The sample names in OpenMetrics text: what PromQL sees, counters with `_total`, histograms
/// as `_bucket`, `_sum` and `_count`.
fn sample_names(text: &str) -> BTreeSet<String> {
    text.lines()
        .filter(|line| !line.starts_with('#') && !line.is_empty())
        .filter_map(|line| line.split(['{', ' ']).next())
        .map(str::to_owned)
        .collect()
}

async fn scrape(addr: SocketAddr) -> String {
    let reply = metrics_endpoint::get(addr, "/metrics").await.unwrap();
    assert_eq!(reply.status, 200, "{}", reply.body);
    reply.body
}

/// A real central (SQLite, an SMTP sink) and a real site-forwarder process, both serving
/// `/metrics`, after one notification went through and the site reported its health (so the
/// per-site and per-node series exist): every metric named by an alert rule or a dashboard
/// query is among the samples one of them exports.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_metric_the_rules_and_the_dashboard_name_is_exported() {
    let mut used: BTreeSet<(String, &str)> = BTreeSet::new();
    for expr in rule_expressions(&read(&alerts())) {
        let names = metric_names(&expr);
        assert!(!names.is_empty(), "no metric in the rule {expr}");
        used.extend(names.into_iter().map(|name| (name, "alerts.yml")));
    }
    let mut queries = Vec::new();
    dashboard_expressions(&dashboard(), &mut queries);
    assert!(!queries.is_empty());
    for expr in queries {
        let names = metric_names(&expr);
        assert!(!names.is_empty(), "no metric in the dashboard query {expr}");
        used.extend(
            names
                .into_iter()
                .map(|name| (name, "outbox-dashboard.json")),
        );
    }

    let dir = tempfile::tempdir().unwrap();
    let sink = smtp_sink().await;
    let mut config = central_config(dir.path(), Some(sink.addr()));
    let central_metrics = free_addr().await;
    config.metrics_listen = Some(central_metrics);
    // Self-alerts on (to the test's own list), so their series are exported too.
    config.self_alerts = Some(SelfAlertsConfig {
        email_list: Some(LIST.into()),
        ..SelfAlertsConfig::default()
    });
    // A webhook list with a fallback URL, so the per-list failover series exist once one
    // notification went to it.
    let hooks = WebhookServer::start().await.unwrap();
    config.lists.push(ListConfig {
        fallback_urls: vec![hooks.url("/backup")],
        ..ListConfig::webhook(
            "hooks",
            vec![hooks.url("/hook")],
            WebhookFormatKind::Generic,
        )
    });
    let central = Central::start(config).await;
    ingest_submit(
        &central,
        v1::NotificationSubmit {
            r#type: v1::NotificationType::Webhook.into(),
            list_name: "hooks".into(),
            ..submit("Tank 4 high level", "Level 97%")
        },
    )
    .await;

    let site_addr = free_addr().await;
    let site_metrics = free_addr().await;
    let buffer = dir.path().join("site-a.db");
    let site = Process(
        tokio::process::Command::new(binary("site-forwarder"))
            .args(["serve", "--site-id", "site-a", "--listen"])
            .arg(site_addr.to_string())
            .arg("--buffer")
            .arg(&buffer)
            .arg("--central")
            .arg(format!("http://{}", central.addr))
            .env("RUST_LOG", "warn")
            .env("OUTBOX_SITE_METRICS_LISTEN", site_metrics.to_string())
            .env("OUTBOX_SITE_HEALTH_REPORT_INTERVAL", "200ms")
            .env("OUTBOX_SITE_FORWARD_RETRY_INTERVAL", "100ms")
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .unwrap(),
    );
    wait_until_serving(site_addr).await;
    SiteNotifyClient::new(channel(site_addr).await)
        .send(send_request("Tank 4 high level", "Level 97%"))
        .await
        .unwrap();

    // Delivered, and the site online at central with its figures: the labelled series exist.
    let delivered = "outbox_delivery_attempts_total{channel=\"Email\",outcome=\"Delivered\"}";
    let online = "outbox_site_health_online{site=\"site-a\",node=\"site-a\"}";
    let forwarded = "outbox_site_forwarded_total{outcome=\"accepted\"}";
    let (central_text, site_text) = eventually(
        "a delivery, the site online at central, and its forward counted",
        || async {
            let central_text = scrape(central_metrics).await;
            let site_text = scrape(site_metrics).await;
            let ready = sample(&central_text, delivered) == Some(1.0)
                && sample(&central_text, online) == Some(1.0)
                && sample(&central_text, "outbox_by_site_queue_depth{site=\"site-a\"}").is_some()
                && sample(&central_text, "outbox_list_provider{list=\"hooks\"}") == Some(0.0)
                && sample(&site_text, forwarded) == Some(1.0);
            ready.then_some((central_text, site_text))
        },
    )
    .await;
    assert_eq!(
        sink.wait_for_messages(1, crate::harness::DEADLINE)
            .await
            .len(),
        1
    );

    let exported: BTreeSet<String> = sample_names(&central_text)
        .union(&sample_names(&site_text))
        .cloned()
        .collect();
    let missing: Vec<String> = used
        .iter()
        .filter(|(name, _)| !exported.contains(name))
        .map(|(name, file)| format!("{name} (in {file})"))
        .collect();
    assert!(
        missing.is_empty(),
        "named in deploy/ but exported by neither service: {missing:#?}\nexported: {exported:#?}"
    );

    site.kill9().await;
    central.stop().await;
}
