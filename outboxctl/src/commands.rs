//! Runs one subcommand against central and returns what it found or did as a [`Report`];
//! turning the report into text or JSON is `render`'s job.
//!
//! The multi-call commands keep these promises:
//! - `list --limit N` asks each page for at most the rows still wanted, so the last page's
//!   `next_page_token` points exactly after the last row shown.
//! - A bulk action by filter calls central until `more_matching` is false; central takes at most
//!   `--batch-size` rows per call, oldest first, so the loop ends once nothing Parked matches. It
//!   also stops when a call changes nothing or changes a row this run already changed (a retried
//!   row that failed and parked again), so it always ends.
//! - A bulk action by filter never runs unconfirmed: `--yes`, or a "y" typed at a terminal.

use std::collections::HashSet;
use std::io::{BufRead, IsTerminal, Write};

use chrono::Utc;
use outbox_proto::v1;
use outbox_proto::v1::bulk_action_request::Selector;

use crate::args::{
    ActionArgs, Command, IncidentArgs, ListArgs, ListsCommand, SmtpCommand, WebhookCommand,
};
use crate::connect::OutboxClient;
use crate::error::{CliError, Result};
use crate::{filter, secret, upsert};

/// Most ids central takes in one bulk call (`NotificationIds` in the contract).
const MAX_IDS_PER_CALL: usize = 1000;
/// The confirmation prompt counts matching rows up to this many; past it, it says "more than".
/// Counting pages through QueryNotifications, and a prompt needs an order of magnitude, not an
/// exact figure for a million rows.
const COUNT_CAP: usize = 10_000;
/// Page size for counting: the largest central serves.
const COUNT_PAGE: u32 = 500;

/// What a command produced.
#[derive(Debug)]
pub(crate) enum Report {
    Notifications {
        rows: Vec<v1::NotificationStatusView>,
        next_page_token: String,
    },
    Status(v1::NotificationStatusView),
    Detail(v1::NotificationDetail),
    /// A single retry or discard, with the notification as it is now.
    Acted {
        action: Action,
        view: v1::NotificationStatusView,
    },
    /// A bulk retry or discard; the responses of every call added up.
    Bulk {
        action: Action,
        result: v1::BulkActionResponse,
    },
    Kpis(v1::GetKpisResponse),
    Sites(v1::ListSiteHealthResponse),
    Lists(Vec<v1::NotificationList>),
    List(v1::NotificationList),
    ListDeleted(String),
    Smtp(v1::SmtpConfig),
    SmtpDeleted,
    Webhook(v1::WebhookConfig),
    Incidents(v1::ListIncidentsResponse),
    Incident(v1::IncidentDetail),
    IncidentAcknowledged(v1::AcknowledgeIncidentResponse),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Action {
    Retry,
    Discard,
}

impl Action {
    pub(crate) fn verb(self) -> &'static str {
        match self {
            Self::Retry => "retry",
            Self::Discard => "discard",
        }
    }

    pub(crate) fn past(self) -> &'static str {
        match self {
            Self::Retry => "retried",
            Self::Discard => "discarded",
        }
    }
}

/// Talks to central for one command.
pub(crate) struct Session {
    pub client: OutboxClient,
    /// For error messages.
    pub addr: String,
}

