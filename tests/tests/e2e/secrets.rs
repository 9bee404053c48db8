//! Secrets at rest, end to end: the SMTP password, the OAuth client secret and webhook signing
//! keys, set from the config file and through the admin API, are unreadable in the database
//! (the SQLite file and its WAL, byte for byte), never come back from the admin API, and still
//! authenticate every delivery. A restart with the wrong key stops with an error naming the key
//! id the secrets need; with the old key kept as previous, every secret (a clear-text one an
//! older release left too) is re-encrypted with the new key. An admin, who cannot read a stored
//! secret, cannot have it sent anywhere else either: moving the relay or the token endpoint needs
//! the secret again, and a password crosses the network in clear only to this host.

use std::path::Path;
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use central_outbox::config::{Config as CentralConfig, ListConfig, OAuthConfig, WebhookFormatKind};
use outbox_proto::time::to_duration;
use outbox_proto::v1;
use outbox_tests::oauth_server::OAuthServer;
use outbox_tests::smtp_sink::{AuthRequirement, SinkOptions, SmtpSink};
use outbox_tests::webhook_server::WebhookServer;
use sha2::{Digest, Sha256};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tonic::Code;

use crate::harness::{
    Central, CentralDatabase, DEADLINE, Db, central_config, submit, wait_for_status,
};

/// The key `central_config` configures (base64 of "outbox-test-secrets-key-32-bytes").
const KEY_A: &str = "b3V0Ym94LXRlc3Qtc2VjcmV0cy1rZXktMzItYnl0ZXM=";
/// The key rotated to (base64 of "outbox-rotated-secrets-key-32byt").
const KEY_B: &str = "b3V0Ym94LXJvdGF0ZWQtc2VjcmV0cy1rZXktMzJieXQ=";

const SMTP_USER: &str = "outbox@plant.example.test";
const OAUTH_CLIENT: &str = "outbox-client";
/// Every secret of these tests: distinctive, so a byte search cannot match by chance.
const OAUTH_SECRET_FILE: &str = "oauth-client-secret-from-the-file-7Q2x";
const PASSWORD_API: &str = "smtp-password-from-the-admin-api-9Kd3";
const PASSWORD_FILE: &str = "smtp-password-from-the-file-4Jw8";
const HOOK_SECRET_FILE: &str = "webhook-secret-from-the-file-5Tz1";
const HOOK_SECRET_API: &str = "webhook-secret-from-the-admin-api-2Vb6";
const HOOK_SECRET_LEGACY: &str = "webhook-secret-left-in-clear-8Hn4";

/// A key's id as docs/security.md says to compute it: the first 4 bytes of the SHA-256 of the key,
/// in hex.
fn key_id(key: &str) -> String {
    let digest = Sha256::digest(BASE64.decode(key).unwrap());
    digest[..4].iter().map(|b| format!("{b:02x}")).collect()
}

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

fn hook_submit(list: &str, subject: &str) -> v1::NotificationSubmit {
    v1::NotificationSubmit {
        r#type: v1::NotificationType::Webhook.into(),
        list_name: list.into(),
        ..submit(subject, "Level 97%")
    }
}

fn hook_list(name: &str, endpoint: String, secret: &str) -> ListConfig {
    ListConfig {
        webhook_secret: Some(secret.into()),
        ..ListConfig::webhook(name, vec![endpoint], WebhookFormatKind::Generic)
    }
}

/// Sends a webhook notification to `list` and checks that it arrived at `path` signed with
/// `secret`.
async fn assert_signed_delivery(
    central: &Central,
    server: &WebhookServer,
    list: &str,
    path: &str,
    secret: &str,
) {
    let id = send(central, hook_submit(list, &format!("to {list}"))).await;
    wait_for_status(&central.db, &id, "Delivered").await;
    // Recorded before it was answered, so before the row could be Delivered.
    let requests = server.requests();
    let request = requests
        .iter()
        .find(|r| r.idempotency_key() == Some(id.as_str()))
        .unwrap_or_else(|| panic!("no request for {id}"));
    assert_eq!(request.path, path);
    assert!(
        request.signature_valid(secret.as_bytes()),
        "{list}: not signed with its secret: {:?}",
        request.headers
    );
}

