//! `ClearCondition` on one node: the key forwarded, the clear queued and sent to central after
//! the rows before it, bad keys refused, a pending clear surviving a restart.

use super::*;

/// A key reaches central with the notification; a clear after the notification was acked marks
/// nothing here (it is central's now) and reaches central, for this site whatever the request
/// said; a row of another key is never touched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_condition_key_is_forwarded_and_a_later_clear_goes_to_central() {
    let central = FakeCentral::default();
    let (central_addr, central_stop) = serve_central(central.clone()).await;
    let mut site = start_site(central_addr).await;

    let keyed = site.send_keyed("Tank 4 high", "tank4.level.high").await;
    let other = site.send_keyed("Pump 7 stopped", "pump7.running").await;
    site.wait_for("the buffer to drain", |s| s.depth == 0).await;
    let stored = central.stored.lock().unwrap().clone();
    assert_eq!(stored[&keyed].condition_key, "tank4.level.high");
    assert_eq!(stored[&keyed].cleared_at_site, None);

    assert_eq!(site.clear("tank4.level.high").await.unwrap(), 0);
    central
        .wait_for("the clear", |c| c.cleared_at("tank4.level.high").is_some())
        .await;
    assert!(central.received().contains(&Received::Clear {
        key: "tank4.level.high".into(),
        site: "site-a".into(),
    }));
    assert!(central.cleared_at("pump7.running").is_none());
    assert_eq!(central.stored.lock().unwrap()[&other].cleared_at_site, None);
    eventually("the pending clear to be deleted", || {
        pending_clear_keys(&site.buffer).is_empty()
    })
    .await;
    site.shut_down().await;
    central_stop.cancel();
}

/// The whole ordering while central is away: the clear marks the key's buffered rows (GetStatus
/// says CLEARED); when central returns they arrive marked, THEN central is asked to clear the
/// key (retried after a refusal), and only then goes the row of the key sent after the clear.
/// Rows of another key or none are sent unmarked and never wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clear_while_central_is_away_reaches_central_after_the_rows_before_it() {
    let central_port = Reserved::new();
    let mut site = start_site(central_port.addr).await;
    let key = "tank4.level.high";

    let first = site.send_keyed("high", key).await;
    let second = site.send_keyed("still high", key).await;
    let other_key = site.send_keyed("pump stopped", "pump7.running").await;
    let no_key = site.send("plain").await;
    assert_eq!(site.clear(key).await.unwrap(), 2);
    assert_eq!(site.clear(key).await.unwrap(), 0, "already cleared");
    let after = site.send_keyed("high again", key).await;

    let view = site.status(&first).await.unwrap();
    assert_eq!(view.status(), NotificationStatus::Cleared);
    assert_eq!(view.condition_key, key);
    let view = site.status(&other_key).await.unwrap();
    assert_eq!(view.status(), NotificationStatus::Forwarding);
    assert_eq!(view.condition_key, "pump7.running");
    assert_eq!(
        site.status(&after).await.unwrap().status(),
        NotificationStatus::Forwarding
    );
    assert_eq!(pending_clear_keys(&site.buffer), vec![key.to_owned()]);

    let central = FakeCentral::default();
    central.fail_clears.store(1, Ordering::SeqCst);
    let central_stop = serve_central_at(central_port, central.clone()).await;
    site.wait_for("the buffer to drain", |s| s.depth == 0).await;

    let stored = central.stored.lock().unwrap().clone();
    for id in [&first, &second] {
        assert!(stored[id].cleared_at_site.is_some(), "{id} arrives cleared");
    }
    for id in [&other_key, &no_key, &after] {
        assert_eq!(stored[id].cleared_at_site, None, "{id} is not touched");
    }
    let clear = central.cleared_at(key).expect("central applied the clear");
    for id in [&first, &second] {
        assert!(
            central.submitted_at(id).unwrap() < clear,
            "{id} before the clear: {:?}",
            central.received()
        );
    }
    assert!(
        central.submitted_at(&after).unwrap() > clear,
        "the row sent after the clear waits for it: {:?}",
        central.received()
    );
    assert!(
        central.clear_attempts.load(Ordering::SeqCst) >= 2,
        "retried"
    );
    assert!(central.cleared_at("pump7.running").is_none());
    eventually("the pending clear to be deleted", || {
        pending_clear_keys(&site.buffer).is_empty()
    })
    .await;
    site.shut_down().await;
    central_stop.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_condition_keys_are_refused_naming_the_field() {
    let central = Reserved::new();
    let mut site = start_site(central.addr).await;
    for bad in ["tank 4", "tänk", &"k".repeat(129)] {
        let request = SendRequest {
            condition_key: bad.to_string(),
            ..send_request("x")
        };
        let err = site.client.send(request).await.unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument);
        assert!(err.message().starts_with("condition_key: "), "{err:?}");
    }
    for bad in ["", "tank 4"] {
        let err = site.clear(bad).await.unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument);
        assert!(err.message().starts_with("condition_key: "), "{err:?}");
    }
    assert_eq!(site.stats().await.depth, 0);
    assert!(pending_clear_keys(&site.buffer).is_empty());
    site.shut_down().await;
}

