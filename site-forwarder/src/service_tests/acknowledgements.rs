//! `Acknowledge`: queued and sent to central after the alarm it answers, retried while central
//! refuses, kept across a restart, bad input refused naming the field; across a pair, kept by
//! the standby and carried by a hand-over.

use super::*;

/// While central is away, an acknowledgement waits for the alarm buffered before it: when
/// central returns, the alarm arrives first, then the acknowledgement (for this site, with the
/// actor), retried after a refusal; the pending row is then gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acknowledgement_reaches_central_after_the_alarm_it_answers() {
    let central_port = Reserved::new();
    let mut site = start_site(central_port.addr).await;
    let key = "tank4.level.high";
    let alarm = site.send_keyed("Tank 4 level high", key).await;
    assert_eq!(site.acknowledge(key, "Jo at HMI 2").await.unwrap(), 1);
    assert_eq!(
        site.acknowledge(key, "Kim").await.unwrap(),
        1,
        "one pending acknowledgement per key"
    );
    assert_eq!(pending_ack_keys(&site.buffer), vec![key.to_owned()]);

    let central = FakeCentral::default();
    central.fail_acks.store(1, Ordering::SeqCst);
    let central_stop = serve_central_at(central_port, central.clone()).await;
    central
        .wait_for("the acknowledgement", |c| c.acknowledged_at(key).is_some())
        .await;
    assert!(
        central.submitted_at(&alarm).unwrap() < central.acknowledged_at(key).unwrap(),
        "{:?}",
        central.received()
    );
    assert!(central.received().contains(&Received::Ack {
        key: key.into(),
        site: "site-a".into(),
        actor: "Kim".into(),
    }));
    assert!(central.ack_attempts.load(Ordering::SeqCst) >= 2, "retried");
    eventually("the pending acknowledgement to be deleted", || {
        pending_ack_keys(&site.buffer).is_empty()
    })
    .await;
    site.shut_down().await;
    central_stop.cancel();
}

/// An acknowledgement committed while central is away is on disk: a restarted site sends it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pending_acknowledgement_survives_a_restart() {
    let central_port = Reserved::new();
    let dir = tempfile::tempdir().unwrap();
    let buffer = dir.path().join("buffer.db");
    let configure = || {
        let buffer = buffer.clone();
        move |config: &mut Config| config.buffer_path = buffer
    };
    let mut site = start_site_with(central_port.addr, configure()).await;
    site.acknowledge("pump7.trip", "").await.unwrap();
    site.shut_down().await;

    let site = start_site_with(central_port.addr, configure()).await;
    let central = FakeCentral::default();
    let central_stop = serve_central_at(central_port, central.clone()).await;
    central
        .wait_for("the acknowledgement", |c| {
            c.acknowledged_at("pump7.trip").is_some()
        })
        .await;
    site.shut_down().await;
    central_stop.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_key_or_actor_is_refused_naming_the_field() {
    let central = Reserved::new();
    let mut site = start_site(central.addr).await;
    let refused = site.acknowledge("no spaces allowed", "").await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::InvalidArgument);
    assert!(
        refused.message().starts_with("condition_key:"),
        "{refused:?}"
    );
    let refused = site
        .acknowledge("tank4.level", &"x".repeat(129))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::InvalidArgument);
    assert_eq!(
        refused.message(),
        "actor: is 129 characters, the limit is 128"
    );
    assert!(pending_ack_keys(&site.buffer).is_empty(), "nothing stored");
    site.shut_down().await;
}

/// A pair's standby holds the active's pending acknowledgement: promoted after the active
/// stopped for good, it sends it to central (after the alarm), once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_promoted_standby_sends_the_acknowledgement_the_active_left_pending() {
    let central_port = Reserved::new();
    let mut pair = PairRig::new(central_port.addr);
    let mut active = pair.start(Node::A).await;
    let mut standby = pair.start(Node::B).await;
    let (_, b_buffer) = pair.buffers();
    let key = "tank4.level.high";
    let alarm = active.send_keyed("high", key).await;
    active.acknowledge(key, "Jo").await.unwrap();
    standby
        .wait_for("the alarm to be copied", |s| s.depth == 1)
        .await;
    eventually("the standby to hold the pending acknowledgement", || {
        pending_ack_keys(&b_buffer) == [key]
    })
    .await;

    active.shut_down().await;
    standby.promote().await;
    let central = FakeCentral::default();
    let central_stop = serve_central_at(central_port, central.clone()).await;
    standby
        .wait_for("the new active to drain", |s| {
            s.depth == 0 && pending_ack_keys(&b_buffer).is_empty()
        })
        .await;
    assert!(central.submitted_at(&alarm).unwrap() < central.acknowledged_at(key).unwrap());
    let acks = central
        .received()
        .iter()
        .filter(|r| matches!(r, Received::Ack { .. }))
        .count();
    assert_eq!(acks, 1, "{:?}", central.received());
    standby.shut_down().await;
    central_stop.cancel();
}

/// An acknowledgement the standby never saw is handed over: the active acknowledges while its
/// standby is away and central unreachable, then stops; once the standby was promoted, the old
/// active comes back, steps down and hands it over, and the new active sends it to central.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handover_carries_the_pending_acknowledgement() {
    let central_port = Reserved::new();
    let mut pair = PairRig::new(central_port.addr);
    let mut a = pair.start(Node::A).await;
    let mut b = pair.start(Node::B).await;
    let (a_buffer, b_buffer) = pair.buffers();
    b.wait_for("b to follow a", |s| s.active_node == "a").await;
    pair.stop(Node::B, b).await;

    let key = "pump7.trip";
    a.acknowledge(key, "Jo").await.unwrap();
    pair.stop(Node::A, a).await;
    assert_eq!(pending_ack_keys(&a_buffer), [key]);
    assert!(pending_ack_keys(&b_buffer).is_empty());

    let mut b = pair.start(Node::B).await;
    b.promote().await;
    let mut a = pair.start(Node::A).await;
    eventually("a's acknowledgement to be handed over", || {
        pending_ack_keys(&b_buffer) == [key]
    })
    .await;
    a.wait_for("a to follow b", |s| s.active_node == "b").await;

    let central = FakeCentral::default();
    let central_stop = serve_central_at(central_port, central.clone()).await;
    central
        .wait_for("the acknowledgement", |c| c.acknowledged_at(key).is_some())
        .await;
    assert!(central.received().contains(&Received::Ack {
        key: key.into(),
        site: "site-a".into(),
        actor: "Jo".into(),
    }));
    eventually("both nodes to forget it", || {
        pending_ack_keys(&b_buffer).is_empty() && pending_ack_keys(&a_buffer).is_empty()
    })
    .await;
    a.shut_down().await;
    b.shut_down().await;
    central_stop.cancel();
}