/// Sends an email notification and checks that the sink received it from an authenticated
/// session.
async fn assert_authenticated_delivery(central: &Central, sink: &SmtpSink, subject: &str) {
    let id = send(central, submit(subject, "Level 97%")).await;
    wait_for_status(&central.db, &id, "Delivered").await;
    let mails = sink.wait_for_messages(1, DEADLINE).await;
    let mail = mails
        .iter()
        .find(|m| m.message_id().is_some_and(|mid| mid.contains(&id)))
        .unwrap_or_else(|| panic!("no mail for {id}"));
    assert_eq!(mail.authenticated_as.as_deref(), Some(SMTP_USER));
}

/// Every stored secret column, as stored (list secrets by list name, then the SMTP password
/// and OAuth client secret).
fn stored_secrets(db: &Db) -> Vec<(String, String)> {
    let mut stored: Vec<(String, String)> = db.rows(
        "SELECT Name, WebhookSecret FROM NotificationLists WHERE WebhookSecret IS NOT NULL
         ORDER BY Name",
        |r| Ok((r.get(0)?, r.get(1)?)),
    );
    for (column, label) in [
        ("Password", "smtp password"),
        ("OAuthClientSecret", "smtp oauth client secret"),
    ] {
        let values: Vec<Option<String>> = db.rows(
            &format!("SELECT {column} FROM ChannelConfig WHERE Channel = 'email'"),
            |r| r.get(0),
        );
        stored.extend(values.into_iter().flatten().map(|v| (label.to_owned(), v)));
    }
    stored
}

/// Asserts that every stored secret is sealed with `key` and holds none of `secrets` in clear.
fn assert_sealed_with(db: &Db, key: &str, secrets: &[&str]) -> usize {
    let prefix = format!("enc:v1:{}:", key_id(key));
    let stored = stored_secrets(db);
    for (place, value) in &stored {
        assert!(value.starts_with(&prefix), "{place}: {value}");
        for secret in secrets {
            assert!(!value.contains(secret), "{place} holds {secret} in clear");
        }
    }
    stored.len()
}

/// On SQLite: asserts that no secret appears anywhere in the database file or its WAL, byte for
/// byte (freed pages and old WAL frames included). On MS SQL there is no file to read; the
/// columns are checked by [`assert_sealed_with`].
fn assert_not_in_database_files(db_path: &Path, secrets: &[&str]) {
    if !matches!(Db::open(db_path), Db::Sqlite(_)) {
        return;
    }
    let mut read = 0;
    for suffix in ["", "-wal", "-shm"] {
        let path = format!("{}{suffix}", db_path.display());
        let Ok(bytes) = std::fs::read(&path) else {
            continue; // No WAL after a clean close.
        };
        read += bytes.len();
        for secret in secrets {
            assert!(
                !bytes.windows(secret.len()).any(|w| w == secret.as_bytes()),
                "{path} holds {secret:?} in clear"
            );
        }
    }
    assert!(read > 0, "no database file at {}", db_path.display());
}

/// Asserts that a debug print of an admin API answer holds none of `secrets`.
fn assert_not_returned(what: &str, answer: &impl std::fmt::Debug, secrets: &[&str]) {
    let shown = format!("{answer:?}");
    for secret in secrets {
        assert!(!shown.contains(secret), "{what} returned {secret}: {shown}");
    }
}

