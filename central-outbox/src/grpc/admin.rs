//! `NotificationOutbox`: the admin API for UI backends, outboxctl and grpcurl. This issue serves
//! `GetNotificationStatus`; the rest of the service follows.

use std::sync::Arc;

use outbox_proto::v1::notification_outbox_server::NotificationOutbox;
use outbox_proto::v1::{GetNotificationStatusRequest, NotificationStatusView};
use tonic::{Request, Response, Status};

use super::{convert, invalid_argument, store_status};
use crate::domain::NotificationId;
use crate::store::OutboxStore;

pub struct OutboxService<S> {
    store: Arc<S>,
}

impl<S> OutboxService<S> {
    pub fn new(store: Arc<S>) -> Self {
        Self { store }
    }
}

#[tonic::async_trait]
impl<S: OutboxStore> NotificationOutbox for OutboxService<S> {
    async fn get_notification_status(
        &self,
        request: Request<GetNotificationStatusRequest>,
    ) -> Result<Response<NotificationStatusView>, Status> {
        let id = NotificationId::parse(&request.into_inner().notification_id, "notification_id")
            .map_err(invalid_argument)?;
        match self.store.state(id).await.map_err(store_status)? {
            Some(state) => Ok(Response::new(convert::state_view(state))),
            None => Err(Status::not_found(format!(
                "notification {id} is not known to central"
            ))),
        }
    }
}
