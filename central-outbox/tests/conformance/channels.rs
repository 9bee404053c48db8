//! Behaviours of the stored channel settings beyond the lists and the email row (`admin`): the
//! webhook channel's row beside the email channel's, and the seeds start-up uses, which store
//! an item only where none is, so the stored settings stay the authority.

use std::time::Duration;

use central_outbox::domain::channel::{
    DeliveryPolicy, EmailAddress, ListInput, NotificationList, RateLimit, SmtpAuth, SmtpSettings,
    TlsMode, WebhookSettings,
};
use central_outbox::domain::retry::Backoff;
use central_outbox::domain::smtp_relay::SmtpRelay;
use central_outbox::domain::{ListName, NotificationType};
use central_outbox::store::OutboxStore;

fn webhook(max_retries: i64, backoff: Backoff, rate_limit: Option<RateLimit>) -> WebhookSettings {
    WebhookSettings {
        timeout: Duration::from_millis(2500),
        policy: DeliveryPolicy {
            max_retries,
            retry_delay: Duration::from_secs(15),
            backoff,
            max_concurrent_connections: 6,
            rate_limit,
        },
    }
}

fn smtp(host: &str) -> SmtpSettings {
    SmtpSettings {
        host: host.into(),
        port: 25,
        tls: TlsMode::None,
        auth: SmtpAuth::None,
        from_address: EmailAddress::parse("outbox@plant.test", "from_address").unwrap(),
        timeout: Duration::from_secs(30),
        overall_timeout: Duration::from_secs(120),
        fallback_relays: vec![],
        policy: DeliveryPolicy {
            max_retries: 10,
            retry_delay: Duration::from_secs(60),
            backoff: Backoff::Fixed,
            max_concurrent_connections: 4,
            rate_limit: None,
        },
    }
}

fn list(name: &str, recipient: &str) -> NotificationList {
    NotificationList::parse(ListInput {
        name: name.into(),
        recipients: vec![recipient.into()],
        ..Default::default()
    })
    .unwrap()
}

fn hooks(endpoint: &str) -> NotificationList {
    NotificationList::parse(ListInput {
        name: "hooks".into(),
        kind: Some(NotificationType::Webhook),
        endpoints: vec![endpoint.into()],
        ..Default::default()
    })
    .unwrap()
}

pub(crate) async fn webhook_settings_round_trip_beside_the_email_row<S: OutboxStore>(store: &S) {
    assert!(store.webhook_settings().await.unwrap().is_none());
    let exponential = webhook(
        3,
        Backoff::Exponential {
            cap: Duration::from_secs(600),
        },
        Some(RateLimit::parse(Some(2.5), Some(5)).unwrap().unwrap()),
    );
    let fixed = webhook(0, Backoff::Fixed, None);
    for settings in [exponential, fixed.clone()] {
        store.put_webhook_settings(settings.clone()).await.unwrap();
        assert_eq!(
            store.webhook_settings().await.unwrap().unwrap().value,
            settings
        );
    }
    // The webhook row is no email row, and the email row's life does not touch it.
    assert!(store.smtp_settings().await.unwrap().is_none());
    assert!(!store.delete_smtp_settings().await.unwrap());
    store.put_smtp_settings(smtp("relay.test")).await.unwrap();
    assert!(store.delete_smtp_settings().await.unwrap());
    assert_eq!(
        store.webhook_settings().await.unwrap().unwrap().value,
        fixed
    );
}

/// An email row's fallback relays come back in their order, with their TLS modes; a seed that
/// finds the row stored leaves them, and a replace without them removes them.
pub(crate) async fn fallback_relays_round_trip_in_their_order<S: OutboxStore>(store: &S) {
    let mut settings = smtp("relay1.plant.test");
    settings.fallback_relays = SmtpRelay::parse_list(
        "relay2.plant.test:587 starttls, [::1]:2525 none, 10.0.0.5:465 tls, \
         relay4.plant.test:25 none",
    )
    .unwrap();
    store.put_smtp_settings(settings.clone()).await.unwrap();
    let stored = store.smtp_settings().await.unwrap().unwrap().value;
    assert_eq!(stored.fallback_relays, settings.fallback_relays);
    assert_eq!(stored, settings);
    assert!(!store.seed_smtp_settings(smtp("other.test")).await.unwrap());
    assert_eq!(
        store.smtp_settings().await.unwrap().unwrap().value,
        settings
    );
    store
        .put_smtp_settings(smtp("relay1.plant.test"))
        .await
        .unwrap();
    assert!(
        store
            .smtp_settings()
            .await
            .unwrap()
            .unwrap()
            .value
            .fallback_relays
            .is_empty()
    );
}