impl Session {
    fn rpc_error(&self) -> impl Fn(tonic::Status) -> CliError + '_ {
        |status| CliError::from_status(&self.addr, status)
    }

    pub(crate) async fn run(&mut self, command: Command) -> Result<Report> {
        match command {
            Command::List(args) => self.list(args).await,
            Command::Show { id } => self.show(id).await,
            Command::Status { id } => self.status(id).await,
            Command::Retry(args) => self.act(Action::Retry, args).await,
            Command::Discard(args) => self.act(Action::Discard, args).await,
            Command::Kpis => self.kpis().await,
            Command::Sites => self.sites().await,
            Command::Lists(command) => self.lists(command).await,
            Command::Smtp(command) => self.smtp(command).await,
            Command::Webhook(command) => self.webhook(command).await,
            Command::Incidents(args) => self.incidents(args).await,
            Command::Incident { id } => {
                let detail = self
                    .client
                    .get_incident(v1::GetIncidentRequest { id })
                    .await
                    .map_err(self.rpc_error())?
                    .into_inner();
                Ok(Report::Incident(detail))
            }
            Command::Ack { id } => {
                let answer = self
                    .client
                    .acknowledge_incident(v1::AcknowledgeIncidentRequest { id })
                    .await
                    .map_err(self.rpc_error())?
                    .into_inner();
                Ok(Report::IncidentAcknowledged(answer))
            }
        }
    }

    async fn list(&mut self, args: ListArgs) -> Result<Report> {
        let only = filter::Only {
            stuck: args.stuck,
            scheduled: args.scheduled,
        };
        let filter =
            filter::build(&args.select, &args.status, only, Utc::now()).map_err(CliError::Usage)?;
        let wanted = match args.limit {
            0 => usize::MAX,
            n => usize::try_from(n).unwrap_or(usize::MAX),
        };
        let mut rows = Vec::new();
        let mut page_token = args.page_token.unwrap_or_default();
        loop {
            let remaining = wanted.saturating_sub(rows.len());
            if remaining == 0 {
                break;
            }
            let page_size =
                u32::try_from(remaining).map_or(args.page_size, |r| r.min(args.page_size));
            let page = self
                .client
                .query_notifications(v1::QueryNotificationsRequest {
                    filter: Some(filter.clone()),
                    page_size,
                    page_token: page_token.clone(),
                })
                .await
                .map_err(self.rpc_error())?
                .into_inner();
            let got = page.notifications.len();
            rows.extend(page.notifications);
            page_token = page.next_page_token;
            // An empty page with a token would loop forever on a misbehaving server.
            if page_token.is_empty() || got == 0 {
                break;
            }
        }
        // Central may return more than asked if it ignores page_size; never show more than --limit.
        rows.truncate(wanted);
        Ok(Report::Notifications {
            rows,
            next_page_token: page_token,
        })
    }

    async fn show(&mut self, id: String) -> Result<Report> {
        let detail = self
            .client
            .get_notification_detail(v1::GetNotificationDetailRequest {
                notification_id: id,
            })
            .await
            .map_err(self.rpc_error())?
            .into_inner();
        Ok(Report::Detail(detail))
    }

    async fn status(&mut self, id: String) -> Result<Report> {
        let view = self
            .client
            .get_notification_status(v1::GetNotificationStatusRequest {
                notification_id: id,
            })
            .await
            .map_err(self.rpc_error())?
            .into_inner();
        Ok(Report::Status(view))
    }

    async fn act(&mut self, action: Action, args: ActionArgs) -> Result<Report> {
        match selection(action, &args)? {
            Selection::Filter => self.act_by_filter(action, args).await,
            Selection::One => {
                let id = args.ids.into_iter().next().unwrap_or_default();
                self.act_on_one(action, id).await
            }
            Selection::Ids => self.act_on_ids(action, &args.ids).await,
        }
    }

    async fn act_on_one(&mut self, action: Action, id: String) -> Result<Report> {
        let view = match action {
            Action::Retry => self
                .client
                .retry_notification(v1::RetryNotificationRequest {
                    notification_id: id,
                })
                .await
                .map_err(self.rpc_error())?,
            Action::Discard => self
                .client
                .discard_notification(v1::DiscardNotificationRequest {
                    notification_id: id,
                })
                .await
                .map_err(self.rpc_error())?,
        }
        .into_inner();
        Ok(Report::Acted { action, view })
    }

    async fn act_on_ids(&mut self, action: Action, ids: &[String]) -> Result<Report> {
        let mut total = v1::BulkActionResponse::default();
        for chunk in ids.chunks(MAX_IDS_PER_CALL) {
            let request = v1::BulkActionRequest {
                selector: Some(Selector::Ids(v1::NotificationIds {
                    notification_ids: chunk.to_vec(),
                })),
                ..Default::default()
            };
            let response = self.bulk(action, request).await?;
            add_up(&mut total, response);
        }
        total.more_matching = false;
        Ok(Report::Bulk {
            action,
            result: total,
        })
    }

    async fn act_by_filter(&mut self, action: Action, args: ActionArgs) -> Result<Report> {
        // Central requires the statuses to be empty or exactly [PARKED]; saying PARKED keeps the
        // count query below and the action selecting the same rows.
        let filter = filter::build(
            &args.select,
            &[v1::NotificationStatus::Parked],
            filter::Only::default(),
            Utc::now(),
        )
        .map_err(CliError::Usage)?;
        if !args.yes {
            self.confirm(action, &args, &filter).await?;
        }
        let mut total = v1::BulkActionResponse::default();
        let mut seen = HashSet::new();
        // Rows that park again after this command retried them are not its business.
        let started = outbox_proto::time::to_timestamp(Utc::now());
        loop {
            let request = v1::BulkActionRequest {
                selector: Some(Selector::Filter(filter.clone())),
                limit: args.batch_size,
                parked_before: Some(started),
                dry_run: false,
            };
            let response = self.bulk(action, request).await?;
            let more = response.more_matching;
            // A retried row that fails again parks again and matches the filter again; without
            // this check a retry against a still-broken relay would chase its own rows forever.
            let repeated = !response
                .changed_ids
                .iter()
                .all(|id| seen.insert(id.clone()));
            let progress = response.changed > 0;
            add_up(&mut total, response);
            // `changed == 0` with more matching would mean central made no progress; stop rather
            // than spin.
            if !more || !progress || repeated {
                total.more_matching = more;
                break;
            }
        }
        Ok(Report::Bulk {
            action,
            result: total,
        })
    }

    async fn bulk(
        &mut self,
        action: Action,
        request: v1::BulkActionRequest,
    ) -> Result<v1::BulkActionResponse> {
        let response = match action {
            Action::Retry => self.client.retry_notifications(request).await,
            Action::Discard => self.client.discard_notifications(request).await,
        };
        Ok(response.map_err(self.rpc_error())?.into_inner())
    }

    /// Asks "Retry 12 parked notifications with site X? [y/N]" on the terminal. Without a
    /// terminal there is nobody to ask, and acting on a filter unasked is how whole queues get
    /// discarded by a script typo: refuse.
    async fn confirm(
        &mut self,
        action: Action,
        args: &ActionArgs,
        filter: &v1::NotificationFilter,
    ) -> Result<()> {
        if !std::io::stdin().is_terminal() {
            return Err(CliError::Usage(format!(
                "{} by filter needs confirmation and stdin is not a terminal: pass --yes",
                action.verb()
            )));
        }
        let count = self.count(filter).await?;
        let how_many = match count {
            Count::Exactly(0) => {
                eprintln!(
                    "no parked notification matches; nothing to {}",
                    action.verb()
                );
                return Ok(());
            }
            Count::Exactly(n) => n.to_string(),
            Count::MoreThan(n) => format!("more than {n}"),
        };
        let mut stderr = std::io::stderr().lock();
        write!(
            stderr,
            "{} {how_many} {}? [y/N] ",
            capitalise(action.verb()),
            filter::describe(&args.select)
        )
        .and_then(|()| stderr.flush())
        .map_err(|source| CliError::Io {
            what: "writing the prompt",
            source,
        })?;
        let mut answer = String::new();
        std::io::stdin()
            .lock()
            .read_line(&mut answer)
            .map_err(|source| CliError::Io {
                what: "reading the answer",
                source,
            })?;
        match answer.trim().to_ascii_lowercase().as_str() {
            "y" | "yes" => Ok(()),
            _ => Err(CliError::Aborted),
        }
    }

    /// Counts the Parked rows a filter matches, up to [`COUNT_CAP`].
    async fn count(&mut self, filter: &v1::NotificationFilter) -> Result<Count> {
        let mut seen = 0usize;
        let mut page_token = String::new();
        loop {
            let page = self
                .client
                .query_notifications(v1::QueryNotificationsRequest {
                    filter: Some(filter.clone()),
                    page_size: COUNT_PAGE,
                    page_token,
                })
                .await
                .map_err(self.rpc_error())?
                .into_inner();
            seen += page.notifications.len();
            if page.next_page_token.is_empty() || page.notifications.is_empty() {
                return Ok(Count::Exactly(seen));
            }
            if seen >= COUNT_CAP {
                return Ok(Count::MoreThan(seen));
            }
            page_token = page.next_page_token;
        }
    }

    async fn incidents(&mut self, args: IncidentArgs) -> Result<Report> {
        let list = self
            .client
            .list_incidents(v1::ListIncidentsRequest {
                statuses: args.status.iter().map(|s| s.proto().into()).collect(),
                late_only: args.late,
                page_size: args.limit,
                page_token: args.page_token.unwrap_or_default(),
            })
            .await
            .map_err(self.rpc_error())?
            .into_inner();
        Ok(Report::Incidents(list))
    }

    async fn kpis(&mut self) -> Result<Report> {
        let kpis = self
            .client
            .get_kpis(v1::GetKpisRequest::default())
            .await
            .map_err(self.rpc_error())?
            .into_inner();
        Ok(Report::Kpis(kpis))
    }

    async fn sites(&mut self) -> Result<Report> {
        let sites = self
            .client
            .list_site_health(v1::ListSiteHealthRequest {})
            .await
            .map_err(self.rpc_error())?
            .into_inner();
        Ok(Report::Sites(sites))
    }

    async fn lists(&mut self, command: ListsCommand) -> Result<Report> {
        match command {
            ListsCommand::Ls => {
                let lists = self
                    .client
                    .list_notification_lists(v1::ListNotificationListsRequest {})
                    .await
                    .map_err(self.rpc_error())?
                    .into_inner()
                    .lists;
                Ok(Report::Lists(lists))
            }
            ListsCommand::Show { name } => {
                let list = self
                    .client
                    .get_notification_list(v1::GetNotificationListRequest { name })
                    .await
                    .map_err(self.rpc_error())?
                    .into_inner();
                Ok(Report::List(list))
            }
            ListsCommand::Set(args) => {
                let request = upsert::list_request(*args, &mut secret::Process)?;
                let list = self
                    .client
                    .upsert_notification_list(request)
                    .await
                    .map_err(self.rpc_error())?
                    .into_inner();
                Ok(Report::List(list))
            }
            ListsCommand::Rm { name } => {
                self.client
                    .delete_notification_list(v1::DeleteNotificationListRequest {
                        name: name.clone(),
                    })
                    .await
                    .map_err(self.rpc_error())?;
                Ok(Report::ListDeleted(name))
            }
        }
    }

    async fn smtp(&mut self, command: SmtpCommand) -> Result<Report> {
        match command {
            SmtpCommand::Show => {
                let config = self
                    .client
                    .get_smtp_config(v1::GetSmtpConfigRequest {})
                    .await
                    .map_err(self.rpc_error())?
                    .into_inner();
                Ok(Report::Smtp(config))
            }
            SmtpCommand::Set(args) => {
                let request = upsert::smtp_request(*args, &mut secret::Process)?;
                let config = self
                    .client
                    .upsert_smtp_config(request)
                    .await
                    .map_err(self.rpc_error())?
                    .into_inner();
                Ok(Report::Smtp(config))
            }
            SmtpCommand::Rm => {
                self.client
                    .delete_smtp_config(v1::DeleteSmtpConfigRequest {})
                    .await
                    .map_err(self.rpc_error())?;
                Ok(Report::SmtpDeleted)
            }
        }
    }

    async fn webhook(&mut self, command: WebhookCommand) -> Result<Report> {
        let config = match command {
            WebhookCommand::Show => self
                .client
                .get_webhook_config(v1::GetWebhookConfigRequest {})
                .await
                .map_err(self.rpc_error())?,
            WebhookCommand::Set(args) => {
                let request = upsert::webhook_request(args)?;
                self.client
                    .upsert_webhook_config(request)
                    .await
                    .map_err(self.rpc_error())?
            }
        };
        Ok(Report::Webhook(config.into_inner()))
    }
}

