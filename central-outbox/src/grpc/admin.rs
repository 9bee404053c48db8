//! `NotificationOutbox`: the admin API for UI backends, outboxctl and grpcurl. Each handler first
//! asks `auth` whether the caller's role allows the call (and who the actor is), then validates
//! (through `admin_convert`), calls the store once, and answers. A reader whose role does not
//! see webhook URLs whole (viewers, and sites reading their own notifications' status) gets
//! them cut to scheme, host and port in every answer that carries one: lists, LastError,
//! "Delivered to" and attempt errors. The console calls this service, so its pages show the
//! same.

use crate::config_cache::ConfigCache;
use std::sync::Arc;

use chrono::Utc;
use outbox_proto::time::{to_duration, to_timestamp};
use outbox_proto::v1::notification_outbox_server::NotificationOutbox;
use outbox_proto::v1::{self, GetNotificationStatusRequest, NotificationStatusView};
use tokio::sync::Notify;
use tonic::{Request, Response, Status};

use super::{admin_convert, convert, incident_convert, invalid_argument, store_status};
use crate::auth::{AdminRpc, Authenticator, StatusReader};
use crate::domain::channel::{NotificationList, WebhookSettings};
use crate::domain::escalation::{AckMeans, AckResult, Acknowledgement, IncidentId};
use crate::domain::history::{ActionRefusal, Actor, OperatorAction};
use crate::domain::kpi::KpiSettings;
use crate::domain::query::{Cursor, PageRequest};
use crate::domain::{ContentError, ListName, NotificationId};
use crate::kpi_gauges::KpiGauges;
use crate::on_fallback::FailoverBoard;
use crate::records::NotificationState;
use crate::store::{AdminStore, ChannelSettingsStore, EscalationStore};

/// Most notifications one bulk call may name or change.
pub(crate) const MAX_BULK: usize = 1000;

pub(crate) struct OutboxService<S> {
    store: Arc<S>,
    kpis: KpiSettings,
    /// Wakes the dispatcher when a retry makes rows due.
    wake: Arc<Notify>,
    /// The dispatcher's copy of lists and SMTP settings, dropped on every change made here.
    config: Arc<ConfigCache>,
    auth: Authenticator,
    /// A site node silent this long is offline (`site_offline_after`).
    site_offline_after: std::time::Duration,
    /// The figures `/metrics` shows, shared with `GetKpis` calls that accept figures a second old
    /// (`max_age`; every console tab refreshing its tiles), so those read the database at most
    /// once a second together; `None`: each call reads it.
    kpi_cache: Option<Arc<KpiGauges>>,
    /// What this node's dispatcher delivers through fallback providers (`GetKpis.failover`);
    /// `None`: no dispatcher here, which `GetKpis` reports as not dispatching.
    on_fallback: Option<Arc<FailoverBoard>>,
    /// Whether `status_callbacks.key` is configured: without it no list may name a status
    /// callback, since its calls could not be signed.
    can_sign_callbacks: bool,
}

impl<S> OutboxService<S> {
    pub(crate) fn new(
        store: Arc<S>,
        kpis: KpiSettings,
        wake: Arc<Notify>,
        config: Arc<ConfigCache>,
        auth: Authenticator,
    ) -> Self {
        Self {
            store,
            kpis,
            wake,
            config,
            auth,
            site_offline_after: crate::config::DEFAULT_SITE_OFFLINE_AFTER,
            kpi_cache: None,
            on_fallback: None,
            can_sign_callbacks: false,
        }
    }

    /// Lets lists name a status callback: `status_callbacks.key` is configured.
    pub(crate) fn with_status_callback_key(mut self, configured: bool) -> Self {
        self.can_sign_callbacks = configured;
        self
    }

    /// Reports what `board` says this node delivers through fallbacks (`GetKpis.failover`).
    pub(crate) fn with_failover_board(mut self, board: Arc<FailoverBoard>) -> Self {
        self.on_fallback = Some(board);
        self
    }

    /// How long a site node may go unheard before it is offline.
    pub(crate) fn with_site_offline_after(mut self, after: std::time::Duration) -> Self {
        self.site_offline_after = after;
        self
    }

    /// Serves `GetKpis` from `cache` (see [`crate::kpi_gauges`]).
    pub(crate) fn with_kpi_cache(mut self, cache: Arc<KpiGauges>) -> Self {
        self.kpi_cache = Some(cache);
        self
    }

