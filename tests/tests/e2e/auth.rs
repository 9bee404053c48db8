//! Operator roles on the admin API against a running central with authentication on: every RPC
//! answers each caller exactly as its role allows (table-driven over every admin RPC), the
//! actor recorded in history is the authenticated identity whatever header the caller sends,
//! and outboxctl and grpcurl work with a bearer token. Bad tokens are throttled per client
//! address, on the API and the console's login alike, and counted on `/metrics`.

use central_outbox::auth::{
    AdminRpc, AuthMode, CertificateConfig, Role, TokenConfig, token_digest,
};
use outbox_proto::v1;
use outbox_proto::v1::notification_outbox_client::NotificationOutboxClient;
use outbox_tests::pki::Pki;
use outbox_tests::smtp_sink::Behaviour;
use tonic::transport::Channel;
use tonic::{Code, Request, Status};

use crate::console::Browser;
use crate::harness::{
    Central, Db, binary, central_config, channel, eventually, free_addr, smtp_sink, submit,
    wait_for_status, with_console,
};
use crate::operations::{grpcurl_path, run};

const VIEWER_TOKEN: &str = "viewer-token-5f1c0a9e";
const OPERATOR_TOKEN: &str = "operator-token-8d2b7c31";
const ADMIN_TOKEN: &str = "admin-token-0e4a6f92";

fn token(name: &str, role: Role, secret: &str) -> TokenConfig {
    TokenConfig {
        name: name.into(),
        role,
        sha256: token_digest(secret),
    }
}

/// Central with authentication required and one token per role.
async fn start(dir: &std::path::Path, smtp: Option<std::net::SocketAddr>) -> Central {
    let mut config = central_config(dir, smtp);
    config.auth.mode = AuthMode::Required;
    config.auth.tokens = vec![
        token("vera", Role::Viewer, VIEWER_TOKEN),
        token("otto", Role::Operator, OPERATOR_TOKEN),
        token("ada", Role::Admin, ADMIN_TOKEN),
    ];
    Central::start(config).await
}

/// `message` with the caller's credentials: a bearer token (if any), and always an
/// `x-outbox-actor` that must not matter once authentication is on.
fn with<T>(message: T, token: Option<&str>) -> Request<T> {
    let mut request = Request::new(message);
    if let Some(token) = token {
        request
            .metadata_mut()
            .insert("authorization", format!("Bearer {token}").parse().unwrap());
    }
    request
        .metadata_mut()
        .insert("x-outbox-actor", "mallory".parse().unwrap());
    request
}

