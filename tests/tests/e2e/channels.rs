//! The delivery channels end to end: an in-process central, fed through real ingest, delivering
//! to the workspace's real test servers (the SMTP sink, the OAuth2 token endpoint, the webhook
//! receiver). Each test asserts what an operator relies on: the row's status, RetryCount and
//! LastError, the attempt history, and what the server actually received.
//!
//! Faults are scripted on the servers ("451 for the next transaction", "429 with Retry-After
//! once") so a test never races the dispatcher; waiting is always for a condition.

use std::path::Path;
use std::time::Duration;

use central_outbox::config::{
    BackoffKind, Config as CentralConfig, ListConfig, OAuthConfig, SmtpTls, WebhookConfig,
    WebhookFormatKind,
};
use outbox_proto::v1;
use outbox_tests::oauth_server::OAuthServer;
use outbox_tests::smtp_sink::{AuthRequirement, Behaviour, SinkOptions, SmtpSink};
use outbox_tests::webhook_server::{
    Reply, SIGNATURE_TOLERANCE, SignatureRejection, WebhookServer, unix_now, verify_signature,
};
use tokio::net::TcpListener;

use crate::harness::{
    Central, DEADLINE, Db, central_config, eventually, smtp_sink, submit, wait_for_status,
};

/// The mailbox the XOAUTH2 and password tests authenticate as.
const SMTP_USER: &str = "outbox@plant.example.test";

/// Signing key of the webhook lists (the product requires at least 16 characters).
const HOOK_SECRET: &str = "hook-secret-0123456789";

/// Ingests `msg` and returns its NotificationId.
async fn send(central: &Central, msg: v1::NotificationSubmit) -> String {
    let id = msg.notification_id.clone();
    central
        .ingest()
        .await
        .submit_notification(msg)
        .await
        .unwrap();
    id
}

/// Ingests `n` email notifications to the default list, one after another.
async fn send_many(central: &Central, n: usize) -> Vec<String> {
    let mut ingest = central.ingest().await;
    let mut ids = Vec::with_capacity(n);
    for i in 0..n {
        let msg = submit(&format!("Tank {i} high level"), "Level 97%");
        ids.push(msg.notification_id.clone());
        ingest.submit_notification(msg).await.unwrap();
    }
    ids
}

/// Waits until `n` notifications are Delivered.
async fn wait_for_delivered(db: &Path, n: i64) {
    let db = Db::open(db);
    eventually(&format!("{n} notifications Delivered"), || {
        let delivered = db.count("SELECT COUNT(*) FROM Notifications WHERE Status = 'Delivered'");
        async move { (delivered >= n).then_some(()) }
    })
    .await;
}

/// (LastAttemptAt, NextAttemptAt) of one notification, in Unix milliseconds.
fn schedule(db: &Path, id: &str) -> (Option<i64>, Option<i64>) {
    let rows = Db::open(db).query(
        "SELECT LastAttemptAt, NextAttemptAt FROM Notifications WHERE NotificationId = ?1",
        &[id],
    );
    (rows[0].get(0).unwrap(), rows[0].get(1).unwrap())
}

/// StartedAt of every attempt of every notification, in Unix milliseconds, oldest first.
fn attempt_starts(db: &Path) -> Vec<i64> {
    Db::open(db).rows(
        "SELECT StartedAt FROM NotificationAttempts ORDER BY StartedAt",
        |r| r.get(0),
    )
}

/// The outcome column of each attempt, oldest first.
fn outcomes(db: &Db, id: &str) -> Vec<String> {
    db.attempts(id).into_iter().map(|a| a.1).collect()
}

// ---- SMTP replies -------------------------------------------------------------------------

/// One scripted SMTP fault and what it must lead to.
struct SmtpCase {
    name: String,
    behaviour: Behaviour,
    /// Transient: Retrying, then Delivered. Otherwise Parked at once.
    transient: bool,
    /// What LastError and the failed attempt's Error must both contain.
    expect: Vec<String>,
}

