//! The site's client of central's status API (`NotificationOutbox.GetNotificationStatus`):
//! `GetStatus` asks central about a notification that is no longer in the buffer. Beside
//! `link` (which builds the endpoint) rather than in the gRPC edge: it is an outgoing link,
//! and its channel is shared with the health reports (`crate::health_report`).

use std::time::Duration;

use outbox_proto::v1::notification_outbox_client::NotificationOutboxClient;
use outbox_proto::v1::{GetNotificationStatusRequest, NotificationStatusView};
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Request, Status};

use crate::domain::NotificationId;
use crate::link::error_chain;

/// Central's status API as the forwarder uses it: one lazily connected channel (tonic reconnects
/// it as needed) and a bounded wait per call.
#[derive(Debug, Clone)]
pub(crate) struct CentralStatus {
    client: NotificationOutboxClient<Channel>,
    /// The channel under `client`, shared with the health reports (`crate::health_report`), so
    /// a node keeps one connection to central besides its submit stream.
    channel: Channel,
    url: String,
    timeout: Duration,
}

impl CentralStatus {
    pub(crate) fn new(endpoint: &Endpoint, url: String, timeout: Duration) -> Self {
        let channel = endpoint.connect_lazy();
        Self {
            client: NotificationOutboxClient::new(channel.clone()),
            channel,
            url,
            timeout,
        }
    }

    /// The lazily connected channel to central these lookups use.
    pub(crate) fn channel(&self) -> Channel {
        self.channel.clone()
    }

    fn unreachable(&self, detail: impl std::fmt::Display) -> Status {
        Status::unavailable(format!(
            "central outbox at {} is unreachable: {detail}",
            self.url
        ))
    }

    /// Central's answer, passed through; transport failures and timeouts become UNAVAILABLE
    /// with a message naming central.
    pub(crate) async fn status(
        &self,
        id: NotificationId,
    ) -> Result<NotificationStatusView, Status> {
        let mut request = Request::new(GetNotificationStatusRequest {
            notification_id: id.to_string(),
        });
        // Tells central the deadline too, so it stops working on an answer nobody awaits.
        request.set_timeout(self.timeout);
        let mut client = self.client.clone();
        match tokio::time::timeout(self.timeout, client.get_notification_status(request)).await {
            Err(_) => Err(self.unreachable(format!("no answer within {:?}", self.timeout))),
            Ok(Ok(view)) => Ok(view.into_inner()),
            // Connection refused/reset, DNS failure and the like surface as these codes.
            Ok(Err(status))
                if matches!(
                    status.code(),
                    Code::Unavailable | Code::DeadlineExceeded | Code::Cancelled | Code::Unknown
                ) =>
            {
                let mut detail = status.message().to_owned();
                // The message is terse ("tcp connect error"); the source says why.
                if let Some(source) = std::error::Error::source(&status) {
                    let cause = error_chain(source);
                    if !detail.contains(&cause) {
                        detail = format!("{detail}: {cause}");
                    }
                }
                Err(self.unreachable(detail))
            }
            // Central's own answer (NOT_FOUND, INVALID_ARGUMENT, ...): code and message only,
            // not central's response metadata.
            Ok(Err(status)) => Err(Status::new(status.code(), status.message())),
        }
    }
}