    /// The actor of a call to `rpc`, or why the caller may not make it.
    fn authorize<T>(&self, request: &Request<T>, rpc: AdminRpc) -> Result<Actor, Status> {
        let client_cn = crate::tls::client_common_name(request);
        self.auth.authorize(request, client_cn.as_deref(), rpc)
    }

    /// Whether the caller of a read, `rpc`, may make it and sees webhook URLs whole
    /// (`Role::sees_webhook_urls`), or why it may not make it.
    fn authorize_read<T>(&self, request: &Request<T>, rpc: AdminRpc) -> Result<Urls, Status> {
        let client_cn = crate::tls::client_common_name(request);
        let (_, role) = self.auth.authorize_as(request, client_cn.as_deref(), rpc)?;
        Ok(Urls::seen_by(role.sees_webhook_urls()))
    }

    fn view(&self, state: NotificationState) -> NotificationStatusView {
        let stuck = self
            .kpis
            .is_stuck(state.status, state.waiting_since(), Utc::now());
        convert::state_view(state, stuck)
    }

    fn filter_clock(&self) -> admin_convert::FilterClock {
        admin_convert::FilterClock::at(Utc::now(), self.kpis.stuck_age_threshold)
    }
}

/// How an answer shows webhook URLs to its reader.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Urls {
    Whole,
    /// Cut to scheme, host and port (`domain::webhook::cut_urls`).
    Cut,
}

impl Urls {
    fn seen_by(whole: bool) -> Self {
        if whole { Self::Whole } else { Self::Cut }
    }
}

fn not_found(id: NotificationId) -> Status {
    Status::not_found(format!("notification {id} is not known to central"))
}

fn refusal_reason(action: OperatorAction, refusal: ActionRefusal) -> String {
    match refusal {
        ActionRefusal::NotFound => "not found".into(),
        ActionRefusal::WrongStatus(status) => format!(
            "status is {}; only PARKED notifications can be {}",
            status.as_str().to_uppercase(),
            action.verb()
        ),
    }
}

fn parse_id(text: &str, field: &'static str) -> Result<NotificationId, Status> {
    NotificationId::parse(text, field).map_err(invalid_argument)
}

impl<S: AdminStore + ChannelSettingsStore> OutboxService<S> {
    async fn act_on_one(
        &self,
        action: OperatorAction,
        id: &str,
        actor: Actor,
    ) -> Result<Response<NotificationStatusView>, Status> {
        let id = parse_id(id, "notification_id")?;
        let mut results = self
            .store
            .act_on_ids(action, vec![id], actor.clone())
            .await
            .map_err(store_status)?;
        match results.pop() {
            Some(Ok(state)) => {
                tracing::info!(%id, actor = actor.as_str(), "notification {}", action.verb());
                if action == OperatorAction::Retry {
                    self.wake.notify_one();
                }
                Ok(Response::new(self.view(state)))
            }
            Some(Err(ActionRefusal::NotFound)) | None => Err(not_found(id)),
            Some(Err(refusal @ ActionRefusal::WrongStatus(_))) => Err(Status::failed_precondition(
                format!("notification {id}: {}", refusal_reason(action, refusal)),
            )),
        }
    }

    /// Refuses a policy whose step names a list that does not exist (other than the list being
    /// stored): its page would reach nobody. A list deleted later is skipped at the page, with
    /// a history row and a metric an alert watches.
    async fn check_step_lists(&self, list: &NotificationList) -> Result<(), Status> {
        let Some(policy) = &list.escalation else {
            return Ok(());
        };
        for (i, step) in policy.steps().iter().enumerate() {
            for name in &step.notify {
                if *name == list.name {
                    continue;
                }
                if self.store.list(name).await.map_err(store_status)?.is_none() {
                    return Err(invalid_argument(ContentError::new(
                        "list.escalation.steps",
                        format!(
                            "step {}: there is no notification list {:?}",
                            i + 2,
                            name.as_str()
                        ),
                    )));
                }
            }
        }
        Ok(())
    }