fn smtp_cases() -> Vec<SmtpCase> {
    type Stage = fn(u16, String) -> Behaviour;
    let stages: [(&str, Stage); 3] = [
        ("MAIL", |code, text| Behaviour::RejectMail { code, text }),
        ("RCPT", |code, text| Behaviour::RejectRcpt { code, text }),
        ("DATA", |code, text| Behaviour::RejectData { code, text }),
    ];
    let replies = [
        (421, "4.3.2 service shutting down", true),
        (451, "4.3.0 local error, try again later", true),
        (452, "4.3.1 insufficient system storage", true),
        (550, "5.1.1 mailbox unavailable", false),
        (553, "5.1.3 mailbox name not allowed", false),
        (554, "5.7.1 transaction failed, spam suspected", false),
    ];
    let mut cases = Vec::new();
    for (stage, behaviour) in stages {
        for (code, text, transient) in replies {
            cases.push(SmtpCase {
                name: format!("{code} to {stage}"),
                behaviour: behaviour(code, text.to_owned()),
                transient,
                expect: vec![code.to_string(), text.to_owned()],
            });
        }
    }
    cases.push(SmtpCase {
        name: "connection dropped mid-DATA".into(),
        behaviour: Behaviour::DropMidData,
        transient: true,
        expect: Vec::new(),
    });
    cases
}

/// Runs one case against its own sink and central; the sink misbehaves for one transaction only,
/// so a transient case must recover by itself.
async fn run_smtp_case(case: SmtpCase) {
    let name = &case.name;
    let dir = tempfile::tempdir().unwrap();
    let sink = smtp_sink().await;
    sink.set_behaviour_for(1, case.behaviour.clone());
    let central = Central::start(central_config(dir.path(), Some(sink.addr()))).await;
    let id = send(&central, submit("Tank 4 high level", "Level 97%")).await;
    let db = Db::open(&central.db);

    let want = if case.transient {
        "Delivered"
    } else {
        "Parked"
    };
    let (_, retries, last_error) = wait_for_status(&central.db, &id, want).await;
    let last_error = last_error.unwrap_or_else(|| panic!("{name}: no LastError"));
    let attempts = db.attempts(&id);
    let failed_error = attempts[0]
        .2
        .clone()
        .unwrap_or_else(|| panic!("{name}: the failed attempt has no Error"));
    for expected in &case.expect {
        assert!(
            last_error.contains(expected),
            "{name}: LastError {last_error:?}"
        );
        assert!(
            failed_error.contains(expected),
            "{name}: attempt Error {failed_error:?}"
        );
    }
    assert_eq!(sink.refused_count(), 1, "{name}: the fault fired once");

    if case.transient {
        // Delivered after exactly one retry; the row still shows why it had to retry.
        assert_eq!(retries, 1, "{name}");
        assert_eq!(
            outcomes(&db, &id),
            ["TransientFailure", "Delivered"],
            "{name}"
        );
        assert!(!last_error.is_empty(), "{name}");
        assert_eq!(sink.wait_for_messages(1, DEADLINE).await.len(), 1, "{name}");
    } else {
        assert_eq!(retries, 0, "{name}: a permanent failure is not retried");
        assert_eq!(outcomes(&db, &id), ["PermanentFailure"], "{name}");
        assert!(sink.messages().is_empty(), "{name}");
    }
    central.stop().await;
}

#[tokio::test]
async fn smtp_4xx_and_dropped_connections_retry_then_deliver_and_5xx_park() {
    // The cases run side by side, each with its own sink and central. A LocalSet because the
    // harness's waits hold a (single-threaded) SQLite connection.
    let local = tokio::task::LocalSet::new();
    let cases: Vec<_> = smtp_cases()
        .into_iter()
        .map(|case| local.spawn_local(run_smtp_case(case)))
        .collect();
    local
        .run_until(async {
            for case in cases {
                if let Err(e) = case.await {
                    std::panic::resume_unwind(e.into_panic());
                }
            }
        })
        .await;
}

/// The table above sees Retrying only in the history (the retry follows 300 ms later); with the
/// fault left on, the row is seen sitting in Retrying with the reply in LastError and a
/// NextAttemptAt.
#[tokio::test]
async fn a_4xx_row_is_retrying_with_the_reply_until_the_server_recovers() {
    let dir = tempfile::tempdir().unwrap();
    let sink = smtp_sink().await;
    sink.set_behaviour(Behaviour::RejectRcpt {
        code: 452,
        text: "4.3.1 insufficient system storage".into(),
    });
    let central = Central::start(central_config(dir.path(), Some(sink.addr()))).await;
    let id = send(&central, submit("Tank 4 high level", "Level 97%")).await;

    let (_, retries, error) = wait_for_status(&central.db, &id, "Retrying").await;
    assert!(retries >= 1);
    let error = error.unwrap();
    assert!(
        error.contains("452") && error.contains("insufficient system storage"),
        "{error}"
    );
    let (last, next) = schedule(&central.db, &id);
    assert!(
        next.unwrap() > last.unwrap(),
        "Retrying has a NextAttemptAt"
    );

    sink.set_behaviour(Behaviour::Accept);
    let (_, _, error) = wait_for_status(&central.db, &id, "Delivered").await;
    assert!(
        error.unwrap().contains("452"),
        "the last failure stays visible"
    );
    assert_eq!(sink.wait_for_messages(1, DEADLINE).await.len(), 1);
    central.stop().await;
}

