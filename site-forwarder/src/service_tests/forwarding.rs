//! Forwarding: delete only on ack, rejections set aside, buffering while central is away and
//! resending after a broken stream, the priority and a schedule kept, bad input refused.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forwards_deletes_on_ack_and_sets_rejections_aside() {
    let central = FakeCentral::default();
    let (central_addr, central_stop) = serve_central(central.clone()).await;
    let mut site = start_site(central_addr).await;

    let a = site.send("first").await;
    let b = site.send("second").await;
    let bad = site.send("please reject").await;
    // last_forward_at is stamped just after the buffer commit the depth shows: wait for both.
    let stats = site
        .wait_for("the buffer to drain", |s| {
            s.depth == 0 && s.rejected == 1 && s.last_forward_at.is_some()
        })
        .await;
    assert!(stats.central_reachable);
    let mut expected = vec![a.clone(), b];
    expected.sort();
    assert_eq!(central.stored_ids(), expected);
    let stored = central.stored.lock().unwrap().get(&a).cloned().unwrap();
    assert_eq!(stored.source_site_id, "site-a");
    assert_eq!(stored.source_script, "tank.py");
    assert!(stored.site_enqueued_at.is_some());

    // Forwarded: central answers. Rejected: the local reason. Unknown: central's NOT_FOUND.
    let view = site.status(&a).await.unwrap();
    assert_eq!(view.status, i32::from(NotificationStatus::Pending));
    let err = site.status(&bad).await.unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition);
    assert_eq!(
        err.message(),
        "rejected by central: list_name: no such list"
    );
    let unknown = crate::domain::NotificationId::generate().to_string();
    assert_eq!(
        site.status(&unknown).await.unwrap_err().code(),
        Code::NotFound
    );
    let err = site.status("not-a-uuid").await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().starts_with("notification_id:"));

    site.shut_down().await;
    central_stop.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn buffers_while_central_is_away_and_resends_after_a_broken_stream() {
    // Central's port, held and refusing until central comes.
    let central_port = Reserved::new();
    let central_addr = central_port.addr;
    let mut site = start_site(central_addr).await;

    let first = site.send("first").await;
    let forwarding = site.status(&first).await.unwrap();
    assert_eq!(forwarding.status, i32::from(NotificationStatus::Forwarding));
    assert_eq!(forwarding.list_name, "ops");
    assert_eq!(forwarding.source_site_id, "site-a");
    let unknown = crate::domain::NotificationId::generate().to_string();
    let err = site.status(&unknown).await.unwrap_err();
    assert_eq!(err.code(), Code::Unavailable);
    assert!(
        err.message().starts_with(&format!(
            "central outbox at http://{central_addr} is unreachable"
        )),
        "{}",
        err.message()
    );
    let second = site.send("second").await;
    let stats = site.stats().await;
    assert_eq!(stats.depth, 2);
    assert!(!stats.central_reachable);
    assert!(stats.oldest_enqueued_at.is_some());

    // Central comes back, but its first stream breaks after one unacked submit.
    let central = FakeCentral::default();
    central.break_first_stream.store(true, Ordering::SeqCst);
    let central_stop = serve_central_at(central_port, central.clone()).await;

    site.wait_for("the buffer to drain", |s| s.depth == 0).await;
    let mut expected = vec![first.clone(), second];
    expected.sort();
    assert_eq!(central.stored_ids(), expected);
    let seen = central.submits_seen.lock().unwrap().clone();
    assert!(
        seen.iter().filter(|id| **id == first).count() >= 2,
        "the unacked submit was resent: {seen:?}"
    );

    site.shut_down().await;
    central_stop.cancel();
}

/// The priority a script gives reaches central unchanged (none given: normal), and the site
/// shows it while the notification waits in the buffer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_priority_is_shown_while_buffered_and_forwarded_to_central() {
    let central_port = Reserved::new();
    let central_addr = central_port.addr;
    let mut site = start_site(central_addr).await;

    let mut urgent = send_request("urgent");
    urgent.priority = NotificationPriority::Critical.into();
    let critical = site.client.send(urgent).await.unwrap().into_inner();
    let normal = site.send("unspecified").await;
    let view = site.status(&critical.notification_id).await.unwrap();
    assert_eq!(view.status(), NotificationStatus::Forwarding);
    assert_eq!(view.priority(), NotificationPriority::Critical);
    let view = site.status(&normal).await.unwrap();
    assert_eq!(view.priority(), NotificationPriority::Normal);

    let central = FakeCentral::default();
    let central_stop = serve_central_at(central_port, central.clone()).await;
    site.wait_for("the buffer to drain", |s| s.depth == 0).await;
    let stored = central.stored.lock().unwrap().clone();
    assert_eq!(
        stored[&critical.notification_id].priority(),
        NotificationPriority::Critical
    );
    assert_eq!(stored[&normal].priority(), NotificationPriority::Normal);

    site.shut_down().await;
    central_stop.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn send_rejects_bad_input_and_buffers_nothing() {
    let central = Reserved::new();
    let mut site = start_site(central.addr).await;

    let mut bad_subject = send_request("x");
    bad_subject.subject = "hi\r\nBcc: victim@example.com".into();
    let mut bad_type = send_request("x");
    bad_type.r#type = 42;
    let mut bad_priority = send_request("x");
    bad_priority.priority = 42;
    let mut too_far = send_request("x");
    too_far.deliver_after = Some(outbox_proto::time::to_timestamp(
        chrono::Utc::now() + chrono::Duration::days(41),
    ));
    for (request, field) in [
        (bad_subject, "subject"),
        (bad_type, "type"),
        (bad_priority, "priority"),
        (too_far, "deliver_after"),
    ] {
        let err = site.client.send(request).await.unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument);
        assert!(err.message().starts_with(&format!("{field}: ")), "{err:?}");
    }
    assert_eq!(site.stats().await.depth, 0);
    site.shut_down().await;
}

/// A scheduled Send is buffered and forwarded at once with its time (central, not the site,
/// holds it until then); while buffered, GetStatus shows when it is scheduled for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scheduled_send_shows_its_time_while_buffered_and_reaches_central_with_it() {
    let central_port = Reserved::new();
    let central_addr = central_port.addr;
    let mut site = start_site(central_addr).await;

    let due = chrono::Utc::now() + chrono::Duration::hours(8);
    let request = SendRequest {
        deliver_after: Some(outbox_proto::time::to_timestamp(due)),
        ..send_request("shift handover")
    };
    let id = site
        .client
        .send(request)
        .await
        .unwrap()
        .into_inner()
        .notification_id;
    let buffered = site.status(&id).await.unwrap();
    assert_eq!(buffered.status(), NotificationStatus::Forwarding);
    let shown = buffered
        .deliver_after
        .as_ref()
        .and_then(outbox_proto::time::from_timestamp)
        .unwrap();
    assert_eq!(shown.timestamp_millis(), due.timestamp_millis());

    let central = FakeCentral::default();
    let _central_stop = serve_central_at(central_port, central.clone()).await;
    site.wait_for("the row forwarded", |s| s.depth == 0).await;
    let stored = central.stored.lock().unwrap().get(&id).cloned().unwrap();
    assert_eq!(stored.deliver_after, buffered.deliver_after);
    site.shut_down().await;
}