/// A webhook list's fallback URLs come back in their order, are not among its targets, and go
/// when a replace leaves them out.
pub(crate) async fn webhook_fallbacks_round_trip_in_their_order<S: OutboxStore>(store: &S) {
    let with_fallbacks = NotificationList::parse(ListInput {
        name: "hooks".into(),
        kind: Some(NotificationType::Webhook),
        endpoints: vec!["https://hooks.plant.test/a?token=t".into()],
        // Four, one of them as long as a URL may be: the column holds the most a list may name.
        fallback_urls: vec![
            "https://zz-backup.plant.test/b".into(),
            "http://127.0.0.1:8080/c".into(),
            "https://aa-backup.plant.test/d?x=1".into(),
            format!("https://long.plant.test/{}", "p".repeat(2048 - 24)),
        ],
        ..Default::default()
    })
    .unwrap();
    store.upsert_list(with_fallbacks.clone()).await.unwrap();
    let name = with_fallbacks.name.clone();
    let stored = store.list(&name).await.unwrap().unwrap().value;
    assert_eq!(stored, with_fallbacks);
    assert_eq!(
        stored.target_names(),
        ["https://hooks.plant.test/a?token=t"]
    );
    let listed = store.lists().await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].value, with_fallbacks);
    store
        .upsert_list(hooks("https://hooks.plant.test/a"))
        .await
        .unwrap();
    assert_eq!(
        store.list(&name).await.unwrap().unwrap().value,
        hooks("https://hooks.plant.test/a")
    );
    store.delete_list(&name).await.unwrap();
    assert!(store.seed_list(with_fallbacks.clone()).await.unwrap());
    assert_eq!(
        store.list(&name).await.unwrap().unwrap().value,
        with_fallbacks
    );
}

pub(crate) async fn seeds_store_only_what_is_missing<S: OutboxStore>(store: &S) {
    // Missing: each seed stores its item.
    assert!(store.seed_smtp_settings(smtp("first.test")).await.unwrap());
    let first_hook = webhook(3, Backoff::Fixed, None);
    assert!(
        store
            .seed_webhook_settings(first_hook.clone())
            .await
            .unwrap()
    );
    assert!(store.seed_list(list("ops", "a@plant.test")).await.unwrap());

    // Stored: a second seed (another replica's file) changes nothing, whatever it says.
    assert!(!store.seed_smtp_settings(smtp("second.test")).await.unwrap());
    assert!(
        !store
            .seed_webhook_settings(webhook(9, Backoff::Fixed, None))
            .await
            .unwrap()
    );
    assert!(!store.seed_list(list("ops", "b@plant.test")).await.unwrap());
    assert_eq!(
        store.smtp_settings().await.unwrap().unwrap().value.host,
        "first.test"
    );
    assert_eq!(
        store.webhook_settings().await.unwrap().unwrap().value,
        first_hook
    );
    let ops = ListName::parse("ops".into()).unwrap();
    assert_eq!(
        store
            .list(&ops)
            .await
            .unwrap()
            .unwrap()
            .value
            .target_names(),
        ["a@plant.test"]
    );

    // An operator's edit is what a later seed finds, and keeps.
    store
        .upsert_list(list("ops", "edited@plant.test"))
        .await
        .unwrap();
    assert!(!store.seed_list(list("ops", "a@plant.test")).await.unwrap());
    assert_eq!(
        store
            .list(&ops)
            .await
            .unwrap()
            .unwrap()
            .value
            .target_names(),
        ["edited@plant.test"]
    );

    // A deleted item is missing again: the next seed stores it.
    assert!(store.delete_smtp_settings().await.unwrap());
    assert!(store.seed_smtp_settings(smtp("third.test")).await.unwrap());
    assert!(store.delete_list(&ops).await.unwrap());
    assert!(store.seed_list(list("ops", "c@plant.test")).await.unwrap());
    assert_eq!(
        store
            .list(&ops)
            .await
            .unwrap()
            .unwrap()
            .value
            .target_names(),
        ["c@plant.test"]
    );

    // Two replicas seeding the same missing items at once: exactly one stores each, and what
    // is stored is that one's.
    let (a, b) = tokio::join!(
        store.seed_list(hooks("https://a.plant.test/hook")),
        store.seed_list(hooks("https://b.plant.test/hook")),
    );
    let (a, b) = (a.unwrap(), b.unwrap());
    assert!(a ^ b, "one seed stores the list: {a} {b}");
    let winner = if a {
        "https://a.plant.test/hook"
    } else {
        "https://b.plant.test/hook"
    };
    let stored = store
        .list(&ListName::parse("hooks".into()).unwrap())
        .await
        .unwrap()
        .unwrap()
        .value;
    assert_eq!(stored.target_names(), [winner]);
    assert!(store.delete_smtp_settings().await.unwrap());
    let (a, b) = tokio::join!(
        store.seed_smtp_settings(smtp("a.test")),
        store.seed_smtp_settings(smtp("b.test")),
    );
    let (a, b) = (a.unwrap(), b.unwrap());
    assert!(a ^ b, "one seed stores the SMTP settings: {a} {b}");
    assert_eq!(
        store.smtp_settings().await.unwrap().unwrap().value.host,
        if a { "a.test" } else { "b.test" }
    );
}