#[tokio::test]
async fn starttls_required_against_a_server_without_starttls_parks() {
    let dir = tempfile::tempdir().unwrap();
    let sink = smtp_sink().await;
    let mut config = central_config(dir.path(), Some(sink.addr()));
    config.smtp.as_mut().unwrap().tls = SmtpTls::StartTls;
    let central = Central::start(config).await;
    let id = send(&central, submit("Tank 4 high level", "Level 97%")).await;

    let (_, retries, error) = wait_for_status(&central.db, &id, "Parked").await;
    let error = error.unwrap();
    assert!(error.contains("STARTTLS"), "{error}");
    assert_eq!(retries, 0, "a server without STARTTLS will not grow it");
    assert_eq!(outcomes(&Db::open(&central.db), &id), ["PermanentFailure"]);
    assert!(
        sink.messages().is_empty(),
        "nothing may go out in clear text"
    );
    central.stop().await;
}

// ---- SMTP authentication ------------------------------------------------------------------

const OAUTH_CLIENT: &str = "outbox-client";
const OAUTH_SECRET: &str = "client-secret-s3cr3t-value";
const OAUTH_SCOPE: &str = "https://mail.example.test/.default";

/// Central's config for XOAUTH2 through `oauth`, presenting `client_secret`.
fn xoauth2_config(
    dir: &Path,
    sink: &SmtpSink,
    oauth: &OAuthServer,
    client_secret: &str,
) -> CentralConfig {
    let mut config = central_config(dir, Some(sink.addr()));
    let smtp = config.smtp.as_mut().unwrap();
    smtp.username = Some(SMTP_USER.into());
    smtp.oauth = Some(OAuthConfig {
        token_url: oauth.url(),
        client_id: OAUTH_CLIENT.into(),
        client_secret: client_secret.into(),
        scope: OAUTH_SCOPE.into(),
    });
    config
}

/// Serves a new sink on `addr` (a relay restart: same address, new process state).
async fn restart_sink(addr: std::net::SocketAddr, options: SinkOptions) -> SmtpSink {
    // The old listener closes when its task is dropped, which the runtime does shortly after
    // `stop`; until then the bind is refused.
    let listener = eventually(&format!("{addr} can be bound again"), || async move {
        TcpListener::bind(addr).await.ok()
    })
    .await;
    SmtpSink::serve_with(listener, options)
}

#[tokio::test]
async fn xoauth2_caches_one_token_and_fetches_a_new_one_after_revocation() {
    let dir = tempfile::tempdir().unwrap();
    let oauth = OAuthServer::start(OAUTH_CLIENT, OAUTH_SECRET, 3600)
        .await
        .unwrap();
    let options = SinkOptions {
        auth: Some(AuthRequirement::xoauth2(SMTP_USER, oauth.token_check())),
    };
    let sink = SmtpSink::start_with(options.clone()).await.unwrap();
    let central = Central::start(xoauth2_config(dir.path(), &sink, &oauth, OAUTH_SECRET)).await;

    let ids = send_many(&central, 5).await;
    for id in &ids {
        let (_, retries, _) = wait_for_status(&central.db, id, "Delivered").await;
        assert_eq!(retries, 0);
    }
    let mails = sink.wait_for_messages(5, DEADLINE).await;
    assert_eq!(mails.len(), 5);
    assert!(
        mails
            .iter()
            .all(|m| m.authenticated_as.as_deref() == Some(SMTP_USER)),
        "{mails:?}"
    );
    assert_eq!(oauth.request_count(), 1, "one token serves every delivery");
    let request = &oauth.requests()[0];
    assert_eq!(request.status, 200);
    assert_eq!(request.client_id.as_deref(), Some(OAUTH_CLIENT));
    assert_eq!(request.grant_type.as_deref(), Some("client_credentials"));
    assert_eq!(request.scope.as_deref(), Some(OAUTH_SCOPE));
    assert_eq!(sink.auth_failures(), 0);

    // The provider revokes the token. A session already authenticated with it stays usable (as
    // on real servers), so restart the relay: the next session must authenticate afresh, the
    // cached token is refused, and central must fetch a new one by itself.
    oauth.revoke_tokens();
    let addr = sink.addr();
    sink.stop();
    eventually("the old relay's sessions are closed", || {
        let open = sink.active_sessions();
        async move { (open == 0).then_some(()) }
    })
    .await;
    drop(sink);
    let sink = restart_sink(addr, options).await;

    let id = send(&central, submit("Tank 5 high level", "Level 98%")).await;
    wait_for_status(&central.db, &id, "Delivered").await;
    assert_eq!(oauth.request_count(), 2, "a refused token is fetched anew");
    assert_eq!(oauth.tokens_issued().len(), 2);
    let mails = sink.wait_for_messages(1, DEADLINE).await;
    assert_eq!(mails.len(), 1);
    assert_eq!(mails[0].authenticated_as.as_deref(), Some(SMTP_USER));
    assert!(mails[0].message_id().unwrap().contains(&id));
    assert_eq!(sink.auth_failures(), 1, "the revoked token was tried once");
    let history = outcomes(&Db::open(&central.db), &id);
    assert_eq!(history.last().map(String::as_str), Some("Delivered"));
    assert!(
        history[..history.len() - 1]
            .iter()
            .all(|o| o == "TransientFailure"),
        "{history:?}"
    );
    central.stop().await;
}