/// Calls `rpc` with an empty request: enough to see whether the caller got past authorization
/// (an empty request may then fail validation, which is not an auth error).
async fn call(
    client: &mut NotificationOutboxClient<Channel>,
    rpc: AdminRpc,
    token: Option<&str>,
) -> Result<(), Status> {
    macro_rules! call {
        ($method:ident) => {
            client
                .$method(with(Default::default(), token))
                .await
                .map(drop)
        };
    }
    match rpc {
        AdminRpc::QueryNotifications => call!(query_notifications),
        AdminRpc::GetNotificationStatus => call!(get_notification_status),
        AdminRpc::GetNotificationDetail => call!(get_notification_detail),
        AdminRpc::GetKpis => call!(get_kpis),
        AdminRpc::ListNotificationLists => call!(list_notification_lists),
        AdminRpc::GetNotificationList => call!(get_notification_list),
        AdminRpc::RetryNotification => call!(retry_notification),
        AdminRpc::DiscardNotification => call!(discard_notification),
        AdminRpc::RetryNotifications => call!(retry_notifications),
        AdminRpc::DiscardNotifications => call!(discard_notifications),
        AdminRpc::UpsertNotificationList => call!(upsert_notification_list),
        AdminRpc::DeleteNotificationList => call!(delete_notification_list),
        AdminRpc::GetSmtpConfig => call!(get_smtp_config),
        AdminRpc::UpsertSmtpConfig => call!(upsert_smtp_config),
        AdminRpc::DeleteSmtpConfig => call!(delete_smtp_config),
        AdminRpc::GetWebhookConfig => call!(get_webhook_config),
        AdminRpc::UpsertWebhookConfig => call!(upsert_webhook_config),
        AdminRpc::ListSiteHealth => call!(list_site_health),
        AdminRpc::ListIncidents => call!(list_incidents),
        AdminRpc::GetIncident => call!(get_incident),
        AdminRpc::AcknowledgeIncident => call!(acknowledge_incident),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_admin_rpc_answers_each_role_as_the_table_says() {
    let dir = tempfile::tempdir().unwrap();
    let central = start(dir.path(), None).await;
    let mut client = NotificationOutboxClient::new(channel(central.addr).await);
    let callers: [(&str, Option<&str>, Option<Role>); 5] = [
        ("no credentials", None, None),
        ("an unknown token", Some("guessed-token"), None),
        ("a viewer", Some(VIEWER_TOKEN), Some(Role::Viewer)),
        ("an operator", Some(OPERATOR_TOKEN), Some(Role::Operator)),
        ("an admin", Some(ADMIN_TOKEN), Some(Role::Admin)),
    ];
    let mut wrong = Vec::new();
    for (i, rpc) in AdminRpc::ALL.into_iter().enumerate() {
        // Bad tokens from one address are throttled after a few (see the last test): each
        // RPC's guess comes from an address of its own, so here every one is just refused.
        let mut guesser = NotificationOutboxClient::new(
            channel_from(&central, [127, 0, 1, i as u8 + 1].into()).await,
        );
        for (who, token, role) in callers {
            let client = if role.is_none() && token.is_some() {
                &mut guesser
            } else {
                &mut client
            };
            let code = call(client, rpc, token)
                .await
                .err()
                .map_or(Code::Ok, |s| s.code());
            let expected_ok = role.is_some_and(|role| role >= rpc.role());
            let fine = match (role, expected_ok) {
                (None, _) => code == Code::Unauthenticated,
                (Some(_), false) => code == Code::PermissionDenied,
                // Past authorization: an empty request may be invalid or name nothing.
                (Some(_), true) => !matches!(code, Code::Unauthenticated | Code::PermissionDenied),
            };
            if !fine {
                wrong.push(format!("{rpc:?} by {who}: {code:?}"));
            }
        }
    }
    assert!(wrong.is_empty(), "wrong answers:\n{}", wrong.join("\n"));
    central.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_actor_in_history_is_the_token_holder_not_the_header() {
    let dir = tempfile::tempdir().unwrap();
    let sink = smtp_sink().await;
    sink.set_behaviour(Behaviour::RejectMail {
        code: 550,
        text: "5.1.1 no such user".into(),
    });
    let central = start(dir.path(), Some(sink.addr())).await;
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

    let mut client = NotificationOutboxClient::new(channel(central.addr).await);
    client
        .retry_notification(with(
            v1::RetryNotificationRequest {
                notification_id: id.clone(),
            },
            Some(OPERATOR_TOKEN),
        ))
        .await
        .unwrap();
    wait_for_status(&central.db, &id, "Delivered").await;
    let detail = client
        .get_notification_detail(with(
            v1::GetNotificationDetailRequest {
                notification_id: id.clone(),
            },
            Some(VIEWER_TOKEN),
        ))
        .await
        .unwrap()
        .into_inner();
    let actors: Vec<&str> = detail
        .history
        .iter()
        .map(|h| h.actor.as_str())
        .filter(|a| !a.is_empty())
        .collect();
    assert_eq!(actors, ["otto"], "{:?}", detail.history);
    let stored = Db::open(&central.db).strings(&format!(
        "SELECT Actor FROM NotificationAttempts WHERE NotificationId = '{id}' AND Actor IS NOT NULL"
    ));
    assert_eq!(stored, ["otto"]);
    central.stop().await;
}

/// outboxctl and grpcurl against central serving TLS, authenticated by a bearer token: they
/// work with the CA and the token, and are refused (UNAUTHENTICATED) without the token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outboxctl_and_grpcurl_work_over_tls_with_a_token() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path(), "ca").unwrap();
    let server = pki.server_cert().unwrap();
    let mut config = central_config(dir.path(), None);
    config.auth.mode = AuthMode::Required;
    config.auth.tokens = vec![token("vera", Role::Viewer, VIEWER_TOKEN)];
    config.tls.cert = Some(server.cert.clone());
    config.tls.key = Some(server.key.clone());
    let central = Central::start_tls(config, pki.client_tls(None).unwrap()).await;
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, format!("{VIEWER_TOKEN}\n")).unwrap();
    let addr = format!("localhost:{}", central.addr.port());
    let ca = pki.ca_cert().to_str().unwrap();

    let outboxctl = binary("outboxctl");
    let tf = token_file.to_str().unwrap();
    let ok = run(
        &outboxctl,
        &[
            "--addr",
            &addr,
            "--ca",
            ca,
            "--token-file",
            tf,
            "--json",
            "kpis",
        ],
        &[],
        None,
    )
    .await;
    assert_eq!(ok.code, Some(0), "{}", ok.stderr);
    assert!(ok.json()["global"].is_object(), "{}", ok.stdout);
    // The token from the environment works the same.
    let from_env = run(
        &outboxctl,
        &["--addr", &addr, "--ca", ca, "--json", "kpis"],
        &[("OUTBOX_TOKEN", VIEWER_TOKEN)],
        None,
    )
    .await;
    assert_eq!(from_env.code, Some(0), "{}", from_env.stderr);
    let refused = run(
        &outboxctl,
        &["--addr", &addr, "--ca", ca, "kpis"],
        &[],
        None,
    )
    .await;
    assert_eq!(refused.code, Some(1));
    assert!(
        refused.stderr.contains("UNAUTHENTICATED"),
        "{}",
        refused.stderr
    );

    let grpcurl = grpcurl_path();
    let authorization = format!("authorization: Bearer {VIEWER_TOKEN}");
    let kpis = "outbox.v1.NotificationOutbox/GetKpis";
    let ok = run(
        &grpcurl,
        &["-cacert", ca, "-H", &authorization, &addr, kpis],
        &[],
        None,
    )
    .await;
    assert_eq!(ok.code, Some(0), "{}", ok.stderr);
    assert!(ok.json()["global"].is_object(), "{}", ok.stdout);
    let refused = run(&grpcurl, &["-cacert", ca, &addr, kpis], &[], None).await;
    assert_ne!(refused.code, Some(0));
    assert!(
        refused.stderr.contains("Unauthenticated"),
        "{}",
        refused.stderr
    );
    central.stop().await;
}

/// With mutual TLS, an operator's client certificate mapped to a role is its identity: outboxctl
/// presenting it may act within that role, and a site's certificate (not mapped) may not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mapped_client_certificate_is_an_operator_identity() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path(), "ca").unwrap();
    let server = pki.server_cert().unwrap();
    let console = pki.client_cert("ops-console").unwrap();
    let site = pki.client_cert("site-a").unwrap();
    let mut config = central_config(dir.path(), None);
    config.auth.mode = AuthMode::Required;
    config.auth.certificates = vec![CertificateConfig {
        common_name: "ops-console".into(),
        role: Role::Admin,
    }];
    config.tls.cert = Some(server.cert.clone());
    config.tls.key = Some(server.key.clone());
    config.tls.client_ca = Some(pki.ca_cert().to_owned());
    let central = Central::start_tls(config, pki.client_tls(Some(&console)).unwrap()).await;
    let addr = format!("localhost:{}", central.addr.port());
    let ca = pki.ca_cert().to_str().unwrap();
    let outboxctl = binary("outboxctl");
    let as_cert = |files: &outbox_tests::pki::CertFiles| {
        vec![
            files.cert.to_str().unwrap().to_owned(),
            files.key.to_str().unwrap().to_owned(),
        ]
    };

    let c = as_cert(&console);
    let ok = run(
        &outboxctl,
        &[
            "--addr", &addr, "--ca", ca, "--cert", &c[0], "--key", &c[1], "--json", "smtp", "show",
        ],
        &[],
        None,
    )
    .await;
    assert_ne!(ok.code, None);
    assert!(
        !ok.stderr.contains("PERMISSION_DENIED") && !ok.stderr.contains("UNAUTHENTICATED"),
        "an admin certificate may read SMTP settings: {}",
        ok.stderr
    );
    let s = as_cert(&site);
    let denied = run(
        &outboxctl,
        &[
            "--addr", &addr, "--ca", ca, "--cert", &s[0], "--key", &s[1], "kpis",
        ],
        &[],
        None,
    )
    .await;
    assert_eq!(denied.code, Some(1));
    assert!(
        denied.stderr.contains("PERMISSION_DENIED"),
        "{}",
        denied.stderr
    );
    central.stop().await;
}

