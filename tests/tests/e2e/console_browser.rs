//! The web console in a real browser: headless Chromium under chromedriver
//! ([`outbox_tests::browser`]) against a real central (SQLite, authentication required, console
//! on), a real SMTP sink and a real site-forwarder process reporting its health.
//!
//! An operator logs in with a token, reads the tiles, filters the list to PARKED (two parked rows
//! shown, the delivered one not), sees the bulk Retry confirmation count them, opens a parked
//! notification and retries it once the mail server accepts again, and sees it DELIVERED (the mail
//! received, the retry recorded as theirs). A viewer logs in and is refused Retry, one and in bulk,
//! with the admin API's message, and nothing changes. Then the site's forwarder stops and the
//! dashboard, refreshing by itself, shows the site offline.
//!
//! Every step that shows something worth seeing saves a screenshot: into `docs/console/`
//! (docs/operations.md shows them) when `UPDATE_SCREENSHOTS=1`, else into the build's
//! `target/console-screenshots/`, so a plain `make test` leaves the checkout as it was. Markup is the
//! console's contract: ids, classes and data attributes, never layout or wording beyond what it
//! names.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Result;
use central_outbox::auth::{AuthMode, Role, TokenConfig, token_digest};
use outbox_proto::v1;
use outbox_proto::v1::notification_outbox_client::NotificationOutboxClient;
use outbox_proto::v1::site_notify_client::SiteNotifyClient;
use outbox_tests::browser::{Browser, WAIT_DEADLINE};
use outbox_tests::smtp_sink::Behaviour;
use tonic::Request;
use tonic::transport::Channel;

use crate::harness::{
    Central, central_config, channel, send_request, smtp_sink, wait_for_status, with_console,
};

const OPERATOR_TOKEN: &str = "operator-token-3b9e51d7";
const VIEWER_TOKEN: &str = "viewer-token-c04f2a86";

/// Short, so the site turns offline on the page quickly; far longer than the report interval.
const OFFLINE_AFTER: Duration = Duration::from_secs(3);

/// Where the screenshots go: `docs/console/` of the workspace with `UPDATE_SCREENSHOTS=1`,
/// else `console-screenshots/` beside the test binary's build output.
fn screenshot_dir() -> PathBuf {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    if std::env::var_os("UPDATE_SCREENSHOTS").is_some_and(|v| v == "1") {
        return workspace.join("docs/console");
    }
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace.join("target"));
    target.join("console-screenshots")
}

fn token(name: &str, role: Role, secret: &str) -> TokenConfig {
    TokenConfig {
        name: name.into(),
        role,
        sha256: token_digest(secret),
    }
}

/// `message` with a bearer token, for the admin API with authentication on.
fn authed<T>(message: T, token: &str) -> Request<T> {
    let mut request = Request::new(message);
    request
        .metadata_mut()
        .insert("authorization", format!("Bearer {token}").parse().unwrap());
    request
}

/// The notification as the admin API tells it (asked as the viewer: reading is enough).
async fn detail(
    outbox: &mut NotificationOutboxClient<Channel>,
    id: &str,
) -> v1::NotificationDetail {
    outbox
        .get_notification_detail(authed(
            v1::GetNotificationDetailRequest {
                notification_id: id.into(),
            },
            VIEWER_TOKEN,
        ))
        .await
        .unwrap()
        .into_inner()
}

fn status_of(detail: &v1::NotificationDetail) -> v1::NotificationStatus {
    detail.notification.as_ref().unwrap().status()
}

/// Logs in with `token` and waits until the header names `whoami`.
async fn log_in(browser: &Browser, console: &str, token: &str, whoami: &str) -> Result<()> {
    browser.goto(&format!("{console}/login")).await?;
    browser.wait_for("#login-form").await?;
    browser.fill("#token", token).await?;
    browser.click("#login").await?;
    browser
        .wait_for_text(
            "#whoami",
            &format!("{whoami:?}"),
            false,
            WAIT_DEADLINE,
            |t| t == whoami,
        )
        .await?;
    Ok(())
}