#[tokio::test]
async fn xoauth2_with_a_wrong_client_secret_parks_naming_the_token_request() {
    let dir = tempfile::tempdir().unwrap();
    let oauth = OAuthServer::start(OAUTH_CLIENT, OAUTH_SECRET, 3600)
        .await
        .unwrap();
    let sink = SmtpSink::start_with(SinkOptions {
        auth: Some(AuthRequirement::xoauth2(SMTP_USER, oauth.token_check())),
    })
    .await
    .unwrap();
    let wrong = "not-the-client-secret-4711";
    let central = Central::start(xoauth2_config(dir.path(), &sink, &oauth, wrong)).await;
    let id = send(&central, submit("Tank 4 high level", "Level 97%")).await;

    let (_, retries, error) = wait_for_status(&central.db, &id, "Parked").await;
    let error = error.unwrap();
    assert!(
        error.contains("OAuth2 token request") && error.contains("401"),
        "{error}"
    );
    assert_eq!(retries, 0, "a refused client is not retried");
    let attempts = Db::open(&central.db).attempts(&id);
    let texts = std::iter::once(error.as_str())
        .chain(attempts.iter().filter_map(|a| a.2.as_deref()))
        .collect::<Vec<_>>();
    for text in texts {
        assert!(!text.contains(wrong), "secret leaked: {text}");
        assert!(!text.contains(OAUTH_SECRET), "secret leaked: {text}");
    }
    assert_eq!(oauth.request_count(), 1);
    assert_eq!(oauth.requests()[0].status, 401);
    assert_eq!(sink.auth_failures(), 0, "no AUTH without a token");
    assert!(sink.messages().is_empty());
    central.stop().await;
}

/// Only the server refusing the token while authenticating (535, or Gmail's error challenge)
/// sends central for a new token. A 5xx later in the transaction is the relay refusing the
/// message, whatever its text says: it parks at once, and the good token is kept.
#[tokio::test]
async fn xoauth2_a_5xx_after_authentication_parks_even_when_it_mentions_authentication() {
    let dir = tempfile::tempdir().unwrap();
    let oauth = OAuthServer::start(OAUTH_CLIENT, OAUTH_SECRET, 3600)
        .await
        .unwrap();
    let sink = SmtpSink::start_with(SinkOptions {
        auth: Some(AuthRequirement::xoauth2(SMTP_USER, oauth.token_check())),
    })
    .await
    .unwrap();
    let reply = "5.7.1 Message rejected: sender authentication failed (DMARC policy; see 535 FAQ)";
    sink.set_behaviour(Behaviour::RejectData {
        code: 554,
        text: reply.into(),
    });
    let central = Central::start(xoauth2_config(dir.path(), &sink, &oauth, OAUTH_SECRET)).await;
    let id = send(&central, submit("Tank 4 high level", "Level 97%")).await;

    let (_, retries, error) = wait_for_status(&central.db, &id, "Parked").await;
    assert_eq!(retries, 0, "a refused message is not retried");
    let error = error.unwrap();
    assert!(error.contains("554") && error.contains("DMARC"), "{error}");
    assert_eq!(outcomes(&Db::open(&central.db), &id), ["PermanentFailure"]);
    assert_eq!(oauth.request_count(), 1, "the token was not thrown away");
    assert_eq!(sink.auth_failures(), 0);
    central.stop().await;
}

const SMTP_PASSWORD: &str = "correct-horse-battery-staple";