/// A connection to central's gRPC port from `local`, a loopback address of its own: to central,
/// another client machine.
async fn channel_from(central: &Central, local: std::net::IpAddr) -> Channel {
    Channel::from_shared(format!("http://{}", central.addr))
        .unwrap()
        .local_address(Some(local))
        .connect()
        .await
        .unwrap()
}

/// After 10 bad tokens from one address within 5 minutes, the admin API and the console's login
/// refuse that address for 15 minutes, even with a good token: UNAVAILABLE with `retry-after`
/// on the API, 429 with `Retry-After` on the console; other addresses go on as before. Failures
/// from one address count together wherever they were made, and every failure and every
/// throttled attempt is counted on `/metrics`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_tokens_are_throttled_per_client_address_and_counted() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = central_config(dir.path(), None);
    config.auth.mode = AuthMode::Required;
    config.auth.tokens = vec![token("vera", Role::Viewer, VIEWER_TOKEN)];
    let metrics = free_addr().await;
    config.metrics_listen = Some(metrics);
    with_console(&mut config).await;
    let central = Central::start(config).await;
    let kpis = || v1::GetKpisRequest::default();

    // The API: ten bad tokens from one address are each refused as such...
    let guesser: std::net::IpAddr = [127, 0, 0, 3].into();
    let mut from_guesser = NotificationOutboxClient::new(channel_from(&central, guesser).await);
    for i in 0..10 {
        let refused = from_guesser
            .get_kpis(with(kpis(), Some(&format!("guess-{i}"))))
            .await
            .unwrap_err();
        assert_eq!(
            refused.code(),
            Code::Unauthenticated,
            "guess {i}: {refused:?}"
        );
    }
    // ...and then that address is refused, good token or not, and told for how long.
    for token in [VIEWER_TOKEN, "guess-10"] {
        let throttled = from_guesser
            .get_kpis(with(kpis(), Some(token)))
            .await
            .unwrap_err();
        assert_eq!(throttled.code(), Code::Unavailable, "{throttled:?}");
        assert!(
            throttled.message().contains("too many failed"),
            "{throttled:?}"
        );
        let retry_after: u64 = throttled
            .metadata()
            .get("retry-after")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no retry-after: {throttled:?}"));
        assert!((1..=900).contains(&retry_after), "{retry_after}");
    }
    // Another address is not held back.
    let mut from_elsewhere =
        NotificationOutboxClient::new(channel_from(&central, [127, 0, 0, 4].into()).await);
    from_elsewhere
        .get_kpis(with(kpis(), Some(VIEWER_TOKEN)))
        .await
        .unwrap();

    // The console's login from the throttled address is refused too, with a good token.
    let mut browser = Browser::from_address(&central, guesser);
    let refused = browser.log_in(VIEWER_TOKEN).await;
    assert_eq!(refused.status, 429, "{}", refused.body);
    let retry_after: u64 = refused
        .header("retry-after")
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no Retry-After: {:?}", refused.headers));
    assert!((1..=900).contains(&retry_after), "{retry_after}");
    assert!(refused.body.contains("too many failed"), "{}", refused.body);

    // Ten bad logins on the console from a third address throttle it the same way.
    let mut third = Browser::from_address(&central, [127, 0, 0, 5].into());
    for i in 0..10 {
        let refused = third.log_in(&format!("guess-{i}")).await;
        assert_eq!(refused.status, 401, "guess {i}: {}", refused.body);
    }
    assert_eq!(third.log_in(VIEWER_TOKEN).await.status, 429);
    let mut fourth = Browser::from_address(&central, [127, 0, 0, 6].into());
    assert_eq!(fourth.log_in(VIEWER_TOKEN).await.status, 303);

    // Every failure and every throttled attempt is counted.
    let scrape = eventually("/metrics answers", || async move {
        metrics_endpoint::get(metrics, "/metrics").await.ok()
    })
    .await;
    let sample = |series: &str| {
        metrics_endpoint::sample(&scrape.body, series)
            .unwrap_or_else(|| panic!("no {series}:\n{}", scrape.body))
    };
    assert_eq!(sample(r#"outbox_auth_failures_total{via="api"}"#), 10.0);
    assert_eq!(sample(r#"outbox_auth_failures_total{via="console"}"#), 10.0);
    assert_eq!(sample(r#"outbox_auth_throttled_total{via="api"}"#), 2.0);
    assert_eq!(sample(r#"outbox_auth_throttled_total{via="console"}"#), 2.0);
    central.stop().await;
}
