//! Who wins for channel settings and lists: the database. Central restarted on the same
//! database with the same file keeps what operators changed through the admin API; replicas
//! started with different files do not take turns overwriting each other; the file fills in
//! only what is missing; and `central-outbox --apply-config` (a real process) replaces the
//! stored settings with the file's on purpose. The webhook channel's settings go the same way as
//! SMTP's: through the admin API and `outboxctl`, and the dispatcher delivers with the stored
//! ones.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use central_outbox::config::{ListConfig, WebhookConfig, WebhookFormatKind};
use outbox_proto::time::to_duration;
use outbox_proto::v1;
use outbox_tests::webhook_server::{Reply, WebhookServer};

use crate::harness::{
    Central, CentralDatabase, LIST, Process, binary, central_config, database_url, free_addr,
    submit, wait_for_status, wait_until_serving,
};
use crate::operations::run;

async fn smtp_config(central: &Central) -> v1::SmtpConfig {
    central
        .outbox()
        .await
        .get_smtp_config(v1::GetSmtpConfigRequest {})
        .await
        .unwrap()
        .into_inner()
}

async fn recipients(central: &Central, name: &str) -> Vec<String> {
    central
        .outbox()
        .await
        .get_notification_list(v1::GetNotificationListRequest { name: name.into() })
        .await
        .unwrap()
        .into_inner()
        .recipients
}