/// A sink requiring PLAIN/LOGIN as [`SMTP_USER`], and central presenting `password`.
async fn password_setup(dir: &Path, password: &str) -> (SmtpSink, Central) {
    let sink = SmtpSink::start_with(SinkOptions {
        auth: Some(AuthRequirement::password(SMTP_USER, SMTP_PASSWORD)),
    })
    .await
    .unwrap();
    let mut config = central_config(dir, Some(sink.addr()));
    let smtp = config.smtp.as_mut().unwrap();
    smtp.username = Some(SMTP_USER.into());
    smtp.password = Some(password.into());
    let central = Central::start(config).await;
    (sink, central)
}

#[tokio::test]
async fn password_auth_delivers_as_the_configured_user() {
    let dir = tempfile::tempdir().unwrap();
    let (sink, central) = password_setup(dir.path(), SMTP_PASSWORD).await;
    let id = send(&central, submit("Tank 4 high level", "Level 97%")).await;

    let (_, retries, error) = wait_for_status(&central.db, &id, "Delivered").await;
    assert_eq!((retries, error), (0, None));
    let mails = sink.wait_for_messages(1, DEADLINE).await;
    assert_eq!(mails.len(), 1);
    assert_eq!(mails[0].authenticated_as.as_deref(), Some(SMTP_USER));
    assert_eq!(sink.auth_failures(), 0);
    central.stop().await;
}

#[tokio::test]
async fn a_wrong_password_parks_with_535_and_never_shows_the_password() {
    let dir = tempfile::tempdir().unwrap();
    let wrong = "tr0ub4dor-and-3";
    let (sink, central) = password_setup(dir.path(), wrong).await;
    let id = send(&central, submit("Tank 4 high level", "Level 97%")).await;

    let (_, retries, error) = wait_for_status(&central.db, &id, "Parked").await;
    let error = error.unwrap();
    assert!(error.contains("535"), "{error}");
    assert!(!error.contains(wrong), "password leaked: {error}");
    assert!(!error.contains(SMTP_PASSWORD), "password leaked: {error}");
    assert_eq!(retries, 0);
    let attempts = Db::open(&central.db).attempts(&id);
    assert_eq!(attempts.len(), 1);
    assert!(!attempts[0].2.as_deref().unwrap_or("").contains(wrong));
    assert_eq!(sink.auth_failures(), 1);
    assert!(sink.messages().is_empty());
    central.stop().await;
}

// ---- SMTP pacing --------------------------------------------------------------------------

#[tokio::test]
async fn no_more_smtp_sessions_than_max_concurrent_connections() {
    let dir = tempfile::tempdir().unwrap();
    let sink = smtp_sink().await;
    // Slow replies make sessions overlap, so a limit that is not enforced shows.
    sink.set_reply_delay(Duration::from_millis(15));
    let mut config = central_config(dir.path(), Some(sink.addr()));
    config.smtp.as_mut().unwrap().max_concurrent_connections = 3;
    let central = Central::start(config).await;

    send_many(&central, 30).await;
    wait_for_delivered(&central.db, 30).await;
    assert_eq!(sink.wait_for_messages(30, DEADLINE).await.len(), 30);
    let most = sink.max_concurrent_sessions();
    assert!(most <= 3, "{most} sessions were open at once");
    assert!(
        most >= 2,
        "deliveries never overlapped ({most}): the test proves nothing"
    );
    central.stop().await;
}

#[tokio::test]
async fn the_rate_limit_keeps_every_window_within_burst_plus_rate() {
    const RATE: f64 = 20.0;
    const BURST: u32 = 5;
    const N: usize = 60;
    let dir = tempfile::tempdir().unwrap();
    let sink = smtp_sink().await;
    let mut config = central_config(dir.path(), Some(sink.addr()));
    let smtp = config.smtp.as_mut().unwrap();
    smtp.rate_limit_per_second = Some(RATE);
    smtp.rate_limit_burst = Some(BURST);
    let central = Central::start(config).await;

    send_many(&central, N).await;
    wait_for_delivered(&central.db, N as i64).await;
    assert_eq!(sink.wait_for_messages(N, DEADLINE).await.len(), N);

    // StartedAt is stamped when the row is claimed, which is when the limiter hands out a
    // token. In every window [t_i, t_j] of attempt starts, at most BURST + RATE * (t_j - t_i)
    // may start (+1 for millisecond rounding). An upper bound only: a slow machine cannot
    // break it.
    let starts = attempt_starts(&central.db);
    assert_eq!(starts.len(), N, "no retries were needed");
    for i in 0..N {
        for j in i..N {
            let started = (j - i + 1) as f64;
            let window = (starts[j] - starts[i]) as f64 / 1000.0;
            let allowed = f64::from(BURST) + RATE * window + 1.0;
            assert!(
                started <= allowed,
                "{started} deliveries started within {window:.3}s, at most {allowed:.1} allowed"
            );
        }
    }
    // The limit is what paced them: unthrottled, 60 local deliveries take far less.
    let span = (starts[N - 1] - starts[0]) as f64 / 1000.0;
    assert!(
        span >= (N as f64 - f64::from(BURST) - 1.0) / RATE,
        "{span}s"
    );
    central.stop().await;
}