#[tokio::test]
async fn secrets_are_unreadable_in_the_database_never_returned_and_still_authenticate() {
    let dir = tempfile::tempdir().unwrap();
    let all = [
        OAUTH_SECRET_FILE,
        PASSWORD_API,
        HOOK_SECRET_FILE,
        HOOK_SECRET_API,
    ];
    let oauth = OAuthServer::start(OAUTH_CLIENT, OAUTH_SECRET_FILE, 3600)
        .await
        .unwrap();
    let xoauth2_sink = SmtpSink::start_with(SinkOptions {
        auth: Some(AuthRequirement::xoauth2(SMTP_USER, oauth.token_check())),
    })
    .await
    .unwrap();
    let hooks = WebhookServer::start().await.unwrap();

    // From the config file: XOAUTH2 with a client secret, and a signed webhook list.
    let mut config = central_config(dir.path(), Some(xoauth2_sink.addr()));
    let smtp = config.smtp.as_mut().unwrap();
    smtp.username = Some(SMTP_USER.into());
    smtp.oauth = Some(OAuthConfig {
        token_url: oauth.url(),
        client_id: OAUTH_CLIENT.into(),
        client_secret: OAUTH_SECRET_FILE.into(),
        scope: String::new(),
    });
    config.lists.push(hook_list(
        "hooks-file",
        hooks.url("/file"),
        HOOK_SECRET_FILE,
    ));
    let central = Central::start(config).await;
    assert_authenticated_delivery(&central, &xoauth2_sink, "by XOAUTH2").await;
    assert_eq!(oauth.request_count(), 1);
    assert_signed_delivery(&central, &hooks, "hooks-file", "/file", HOOK_SECRET_FILE).await;

    // Through the admin API: a signed webhook list and SMTP with a password.
    let mut admin = central.outbox().await;
    let list = admin
        .upsert_notification_list(v1::UpsertNotificationListRequest {
            list: Some(v1::NotificationList {
                name: "hooks-api".into(),
                r#type: v1::NotificationType::Webhook.into(),
                endpoints: vec![hooks.url("/api")],
                webhook_secret: Some(HOOK_SECRET_API.into()),
                ..Default::default()
            }),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(list.webhook_secret_set);
    assert_not_returned("UpsertNotificationList", &list, &all);
    let password_sink = SmtpSink::start_with(SinkOptions {
        auth: Some(AuthRequirement::password(SMTP_USER, PASSWORD_API)),
    })
    .await
    .unwrap();
    let smtp = admin
        .upsert_smtp_config(v1::UpsertSmtpConfigRequest {
            host: password_sink.addr().ip().to_string(),
            port: u32::from(password_sink.addr().port()),
            tls_mode: v1::SmtpTlsMode::None.into(),
            from_address: SMTP_USER.into(),
            auth_mechanism: v1::SmtpAuthMechanism::Password.into(),
            username: SMTP_USER.into(),
            password: Some(PASSWORD_API.into()),
            max_retries: 5,
            retry_delay: Some(to_duration(Duration::from_millis(300))),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(smtp.password_set);
    assert_not_returned("UpsertSmtpConfig", &smtp, &all);
    assert_authenticated_delivery(&central, &password_sink, "by password").await;
    assert_signed_delivery(&central, &hooks, "hooks-api", "/api", HOOK_SECRET_API).await;

    // Reads never return a secret either.
    let shown = admin
        .get_smtp_config(v1::GetSmtpConfigRequest {})
        .await
        .unwrap()
        .into_inner();
    assert!(shown.password_set);
    assert_not_returned("GetSmtpConfig", &shown, &all);
    let lists = admin
        .list_notification_lists(v1::ListNotificationListsRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        lists
            .lists
            .iter()
            .filter(|l| l.webhook_secret_set && l.webhook_secret.is_none())
            .count(),
        2
    );
    assert_not_returned("ListNotificationLists", &lists, &all);
    let one = admin
        .get_notification_list(v1::GetNotificationListRequest {
            name: "hooks-file".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_not_returned("GetNotificationList", &one, &all);

    // At rest: sealed with the configured key, and nowhere in the files in clear, not even in
    // the pages and WAL frames the replaced OAuth secret was written to.
    let db = Db::open(&central.db);
    assert_eq!(assert_sealed_with(&db, KEY_A, &all), 3);
    drop(db);
    assert_not_in_database_files(&central.db, &all);
    let db_path = central.db.clone();
    central.stop().await;
    assert_not_in_database_files(&db_path, &all);
}

/// Central on `dir`'s database with these keys and nothing from the file but the email list, so
/// every secret it uses comes from the database.
fn restart_config(dir: &Path, key: &str, previous: &[&str]) -> CentralConfig {
    let mut config = central_config(dir, None);
    config.secrets.key = Some(key.into());
    config.secrets.previous_keys = previous.iter().map(|k| (*k).to_owned()).collect();
    config
}

#[tokio::test]
async fn a_wrong_key_stops_start_up_naming_the_key_id_and_rotation_reseals_every_secret() {
    let dir = tempfile::tempdir().unwrap();
    let all = [PASSWORD_FILE, HOOK_SECRET_FILE, HOOK_SECRET_LEGACY];
    let sink = SmtpSink::start_with(SinkOptions {
        auth: Some(AuthRequirement::password(SMTP_USER, PASSWORD_FILE)),
    })
    .await
    .unwrap();
    let hooks = WebhookServer::start().await.unwrap();

    // Key A: the password and two signed lists from the file.
    let mut config = central_config(dir.path(), Some(sink.addr()));
    let smtp = config.smtp.as_mut().unwrap();
    smtp.username = Some(SMTP_USER.into());
    smtp.password = Some(PASSWORD_FILE.into());
    config.lists.extend([
        hook_list("hooks", hooks.url("/hooks"), HOOK_SECRET_FILE),
        hook_list("legacy", hooks.url("/legacy"), HOOK_SECRET_FILE),
    ]);
    let central = Central::start(config).await;
    let db_path = central.db.clone();
    central.stop().await;
    // An older release stored secrets in clear: put one back that way.
    let db = Db::open(&db_path);
    let changed = db.execute(
        "UPDATE NotificationLists SET WebhookSecret = ?1 WHERE Name = 'legacy'",
        &[HOOK_SECRET_LEGACY],
    );
    assert_eq!(changed, 1);

    // Key B alone: the secrets sealed with A cannot be opened; start-up stops, naming A's id.
    let mut wrong = restart_config(dir.path(), KEY_B, &[]);
    let database = CentralDatabase::create(&db_path).await;
    wrong.database = database.url();
    let settings = wrong.validate().unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let run = central_outbox::run(settings, listener, CancellationToken::new());
    let err = tokio::time::timeout(DEADLINE, run)
        .await
        .expect("start-up with a wrong key must end")
        .expect_err("start-up with a wrong key must fail")
        .to_string();
    assert!(
        err.contains(&format!("key id {}", key_id(KEY_A))),
        "names the key id the secrets need: {err}"
    );
    assert!(
        err.contains(&key_id(KEY_B)),
        "names the configured key: {err}"
    );
    assert!(err.contains("previous_key_files"), "says what to do: {err}");
    for secret in all {
        assert!(!err.contains(secret), "{err}");
    }
    // Nothing was changed: still sealed with A, the clear one still in clear.
    let before: Vec<(String, String)> = stored_secrets(&db);
    assert_eq!(before.len(), 3);
    assert!(
        before
            .iter()
            .any(|(name, value)| name == "legacy" && value == HOOK_SECRET_LEGACY),
        "{before:?}"
    );

    // B current, A previous: every secret is re-encrypted with B, the clear one included, and
    // deliveries authenticate with them.
    let central = Central::start(restart_config(dir.path(), KEY_B, &[KEY_A])).await;
    assert_eq!(assert_sealed_with(&db, KEY_B, &all), 3);
    assert_authenticated_delivery(&central, &sink, "after rotation").await;
    assert_signed_delivery(&central, &hooks, "hooks", "/hooks", HOOK_SECRET_FILE).await;
    assert_signed_delivery(&central, &hooks, "legacy", "/legacy", HOOK_SECRET_LEGACY).await;
    central.stop().await;

    // A dropped: B alone reads everything.
    let central = Central::start(restart_config(dir.path(), KEY_B, &[])).await;
    assert_eq!(assert_sealed_with(&db, KEY_B, &all), 3);
    assert_authenticated_delivery(&central, &sink, "with the old key dropped").await;
    let mut admin = central.outbox().await;
    let shown = admin
        .get_smtp_config(v1::GetSmtpConfigRequest {})
        .await
        .unwrap()
        .into_inner();
    assert!(shown.password_set);
    central.stop().await;
    drop(db);
    assert_not_in_database_files(&db_path, &[PASSWORD_FILE, HOOK_SECRET_FILE]);
}

/// Without a `[secrets]` key a secret would be stored in clear, so central refuses to store one
/// and says how to configure the key; everything without a secret still works.
#[tokio::test]
async fn without_a_key_the_admin_api_refuses_to_store_a_secret() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = central_config(dir.path(), None);
    config.secrets.key = None;
    let central = Central::start(config).await;
    let mut admin = central.outbox().await;
    let hook = |secret: Option<&str>| v1::UpsertNotificationListRequest {
        list: Some(v1::NotificationList {
            name: "hooks".into(),
            r#type: v1::NotificationType::Webhook.into(),
            endpoints: vec!["https://hooks.plant.example.test/a".into()],
            webhook_secret: secret.map(Into::into),
            ..Default::default()
        }),
    };
    let refused = admin
        .upsert_notification_list(hook(Some(HOOK_SECRET_API)))
        .await
        .unwrap_err();
    assert_eq!(
        refused.code(),
        tonic::Code::FailedPrecondition,
        "{refused:?}"
    );
    assert!(refused.message().contains("[secrets]"), "{refused:?}");
    assert!(!refused.message().contains(HOOK_SECRET_API), "{refused:?}");
    let refused = admin
        .upsert_smtp_config(v1::UpsertSmtpConfigRequest {
            host: "relay.plant.example.test".into(),
            port: 587,
            tls_mode: v1::SmtpTlsMode::Starttls.into(),
            from_address: SMTP_USER.into(),
            username: SMTP_USER.into(),
            password: Some(PASSWORD_API.into()),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(
        refused.code(),
        tonic::Code::FailedPrecondition,
        "{refused:?}"
    );
    assert!(
        refused.message().contains("SMTP password") && refused.message().contains("[secrets]"),
        "{refused:?}"
    );
    // Nothing was stored, and a list without a secret is fine.
    let db = Db::open(&central.db);
    assert!(stored_secrets(&db).is_empty());
    let list = admin
        .upsert_notification_list(hook(None))
        .await
        .unwrap()
        .into_inner();
    assert!(!list.webhook_secret_set);
    central.stop().await;
}

/// The request an admin sends to store password AUTH to `relay` in clear (loopback), with
/// `password` (`None`: keep the stored one).
fn password_request(
    relay: std::net::SocketAddr,
    password: Option<&str>,
) -> v1::UpsertSmtpConfigRequest {
    v1::UpsertSmtpConfigRequest {
        host: relay.ip().to_string(),
        port: u32::from(relay.port()),
        tls_mode: v1::SmtpTlsMode::None.into(),
        from_address: SMTP_USER.into(),
        auth_mechanism: v1::SmtpAuthMechanism::Password.into(),
        username: SMTP_USER.into(),
        password: password.map(Into::into),
        max_retries: 5,
        retry_delay: Some(to_duration(Duration::from_millis(300))),
        ..Default::default()
    }
}

/// Asserts that `refused` is INVALID_ARGUMENT naming `field` first and saying `why`.
fn assert_refused(what: &str, refused: &tonic::Status, field: &str, why: &str) {
    assert_eq!(refused.code(), Code::InvalidArgument, "{what}: {refused:?}");
    assert!(
        refused.message().starts_with(&format!("{field}:")) && refused.message().contains(why),
        "{what}: {refused:?}"
    );
}

#[tokio::test]
async fn a_stored_password_is_sent_only_to_the_relay_it_was_given_for() {
    let dir = tempfile::tempdir().unwrap();
    let sink = SmtpSink::start_with(SinkOptions {
        auth: Some(AuthRequirement::password(SMTP_USER, PASSWORD_FILE)),
    })
    .await
    .unwrap();
    // A relay of the admin's choosing, which would learn the password if it were sent there.
    let elsewhere = SmtpSink::start_with(SinkOptions {
        auth: Some(AuthRequirement::password(SMTP_USER, PASSWORD_API)),
    })
    .await
    .unwrap();
    let mut config = central_config(dir.path(), Some(sink.addr()));
    let smtp = config.smtp.as_mut().unwrap();
    smtp.username = Some(SMTP_USER.into());
    smtp.password = Some(PASSWORD_FILE.into());
    let central = Central::start(config).await;
    let mut admin = central.outbox().await;
    let stored = admin
        .get_smtp_config(v1::GetSmtpConfigRequest {})
        .await
        .unwrap()
        .into_inner();

    // Host, port or TLS mode changed with the password left out: refused, naming the password.
    let keep = password_request(sink.addr(), None);
    let moves = [
        (
            "another port",
            v1::UpsertSmtpConfigRequest {
                port: u32::from(elsewhere.addr().port()),
                ..keep.clone()
            },
        ),
        (
            "another host",
            v1::UpsertSmtpConfigRequest {
                host: "localhost".into(),
                ..keep.clone()
            },
        ),
        (
            "another TLS mode",
            v1::UpsertSmtpConfigRequest {
                tls_mode: v1::SmtpTlsMode::Starttls.into(),
                ..keep.clone()
            },
        ),
    ];
    for (what, request) in moves {
        let refused = admin.upsert_smtp_config(request).await.unwrap_err();
        assert_refused(what, &refused, "password", "must be given again");
    }
    // Password AUTH in clear to a host that is not this one: refused, saying loopback only.
    let in_clear = v1::UpsertSmtpConfigRequest {
        host: "relay.plant.example.test".into(),
        password: Some(PASSWORD_API.into()),
        ..keep.clone()
    };
    let refused = admin.upsert_smtp_config(in_clear).await.unwrap_err();
    assert_refused("AUTH in clear", &refused, "tls_mode", "loopback");

    // Nothing changed: the stored relay and password still deliver, and the other relay never
    // heard from central.
    let after = admin
        .get_smtp_config(v1::GetSmtpConfigRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(after, stored);
    assert_authenticated_delivery(&central, &sink, "after the refused moves").await;

    // The same relay keeps the stored password: other settings change without it.
    let retuned = admin
        .upsert_smtp_config(v1::UpsertSmtpConfigRequest {
            max_retries: 4,
            ..keep.clone()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(retuned.password_set);
    assert_eq!(retuned.max_retries, 4);
    assert_authenticated_delivery(&central, &sink, "with the password kept").await;
    assert_eq!(
        elsewhere.max_concurrent_sessions(),
        0,
        "the other relay was contacted"
    );

    // With the password given again, the relay may move.
    admin
        .upsert_smtp_config(password_request(elsewhere.addr(), Some(PASSWORD_API)))
        .await
        .unwrap();
    assert_authenticated_delivery(&central, &elsewhere, "to the new relay").await;
    central.stop().await;
}

#[tokio::test]
async fn a_stored_oauth_client_secret_is_sent_only_to_the_token_endpoint_it_was_given_for() {
    let dir = tempfile::tempdir().unwrap();
    let oauth = OAuthServer::start(OAUTH_CLIENT, OAUTH_SECRET_FILE, 3600)
        .await
        .unwrap();
    // A token endpoint of the admin's choosing, which would learn the client secret.
    let elsewhere = OAuthServer::start(OAUTH_CLIENT, OAUTH_SECRET_FILE, 3600)
        .await
        .unwrap();
    let sink = SmtpSink::start_with(SinkOptions {
        auth: Some(AuthRequirement::xoauth2(SMTP_USER, oauth.token_check())),
    })
    .await
    .unwrap();
    // A relay of the admin's choosing, which would receive the access tokens.
    let other_relay = SmtpSink::start().await.unwrap();
    let central = Central::start(central_config(dir.path(), None)).await;
    let mut admin = central.outbox().await;
    let request = |relay: std::net::SocketAddr, token_url: String, secret: Option<&str>| {
        v1::UpsertSmtpConfigRequest {
            host: relay.ip().to_string(),
            port: u32::from(relay.port()),
            tls_mode: v1::SmtpTlsMode::None.into(),
            from_address: SMTP_USER.into(),
            auth_mechanism: v1::SmtpAuthMechanism::Xoauth2.into(),
            username: SMTP_USER.into(),
            oauth_token_url: token_url,
            oauth_client_id: OAUTH_CLIENT.into(),
            oauth_client_secret: secret.map(Into::into),
            max_retries: 5,
            retry_delay: Some(to_duration(Duration::from_millis(300))),
            ..Default::default()
        }
    };
    admin
        .upsert_smtp_config(request(sink.addr(), oauth.url(), Some(OAUTH_SECRET_FILE)))
        .await
        .unwrap();
    let stored = admin
        .get_smtp_config(v1::GetSmtpConfigRequest {})
        .await
        .unwrap()
        .into_inner();

    // Another token endpoint, or another relay for the tokens, without the secret: refused.
    let refused = admin
        .upsert_smtp_config(request(sink.addr(), elsewhere.url(), None))
        .await
        .unwrap_err();
    assert_refused(
        "another token URL",
        &refused,
        "oauth_client_secret",
        "must be given again",
    );
    let refused = admin
        .upsert_smtp_config(request(other_relay.addr(), oauth.url(), None))
        .await
        .unwrap_err();
    assert_refused(
        "another relay",
        &refused,
        "oauth_client_secret",
        "must be given again",
    );
    assert_eq!(
        admin
            .get_smtp_config(v1::GetSmtpConfigRequest {})
            .await
            .unwrap()
            .into_inner(),
        stored
    );

    // Unchanged endpoint and relay keep the secret; deliveries authenticate as before, and
    // neither the other endpoint nor the other relay heard from central.
    admin
        .upsert_smtp_config(request(sink.addr(), oauth.url(), None))
        .await
        .unwrap();
    assert_authenticated_delivery(&central, &sink, "with the client secret kept").await;
    assert_eq!(elsewhere.request_count(), 0);
    assert_eq!(other_relay.max_concurrent_sessions(), 0);
    central.stop().await;
}

/// The request an admin sends to change webhook list "hooks" to `endpoints`, with `secret`
/// (`None`: keep the stored one; `Some("")`: remove it).
fn hook_list_request(
    endpoints: Vec<String>,
    secret: Option<&str>,
) -> v1::UpsertNotificationListRequest {
    v1::UpsertNotificationListRequest {
        list: Some(v1::NotificationList {
            name: "hooks".into(),
            r#type: v1::NotificationType::Webhook.into(),
            endpoints,
            webhook_format: v1::WebhookFormat::Generic.into(),
            webhook_secret: secret.map(Into::into),
            ..Default::default()
        }),
    }
}

/// List "hooks" as the admin API shows it.
async fn hooks_list(central: &Central) -> v1::NotificationList {
    central
        .outbox()
        .await
        .get_notification_list(v1::GetNotificationListRequest {
            name: "hooks".into(),
        })
        .await
        .unwrap()
        .into_inner()
}

/// A list's signing secret stays with the receivers it was given for: endpoints moved to
/// another port, host or scheme (or one added there) without the secret are refused naming
/// `list.webhook_secret`, and nothing changes; new paths on the same receiver keep it; given
/// again, or removed, the endpoints may move anywhere.
#[tokio::test]
async fn a_stored_webhook_secret_is_kept_only_for_the_same_receivers() {
    let dir = tempfile::tempdir().unwrap();
    let server = WebhookServer::start().await.unwrap();
    // A receiver of the admin's choosing, which would get requests signed with the secret.
    let elsewhere = WebhookServer::start().await.unwrap();
    let mut config = central_config(dir.path(), None);
    config
        .lists
        .push(hook_list("hooks", server.url("/a"), HOOK_SECRET_FILE));
    let central = Central::start(config).await;
    let mut admin = central.outbox().await;
    let stored = hooks_list(&central).await;
    assert!(stored.webhook_secret_set);

    let port = server.addr().port();
    let moves = [
        ("another port", vec![elsewhere.url("/a")]),
        ("another host", vec![format!("http://localhost:{port}/a")]),
        (
            "another scheme",
            vec![format!("https://127.0.0.1:{port}/a")],
        ),
        (
            "one added elsewhere",
            vec![server.url("/a"), elsewhere.url("/b")],
        ),
    ];
    for (what, endpoints) in moves {
        let refused = admin
            .upsert_notification_list(hook_list_request(endpoints, None))
            .await
            .unwrap_err();
        assert_refused(what, &refused, "list.webhook_secret", "must be given again");
    }
    assert_eq!(hooks_list(&central).await, stored, "nothing changed");
    assert_signed_delivery(&central, &server, "hooks", "/a", HOOK_SECRET_FILE).await;

    // Another path on the same receiver, and a second one there: the secret is kept.
    let kept = admin
        .upsert_notification_list(hook_list_request(
            vec![server.url("/b"), server.url("/c")],
            None,
        ))
        .await
        .unwrap()
        .into_inner();
    assert!(kept.webhook_secret_set);
    assert_signed_delivery(&central, &server, "hooks", "/b", HOOK_SECRET_FILE).await;
    assert!(
        elsewhere.requests().is_empty(),
        "the other receiver was contacted"
    );

    // Given again, the endpoints may move; removed, too.
    admin
        .upsert_notification_list(hook_list_request(
            vec![elsewhere.url("/a")],
            Some(HOOK_SECRET_API),
        ))
        .await
        .unwrap();
    assert_signed_delivery(&central, &elsewhere, "hooks", "/a", HOOK_SECRET_API).await;
    let removed = admin
        .upsert_notification_list(hook_list_request(vec![server.url("/d")], Some("")))
        .await
        .unwrap()
        .into_inner();
    assert!(!removed.webhook_secret_set);
    central.stop().await;
}