    /// What `act_on_ids` would answer now, changing nothing (a bulk dry run): each id's current
    /// state, refused as the action would refuse it. Each row is read on its own, so the answer
    /// is a moment's view, not a promise.
    async fn would_act_on_ids(
        &self,
        action: OperatorAction,
        ids: &[NotificationId],
    ) -> Result<Vec<crate::records::ActionResult>, Status> {
        let mut results = Vec::with_capacity(ids.len());
        let mut seen = std::collections::HashSet::new();
        for &id in ids {
            let state = self.store.state(id).await.map_err(store_status)?;
            results.push(match state {
                None => Err(ActionRefusal::NotFound),
                // An id named twice changes once: the real call finds it already changed.
                Some(_) if !seen.insert(id) => Err(ActionRefusal::WrongStatus(action.target())),
                Some(state) if state.status == OperatorAction::FROM => Ok(state),
                Some(state) => Err(ActionRefusal::WrongStatus(state.status)),
            });
        }
        Ok(results)
    }

    async fn act_in_bulk(
        &self,
        action: OperatorAction,
        actor: Actor,
        msg: v1::BulkActionRequest,
    ) -> Result<Response<v1::BulkActionResponse>, Status> {
        let limit = match msg.limit as usize {
            0 => MAX_BULK,
            n => n.min(MAX_BULK),
        };
        let response = match msg.selector {
            None => {
                return Err(invalid_argument(ContentError::new(
                    "selector",
                    "set ids or filter",
                )));
            }
            Some(v1::bulk_action_request::Selector::Ids(ids)) => {
                let given = ids.notification_ids;
                if given.is_empty() {
                    return Err(invalid_argument(ContentError::new(
                        "ids.notification_ids",
                        "must name at least one notification",
                    )));
                }
                if given.len() > MAX_BULK {
                    return Err(invalid_argument(ContentError::new(
                        "ids.notification_ids",
                        format!("{} given, at most {MAX_BULK} per call", given.len()),
                    )));
                }
                let parsed = given
                    .iter()
                    .map(|id| parse_id(id, "ids.notification_ids"))
                    .collect::<Result<Vec<_>, _>>()?;
                let results = if msg.dry_run {
                    self.would_act_on_ids(action, &parsed).await?
                } else {
                    self.store
                        .act_on_ids(action, parsed.clone(), actor.clone())
                        .await
                        .map_err(store_status)?
                };
                let mut response = v1::BulkActionResponse::default();
                for (id, result) in parsed.into_iter().zip(results) {
                    match result {
                        Ok(_) => response.changed_ids.push(id.to_string()),
                        Err(refusal) => response.skipped.push(v1::SkippedNotification {
                            notification_id: id.to_string(),
                            reason: refusal_reason(action, refusal),
                        }),
                    }
                }
                response
            }
            Some(v1::bulk_action_request::Selector::Filter(filter)) => {
                let filter =
                    admin_convert::action_filter(filter, msg.parked_before, self.filter_clock())
                        .map_err(invalid_argument)?;
                if msg.dry_run {
                    let count = self
                        .store
                        .count_on_filter(filter, limit)
                        .await
                        .map_err(store_status)?;
                    return Ok(Response::new(v1::BulkActionResponse {
                        changed: u32::try_from(count.matching).unwrap_or(u32::MAX),
                        more_matching: count.more_matching,
                        ..Default::default()
                    }));
                }
                let report = self
                    .store
                    .act_on_filter(action, filter, limit, actor.clone())
                    .await
                    .map_err(store_status)?;
                v1::BulkActionResponse {
                    changed_ids: report.changed.iter().map(ToString::to_string).collect(),
                    more_matching: report.more_matching,
                    ..Default::default()
                }
            }
        };
        let changed = response.changed_ids.len();
        if msg.dry_run {
            // Nothing changed: no log line, no dispatcher wake-up.
            return Ok(Response::new(v1::BulkActionResponse {
                changed: u32::try_from(changed).unwrap_or(u32::MAX),
                ..response
            }));
        }
        tracing::info!(
            changed,
            skipped = response.skipped.len(),
            actor = actor.as_str(),
            "bulk: notifications {}",
            action.verb()
        );
        if action == OperatorAction::Retry && changed > 0 {
            self.wake.notify_one();
        }
        Ok(Response::new(v1::BulkActionResponse {
            changed: u32::try_from(changed).unwrap_or(u32::MAX),
            ..response
        }))
    }
}