// ---- Webhooks -----------------------------------------------------------------------------

/// Central with webhook lists and quick, fixed retries; a POST times out after 500 ms.
fn webhook_config(dir: &Path, lists: Vec<ListConfig>) -> CentralConfig {
    let mut config = central_config(dir, None);
    config.webhook = Some(WebhookConfig {
        timeout: Duration::from_millis(500),
        max_retries: 5,
        retry_delay: Duration::from_millis(200),
        backoff: BackoffKind::Fixed,
        ..WebhookConfig::default()
    });
    config.lists.extend(lists);
    config
}

/// A signed webhook list.
fn hook_list(name: &str, endpoints: Vec<String>, format: WebhookFormatKind) -> ListConfig {
    ListConfig {
        webhook_secret: Some(HOOK_SECRET.into()),
        ..ListConfig::webhook(name, endpoints, format)
    }
}

/// A webhook notification to `list`, as a site would submit it.
fn hook_submit(list: &str, subject: &str, body: &str) -> v1::NotificationSubmit {
    v1::NotificationSubmit {
        r#type: v1::NotificationType::Webhook.into(),
        list_name: list.into(),
        ..submit(subject, body)
    }
}

#[tokio::test]
async fn a_2xx_webhook_delivers_a_signed_generic_document_with_an_idempotency_key() {
    let dir = tempfile::tempdir().unwrap();
    let server = WebhookServer::start().await.unwrap();
    let lists = vec![hook_list(
        "hooks",
        vec![server.url("/hook")],
        WebhookFormatKind::Generic,
    )];
    let central = Central::start(webhook_config(dir.path(), lists)).await;
    let msg = v1::NotificationSubmit {
        type_data: r#"{"tank":4,"level":97}"#.into(),
        ..hook_submit("hooks", "Tank 4 high level", "Level 97%")
    };
    let id = send(&central, msg).await;

    let (_, retries, error) = wait_for_status(&central.db, &id, "Delivered").await;
    assert_eq!((retries, error), (0, None));
    let requests = server.wait_for_requests(1, DEADLINE).await;
    assert_eq!(requests.len(), 1);
    let request = &requests[0];
    assert_eq!(request.path, "/hook");
    assert_eq!(request.idempotency_key(), Some(id.as_str()));
    assert_eq!(request.header("content-type"), Some("application/json"));
    // X-Outbox-Signature: t=<unix seconds>,v1=<HMAC of "<t>.<id>.<body>">, checked as the
    // docs/delivery.md tells receivers to.
    let signature = request.header("x-outbox-signature").unwrap();
    let now = unix_now();
    let signed_at = verify_signature(HOOK_SECRET.as_bytes(), &id, &request.body, signature, now)
        .unwrap_or_else(|e| panic!("{signature}: {e:?}"));
    assert!(request.signature_valid(HOOK_SECRET.as_bytes()));
    assert_eq!(
        verify_signature(
            b"some-other-secret-0000",
            &id,
            &request.body,
            signature,
            now
        ),
        Err(SignatureRejection::Mismatch),
        "the signature depends on the secret"
    );
    let other_id = uuid::Uuid::now_v7().to_string();
    assert_eq!(
        verify_signature(
            HOOK_SECRET.as_bytes(),
            &other_id,
            &request.body,
            signature,
            now
        ),
        Err(SignatureRejection::Mismatch),
        "the signature covers the id"
    );
    let later = signed_at + SIGNATURE_TOLERANCE.as_secs() as i64 + 1;
    assert!(
        matches!(
            verify_signature(HOOK_SECRET.as_bytes(), &id, &request.body, signature, later),
            Err(SignatureRejection::Stale { .. })
        ),
        "a replay after the tolerance is refused"
    );

    let doc = request.json().unwrap();
    assert_eq!(doc["notification_id"], id.as_str());
    assert_eq!(doc["type"], "webhook");
    assert_eq!(doc["list_name"], "hooks");
    assert_eq!(doc["subject"], "Tank 4 high level");
    assert_eq!(doc["body"], "Level 97%");
    assert_eq!(
        doc["type_data"],
        serde_json::json!({"tank": 4, "level": 97})
    );
    assert_eq!(doc["source"]["site_id"], "site-a");
    assert_eq!(doc["source"]["instance_id"], "tank-farm-1");
    assert_eq!(doc["source"]["script"], "level_alarm.py");
    assert!(doc["source"]["site_enqueued_at"].is_string(), "{doc}");

    let db = Db::open(&central.db);
    assert_eq!(db.attempts(&id), vec![(1, "Delivered".to_string(), None)]);
    central.stop().await;
}