/// A clear committed while central is away is not lost by a restart: its marks and its pending
/// central half are on disk, and the restarted site finishes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pending_clear_survives_a_restart() {
    let central_port = Reserved::new();
    let central_addr = central_port.addr;
    let dir = tempfile::tempdir().unwrap();
    let buffer = dir.path().join("buffer.db");
    let configure = || {
        let buffer = buffer.clone();
        move |config: &mut Config| config.buffer_path = buffer
    };
    let mut site = start_site_with(central_addr, configure()).await;
    let id = site.send_keyed("high", "tank4.level.high").await;
    assert_eq!(site.clear("tank4.level.high").await.unwrap(), 1);
    site.shut_down().await;

    let mut site = start_site_with(central_addr, configure()).await;
    assert_eq!(
        site.status(&id).await.unwrap().status(),
        NotificationStatus::Cleared
    );
    let central = FakeCentral::default();
    let central_stop = serve_central_at(central_port, central.clone()).await;
    central
        .wait_for("the clear", |c| c.cleared_at("tank4.level.high").is_some())
        .await;
    assert!(central.submitted_at(&id).unwrap() < central.cleared_at("tank4.level.high").unwrap());
    assert!(
        central.stored.lock().unwrap()[&id]
            .cleared_at_site
            .is_some()
    );
    site.wait_for("the buffer to drain", |s| s.depth == 0).await;
    site.shut_down().await;
    central_stop.cancel();
}

/// A row already on the stream, unmarked, when the clear is committed is marked here but
/// reaches central as it was sent: central is asked to clear the key only after that row's ack
/// (the watermark), so the clear finds it there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_in_flight_at_the_clear_is_acked_before_central_is_asked_to_clear() {
    let central = FakeCentral::default();
    central.acks_held.send_replace(true);
    let (central_addr, central_stop) = serve_central(central.clone()).await;
    let mut site = start_site(central_addr).await;

    let id = site.send_keyed("high", "tank4.level.high").await;
    central
        .wait_for("the submit", |c| c.submitted_at(&id).is_some())
        .await;
    assert_eq!(site.clear("tank4.level.high").await.unwrap(), 1);
    assert_eq!(
        site.status(&id).await.unwrap().status(),
        NotificationStatus::Cleared
    );
    central.acks_held.send_replace(false);
    central
        .wait_for("the clear", |c| c.cleared_at("tank4.level.high").is_some())
        .await;
    assert!(
        central.acked_at(&id).unwrap() < central.cleared_at("tank4.level.high").unwrap(),
        "{:?}",
        central.received()
    );
    assert_eq!(
        central.stored.lock().unwrap()[&id].cleared_at_site,
        None,
        "sent before the clear"
    );
    site.shut_down().await;
    central_stop.cancel();
}
