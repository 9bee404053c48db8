//! `ClearCondition` across a pair: the standby gets the marks and the pending clears, a promoted
//! standby sends the clear the active left, and a hand-over carries it.

use super::*;

/// The standby's copy follows the clears: rows a clear marks while it follows are copied again
/// marked, and so are rows marked while it was away, once it resumes. A standby refuses a clear
/// as it refuses a Send: only the active's clears reach central.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_gets_the_marks_of_a_clear_live_and_after_a_resume() {
    let central = Reserved::new();
    let mut pair = PairRig::new(central.addr);
    let mut active = pair.start(Node::A).await;
    let mut standby = pair.start(Node::B).await;
    let (a_buffer, b_buffer) = pair.buffers();

    let high = [
        active.send_keyed("high", "tank4.level.high").await,
        active.send_keyed("still high", "tank4.level.high").await,
    ];
    let pump = active.send_keyed("pump stopped", "pump7.running").await;
    standby
        .wait_for("the rows to be copied", |s| s.depth == 3)
        .await;
    assert!(marked_ids(&b_buffer).is_empty());
    assert_eq!(active.clear("tank4.level.high").await.unwrap(), 2);
    let expected: std::collections::BTreeSet<String> = high.iter().cloned().collect();
    eventually("the standby to copy the marks", || {
        marked_ids(&b_buffer) == expected
    })
    .await;
    // The clear's list goes with its marks or before them.
    assert_eq!(pending_clears(&b_buffer), pending_clears(&a_buffer));
    assert_eq!(
        pending_clear_keys(&b_buffer),
        vec!["tank4.level.high".to_owned()]
    );
    let err = standby.clear("tank4.level.high").await.unwrap_err();
    assert_eq!(err.code(), Code::Unavailable);
    assert!(err.message().contains("standby"), "{err:?}");
    assert_eq!(pending_clears(&b_buffer), pending_clears(&a_buffer));

    // Marked while the standby is away: a resume copies the marks it missed.
    pair.stop(Node::B, standby).await;
    assert_eq!(active.clear("pump7.running").await.unwrap(), 1);
    let mut standby = pair.start(Node::B).await;
    let mut expected = expected;
    expected.insert(pump);
    eventually("the resumed standby to copy the marks", || {
        marked_ids(&b_buffer) == expected
    })
    .await;
    assert_eq!(marked_ids(&a_buffer), expected);
    assert_eq!(buffered_ids(&b_buffer), buffered_ids(&a_buffer));
    assert_eq!(pending_clears(&b_buffer), pending_clears(&a_buffer));
    assert_eq!(pending_clear_keys(&b_buffer).len(), 2);
    assert_eq!(standby.stats().await.depth, 3);
    standby.shut_down().await;
    active.shut_down().await;
}

impl Site {
    /// Promotes this node (a standby) through its API, as an operator would.
    pub(super) async fn promote(&mut self) {
        let view = self
            .client
            .promote(v1::PromoteRequest {})
            .await
            .unwrap()
            .into_inner();
        assert_eq!(view.role(), v1::NodeRole::Active);
    }
}

impl FakeCentral {
    /// How many clears of `key` central applied.
    fn clears_of(&self, key: &str) -> usize {
        self.received()
            .iter()
            .filter(|r| matches!(r, Received::Clear { key: seen, .. } if seen == key))
            .count()
    }

    /// Central applied the clear of `key` after it received every one of `before` (marked
    /// cleared or not, as `marked` says) and before any of `after`.
    fn assert_cleared_between(&self, key: &str, before: &[(&String, bool)], after: &[&String]) {
        let clear = self.cleared_at(key).expect("central applied the clear");
        let stored = self.stored.lock().unwrap().clone();
        for (id, marked) in before {
            let at = self.submitted_at(id).expect("submitted");
            assert!(at < clear, "{id} before the clear: {:?}", self.received());
            assert_eq!(stored[*id].cleared_at_site.is_some(), *marked, "{id}");
        }
        for id in after {
            let at = self.submitted_at(id).expect("submitted");
            assert!(at > clear, "{id} after the clear: {:?}", self.received());
            assert_eq!(stored[*id].cleared_at_site, None, "{id} is not cleared");
        }
    }
}

/// A clear on the active while central is unreachable: the standby holds the same pending clear
/// (key, watermark, time) beside the same rows. The active is stopped for good and the standby
/// promoted: once central is back, the new active forwards the rows buffered before the clear
/// (the marked one as cleared), then asks central to clear the key, once, and only then
/// forwards the row of the key sent after the clear.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_promoted_standby_sends_the_clear_the_active_left_pending() {
    let central_port = Reserved::new();
    let mut pair = PairRig::new(central_port.addr);
    let mut active = pair.start(Node::A).await;
    let mut standby = pair.start(Node::B).await;
    let (a_buffer, b_buffer) = pair.buffers();
    let key = "tank4.level.high";
    let high = active.send_keyed("high", key).await;
    let plain = active.send("plain").await;
    assert_eq!(active.clear(key).await.unwrap(), 1);
    let again = active.send_keyed("high again", key).await;
    standby
        .wait_for("the rows to be copied", |s| s.depth == 3)
        .await;
    eventually("the standby to hold the pending clear", || {
        pending_clear_keys(&b_buffer) == [key]
    })
    .await;
    let on_the_active = pending_clears(&a_buffer);
    assert_eq!(pending_clears(&b_buffer), on_the_active);

    active.shut_down().await;
    standby.promote().await;
    let central = FakeCentral::default();
    let central_stop = serve_central_at(central_port, central.clone()).await;
    standby
        .wait_for("the new active to drain", |s| {
            s.depth == 0 && pending_clear_keys(&b_buffer).is_empty()
        })
        .await;
    central.assert_cleared_between(key, &[(&high, true), (&plain, false)], &[&again]);
    assert_eq!(central.clears_of(key), 1);
    assert!(pending_clears(&b_buffer).is_empty());
    standby.shut_down().await;
    central_stop.cancel();
}