#[tokio::test]
async fn webhook_500_503_408_and_timeouts_retry_then_deliver() {
    let dir = tempfile::tempdir().unwrap();
    // One receiver per case, each failing its first request only.
    let cases = [
        ("500", Reply::status(500), "HTTP 500"),
        ("503", Reply::status(503), "HTTP 503"),
        ("408", Reply::status(408), "HTTP 408"),
        ("hang", Reply::hang(), "no complete response within 500ms"),
    ];
    let mut servers = Vec::new();
    let mut lists = Vec::new();
    for (name, reply, _) in &cases {
        let server = WebhookServer::start().await.unwrap();
        server.set_responses(vec![reply.clone()]);
        lists.push(hook_list(
            name,
            vec![server.url("/hook")],
            WebhookFormatKind::Generic,
        ));
        servers.push(server);
    }
    let central = Central::start(webhook_config(dir.path(), lists)).await;
    let mut ids = Vec::new();
    for (name, _, _) in &cases {
        ids.push(
            send(
                &central,
                hook_submit(name, "Tank 4 high level", "Level 97%"),
            )
            .await,
        );
    }

    let db = Db::open(&central.db);
    for (((name, _, expect), server), id) in cases.iter().zip(&servers).zip(&ids) {
        let (_, retries, error) = wait_for_status(&central.db, id, "Delivered").await;
        assert_eq!(retries, 1, "{name}");
        let error = error.unwrap();
        assert!(error.contains(expect), "{name}: {error}");
        assert!(
            error.contains(&server.url("/hook")),
            "{name} names the endpoint: {error}"
        );
        assert_eq!(
            outcomes(&db, id),
            ["TransientFailure", "Delivered"],
            "{name}"
        );
        let requests = server.requests();
        assert_eq!(requests.len(), 2, "{name}");
        assert!(
            requests
                .iter()
                .all(|r| r.idempotency_key() == Some(id.as_str())),
            "{name}: a retry carries the same Idempotency-Key"
        );
    }
    central.stop().await;
}

#[tokio::test]
async fn webhook_429_with_retry_after_is_not_retried_sooner() {
    let dir = tempfile::tempdir().unwrap();
    let server = WebhookServer::start().await.unwrap();
    server.set_responses(vec![Reply::status(429).with_retry_after("2")]);
    let lists = vec![hook_list(
        "hooks",
        vec![server.url("/hook")],
        WebhookFormatKind::Generic,
    )];
    let central = Central::start(webhook_config(dir.path(), lists)).await;
    let id = send(
        &central,
        hook_submit("hooks", "Tank 4 high level", "Level 97%"),
    )
    .await;

    let (_, retries, error) = wait_for_status(&central.db, &id, "Retrying").await;
    assert_eq!(retries, 1);
    assert!(error.unwrap().contains("HTTP 429"));
    // retry_delay is 200 ms; the server's 2 s wins.
    let (last, next) = schedule(&central.db, &id);
    let wait = next.unwrap() - last.unwrap();
    assert!(
        wait >= 2000,
        "NextAttemptAt only {wait} ms after the attempt"
    );

    wait_for_status(&central.db, &id, "Delivered").await;
    let requests = server.requests();
    assert_eq!(requests.len(), 2);
    assert_eq!(requests[0].answered, 429);
    let gap = requests[1].received_at - requests[0].received_at;
    // Tolerance for millisecond rounding of NextAttemptAt and two clocks (Instant vs UTC).
    assert!(
        gap >= Duration::from_millis(1950),
        "retried after {gap:?}, Retry-After said 2 s"
    );
    central.stop().await;
}