/// An operator's SMTP edit: the relay the file names, another sender and retry count.
fn smtp_edit(file: &v1::SmtpConfig, from: &str, max_retries: u32) -> v1::UpsertSmtpConfigRequest {
    v1::UpsertSmtpConfigRequest {
        host: file.host.clone(),
        port: file.port,
        tls_mode: file.tls_mode,
        from_address: from.into(),
        max_retries,
        ..Default::default()
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_keeps_the_operators_edits_and_seeds_only_what_is_missing() {
    let dir = tempfile::tempdir().unwrap();
    let relay = free_addr().await;
    let config = central_config(dir.path(), Some(relay));
    let central = Central::start(config.clone()).await;
    let seeded = smtp_config(&central).await;
    assert_eq!(seeded.from_address, "outbox@plant.example.test");

    // The operator changes the sender, the retries and the list's members at run time.
    let mut outbox = central.outbox().await;
    let edited = outbox
        .upsert_smtp_config(smtp_edit(&seeded, "night-desk@plant.example.test", 2))
        .await
        .unwrap()
        .into_inner();
    outbox
        .upsert_notification_list(v1::UpsertNotificationListRequest {
            list: Some(email_list(LIST, "carol@plant.example.test")),
        })
        .await
        .unwrap();
    central.stop().await;

    // The same file, and a list it names that the database lacks.
    let mut config = config;
    config.lists.push(ListConfig::email(
        "night-shift",
        vec!["dave@plant.example.test".into()],
    ));
    let central = Central::start(config).await;
    let kept = smtp_config(&central).await;
    assert_eq!(kept.from_address, "night-desk@plant.example.test");
    assert_eq!(kept.max_retries, 2);
    assert_eq!(
        kept.updated_at, edited.updated_at,
        "not written at start-up"
    );
    assert_eq!(
        recipients(&central, LIST).await,
        ["carol@plant.example.test"]
    );
    assert_eq!(
        recipients(&central, "night-shift").await,
        ["dave@plant.example.test"],
        "a list the database lacks is seeded from the file"
    );

    // Deleted at run time, the SMTP settings are missing again: the next start seeds them.
    central
        .outbox()
        .await
        .delete_smtp_config(v1::DeleteSmtpConfigRequest {})
        .await
        .unwrap();
    central.stop().await;
    let central = Central::start(central_config(dir.path(), Some(relay))).await;
    assert_eq!(
        smtp_config(&central).await.from_address,
        "outbox@plant.example.test"
    );
    central.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_with_different_files_do_not_flip_the_settings() {
    let dir = tempfile::tempdir().unwrap();
    let relay = free_addr().await;
    let file = |from: &str, member: &str| {
        let mut config = central_config(dir.path(), Some(relay));
        config.smtp.as_mut().unwrap().from_address = from.into();
        config.lists = vec![ListConfig::email(LIST, vec![member.into()])];
        config
    };
    let a = file("replica-a@plant.example.test", "a@plant.example.test");
    let b = file("replica-b@plant.example.test", "b@plant.example.test");

    // Both replicas start together on an empty database: each item is stored from the file of
    // the replica that stores it first (the SMTP relay from one file and the list from the other
    // is as right as both from one). (The database is created first: on MS SQL both replicas
    // must find the same scratch database.)
    let _database = CentralDatabase::create(&dir.path().join("central.db")).await;
    let (first, second) = tokio::join!(Central::start(a.clone()), Central::start(b.clone()));
    let stored = smtp_config(&first).await;
    assert!(
        [
            "replica-a@plant.example.test",
            "replica-b@plant.example.test"
        ]
        .contains(&stored.from_address.as_str()),
        "{stored:?}"
    );
    let winner = recipients(&first, LIST).await;
    assert!(
        winner == ["a@plant.example.test"] || winner == ["b@plant.example.test"],
        "{winner:?}"
    );
    assert_eq!(smtp_config(&second).await, stored);
    assert_eq!(recipients(&second, LIST).await, winner);

    // Restarted one after the other, each with its own file: nothing changes.
    for (running, config) in [(first, a), (second, b)] {
        running.stop().await;
        let restarted = Central::start(config).await;
        assert_eq!(smtp_config(&restarted).await, stored);
        assert_eq!(recipients(&restarted, LIST).await, winner);
        restarted.stop().await;
    }
}

/// The central-outbox binary on `file`, with `extra` flags, once it reports SERVING.
async fn start_process(file: &Path, addr: SocketAddr, extra: &[&str]) -> Process {
    let mut args = vec!["--config", file.to_str().unwrap()];
    args.extend_from_slice(extra);
    let process = Process::spawn(&binary("central-outbox"), &args);
    wait_until_serving(addr).await;
    process
}

/// A config file for the real binary: its database, loopback, no operator roles, the SMTP
/// relay sending as `from` and list [`LIST`] with `member`.
fn write_file(
    dir: &Path,
    addr: SocketAddr,
    relay: SocketAddr,
    from: &str,
    member: &str,
) -> PathBuf {
    let path = dir.join("central.toml");
    let database = database_url(&dir.join("central.db"));
    std::fs::write(
        &path,
        format!(
            "listen_addr = \"{addr}\"\ndatabase = \"{database}\"\n\
             [auth]\nmode = \"none\"\n\
             [smtp]\nhost = \"{}\"\nport = {}\ntls = \"none\"\nfrom_address = \"{from}\"\n\
             [webhook]\nmax_retries = 4\n\
             [[lists]]\nname = \"{LIST}\"\nrecipients = [\"{member}\"]\n",
            relay.ip(),
            relay.port()
        ),
    )
    .unwrap();
    path
}

async fn client(
    addr: SocketAddr,
) -> v1::notification_outbox_client::NotificationOutboxClient<tonic::transport::Channel> {
    v1::notification_outbox_client::NotificationOutboxClient::new(
        crate::harness::channel(addr).await,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apply_config_replaces_the_stored_settings_on_purpose() {
    let dir = tempfile::tempdir().unwrap();
    // Shared by every central process of the test (on MS SQL, a scratch database).
    let _central_db = CentralDatabase::create(&dir.path().join("central.db")).await;
    let (addr, relay) = (free_addr().await, free_addr().await);
    let file = write_file(
        dir.path(),
        addr,
        relay,
        "outbox@plant.example.test",
        "alice@plant.example.test",
    );
    let central = start_process(&file, addr, &[]).await;
    let mut outbox = client(addr).await;
    let seeded = outbox
        .get_smtp_config(v1::GetSmtpConfigRequest {})
        .await
        .unwrap()
        .into_inner();
    outbox
        .upsert_smtp_config(smtp_edit(&seeded, "edited@plant.example.test", 1))
        .await
        .unwrap();
    outbox
        .upsert_webhook_config(v1::UpsertWebhookConfigRequest {
            max_retries: 1,
            ..Default::default()
        })
        .await
        .unwrap();
    outbox
        .upsert_notification_list(v1::UpsertNotificationListRequest {
            list: Some(email_list(LIST, "bob@plant.example.test")),
        })
        .await
        .unwrap();
    central.kill9().await;

    // Restarted with the same file: the edits stand.
    let state = |outbox: &mut v1::notification_outbox_client::NotificationOutboxClient<_>| {
        let mut outbox = outbox.clone();
        async move {
            let smtp = outbox
                .get_smtp_config(v1::GetSmtpConfigRequest {})
                .await
                .unwrap()
                .into_inner();
            let webhook = outbox
                .get_webhook_config(v1::GetWebhookConfigRequest {})
                .await
                .unwrap()
                .into_inner();
            let list = outbox
                .get_notification_list(v1::GetNotificationListRequest { name: LIST.into() })
                .await
                .unwrap()
                .into_inner();
            (smtp.from_address, webhook.max_retries, list.recipients)
        }
    };
    let central = start_process(&file, addr, &[]).await;
    let mut outbox = client(addr).await;
    assert_eq!(
        state(&mut outbox).await,
        (
            "edited@plant.example.test".to_owned(),
            1,
            vec!["bob@plant.example.test".to_owned()]
        )
    );
    central.kill9().await;

    // --apply-config: the file's settings replace the stored ones.
    let central = start_process(&file, addr, &["--apply-config"]).await;
    let mut outbox = client(addr).await;
    assert_eq!(
        state(&mut outbox).await,
        (
            "outbox@plant.example.test".to_owned(),
            4,
            vec!["alice@plant.example.test".to_owned()]
        )
    );
    central.kill9().await;

    // The flag was for that start: an edit after it survives the next plain restart.
    let central = start_process(&file, addr, &[]).await;
    let mut outbox = client(addr).await;
    outbox
        .upsert_webhook_config(v1::UpsertWebhookConfigRequest {
            max_retries: 2,
            ..Default::default()
        })
        .await
        .unwrap();
    central.kill9().await;
    let central = start_process(&file, addr, &[]).await;
    let mut outbox = client(addr).await;
    assert_eq!(state(&mut outbox).await.1, 2);
    central.kill9().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webhook_settings_round_trip_through_outboxctl_and_govern_parking() {
    let dir = tempfile::tempdir().unwrap();
    let server = WebhookServer::start().await.unwrap();
    server.set_default_reply(Reply::status(500));
    let mut config = central_config(dir.path(), None);
    // The file says 5 retries; the operator's stored 1 must win.
    config.webhook = Some(WebhookConfig {
        max_retries: 5,
        ..WebhookConfig::default()
    });
    config.lists.push(ListConfig::webhook(
        "hooks",
        vec![server.url("/hook")],
        WebhookFormatKind::Generic,
    ));
    let central = Central::start(config).await;
    let addr = format!("http://{}", central.addr);
    let outboxctl = |args: &'static [&'static str]| {
        let addr = addr.clone();
        async move {
            let mut all = vec!["--addr", addr.as_str(), "--json"];
            all.extend_from_slice(args);
            run(&binary("outboxctl"), &all, &[], None).await
        }
    };

    let shown = outboxctl(&["webhook", "show"]).await.json();
    assert_eq!(shown["max_retries"], 5, "seeded from the file: {shown}");
    assert!(shown["updated_at"].is_string(), "{shown}");

    let set = outboxctl(&[
        "webhook",
        "set",
        "--max-retries",
        "1",
        "--backoff",
        "fixed",
        "--retry-delay",
        "200ms",
        "--max-connections",
        "2",
        "--timeout",
        "2s",
    ])
    .await
    .json();
    assert_eq!(set["max_retries"], 1);
    assert_eq!(set["backoff"], "fixed");
    assert_eq!(set["max_retry_delay"], serde_json::Value::Null);
    let shown = outboxctl(&["webhook", "show"]).await.json();
    assert_eq!(shown, set);
    assert_eq!(shown["retry_delay"], "0.200s");
    assert_eq!(shown["timeout"], "2s");
    assert_eq!(shown["max_concurrent_connections"], 2);

    // The same through the API; a bad value is refused by its field, and changes nothing.
    let mut outbox = central.outbox().await;
    let refused = outbox
        .upsert_webhook_config(v1::UpsertWebhookConfigRequest {
            max_concurrent_connections: 1000,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::InvalidArgument);
    assert!(
        refused.message().starts_with("max_concurrent_connections"),
        "{}",
        refused.message()
    );
    let refused = outboxctl(&[
        "webhook",
        "set",
        "--backoff",
        "fixed",
        "--max-retry-delay",
        "1h",
    ])
    .await;
    assert_eq!(refused.code, Some(2), "{}", refused.stderr);
    let via_api = outbox
        .get_webhook_config(v1::GetWebhookConfigRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(via_api.max_retries, 1);
    assert_eq!(
        via_api.retry_delay,
        Some(to_duration(Duration::from_millis(200)))
    );

    // The dispatcher delivers with the stored settings: one retry, then parked.
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
    let (_, retries, error) = wait_for_status(&central.db, &id, "Parked").await;
    assert_eq!(retries, 1);
    let error = error.unwrap();
    assert!(
        error.starts_with("retries exhausted (1 retries, 2 attempts)"),
        "{error}"
    );
    assert_eq!(server.requests().len(), 2);
    central.stop().await;
}

/// Issue 33's first scenario. A rate limit so slow that the wait for its next token overflowed
/// (1e-30 per second) once killed the email channel's loop at its second mail while the node
/// kept the lease, and nothing delivered again until a restart. Now the admin API refuses it
/// (naming the field and the bounds), a burst without a rate is refused as the config file and
/// `outboxctl` refuse it, and a value stored before the bounds existed is brought within them
/// when read: the channel paces at the slowest allowed rate, and the admin's correction takes
/// effect without a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_absurd_rate_limit_is_refused_and_a_stored_one_cannot_stop_the_channel() {
    let dir = tempfile::tempdir().unwrap();
    let sink = outbox_tests::smtp_sink::SmtpSink::start().await.unwrap();
    let config = central_config(dir.path(), Some(sink.addr()));
    let central = Central::start(config.clone()).await;
    let file = smtp_config(&central).await;
    let mut outbox = central.outbox().await;
    for (per_second, burst, field) in [
        (Some(1e-30), 0, "rate_limit_per_second"),
        (Some(f64::INFINITY), 0, "rate_limit_per_second"),
        (Some(1e9), 0, "rate_limit_per_second"),
        (Some(10.0), 1_000_000, "rate_limit_burst"),
        (None, 5, "rate_limit_burst"),
    ] {
        let refused = outbox
            .upsert_smtp_config(v1::UpsertSmtpConfigRequest {
                rate_limit_per_second: per_second,
                rate_limit_burst: burst,
                ..smtp_edit(&file, "outbox@plant.example.test", 5)
            })
            .await
            .unwrap_err();
        assert_eq!(
            refused.code(),
            tonic::Code::InvalidArgument,
            "{per_second:?} {burst}"
        );
        assert!(
            refused.message().contains(field),
            "{per_second:?} {burst}: {}",
            refused.message()
        );
    }
    assert_eq!(
        smtp_config(&central).await,
        file,
        "nothing refused was stored"
    );
    central.stop().await;

    // As an older release stored it, behind the admin API's back; central started again
    // reads it from the database (the file seeds only what is missing).
    let db = crate::harness::Db::open(&dir.path().join("central.db"));
    let changed = db.execute(
        "UPDATE ChannelConfig SET RateLimitPerSecond = 1e-30, RateLimitBurst = 1 \
         WHERE Channel = 'email'",
        &[],
    );
    assert_eq!(changed, 1);
    let central = Central::start(config).await;
    let mut outbox = central.outbox().await;
    let mut ingest = central.ingest().await;
    let mut ids = Vec::new();
    for n in 0..2 {
        let msg = submit(&format!("Tank {n} high level"), "Level 97%");
        ids.push(msg.notification_id.clone());
        ingest.submit_notification(msg).await.unwrap();
    }
    // The bucket's one token goes to the first; the second waits for the slowest rate.
    let delivered = crate::harness::eventually("one of the two delivered", || {
        let rows: Vec<_> = ids.iter().filter_map(|id| db.row(id)).collect();
        async move { (rows.iter().filter(|(s, _, _)| s == "Delivered").count() == 1).then_some(()) }
    });
    delivered.await;

    outbox
        .upsert_smtp_config(v1::UpsertSmtpConfigRequest {
            rate_limit_per_second: Some(10.0),
            ..smtp_edit(&file, "outbox@plant.example.test", 5)
        })
        .await
        .unwrap();
    for id in &ids {
        wait_for_status(&central.db, id, "Delivered").await;
    }
    assert_eq!(sink.messages().len(), 2);
    central.stop().await;
}
