//! The web console against a running central (SQLite, a real SMTP sink told to refuse mail so
//! notifications park), driven over real HTTP by a small cookie-keeping client: logging in
//! with a token, the dashboard and the PARKED list, a retry from the detail page with and
//! without the session's CSRF token, a viewer refused, a malformed filter, the bulk dry-run
//! count and the bulk discard, logging out. What changed is checked through the gRPC admin API,
//! not only on the pages. A viewer sees webhook URLs cut to scheme, host and port, on the pages
//! and through the API alike.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::Duration;

use central_outbox::auth::{AuthMode, Role, TokenConfig, token_digest};
use central_outbox::config::{BackoffKind, ListConfig, WebhookConfig, WebhookFormatKind};
use outbox_proto::v1;
use outbox_proto::v1::notification_outbox_client::NotificationOutboxClient;
use outbox_tests::smtp_sink::Behaviour;
use outbox_tests::webhook_server::{Reply as HookReply, WebhookServer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tonic::Request;
use tonic::transport::Channel;

use crate::harness::{
    Central, central_config, channel, eventually, smtp_sink, submit, wait_for_status, with_console,
};

const VIEWER_TOKEN: &str = "viewer-token-2b7c9d41";
const OPERATOR_TOKEN: &str = "operator-token-6e1f0a58";

/// One HTTP answer.
pub(crate) struct Reply {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Reply {
    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// A browser reduced to what the test needs: HTTP/1.1 over a fresh connection per request,
/// a cookie jar, no redirects followed (the test checks them).
pub(crate) struct Browser {
    addr: SocketAddr,
    /// The loopback address it connects from (`None`: the system's choice, 127.0.0.1), so a
    /// test can be several clients.
    local: Option<std::net::IpAddr>,
    cookies: HashMap<String, String>,
}

impl Browser {
    pub(crate) fn new(central: &Central) -> Self {
        let url = central.console_url();
        let addr = url.strip_prefix("http://").unwrap().parse().unwrap();
        Self {
            addr,
            local: None,
            cookies: HashMap::new(),
        }
    }

    /// A browser on another machine, as far as central can tell: it connects from `local` (any
    /// address of 127.0.0.0/8 is this host's on Linux).
    pub(crate) fn from_address(central: &Central, local: std::net::IpAddr) -> Self {
        Self {
            local: Some(local),
            ..Self::new(central)
        }
    }

    async fn send(&mut self, method: &str, path: &str, form: Option<&[(&str, &str)]>) -> Reply {
        let body = form
            .map(|fields| {
                fields
                    .iter()
                    .map(|(key, value)| format!("{}={}", form_encode(key), form_encode(value)))
                    .collect::<Vec<_>>()
                    .join("&")
            })
            .unwrap_or_default();
        let cookie = self
            .cookies
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join("; ");
        let mut request = format!(
            "{method} {path} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n",
            self.addr
        );
        if !cookie.is_empty() {
            request.push_str(&format!("Cookie: {cookie}\r\n"));
        }
        if form.is_some() {
            request.push_str(&format!(
                "Content-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\n",
                body.len()
            ));
        }
        request.push_str("\r\n");
        request.push_str(&body);
        let exchange = async {
            let mut stream = match self.local {
                None => TcpStream::connect(self.addr).await?,
                Some(local) => {
                    let socket = tokio::net::TcpSocket::new_v4()?;
                    socket.bind(SocketAddr::new(local, 0))?;
                    socket.connect(self.addr).await?
                }
            };
            stream.write_all(request.as_bytes()).await?;
            let mut raw = Vec::new();
            stream.read_to_end(&mut raw).await?;
            Ok::<_, std::io::Error>(raw)
        };
        let raw = tokio::time::timeout(Duration::from_secs(30), exchange)
            .await
            .expect("the console answers within 30 s")
            .expect("the console answers over HTTP");
        let text = String::from_utf8(raw).unwrap();
        let (head, body) = text.split_once("\r\n\r\n").unwrap();
        let mut lines = head.split("\r\n");
        let status = lines
            .next()
            .and_then(|l| l.split(' ').nth(1))
            .and_then(|c| c.parse().ok())
            .unwrap();
        let headers: Vec<(String, String)> = lines
            .filter_map(|l| l.split_once(':'))
            .map(|(n, v)| (n.trim().to_owned(), v.trim().to_owned()))
            .collect();
        for (name, value) in &headers {
            if name.eq_ignore_ascii_case("set-cookie") {
                let (pair, attributes) = value.split_once(';').unwrap_or((value, ""));
                let (key, val) = pair.split_once('=').unwrap();
                if attributes.contains("Max-Age=0") {
                    self.cookies.remove(key);
                } else {
                    self.cookies.insert(key.to_owned(), val.to_owned());
                }
            }
        }
        Reply {
            status,
            headers,
            body: body.to_owned(),
        }
    }

    pub(crate) async fn get(&mut self, path: &str) -> Reply {
        self.send("GET", path, None).await
    }

    pub(crate) async fn post(&mut self, path: &str, form: &[(&str, &str)]) -> Reply {
        self.send("POST", path, Some(form)).await
    }

    /// Logs in with `token`, as a person would: the form, then its post.
    pub(crate) async fn log_in(&mut self, token: &str) -> Reply {
        let form = self.get("/login").await;
        assert_eq!(form.status, 200, "{}", form.body);
        assert!(form.body.contains(r#"id="login-form""#));
        let nonce = csrf(&form.body);
        self.post("/login", &[("csrf", &nonce), ("token", token)])
            .await
    }
}

/// `text` as `application/x-www-form-urlencoded` writes it: unreserved bytes as they are,
/// everything else percent-encoded.
fn form_encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                char::from(b).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The value of the first hidden `csrf` field in a page.
pub(crate) fn csrf(html: &str) -> String {
    let start = html
        .find(r#"name="csrf" value=""#)
        .expect("the page has a csrf field")
        + r#"name="csrf" value=""#.len();
    html[start..].split('"').next().unwrap().to_owned()
}

/// The text of the first `.error` element, if any.
pub(crate) fn error_text(html: &str) -> Option<&str> {
    let at = html.find(r#"class="error""#)?;
    let text = &html[at..];
    let start = text.find('>')? + 1;
    text[start..].split('<').next()
}

/// The figure of the dashboard tile `key`.
pub(crate) fn tile(html: &str, key: &str) -> String {
    let at = html
        .find(&format!(r#"data-tile="{key}""#))
        .unwrap_or_else(|| panic!("no tile {key}"));
    let value = &html[at..];
    let start = value.find(r#"class="tile-value">"#).unwrap() + r#"class="tile-value">"#.len();
    value[start..].split('<').next().unwrap().to_owned()
}

fn token(name: &str, role: Role, secret: &str) -> TokenConfig {
    TokenConfig {
        name: name.into(),
        role,
        sha256: token_digest(secret),
    }
}

fn as_operator<T>(message: T) -> Request<T> {
    let mut request = Request::new(message);
    request.metadata_mut().insert(
        "authorization",
        format!("Bearer {OPERATOR_TOKEN}").parse().unwrap(),
    );
    request
}

async fn status_of(
    client: &mut NotificationOutboxClient<Channel>,
    id: &str,
) -> v1::NotificationStatus {
    client
        .get_notification_status(as_operator(v1::GetNotificationStatusRequest {
            notification_id: id.into(),
        }))
        .await
        .unwrap()
        .into_inner()
        .status()
}

async fn history(
    client: &mut NotificationOutboxClient<Channel>,
    id: &str,
) -> Vec<v1::HistoryEntry> {
    client
        .get_notification_detail(as_operator(v1::GetNotificationDetailRequest {
            notification_id: id.into(),
        }))
        .await
        .unwrap()
        .into_inner()
        .history
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operators_see_parked_notifications_and_steer_them_through_the_api_rules() {
    let dir = tempfile::tempdir().unwrap();
    let sink = smtp_sink().await;
    sink.set_behaviour(Behaviour::RejectMail {
        code: 550,
        text: "5.1.1 no such user".into(),
    });
    let mut config = central_config(dir.path(), Some(sink.addr()));
    config.auth.mode = AuthMode::Required;
    config.auth.tokens = vec![
        token("vera", Role::Viewer, VIEWER_TOKEN),
        token("otto", Role::Operator, OPERATOR_TOKEN),
    ];
    with_console(&mut config).await;
    let central = Central::start(config).await;
    let mut ingest = central.ingest().await;
    let mut ids = Vec::new();
    for subject in ["Tank 4 high level", "Pump 2 tripped", "Feeder 7 overload"] {
        let msg = submit(subject, "Level 97%");
        ids.push(msg.notification_id.clone());
        ingest.submit_notification(msg).await.unwrap();
    }
    for id in &ids {
        wait_for_status(&central.db, id, "Parked").await;
    }
    // Retries from here on are delivered.
    sink.set_behaviour(Behaviour::Accept);
    let mut api = NotificationOutboxClient::new(channel(central.addr).await);

    // Nobody gets in without logging in, and a wrong token is told so.
    let mut otto = Browser::new(&central);
    let anonymous = otto.get("/").await;
    assert_eq!(anonymous.status, 303);
    assert_eq!(anonymous.header("location"), Some("/login"));
    let refused = otto.log_in("not-a-token").await;
    assert_eq!(refused.status, 401);
    assert!(
        error_text(&refused.body).is_some_and(|e| e.contains("token")),
        "{}",
        refused.body
    );
    let logged_in = otto.log_in(OPERATOR_TOKEN).await;
    assert_eq!(logged_in.status, 303, "{}", logged_in.body);
    assert_eq!(logged_in.header("location"), Some("/"));
    let session_cookie = logged_in
        .headers
        .iter()
        .find(|(n, v)| n.eq_ignore_ascii_case("set-cookie") && v.starts_with("outbox_console="))
        .map(|(_, v)| v.clone())
        .expect("a session cookie");
    assert!(
        session_cookie.contains("HttpOnly")
            && session_cookie.contains("SameSite=Strict")
            && session_cookie.contains("Path=/"),
        "{session_cookie}"
    );

    // The dashboard counts them; the PARKED filter lists them.
    let dashboard = otto.get("/").await;
    assert_eq!(dashboard.status, 200);
    assert!(
        dashboard
            .body
            .contains(r#"<span id="whoami">otto (operator)</span>"#)
    );
    assert_eq!(tile(&dashboard.body, "parked"), "3");
    assert_eq!(tile(&dashboard.body, "queue_depth"), "0");
    let parked = otto.get("/notifications?status=PARKED").await;
    assert_eq!(parked.status, 200);
    for id in &ids {
        let row = format!(r#"<tr data-notification-id="{id}">"#);
        let at = parked
            .body
            .find(&row)
            .unwrap_or_else(|| panic!("{id} listed"));
        assert!(
            parked.body[at..].contains(r#"<td class="status">PARKED</td>"#),
            "{id} shows PARKED"
        );
    }
    assert!(parked.body.contains(r#"id="bulk-retry""#));

    // A malformed filter names the field, lists nothing, and is the request's fault.
    let malformed = otto.get("/notifications?status=PARKED&from=notatime").await;
    assert_eq!(malformed.status, 400);
    assert!(
        error_text(&malformed.body).is_some_and(|e| e.starts_with("from:")),
        "{}",
        malformed.body
    );
    assert!(!malformed.body.contains("data-notification-id"));
    let unknown = otto
        .get("/notifications/0190b4c6-0000-7000-8000-000000000000")
        .await;
    assert_eq!(unknown.status, 404);
    assert!(error_text(&unknown.body).is_some());

    // The detail shows PARKED with the actions; posts without the session's token change
    // nothing.
    let first = &ids[0];
    let detail = otto.get(&format!("/notifications/{first}")).await;
    assert_eq!(detail.status, 200);
    assert!(
        detail
            .body
            .contains(r#"id="status" class="status">PARKED<"#)
    );
    assert!(detail.body.contains(r#"form id="retry-form""#));
    let token = csrf(&detail.body);
    let retry = format!("/notifications/{first}/retry");
    for form in [vec![], vec![("csrf", "forged-token")]] {
        let refused = otto.post(&retry, &form).await;
        assert_eq!(refused.status, 403, "{form:?}");
        assert!(
            error_text(&refused.body).is_some_and(|e| e.contains("CSRF")),
            "{}",
            refused.body
        );
    }
    assert_eq!(
        status_of(&mut api, first).await,
        v1::NotificationStatus::Parked
    );

    // A viewer gets the API's own refusal, and nothing changes.
    let mut vera = Browser::new(&central);
    assert_eq!(vera.log_in(VIEWER_TOKEN).await.status, 303);
    let seen = vera.get(&format!("/notifications/{first}")).await;
    let vera_token = csrf(&seen.body);
    let refused = vera.post(&retry, &[("csrf", &vera_token)]).await;
    assert_eq!(refused.status, 303);
    let after = vera.get(&format!("/notifications/{first}")).await;
    assert!(
        error_text(&after.body).is_some_and(|e| e.contains("needs the operator role")),
        "{}",
        after.body
    );
    assert_eq!(
        status_of(&mut api, first).await,
        v1::NotificationStatus::Parked
    );
    // A viewer may not even count a bulk action.
    let counted = vera
        .get("/notifications/bulk?action=retry&status=PARKED")
        .await;
    assert_eq!(counted.status, 403);
    // The SMTP settings read for a viewer: the relay shown, the form disabled, no secret; a
    // save is refused by the API (admin only) and changes nothing.
    let smtp = vera.get("/smtp").await;
    assert_eq!(smtp.status, 200, "{}", smtp.body);
    assert!(smtp.body.contains("<fieldset disabled>"), "{}", smtp.body);
    assert!(!smtp.body.contains("id=\"save-smtp\""), "{}", smtp.body);
    assert!(
        smtp.body
            .contains(&format!("name=\"host\" value=\"{}\"", sink.addr().ip())),
        "{}",
        smtp.body
    );
    let saved = vera
        .post(
            "/smtp",
            &[
                ("csrf", &csrf(&smtp.body)),
                ("host", "relay.elsewhere.test"),
                ("port", "25"),
                ("from_address", "outbox@plant.example.test"),
            ],
        )
        .await;
    assert_eq!(saved.status, 403, "{}", saved.body);
    assert!(
        saved.body.contains("needs the admin role"),
        "{}",
        saved.body
    );
    assert_ne!(
        api.get_smtp_config(as_operator(v1::GetSmtpConfigRequest {}))
            .await
            .unwrap()
            .into_inner()
            .host,
        "relay.elsewhere.test"
    );

    // The operator's retry with the token goes through the API: delivered, and the history
    // names the token's holder.
    let retried = otto.post(&retry, &[("csrf", &token)]).await;
    assert_eq!(retried.status, 303);
    assert_eq!(
        retried.header("location"),
        Some(format!("/notifications/{first}").as_str())
    );
    let shown = otto.get(&format!("/notifications/{first}")).await;
    assert!(shown.body.contains(r#"class="notice""#), "{}", shown.body);
    wait_for_status(&central.db, first, "Delivered").await;
    let entries = history(&mut api, first).await;
    assert!(
        entries
            .iter()
            .any(|h| h.kind() == v1::HistoryEntryKind::OperatorRetry && h.actor == "otto"),
        "{entries:?}"
    );

    // Bulk: the confirmation's count is the dry run's, which is what the API counts.
    let parked_now = api
        .query_notifications(as_operator(v1::QueryNotificationsRequest {
            filter: Some(v1::NotificationFilter {
                statuses: vec![v1::NotificationStatus::Parked.into()],
                ..Default::default()
            }),
            ..Default::default()
        }))
        .await
        .unwrap()
        .into_inner()
        .notifications
        .len();
    assert_eq!(parked_now, 2);
    let confirm = otto
        .get("/notifications/bulk?action=discard&status=PARKED")
        .await;
    assert_eq!(confirm.status, 200, "{}", confirm.body);
    assert!(
        confirm
            .body
            .contains(&format!(r#"<strong id="bulk-count">{parked_now}</strong>"#)),
        "{}",
        confirm.body
    );
    assert!(confirm.body.contains(r#"id="confirm""#));
    // A dry run by ids says which would change and why the others would not, and changes
    // nothing either.
    let by_ids = api
        .retry_notifications(as_operator(v1::BulkActionRequest {
            selector: Some(v1::bulk_action_request::Selector::Ids(
                v1::NotificationIds {
                    notification_ids: vec![ids[1].clone(), first.clone()],
                },
            )),
            dry_run: true,
            ..Default::default()
        }))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(by_ids.changed, 1);
    assert_eq!(by_ids.changed_ids, vec![ids[1].clone()]);
    assert_eq!(by_ids.skipped.len(), 1);
    assert!(
        by_ids.skipped[0].reason.contains("DELIVERED"),
        "{:?}",
        by_ids.skipped
    );
    // The counts changed nothing.
    for id in &ids[1..] {
        assert_eq!(
            status_of(&mut api, id).await,
            v1::NotificationStatus::Parked
        );
    }
    let mut fields: Vec<(String, String)> = Vec::new();
    let form = &confirm.body[confirm.body.find(r#"id="bulk-confirm""#).unwrap()..];
    for input in form.split("<input type=\"hidden\" ").skip(1) {
        let name = input
            .split("name=\"")
            .nth(1)
            .unwrap()
            .split('"')
            .next()
            .unwrap();
        let value = input
            .split("value=\"")
            .nth(1)
            .unwrap()
            .split('"')
            .next()
            .unwrap();
        fields.push((name.to_owned(), value.to_owned()));
    }
    let fields: Vec<(&str, &str)> = fields
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let applied = otto.post("/notifications/bulk", &fields).await;
    assert_eq!(applied.status, 303, "{}", applied.body);
    let listed = otto.get(applied.header("location").unwrap()).await;
    assert!(
        listed.body.contains("2 notifications discarded."),
        "{}",
        listed.body
    );
    for id in &ids[1..] {
        assert_eq!(
            status_of(&mut api, id).await,
            v1::NotificationStatus::Discarded
        );
        assert!(
            history(&mut api, id)
                .await
                .iter()
                .any(|h| h.kind() == v1::HistoryEntryKind::OperatorDiscard && h.actor == "otto")
        );
    }

    // Logging out ends the session: its cookie no longer opens a page, and its token is void.
    let stale = csrf(&otto.get("/").await.body);
    let out = otto.post("/logout", &[("csrf", &stale)]).await;
    assert_eq!(out.status, 303);
    assert_eq!(out.header("location"), Some("/login"));
    assert_eq!(otto.get("/").await.status, 303);
    central.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_authentication_off_the_console_is_open_and_acts_as_console() {
    let dir = tempfile::tempdir().unwrap();
    let sink = smtp_sink().await;
    sink.set_behaviour(Behaviour::RejectMail {
        code: 550,
        text: "5.1.1 no such user".into(),
    });
    let mut config = central_config(dir.path(), Some(sink.addr()));
    with_console(&mut config).await;
    let central = Central::start(config).await;
    let msg = submit("Tank 4 high level", "Level 97%");
    let id = msg.notification_id.clone();
    central
        .ingest()
        .await
        .submit_notification(msg)
        .await
        .unwrap();
    wait_for_status(&central.db, &id, "Parked").await;
    sink.set_behaviour(Behaviour::Accept);

    let mut browser = Browser::new(&central);
    let detail = browser.get(&format!("/notifications/{id}")).await;
    assert_eq!(detail.status, 200, "{}", detail.body);
    assert!(
        detail
            .body
            .contains(r#"<span id="whoami">console (admin)</span>"#)
    );
    let token = csrf(&detail.body);
    let retried = browser
        .post(&format!("/notifications/{id}/retry"), &[("csrf", &token)])
        .await;
    assert_eq!(retried.status, 303);
    let api = NotificationOutboxClient::new(channel(central.addr).await);
    let entries = eventually("the retry is in the history", || {
        let mut api = api.clone();
        let id = id.clone();
        async move {
            let entries = history(&mut api, &id).await;
            entries
                .iter()
                .any(|h| h.kind() == v1::HistoryEntryKind::OperatorRetry)
                .then_some(entries)
        }
    })
    .await;
    assert!(
        entries
            .iter()
            .any(|h| h.kind() == v1::HistoryEntryKind::OperatorRetry && h.actor == "console"),
        "{entries:?}"
    );
    central.stop().await;
}

fn as_viewer<T>(message: T) -> Request<T> {
    let mut request = Request::new(message);
    request.metadata_mut().insert(
        "authorization",
        format!("Bearer {VIEWER_TOKEN}").parse().unwrap(),
    );
    request
}

/// Slack, Teams and Discord keep a webhook's credential in its URL's path (other endpoints in
/// the query): whoever reads the URL can post to the channel. A viewer sees scheme, host and port
/// only, in the lists, in "Delivered to" and in the errors, through the API and on the console's
/// pages; an operator sees the whole URL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn viewers_see_webhook_urls_cut_to_scheme_host_and_port() {
    let dir = tempfile::tempdir().unwrap();
    let hooks = WebhookServer::start().await.unwrap();
    // The first POST fails: the endpoint is named in LastError and in that attempt's error.
    hooks.set_responses(vec![HookReply::status(500)]);
    let path = "/services/T0001/B0002/slackPathSecret7Q";
    let endpoint = hooks.url(&format!("{path}?token=queryToken3X"));
    let hidden = ["slackPathSecret7Q", "queryToken3X", "/services/"];
    let cut = format!("http://{}/\u{2026}", hooks.addr());
    let mut config = central_config(dir.path(), None);
    config.webhook = Some(WebhookConfig {
        max_retries: 5,
        retry_delay: Duration::from_millis(200),
        backoff: BackoffKind::Fixed,
        ..WebhookConfig::default()
    });
    config.lists.push(ListConfig::webhook(
        "hooks",
        vec![endpoint.clone()],
        WebhookFormatKind::Slack,
    ));
    config.auth.mode = AuthMode::Required;
    config.auth.tokens = vec![
        token("vera", Role::Viewer, VIEWER_TOKEN),
        token("otto", Role::Operator, OPERATOR_TOKEN),
    ];
    with_console(&mut config).await;
    let central = Central::start(config).await;
    let msg = v1::NotificationSubmit {
        r#type: v1::NotificationType::Webhook.into(),
        list_name: "hooks".into(),
        ..submit("Tank 4 high level", "Level 97%")
    };
    let id = msg.notification_id.clone();
    central
        .ingest()
        .await
        .submit_notification(msg)
        .await
        .unwrap();
    wait_for_status(&central.db, &id, "Delivered").await;
    let assert_hidden = |what: &str, shown: &str| {
        for secret in hidden {
            assert!(
                !shown.contains(secret),
                "{what} shows {secret:?} to a viewer: {shown}"
            );
        }
    };

    // The API, as a viewer.
    let mut api = NotificationOutboxClient::new(channel(central.addr).await);
    let lists = api
        .list_notification_lists(as_viewer(v1::ListNotificationListsRequest {}))
        .await
        .unwrap()
        .into_inner();
    let listed = lists.lists.iter().find(|l| l.name == "hooks").unwrap();
    assert_eq!(listed.endpoints, std::slice::from_ref(&cut));
    assert_hidden("ListNotificationLists", &format!("{lists:?}"));
    let list = api
        .get_notification_list(as_viewer(v1::GetNotificationListRequest {
            name: "hooks".into(),
        }))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(list.endpoints, std::slice::from_ref(&cut));
    let detail = api
        .get_notification_detail(as_viewer(v1::GetNotificationDetailRequest {
            notification_id: id.clone(),
        }))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(detail.resolved_targets, cut);
    let last_error = &detail.notification.as_ref().unwrap().last_error;
    assert!(
        last_error.starts_with(&format!("{cut}: HTTP 500")),
        "{last_error}"
    );
    assert!(
        detail
            .history
            .iter()
            .any(|h| h.error.starts_with(&format!("{cut}: HTTP 500"))),
        "{:?}",
        detail.history
    );
    assert_hidden("GetNotificationDetail", &format!("{detail:?}"));
    let status = api
        .get_notification_status(as_viewer(v1::GetNotificationStatusRequest {
            notification_id: id.clone(),
        }))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(&status.last_error, last_error);
    let query = api
        .query_notifications(as_viewer(v1::QueryNotificationsRequest::default()))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(query.notifications.len(), 1);
    assert_hidden("QueryNotifications", &format!("{query:?}"));

    // An operator sees the whole URL.
    let full = api
        .get_notification_detail(as_operator(v1::GetNotificationDetailRequest {
            notification_id: id.clone(),
        }))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(full.resolved_targets, endpoint);
    assert!(
        full.notification.unwrap().last_error.contains(path),
        "an operator sees the endpoint's path"
    );
    let full_list = api
        .get_notification_list(as_operator(v1::GetNotificationListRequest {
            name: "hooks".into(),
        }))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(full_list.endpoints, std::slice::from_ref(&endpoint));

    // The console's pages, as a viewer: the same cut, wherever a URL shows.
    let mut vera = Browser::new(&central);
    assert_eq!(vera.log_in(VIEWER_TOKEN).await.status, 303);
    for page in [
        "/lists".to_owned(),
        "/lists/hooks".to_owned(),
        "/notifications".to_owned(),
        format!("/notifications/{id}"),
    ] {
        let shown = vera.get(&page).await;
        assert_eq!(shown.status, 200, "{page}: {}", shown.body);
        assert_hidden(&page, &shown.body);
    }
    let seen = vera.get(&format!("/notifications/{id}")).await;
    assert!(seen.body.contains(&cut), "{}", seen.body);
    let mut otto = Browser::new(&central);
    assert_eq!(otto.log_in(OPERATOR_TOKEN).await.status, 303);
    let seen = otto.get(&format!("/notifications/{id}")).await;
    assert!(seen.body.contains(path), "{}", seen.body);
    central.stop().await;
}