#[tokio::test]
async fn webhook_404_and_301_park_with_the_status() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [(404, "HTTP 404"), (301, "HTTP 301")];
    let mut servers = Vec::new();
    let mut lists = Vec::new();
    for (status, _) in cases {
        let server = WebhookServer::start().await.unwrap();
        server.set_default_reply(Reply::status(status));
        lists.push(hook_list(
            &format!("hooks-{status}"),
            vec![server.url("/hook")],
            WebhookFormatKind::Generic,
        ));
        servers.push(server);
    }
    let central = Central::start(webhook_config(dir.path(), lists)).await;
    let db = Db::open(&central.db);
    for ((status, expect), server) in cases.iter().zip(&servers) {
        let list = format!("hooks-{status}");
        let id = send(
            &central,
            hook_submit(&list, "Tank 4 high level", "Level 97%"),
        )
        .await;
        let (_, retries, error) = wait_for_status(&central.db, &id, "Parked").await;
        let error = error.unwrap();
        assert!(error.contains(expect), "{status}: {error}");
        assert_eq!(retries, 0, "{status} is not retried");
        assert_eq!(outcomes(&db, &id), ["PermanentFailure"], "{status}");
        assert_eq!(server.requests().len(), 1, "{status}");
    }
    central.stop().await;
}

#[tokio::test]
async fn teams_and_slack_webhooks_have_their_shapes() {
    let dir = tempfile::tempdir().unwrap();
    let server = WebhookServer::start().await.unwrap();
    let lists = vec![
        ListConfig::webhook(
            "teams",
            vec![server.url("/teams")],
            WebhookFormatKind::Teams,
        ),
        ListConfig::webhook(
            "slack",
            vec![server.url("/slack")],
            WebhookFormatKind::Slack,
        ),
    ];
    let central = Central::start(webhook_config(dir.path(), lists)).await;
    let subject = "Tank 4 <high> & rising";
    let teams = send(&central, hook_submit("teams", subject, "Level 97%")).await;
    let slack = send(&central, hook_submit("slack", subject, "Level 97%")).await;
    wait_for_status(&central.db, &teams, "Delivered").await;
    wait_for_status(&central.db, &slack, "Delivered").await;

    let requests = server.wait_for_requests(2, DEADLINE).await;
    let on = |path: &str| {
        requests
            .iter()
            .find(|r| r.path == path)
            .unwrap_or_else(|| panic!("nothing posted to {path}"))
    };
    let card = on("/teams").json().unwrap();
    assert_eq!(card["@type"], "MessageCard");
    assert_eq!(card["@context"], "https://schema.org/extensions");
    assert_eq!(card["title"], subject);
    assert_eq!(card["summary"], subject);
    assert_eq!(card["text"], "Level 97%");
    assert_eq!(on("/teams").idempotency_key(), Some(teams.as_str()));

    let message = on("/slack").json().unwrap();
    assert_eq!(
        message,
        serde_json::json!({"text": "*Tank 4 &lt;high&gt; &amp; rising*\nLevel 97%"})
    );
    assert_eq!(on("/slack").idempotency_key(), Some(slack.as_str()));
    // Lists without a secret are not signed.
    assert!(
        requests
            .iter()
            .all(|r| r.header("x-outbox-signature").is_none())
    );
    central.stop().await;
}

#[tokio::test]
async fn a_list_with_one_failing_endpoint_is_not_delivered() {
    let dir = tempfile::tempdir().unwrap();
    let good = WebhookServer::start().await.unwrap();
    let bad = WebhookServer::start().await.unwrap();
    bad.set_default_reply(Reply::status(500));
    let lists = vec![hook_list(
        "hooks",
        vec![good.url("/hook"), bad.url("/hook")],
        WebhookFormatKind::Generic,
    )];
    let mut config = webhook_config(dir.path(), lists);
    config.webhook.as_mut().unwrap().max_retries = 3;
    let central = Central::start(config).await;
    let id = send(
        &central,
        hook_submit("hooks", "Tank 4 high level", "Level 97%"),
    )
    .await;

    let (_, retries, error) = wait_for_status(&central.db, &id, "Parked").await;
    assert_eq!(retries, 3);
    let error = error.unwrap();
    assert!(
        error.starts_with("retries exhausted (3 retries, 4 attempts)"),
        "{error}"
    );
    assert!(
        error.contains("1 of 2 webhook endpoints failed")
            && error.contains(&bad.url("/hook"))
            && error.contains("HTTP 500"),
        "{error}"
    );
    assert!(!error.contains(&good.url("/hook")), "{error}");
    let db = Db::open(&central.db);
    // max_retries = 3: the first attempt and three retries.
    assert_eq!(outcomes(&db, &id), ["TransientFailure"; 4]);
    // Every attempt posted to both; the good receiver can drop the repeats by key.
    for server in [&good, &bad] {
        let requests = server.requests();
        assert_eq!(requests.len(), 4);
        assert!(
            requests
                .iter()
                .all(|r| r.idempotency_key() == Some(id.as_str()))
        );
    }
    central.stop().await;
}
