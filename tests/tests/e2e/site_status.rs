//! Final statuses back down to the site: central tells the site-forwarder (a real process)
//! what became of its notifications over the link the site holds; a script's `WatchStatus`
//! sees Delivered (with whom) and a parked one's reason without polling, and `GetStatus`
//! answers from the site with central stopped. (A pair's standby knows them too: `pair`.)

use std::time::Duration;

use outbox_proto::v1;
use outbox_proto::v1::site_notify_client::SiteNotifyClient;
use outbox_tests::smtp_sink::Behaviour;
use tonic::transport::Channel;

use crate::harness::{
    Central, DEADLINE, RECIPIENTS, central_config, channel, send_request, smtp_sink, spawn_site,
};

/// Reads `stream` until a view of `id` with `status` arrives (earlier ones, such as the
/// FORWARDING it starts with, are skipped); panics after [`DEADLINE`].
pub(crate) async fn next_with_status(
    stream: &mut tonic::Streaming<v1::NotificationStatusView>,
    id: &str,
    status: v1::NotificationStatus,
) -> v1::NotificationStatusView {
    let found = tokio::time::timeout(DEADLINE, async {
        loop {
            let view = stream
                .message()
                .await
                .expect("the watch stream stays open")
                .expect("the watch stream does not end");
            if view.notification_id == id && view.status == i32::from(status) {
                return view;
            }
        }
    })
    .await;
    found.unwrap_or_else(|_| panic!("{id} did not reach {status:?} within {DEADLINE:?}"))
}

pub(crate) async fn watch(
    client: &mut SiteNotifyClient<Channel>,
    ids: &[&str],
    keys: &[&str],
) -> tonic::Streaming<v1::NotificationStatusView> {
    client
        .watch_status(v1::WatchStatusRequest {
            notification_ids: ids.iter().map(|s| (*s).to_owned()).collect(),
            condition_keys: keys.iter().map(|s| (*s).to_owned()).collect(),
            all: false,
        })
        .await
        .unwrap()
        .into_inner()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_script_watches_its_outcomes_and_the_site_answers_for_them_with_central_down() {
    let dir = tempfile::tempdir().unwrap();
    let sink = smtp_sink().await;
    // A 550 is permanent: the refused one parks at its first attempt.
    let central = Central::start(central_config(dir.path(), Some(sink.addr()))).await;
    let (site, addr) = spawn_site(dir.path(), "site-a", central.addr).await;
    let mut client = SiteNotifyClient::new(channel(addr).await);

    let delivered = client
        .send(send_request("tank 4 high", "level 97%"))
        .await
        .unwrap()
        .into_inner()
        .notification_id;
    let mut stream = watch(&mut client, &[&delivered], &[]).await;
    let view = next_with_status(&mut stream, &delivered, v1::NotificationStatus::Delivered).await;
    // Whom it went to, and when central decided it.
    for recipient in RECIPIENTS {
        assert!(view.delivered_to.contains(recipient), "{view:?}");
    }
    assert!(view.resolved_at.is_some(), "{view:?}");
    assert!(view.deliver_after.is_none(), "not scheduled: {view:?}");
    assert_eq!(view.subject, "tank 4 high");
    assert_eq!(view.list_name, crate::harness::LIST);

    // A keyed one the relay refuses: a watch on its condition key sees its reason.
    sink.set_behaviour(Behaviour::RejectRcpt {
        code: 550,
        text: "5.1.1 no such mailbox".into(),
    });
    let mut by_key = watch(&mut client, &[], &["pump7.trip"]).await;
    let mut request = send_request("pump 7 tripped", "motor overload");
    request.condition_key = "pump7.trip".into();
    let parked = client
        .send(request)
        .await
        .unwrap()
        .into_inner()
        .notification_id;
    let view = next_with_status(&mut by_key, &parked, v1::NotificationStatus::Parked).await;
    assert!(view.last_error.contains("550"), "{view:?}");
    assert!(view.delivered_to.is_empty(), "{view:?}");
    assert_eq!(view.condition_key, "pump7.trip");

    // A bad request is refused by name.
    let refused = client
        .watch_status(v1::WatchStatusRequest {
            notification_ids: vec!["not-a-uuid".into()],
            condition_keys: vec![],
            all: false,
        })
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::InvalidArgument);
    assert!(
        refused.message().starts_with("notification_ids"),
        "{}",
        refused.message()
    );

    // Central stops: the site still knows both outcomes, as central decided them.
    central.stop().await;
    for (id, status) in [
        (&delivered, v1::NotificationStatus::Delivered),
        (&parked, v1::NotificationStatus::Parked),
    ] {
        let view = client
            .get_status(v1::GetNotificationStatusRequest {
                notification_id: id.clone(),
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(view.status, i32::from(status), "{view:?}");
        assert!(view.resolved_at.is_some());
    }
    // One central never decided is unknown at the site, and central cannot be asked.
    let unknown = client
        .get_status(v1::GetNotificationStatusRequest {
            notification_id: uuid::Uuid::now_v7().to_string(),
        })
        .await
        .unwrap_err();
    assert_eq!(unknown.code(), tonic::Code::Unavailable, "{unknown:?}");
    // A watch opened now answers from the site at once.
    let mut late = watch(&mut client, &[&delivered], &[]).await;
    let view = tokio::time::timeout(Duration::from_secs(10), late.message())
        .await
        .expect("answered from the site")
        .unwrap()
        .unwrap();
    assert_eq!(view.status, i32::from(v1::NotificationStatus::Delivered));
    site.kill9().await;
}