/// How a retry or discard picks its notifications.
enum Selection {
    /// One id: the single RPC, whose errors (not Parked, unknown id) fail the command.
    One,
    /// Several ids: the bulk RPC, which reports the ids it could not change as skipped.
    Ids,
    /// `--all-parked` with filter flags.
    Filter,
}

fn selection(action: Action, args: &ActionArgs) -> Result<Selection> {
    if args.all_parked {
        return Ok(Selection::Filter);
    }
    if args.select.is_set() {
        return Err(CliError::Usage(format!(
            "filter flags select notifications only with --all-parked \
             (e.g. `outboxctl {} --all-parked --site SITE`)",
            action.verb()
        )));
    }
    match args.ids.len() {
        0 => Err(CliError::Usage(format!(
            "give notification ids, or --all-parked with filter flags, to {}",
            action.verb()
        ))),
        1 => Ok(Selection::One),
        _ => Ok(Selection::Ids),
    }
}

/// Usage checks that need no server, run before connecting so a wrong command line is reported
/// as such even when central is down.
pub(crate) fn check(command: &Command) -> Result<()> {
    match command {
        Command::Retry(args) => selection(Action::Retry, args).map(drop),
        Command::Discard(args) => selection(Action::Discard, args).map(drop),
        Command::Lists(ListsCommand::Set(args)) => upsert::check_list(args),
        Command::Smtp(SmtpCommand::Set(args)) => upsert::smtp_auth(args).map(drop),
        Command::Webhook(WebhookCommand::Set(args)) => upsert::check_webhook(args),
        _ => Ok(()),
    }
}