#[tonic::async_trait]
impl<S: AdminStore + ChannelSettingsStore + EscalationStore> NotificationOutbox
    for OutboxService<S>
{
    async fn query_notifications(
        &self,
        request: Request<v1::QueryNotificationsRequest>,
    ) -> Result<Response<v1::QueryNotificationsResponse>, Status> {
        let urls = self.authorize_read(&request, AdminRpc::QueryNotifications)?;
        let msg = request.into_inner();
        let filter =
            admin_convert::filter(msg.filter, self.filter_clock()).map_err(invalid_argument)?;
        let after = if msg.page_token.is_empty() {
            None
        } else {
            Some(Cursor::parse_token(&msg.page_token).map_err(invalid_argument)?)
        };
        let page = self
            .store
            .query(PageRequest {
                filter,
                after,
                size: PageRequest::page_size(msg.page_size),
            })
            .await
            .map_err(store_status)?;
        let mut notifications: Vec<_> = page.rows.into_iter().map(|s| self.view(s)).collect();
        if urls == Urls::Cut {
            notifications
                .iter_mut()
                .for_each(admin_convert::cut_state_urls);
        }
        Ok(Response::new(v1::QueryNotificationsResponse {
            notifications,
            next_page_token: page.next.map(Cursor::token).unwrap_or_default(),
        }))
    }

    async fn get_notification_status(
        &self,
        request: Request<GetNotificationStatusRequest>,
    ) -> Result<Response<NotificationStatusView>, Status> {
        let client_cn = crate::tls::client_common_name(&request);
        let reader = self
            .auth
            .authorize_status_read(&request, client_cn.as_deref())?;
        let id = parse_id(&request.into_inner().notification_id, "notification_id")?;
        match self.store.state(id).await.map_err(store_status)? {
            // A site sees only its own notifications; another's is "not known", as if absent.
            Some(state)
                if matches!(reader, StatusReader::Anyone(_))
                    || reader == StatusReader::Site(state.source_site_id.clone()) =>
            {
                let mut view = self.view(state);
                if !reader.sees_webhook_urls() {
                    admin_convert::cut_state_urls(&mut view);
                }
                Ok(Response::new(view))
            }
            _ => Err(not_found(id)),
        }
    }

    async fn get_notification_detail(
        &self,
        request: Request<v1::GetNotificationDetailRequest>,
    ) -> Result<Response<v1::NotificationDetail>, Status> {
        let urls = self.authorize_read(&request, AdminRpc::GetNotificationDetail)?;
        let id = parse_id(&request.into_inner().notification_id, "notification_id")?;
        let detail = self
            .store
            .detail(id)
            .await
            .map_err(store_status)?
            .ok_or_else(|| not_found(id))?;
        let stuck = self.kpis.is_stuck(
            detail.state.status,
            detail.state.waiting_since(),
            Utc::now(),
        );
        let mut view = admin_convert::detail_view(detail, stuck);
        if urls == Urls::Cut {
            admin_convert::cut_detail_urls(&mut view);
        }
        Ok(Response::new(view))
    }

    async fn retry_notification(
        &self,
        request: Request<v1::RetryNotificationRequest>,
    ) -> Result<Response<NotificationStatusView>, Status> {
        let actor = self.authorize(&request, AdminRpc::RetryNotification)?;
        let id = request.into_inner().notification_id;
        self.act_on_one(OperatorAction::Retry, &id, actor).await
    }

    async fn discard_notification(
        &self,
        request: Request<v1::DiscardNotificationRequest>,
    ) -> Result<Response<NotificationStatusView>, Status> {
        let actor = self.authorize(&request, AdminRpc::DiscardNotification)?;
        let id = request.into_inner().notification_id;
        self.act_on_one(OperatorAction::Discard, &id, actor).await
    }

    async fn retry_notifications(
        &self,
        request: Request<v1::BulkActionRequest>,
    ) -> Result<Response<v1::BulkActionResponse>, Status> {
        let actor = self.authorize(&request, AdminRpc::RetryNotifications)?;
        self.act_in_bulk(OperatorAction::Retry, actor, request.into_inner())
            .await
    }

    async fn discard_notifications(
        &self,
        request: Request<v1::BulkActionRequest>,
    ) -> Result<Response<v1::BulkActionResponse>, Status> {
        let actor = self.authorize(&request, AdminRpc::DiscardNotifications)?;
        self.act_in_bulk(OperatorAction::Discard, actor, request.into_inner())
            .await
    }

    async fn get_kpis(
        &self,
        request: Request<v1::GetKpisRequest>,
    ) -> Result<Response<v1::GetKpisResponse>, Status> {
        self.authorize(&request, AdminRpc::GetKpis)?;
        let max_age = request
            .get_ref()
            .max_age
            .and_then(|age| std::time::Duration::try_from(age).ok());
        let cached = match (&self.kpi_cache, max_age) {
            (Some(cache), Some(age)) if age >= crate::kpi_gauges::REUSE => cache.fresh().await,
            _ => None,
        };
        // Without fresh cached figures (no cache, or its query failed), the store answers: with
        // the figures, or with the error to return.
        let (now, kpis) = match cached {
            Some((at, figures)) => (at, figures.kpis.clone()),
            None => {
                let now = Utc::now();
                let kpis = self
                    .store
                    .kpis(self.kpis.at(now))
                    .await
                    .map_err(store_status)?;
                (now, kpis)
            }
        };
        Ok(Response::new(v1::GetKpisResponse {
            global: Some(admin_convert::kpi_values(&kpis.global)),
            sites: kpis
                .sites
                .iter()
                .map(|(site, values)| v1::SiteKpis {
                    source_site_id: site.clone(),
                    kpis: Some(admin_convert::kpi_values(values)),
                })
                .collect(),
            computed_at: Some(to_timestamp(now)),
            stuck_age_threshold: Some(to_duration(self.kpis.stuck_age_threshold)),
            delivered_kpi_window: Some(to_duration(self.kpis.delivered_window)),
            failover: Some(match &self.on_fallback {
                // A node that does not dispatch has moved nothing: nothing to show.
                Some(board) if board.dispatching() => {
                    admin_convert::failover_state(true, board.snapshot())
                }
                _ => admin_convert::failover_state(false, Vec::new()),
            }),
        }))
    }

    async fn list_site_health(
        &self,
        request: Request<v1::ListSiteHealthRequest>,
    ) -> Result<Response<v1::ListSiteHealthResponse>, Status> {
        self.authorize(&request, AdminRpc::ListSiteHealth)?;
        let snapshot = self.store.site_health().await.map_err(store_status)?;
        Ok(Response::new(super::site_health::list(
            &snapshot,
            self.site_offline_after,
        )))
    }

    async fn list_notification_lists(
        &self,
        request: Request<v1::ListNotificationListsRequest>,
    ) -> Result<Response<v1::ListNotificationListsResponse>, Status> {
        let urls = self.authorize_read(&request, AdminRpc::ListNotificationLists)?;
        let lists = self.store.lists().await.map_err(store_status)?;
        let mut lists: Vec<_> = lists.into_iter().map(admin_convert::list_view).collect();
        if urls == Urls::Cut {
            lists.iter_mut().for_each(admin_convert::cut_list_urls);
        }
        Ok(Response::new(v1::ListNotificationListsResponse { lists }))
    }

    async fn get_notification_list(
        &self,
        request: Request<v1::GetNotificationListRequest>,
    ) -> Result<Response<v1::NotificationList>, Status> {
        let urls = self.authorize_read(&request, AdminRpc::GetNotificationList)?;
        let name = ListName::parse(request.into_inner().name).map_err(invalid_argument)?;
        let list = self
            .store
            .list(&name)
            .await
            .map_err(store_status)?
            .ok_or_else(|| no_such_list(&name))?;
        let mut view = admin_convert::list_view(list);
        if urls == Urls::Cut {
            admin_convert::cut_list_urls(&mut view);
        }
        Ok(Response::new(view))
    }

    async fn upsert_notification_list(
        &self,
        request: Request<v1::UpsertNotificationListRequest>,
    ) -> Result<Response<v1::NotificationList>, Status> {
        let actor = self.authorize(&request, AdminRpc::UpsertNotificationList)?;
        let msg = request.into_inner().list;
        let current = match msg.as_ref().map(|l| ListName::parse(l.name.clone())) {
            Some(Ok(name)) => self.store.list(&name).await.map_err(store_status)?,
            _ => None,
        };
        let list = admin_convert::list_from_proto(msg, current.as_ref().map(|c| &c.value))
            .map_err(invalid_argument)?;
        if list.status_callback.is_some() && !self.can_sign_callbacks {
            return Err(Status::failed_precondition(
                "list.status_callback_url: the calls are signed and central has no \
                 status_callbacks.key; configure one (status_callbacks.key_file or \
                 OUTBOX_CENTRAL_STATUS_CALLBACKS__KEY) and restart central",
            ));
        }
        self.check_step_lists(&list).await?;
        let name = list.name.clone();
        let saved = self.store.upsert_list(list).await;
        self.config.invalidate();
        saved.map_err(store_status)?;
        tracing::info!(list = name.as_str(), actor = actor.as_str(), "list saved");
        let stored = self
            .store
            .list(&name)
            .await
            .map_err(store_status)?
            .ok_or_else(|| Status::aborted("the list was deleted concurrently"))?;
        Ok(Response::new(admin_convert::list_view(stored)))
    }

    async fn delete_notification_list(
        &self,
        request: Request<v1::DeleteNotificationListRequest>,
    ) -> Result<Response<v1::DeleteNotificationListResponse>, Status> {
        let actor = self.authorize(&request, AdminRpc::DeleteNotificationList)?;
        let name = ListName::parse(request.into_inner().name).map_err(invalid_argument)?;
        let deleted = self.store.delete_list(&name).await;
        self.config.invalidate();
        if !deleted.map_err(store_status)? {
            return Err(no_such_list(&name));
        }
        tracing::info!(list = name.as_str(), actor = actor.as_str(), "list deleted");
        Ok(Response::new(v1::DeleteNotificationListResponse {}))
    }

    async fn get_smtp_config(
        &self,
        request: Request<v1::GetSmtpConfigRequest>,
    ) -> Result<Response<v1::SmtpConfig>, Status> {
        self.authorize(&request, AdminRpc::GetSmtpConfig)?;
        let stored = self
            .store
            .smtp_settings()
            .await
            .map_err(store_status)?
            .ok_or_else(no_smtp_config)?;
        Ok(Response::new(admin_convert::smtp_view(stored)))
    }

    async fn upsert_smtp_config(
        &self,
        request: Request<v1::UpsertSmtpConfigRequest>,
    ) -> Result<Response<v1::SmtpConfig>, Status> {
        let actor = self.authorize(&request, AdminRpc::UpsertSmtpConfig)?;
        let current = self.store.smtp_settings().await.map_err(store_status)?;
        let settings = admin_convert::smtp_from_proto(
            request.into_inner(),
            current.as_ref().map(|c| &c.value),
        )
        .map_err(invalid_argument)?;
        // Logged without the auth part: the password must never reach a log line.
        tracing::info!(
            host = settings.host,
            port = settings.port,
            actor = actor.as_str(),
            "SMTP settings saved"
        );
        let saved = self.store.put_smtp_settings(settings).await;
        self.config.invalidate();
        saved.map_err(store_status)?;
        let stored = self
            .store
            .smtp_settings()
            .await
            .map_err(store_status)?
            .ok_or_else(|| Status::aborted("the SMTP settings were deleted concurrently"))?;
        Ok(Response::new(admin_convert::smtp_view(stored)))
    }

    async fn delete_smtp_config(
        &self,
        request: Request<v1::DeleteSmtpConfigRequest>,
    ) -> Result<Response<v1::DeleteSmtpConfigResponse>, Status> {
        let actor = self.authorize(&request, AdminRpc::DeleteSmtpConfig)?;
        let deleted = self.store.delete_smtp_settings().await;
        self.config.invalidate();
        if !deleted.map_err(store_status)? {
            return Err(no_smtp_config());
        }
        tracing::info!(actor = actor.as_str(), "SMTP settings deleted");
        Ok(Response::new(v1::DeleteSmtpConfigResponse {}))
    }

    async fn get_webhook_config(
        &self,
        request: Request<v1::GetWebhookConfigRequest>,
    ) -> Result<Response<v1::WebhookConfig>, Status> {
        self.authorize(&request, AdminRpc::GetWebhookConfig)?;
        let view = match self.store.webhook_settings().await.map_err(store_status)? {
            Some(stored) => admin_convert::webhook_view(stored.value, Some(stored.updated_at)),
            // What the dispatcher delivers with while nothing is stored.
            None => admin_convert::webhook_view(WebhookSettings::default(), None),
        };
        Ok(Response::new(view))
    }

    async fn upsert_webhook_config(
        &self,
        request: Request<v1::UpsertWebhookConfigRequest>,
    ) -> Result<Response<v1::WebhookConfig>, Status> {
        let actor = self.authorize(&request, AdminRpc::UpsertWebhookConfig)?;
        let settings =
            admin_convert::webhook_from_proto(request.into_inner()).map_err(invalid_argument)?;
        let saved = self.store.put_webhook_settings(settings).await;
        self.config.invalidate();
        saved.map_err(store_status)?;
        tracing::info!(actor = actor.as_str(), "webhook settings saved");
        let stored = self
            .store
            .webhook_settings()
            .await
            .map_err(store_status)?
            .ok_or_else(|| Status::aborted("the webhook settings were removed concurrently"))?;
        Ok(Response::new(admin_convert::webhook_view(
            stored.value,
            Some(stored.updated_at),
        )))
    }

    async fn list_incidents(
        &self,
        request: Request<v1::ListIncidentsRequest>,
    ) -> Result<Response<v1::ListIncidentsResponse>, Status> {
        self.authorize(&request, AdminRpc::ListIncidents)?;
        let query =
            incident_convert::incident_query(request.into_inner()).map_err(invalid_argument)?;
        let list = self.store.incidents(query).await.map_err(store_status)?;
        Ok(Response::new(v1::ListIncidentsResponse {
            next_page_token: list
                .next_before
                .map(|id| id.0.to_string())
                .unwrap_or_default(),
            incidents: list
                .incidents
                .into_iter()
                .map(incident_convert::incident_view)
                .collect(),
        }))
    }

    async fn get_incident(
        &self,
        request: Request<v1::GetIncidentRequest>,
    ) -> Result<Response<v1::IncidentDetail>, Status> {
        self.authorize(&request, AdminRpc::GetIncident)?;
        let id = IncidentId(request.into_inner().id);
        let detail = self
            .store
            .incident(id)
            .await
            .map_err(store_status)?
            .ok_or_else(|| no_such_incident(id))?;
        Ok(Response::new(incident_convert::detail_view(detail)))
    }

    async fn acknowledge_incident(
        &self,
        request: Request<v1::AcknowledgeIncidentRequest>,
    ) -> Result<Response<v1::AcknowledgeIncidentResponse>, Status> {
        let actor = self.authorize(&request, AdminRpc::AcknowledgeIncident)?;
        let (means, from) = acknowledged_from(&request);
        let id = IncidentId(request.into_inner().id);
        let ack = Acknowledgement::new(actor.clone(), means, from.as_deref());
        let result = self
            .store
            .acknowledge_incident(id, ack)
            .await
            .map_err(store_status)?;
        let (outcome, stopped) = match result {
            AckResult::NotFound => return Err(no_such_incident(id)),
            AckResult::Acknowledged { stopped } => {
                tracing::info!(
                    incident = id.0,
                    actor = actor.as_str(),
                    stopped,
                    "incident acknowledged"
                );
                (v1::AcknowledgeOutcome::Acknowledged, stopped)
            }
            AckResult::AlreadyAcknowledged { .. } => {
                (v1::AcknowledgeOutcome::AlreadyAcknowledged, 0)
            }
            AckResult::AlreadyEnded { .. } => (v1::AcknowledgeOutcome::AlreadyEnded, 0),
        };
        let incident = self
            .store
            .incident(id)
            .await
            .map_err(store_status)?
            .map(|d| incident_convert::incident_view(d.incident));
        Ok(Response::new(v1::AcknowledgeIncidentResponse {
            outcome: outcome.into(),
            stopped,
            incident,
        }))
    }
}

/// How an acknowledgement through this service came, and from where: the console's calls carry
/// its caller (`ConsoleCaller`) and the browser's address; the rest are API calls from their
/// peer's address.
fn acknowledged_from<T>(request: &Request<T>) -> (AckMeans, Option<String>) {
    match request.extensions().get::<crate::auth::ConsoleCaller>() {
        Some(_) => (
            AckMeans::Console,
            request
                .extensions()
                .get::<ConsoleClient>()
                .map(|c| c.0.clone()),
        ),
        None => (AckMeans::Api, request.remote_addr().map(|a| a.to_string())),
    }
}

/// The address of the browser a console call was made for (set by the console on its
/// in-process requests), recorded with what it does.
#[derive(Debug, Clone)]
pub(crate) struct ConsoleClient(pub(crate) String);

fn no_such_incident(id: IncidentId) -> Status {
    Status::not_found(format!("incident {id} is not known to central"))
}

fn no_such_list(name: &ListName) -> Status {
    Status::not_found(format!("there is no notification list {:?}", name.as_str()))
}

fn no_smtp_config() -> Status {
    Status::not_found("no SMTP configuration is stored")
}