/// A clear central applied leaves the standby too: the active's list replaces the standby's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clear_central_applied_leaves_the_standby() {
    let central_port = Reserved::new();
    let mut pair = PairRig::new(central_port.addr);
    let mut active = pair.start(Node::A).await;
    let mut standby = pair.start(Node::B).await;
    let (a_buffer, b_buffer) = pair.buffers();
    active.send_keyed("high", "tank4.level.high").await;
    active.clear("tank4.level.high").await.unwrap();
    active.clear("pump7.running").await.unwrap();
    eventually("the standby to hold both pending clears", || {
        pending_clear_keys(&b_buffer).len() == 2
    })
    .await;
    assert_eq!(pending_clears(&b_buffer), pending_clears(&a_buffer));

    let central = FakeCentral::default();
    let central_stop = serve_central_at(central_port, central.clone()).await;
    active
        .wait_for("the active to finish", |s| {
            s.depth == 0 && pending_clear_keys(&a_buffer).is_empty()
        })
        .await;
    standby
        .wait_for("the standby to follow", |s| {
            s.depth == 0 && pending_clear_keys(&b_buffer).is_empty()
        })
        .await;
    assert!(pending_clears(&b_buffer).is_empty());
    assert_eq!(central.clears_of("tank4.level.high"), 1);
    assert_eq!(central.clears_of("pump7.running"), 1);
    standby.shut_down().await;
    active.shut_down().await;
    central_stop.cancel();
}

/// A clear the standby never saw is handed over. The active clears a key while its standby is
/// away and central unreachable, then stops; the standby is promoted and takes a Send of the
/// key. The old active comes back, steps down and hands its rows and its pending clear over:
/// the new active asks central to clear the key at once, before the rows of the key sent after
/// the clear, on either node (the row the clear marked arrives cleared whenever it goes). The
/// old active, now its standby, ends with the new active's pending clears, then none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handover_carries_the_pending_clear() {
    let central_port = Reserved::new();
    let mut pair = PairRig::new(central_port.addr);
    let mut a = pair.start(Node::A).await;
    let mut b = pair.start(Node::B).await;
    let (a_buffer, b_buffer) = pair.buffers();
    b.wait_for("b to follow a", |s| s.active_node == "a").await;
    pair.stop(Node::B, b).await;

    let key = "tank4.level.high";
    let high = a.send_keyed("high", key).await;
    assert_eq!(a.clear(key).await.unwrap(), 1);
    let again_on_a = a.send_keyed("high again", key).await;
    pair.stop(Node::A, a).await;
    let on_a = pending_clears(&a_buffer);
    assert_eq!(pending_clear_keys(&a_buffer), [key]);
    assert!(pending_clear_keys(&b_buffer).is_empty());

    let mut b = pair.start(Node::B).await;
    b.promote().await;
    let again_on_b = b.send_keyed("high on b", key).await;
    let mut a = pair.start(Node::A).await;
    b.wait_for("a's rows and clear to be handed over", |s| {
        s.depth == 3 && pending_clear_keys(&b_buffer).len() == 1
    })
    .await;
    let handed = pending_clears(&b_buffer);
    assert_eq!(
        handed,
        vec![(key.to_owned(), 0, on_a[0].2)],
        "due at once on the new active, as cleared on the old one"
    );
    a.wait_for("a to follow b", |s| s.active_node == "b" && s.depth == 3)
        .await;
    eventually("a to hold b's pending clears", || {
        pending_clears(&a_buffer) == handed
    })
    .await;

    let central = FakeCentral::default();
    let central_stop = serve_central_at(central_port, central.clone()).await;
    b.wait_for("b to drain", |s| {
        s.depth == 0 && pending_clear_keys(&b_buffer).is_empty()
    })
    .await;
    // The row the clear marked arrives cleared, before or after the clear alike.
    central.assert_cleared_between(key, &[], &[&again_on_a, &again_on_b]);
    assert!(
        central.stored.lock().unwrap()[&high]
            .cleared_at_site
            .is_some()
    );
    assert_eq!(central.clears_of(key), 1);
    a.wait_for("a to follow", |s| {
        s.depth == 0 && pending_clear_keys(&a_buffer).is_empty()
    })
    .await;
    a.shut_down().await;
    b.shut_down().await;
    central_stop.cancel();
}
