//! `NotificationOutbox`: the admin API for UI backends, outboxctl and grpcurl. This issue serves
//! `GetNotificationStatus`; the rest of the service follows.

use std::sync::Arc;

use outbox_proto::v1::notification_outbox_server::NotificationOutbox;
use outbox_proto::v1::{self, GetNotificationStatusRequest, NotificationStatusView};
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

    async fn query_notifications(
        &self,
        _request: Request<v1::QueryNotificationsRequest>,
    ) -> Result<Response<v1::QueryNotificationsResponse>, Status> {
        Err(Status::unimplemented("not yet"))
    }

    async fn get_notification_detail(
        &self,
        _request: Request<v1::GetNotificationDetailRequest>,
    ) -> Result<Response<v1::NotificationDetail>, Status> {
        Err(Status::unimplemented("not yet"))
    }

    async fn retry_notification(
        &self,
        _request: Request<v1::RetryNotificationRequest>,
    ) -> Result<Response<v1::NotificationStatusView>, Status> {
        Err(Status::unimplemented("not yet"))
    }

    async fn discard_notification(
        &self,
        _request: Request<v1::DiscardNotificationRequest>,
    ) -> Result<Response<v1::NotificationStatusView>, Status> {
        Err(Status::unimplemented("not yet"))
    }

    async fn retry_notifications(
        &self,
        _request: Request<v1::BulkActionRequest>,
    ) -> Result<Response<v1::BulkActionResponse>, Status> {
        Err(Status::unimplemented("not yet"))
    }

    async fn discard_notifications(
        &self,
        _request: Request<v1::BulkActionRequest>,
    ) -> Result<Response<v1::BulkActionResponse>, Status> {
        Err(Status::unimplemented("not yet"))
    }

    async fn get_kpis(
        &self,
        _request: Request<v1::GetKpisRequest>,
    ) -> Result<Response<v1::GetKpisResponse>, Status> {
        Err(Status::unimplemented("not yet"))
    }

    async fn list_notification_lists(
        &self,
        _request: Request<v1::ListNotificationListsRequest>,
    ) -> Result<Response<v1::ListNotificationListsResponse>, Status> {
        Err(Status::unimplemented("not yet"))
    }

    async fn get_notification_list(
        &self,
        _request: Request<v1::GetNotificationListRequest>,
    ) -> Result<Response<v1::NotificationList>, Status> {
        Err(Status::unimplemented("not yet"))
    }

    async fn upsert_notification_list(
        &self,
        _request: Request<v1::UpsertNotificationListRequest>,
    ) -> Result<Response<v1::NotificationList>, Status> {
        Err(Status::unimplemented("not yet"))
    }

    async fn delete_notification_list(
        &self,
        _request: Request<v1::DeleteNotificationListRequest>,
    ) -> Result<Response<v1::DeleteNotificationListResponse>, Status> {
        Err(Status::unimplemented("not yet"))
    }

    async fn get_smtp_config(
        &self,
        _request: Request<v1::GetSmtpConfigRequest>,
    ) -> Result<Response<v1::SmtpConfig>, Status> {
        Err(Status::unimplemented("not yet"))
    }

    async fn upsert_smtp_config(
        &self,
        _request: Request<v1::UpsertSmtpConfigRequest>,
    ) -> Result<Response<v1::SmtpConfig>, Status> {
        Err(Status::unimplemented("not yet"))
    }

    async fn delete_smtp_config(
        &self,
        _request: Request<v1::DeleteSmtpConfigRequest>,
    ) -> Result<Response<v1::DeleteSmtpConfigResponse>, Status> {
        Err(Status::unimplemented("not yet"))
    }
}