/// A figure tile's value, once it is a whole number that `check` accepts.
async fn tile(
    browser: &Browser,
    key: &str,
    what: &str,
    check: impl Fn(u64) -> bool,
) -> Result<u64> {
    let css = format!("[data-tile=\"{key}\"] .tile-value");
    let text = browser
        .wait_for_text(&css, what, false, WAIT_DEADLINE, |t| {
            t.parse::<u64>().is_ok_and(&check)
        })
        .await?;
    Ok(text.parse()?)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_retries_a_parked_notification_a_viewer_may_not_and_a_site_goes_offline() {
    if let Err(e) = run().await {
        panic!("{e:#}");
    }
}

async fn run() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let shots = screenshot_dir();
    std::fs::create_dir_all(&shots)?;
    let sink = smtp_sink().await;
    let mut config = central_config(dir.path(), Some(sink.addr()));
    config.site_offline_after = OFFLINE_AFTER;
    config.auth.mode = AuthMode::Required;
    config.auth.tokens = vec![
        token("otto", Role::Operator, OPERATOR_TOKEN),
        token("vera", Role::Viewer, VIEWER_TOKEN),
    ];
    with_console(&mut config).await;
    let central = Central::start(config).await;
    let console = central.console_url();
    let mut outbox = NotificationOutboxClient::new(channel(central.addr).await);

    // Through a real site: one notification delivered; then the mail server refuses for good,
    // and the next two park.
    let (site, site_addr) =
        crate::site_health::spawn_reporting_site(dir.path(), "site-a", central.addr).await;
    let mut notify = SiteNotifyClient::new(channel(site_addr).await);
    let mut send = async |subject: &str| -> Result<String> {
        let request = send_request(subject, "Level 97% at 10:42.");
        Ok(notify.send(request).await?.into_inner().notification_id)
    };
    let first = send("Shift report").await?;
    wait_for_status(&central.db, &first, "Delivered").await;
    sink.set_behaviour(Behaviour::RejectMail {
        code: 550,
        text: "5.1.1 mailbox unavailable".into(),
    });
    let ids = [
        send("Tank 4 high level").await?,
        send("Pump 2 tripped").await?,
    ];
    for id in &ids {
        wait_for_status(&central.db, id, "Parked").await;
    }
    let (retried, refused) = (ids[0].as_str(), ids[1].as_str());

    let browser = Browser::start().await?;

    // The operator logs in; the dashboard shows the parked ones, the queue and the site online.
    log_in(&browser, &console, OPERATOR_TOKEN, "otto (operator)").await?;
    tile(&browser, "parked", "at least 2 parked", |n| n >= 2).await?;
    tile(&browser, "queue_depth", "a queue depth", |_| true).await?;
    for key in ["stuck", "delivered_recent", "oldest_pending_age"] {
        browser
            .wait_for(&format!("[data-tile=\"{key}\"] .tile-value"))
            .await?;
    }
    let site_state = "#sites tr[data-site=\"site-a\"][data-node=\"site-a\"] .site-state";
    browser
        .wait_for_text(site_state, "site-a online", false, WAIT_DEADLINE, |t| {
            t.starts_with("online")
        })
        .await?;
    browser
        .wait_for_text(
            "#sites tr[data-site=\"site-a\"] .site-buffer-depth",
            "the site's buffer depth, a number",
            false,
            WAIT_DEADLINE,
            |t| t.parse::<u64>().is_ok(),
        )
        .await?;
    browser.screenshot(&shots.join("dashboard.png")).await?;

    // The list, filtered to PARKED with the filter form: both rows, nothing else.
    browser.goto(&format!("{console}/notifications")).await?;
    let filter = browser.wait_for("#filter").await?;
    filter
        .find(fantoccini::Locator::Css("select[name=\"status\"]"))
        .await?
        .select_by_value("PARKED")
        .await?;
    browser.click("#filter [type=\"submit\"]").await?;
    browser
        .wait_for_url("the list filtered by status=PARKED", |url| {
            url.path() == "/notifications"
                && url
                    .query_pairs()
                    .any(|(k, v)| k == "status" && v == "PARKED")
        })
        .await?;
    let row = |id: &str| format!("#notifications tr[data-notification-id=\"{id}\"]");
    for id in &ids {
        browser
            .wait_for_text(
                &format!("{} td.status", row(id)),
                "PARKED",
                false,
                WAIT_DEADLINE,
                |t| t == "PARKED",
            )
            .await?;
    }
    let shown = browser.texts_of("#notifications td.status").await?;
    assert_eq!(
        shown,
        ["PARKED", "PARKED"],
        "exactly the two parked rows, not the delivered one; the page shows:\n{}",
        browser.page_summary().await
    );
    browser
        .screenshot(&shots.join("notifications-parked.png"))
        .await?;

    // Retry in bulk by this filter asks first, counting the rows it would touch; not confirmed.
    browser.click("form#bulk-retry [type=\"submit\"]").await?;
    browser
        .wait_for_text(
            "#bulk-count",
            "2 rows to touch",
            false,
            WAIT_DEADLINE,
            |t| t == "2",
        )
        .await?;
    browser.wait_for("button#confirm").await?;
    browser.client().back().await?;

    // Its detail, from the row's link.
    browser.click(&format!("{} a.detail", row(retried))).await?;
    browser
        .wait_for_text("#status", "PARKED", false, WAIT_DEADLINE, |t| t == "PARKED")
        .await?;
    browser.wait_for("#history tr.history-entry").await?;
    browser.wait_for("form#discard-form #discard").await?;
    browser.screenshot(&shots.join("detail-parked.png")).await?;

    // The mail server accepts again; Retry delivers it.
    sink.set_behaviour(Behaviour::Accept);
    browser.click("form#retry-form #retry").await?;
    let notice = browser.text_of(".notice").await?;
    assert!(!notice.is_empty());
    browser
        .wait_for_text(
            "#status",
            "DELIVERED (reloading the detail)",
            true,
            WAIT_DEADLINE,
            |t| t == "DELIVERED",
        )
        .await?;
    let actors = browser
        .texts_of("#history tr.history-entry .history-actor")
        .await?;
    assert!(
        actors.iter().any(|a| a == "otto"),
        "the retry is recorded as otto's: actors {actors:?}"
    );
    let delivered = detail(&mut outbox, retried).await;
    assert_eq!(status_of(&delivered), v1::NotificationStatus::Delivered);
    assert!(
        delivered.history.iter().any(|h| h.actor == "otto"),
        "{:?}",
        delivered.history
    );
    let mail = sink.wait_for_messages(2, WAIT_DEADLINE).await;
    assert_eq!(
        mail.iter()
            .map(|m| m.subject().unwrap_or_default())
            .collect::<Vec<_>>(),
        ["Shift report", "Tank 4 high level"],
        "the first mail, then the retried notification's, and only it"
    );

    // Log out: the session is over.
    browser.click("#logout").await?;
    browser.wait_for("#login-form").await?;
    browser.goto(&format!("{console}/")).await?;
    browser.wait_for("#login-form").await?;

    // A viewer may look but not act: Retry is refused with the API's message, nothing changes.
    log_in(&browser, &console, VIEWER_TOKEN, "vera (viewer)").await?;
    browser
        .goto(&format!("{console}/notifications/{refused}"))
        .await?;
    browser
        .wait_for_text("#status", "PARKED", false, WAIT_DEADLINE, |t| t == "PARKED")
        .await?;
    browser.click("form#retry-form #retry").await?;
    browser
        .wait_for_text(
            ".error",
            "the operator role named",
            false,
            WAIT_DEADLINE,
            |t| t.contains("operator"),
        )
        .await?;
    browser
        .wait_for_text("#status", "still PARKED", false, WAIT_DEADLINE, |t| {
            t == "PARKED"
        })
        .await?;
    browser
        .screenshot(&shots.join("viewer-refused.png"))
        .await?;
    assert_eq!(
        status_of(&detail(&mut outbox, refused).await),
        v1::NotificationStatus::Parked
    );

    // In bulk too: refused, whether at the confirmation (this console checks the role before
    // counting) or on confirming.
    browser
        .goto(&format!("{console}/notifications?status=PARKED"))
        .await?;
    browser.click("form#bulk-retry [type=\"submit\"]").await?;
    browser.wait_for("#bulk-count, .error").await?;
    if browser.find_all(".error").await?.is_empty() {
        browser
            .wait_for_text("#bulk-count", "1 row to touch", false, WAIT_DEADLINE, |t| {
                t == "1"
            })
            .await?;
        browser.click("button#confirm").await?;
    }
    browser
        .wait_for_text(
            ".error",
            "the operator role named",
            false,
            WAIT_DEADLINE,
            |t| t.contains("operator"),
        )
        .await?;
    assert_eq!(
        status_of(&detail(&mut outbox, refused).await),
        v1::NotificationStatus::Parked
    );
    assert_eq!(sink.messages().len(), 2, "no mail for the refused retries");

    // The site's forwarder stops: the dashboard, refreshing by itself, shows it offline.
    browser.goto(&format!("{console}/")).await?;
    browser
        .wait_for_text(site_state, "site-a online", false, WAIT_DEADLINE, |t| {
            t.starts_with("online")
        })
        .await?;
    site.kill9().await;
    browser
        .wait_for_text(
            site_state,
            "site-a offline (without reloading: the page refreshes itself)",
            false,
            WAIT_DEADLINE,
            |t| t.starts_with("offline"),
        )
        .await?;
    browser
        .wait_for(&format!("{site_state}[data-state=\"offline\"]"))
        .await?;
    browser.screenshot(&shots.join("site-offline.png")).await?;

    browser.close().await?;
    central.stop().await;
    Ok(())
}