enum Count {
    Exactly(usize),
    MoreThan(usize),
}

fn add_up(total: &mut v1::BulkActionResponse, response: v1::BulkActionResponse) {
    total.changed = total.changed.saturating_add(response.changed);
    total.changed_ids.extend(response.changed_ids);
    total.skipped.extend(response.skipped);
    total.more_matching = response.more_matching;
}

fn capitalise(word: &str) -> String {
    let mut chars = word.chars();
    chars
        .next()
        .map(|first| first.to_uppercase().chain(chars).collect())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bulk_responses_add_up() {
        let mut total = v1::BulkActionResponse::default();
        add_up(
            &mut total,
            v1::BulkActionResponse {
                changed: 2,
                changed_ids: vec!["a".into(), "b".into()],
                skipped: vec![],
                more_matching: true,
            },
        );
        add_up(
            &mut total,
            v1::BulkActionResponse {
                changed: 1,
                changed_ids: vec!["c".into()],
                skipped: vec![v1::SkippedNotification {
                    notification_id: "d".into(),
                    reason: "not found".into(),
                }],
                more_matching: false,
            },
        );
        assert_eq!(total.changed, 3);
        assert_eq!(total.changed_ids, ["a", "b", "c"]);
        assert_eq!(total.skipped.len(), 1);
        assert!(!total.more_matching);
    }
}
