//! The statements of lists and channel settings: reading, replacing (as a whole, in one
//! transaction) and deleting a list with its targets or a channel's settings (the email row's
//! relay and policy, the webhook row's policy); seeding each (stored only where none is, in one
//! statement: of two replicas seeding at once, one inserts and the other finds the row, or
//! loses on the key); and the start-up re-seal of stored secrets, which replaces a secret only
//! while it is still the value read (a replica that stored a new one meanwhile keeps it).

use std::borrow::Cow;

use super::super::millis_i64;
use super::{BATCH_START, Param, Statement, int, int_value, text};
use crate::domain::NotificationType;
use crate::domain::channel::{SmtpAuth, SmtpSettings, WebhookSettings};
use crate::domain::consolidation::Consolidation;
use crate::domain::escalation::EscalationPolicy;
use crate::domain::smtp_relay::SmtpRelay;
use crate::store::mssql::escalation::OpeningRule;
use crate::store::stored_policy;

/// List @P1 (first result) and its targets (second).
pub(crate) fn select_list(name: &str) -> Statement {
    Statement::fixed(include_str!("select_list.sql")).set("@P1", text(name))
}

/// Every list by name (first result) and every target (second).
pub(crate) const SELECT_LISTS: &str = include_str!("select_lists.sql");

/// Creates or replaces list @P1 (type @P2, webhook format @P3, secret @P4, consolidation
/// threshold @P5, window in seconds @P6 and rows per digest @P7, all three NULL for none,
/// webhook fallback URLs @P8, NULL for none) and its `targets` targets (@P9...), as a whole, in one transaction. A list that consolidates
/// gets its row of ConsolidationWindows if it has none yet, at a window long past (the same as
/// no row: its first arrival starts a count), so that a submit only ever updates that row
/// (migration 0007).
pub(crate) fn replace_list(targets: usize) -> String {
    let insert = insert_targets(targets);
    format!(
        "{}{}BEGIN TRANSACTION;
UPDATE l
SET l.Type = @P2, l.WebhookFormat = @P3, l.WebhookSecret = @P4, l.UpdatedAt = @now,
    l.ConsolidateThreshold = @P5, l.ConsolidateWindowSeconds = @P6, l.ConsolidateMaxPerDigest = @P7,
    l.WebhookFallbacks = @P8
FROM dbo.NotificationLists AS l
WHERE l.Name = @P1;
INSERT INTO dbo.NotificationLists (Name, Type, WebhookFormat, WebhookSecret, UpdatedAt, ConsolidateThreshold, ConsolidateWindowSeconds, ConsolidateMaxPerDigest, WebhookFallbacks)
SELECT @P1, @P2, @P3, @P4, @now, @P5, @P6, @P7, @P8
WHERE NOT EXISTS (SELECT 1 FROM dbo.NotificationLists AS x WHERE x.Name = @P1);
INSERT INTO dbo.ConsolidationWindows (ListName, WindowStart, Arrived)
SELECT @P1, CAST('19700101' AS datetime2(3)), 0
WHERE @P5 IS NOT NULL AND NOT EXISTS (SELECT 1 FROM dbo.ConsolidationWindows AS w WHERE w.ListName = @P1);
DELETE r
FROM dbo.NotificationListRecipients AS r
WHERE r.ListName = @P1;
{insert}{escalation}COMMIT TRANSACTION;",
        BATCH_START,
        declare_now!(),
        escalation = set_escalation(targets),
    )
}

/// The update of list @P1's escalation columns (migration 0014) from the placeholders after its
/// `targets` targets: the policy's JSON (NULL: none) and its [`OpeningRule`]'s columns; then
/// its status callback endpoint (migration 0018; NULL: none).
fn set_escalation(targets: usize) -> String {
    let p = |i: usize| format!("@P{}", 9 + targets + i);
    format!(
        "UPDATE dbo.NotificationLists
SET Escalation = {}, EscalationPriorities = {}, EscalationFirstWaitMs = {}, EscalationFirstRound = {},
    EscalationFirstStep = {}, EscalateOnPark = {}, EscalationOpenedNote = {},
    StatusCallbackUrl = {}
WHERE Name = @P1;
",
        p(0),
        p(1),
        p(2),
        p(3),
        p(4),
        p(5),
        p(6),
        p(7)
    )
}

/// The insert of `targets` targets (@P9...) of list @P1, or nothing for none.
fn insert_targets(targets: usize) -> String {
    let values: Vec<String> = (0..targets)
        .map(|i| format!("(@P1, @P{})", i + 9))
        .collect();
    if values.is_empty() {
        String::new()
    } else {
        format!(
            "INSERT INTO dbo.NotificationListRecipients (ListName, Address) VALUES {};\n",
            values.join(", ")
        )
    }
}

/// Stores list @P1 as [`replace_list`] does (the same parameters), only if no list of that
/// name is stored: the list's row is inserted first, and its targets (any left by a list
/// deleted meanwhile go first) and consolidation window row follow only if it was. Result:
/// lists stored (0 or 1). Two replicas seeding the same list at once: one inserts, the other
/// finds its row, or fails on the key (2627), which the caller reads as "was there".
pub(crate) fn seed_list(targets: usize) -> String {
    let insert = insert_targets(targets);
    format!(
        "{}{}DECLARE @inserted int;
BEGIN TRANSACTION;
INSERT INTO dbo.NotificationLists (Name, Type, WebhookFormat, WebhookSecret, UpdatedAt, ConsolidateThreshold, ConsolidateWindowSeconds, ConsolidateMaxPerDigest, WebhookFallbacks)
SELECT @P1, @P2, @P3, @P4, @now, @P5, @P6, @P7, @P8
WHERE NOT EXISTS (SELECT 1 FROM dbo.NotificationLists AS x WHERE x.Name = @P1);
SET @inserted = @@ROWCOUNT;
IF @inserted = 1
BEGIN
INSERT INTO dbo.ConsolidationWindows (ListName, WindowStart, Arrived)
SELECT @P1, CAST('19700101' AS datetime2(3)), 0
WHERE @P5 IS NOT NULL AND NOT EXISTS (SELECT 1 FROM dbo.ConsolidationWindows AS w WHERE w.ListName = @P1);
DELETE r
FROM dbo.NotificationListRecipients AS r
WHERE r.ListName = @P1;
{insert}{escalation}END;
COMMIT TRANSACTION;
SELECT @inserted AS Inserted;",
        BATCH_START,
        declare_now!(),
        escalation = set_escalation(targets),
    )
}

/// What [`replace_list`] or [`seed_list`] does to the lists.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ListWrite {
    Replace,
    Seed,
}

/// [`replace_list`] (or [`seed_list`]) of list `name` with its `targets` (each once); `format`
/// and `secret` (sealed) only for a webhook list; `consolidation` when the list consolidates
/// floods; `fallbacks` the webhook list's fallback URLs as one text (`stored_list`);
/// `status_callback` its status callback endpoint.
// One argument per column of the list's row: a struct would only restate them.
#[allow(clippy::too_many_arguments)]
pub(crate) fn replace_list_with(
    write: ListWrite,
    name: &str,
    kind: NotificationType,
    format: Option<String>,
    secret: Option<String>,
    consolidation: Option<Consolidation>,
    fallbacks: Option<String>,
    targets: Vec<String>,
    escalation: Option<&EscalationPolicy>,
    status_callback: Option<String>,
) -> Statement {
    let threshold = consolidation.map(|c| int_value(c.threshold()));
    let window = consolidation.map(|c| i32::try_from(c.window().as_secs()).unwrap_or(i32::MAX));
    let max_per_digest = consolidation.map(|c| int_value(c.max_per_digest()));
    let sql = match write {
        ListWrite::Replace => replace_list(targets.len()),
        ListWrite::Seed => seed_list(targets.len()),
    };
    let mut stmt = Statement {
        sql: Cow::Owned(sql),
        params: Vec::new(),
    }
    .set("@P1", text(name))
    .set("@P2", text(kind.as_str()))
    .set("@P3", Param::Text(format))
    .set("@P4", Param::Text(secret))
    .set("@P5", Param::Int(threshold))
    .set("@P6", Param::Int(window))
    .set("@P7", Param::Int(max_per_digest))
    .set("@P8", Param::Text(fallbacks));
    stmt.params
        .extend(targets.into_iter().map(|t| Param::Text(Some(t))));
    let rule = escalation.map(OpeningRule::of);
    stmt.params.extend([
        Param::Text(escalation.map(stored_policy::encode)),
        Param::Int(rule.as_ref().map(|r| r.priorities)),
        Param::BigInt(rule.as_ref().map(|r| r.first_wait_ms)),
        Param::Int(
            rule.as_ref()
                .and_then(|r| r.first_next)
                .map(|p| int_value(p.round)),
        ),
        Param::Int(
            rule.as_ref()
                .and_then(|r| r.first_next)
                .map(|p| int_value(p.step)),
        ),
        Param::Int(rule.as_ref().map(|r| i32::from(r.escalate_on_park))),
        Param::Text(rule.map(|r| r.opened_note)),
        Param::Text(status_callback),
    ]);
    stmt
}

/// Deletes list @P1 and its targets. Result: lists deleted (0 or 1). The list's row goes first:
/// it is the lock every writer of the list takes, so a replace running at the same time either
/// finishes before (and its targets are deleted here) or starts after (and writes the list
/// anew); no target is left without its list, with or without the foreign key (migration 0003).
pub(crate) fn delete_list(name: &str) -> Statement {
    Statement::fixed(include_str!("delete_list.sql")).set("@P1", text(name))
}

/// The settings of channel @P1.
pub(crate) fn select_channel(channel: &str) -> Statement {
    Statement::fixed(include_str!("select_channel.sql")).set("@P1", text(channel))
}

/// What a channel settings write does: replace the stored row, or store one only where none
/// is (a seed, whose result is the rows inserted, 0 or 1, as `Inserted`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ChannelWrite {
    Replace,
    Seed,
}

/// Creates or replaces email channel `channel`'s settings (@P1) with `s` (@P2..@P21 in
/// select_channel.sql's column order, without UpdatedAt; @P22 the fallback relays' text form),
/// in one transaction, or (a seed)
/// stores them only if the channel has none; its password and OAuth client secret are given
/// sealed (`None` when its authentication has none).
pub(crate) fn replace_channel(
    write: ChannelWrite,
    channel: &str,
    s: &SmtpSettings,
    password: Option<String>,
    client_secret: Option<String>,
) -> Statement {
    let (username, oauth) = match &s.auth {
        SmtpAuth::None => (None, None),
        SmtpAuth::Password { username, .. } => (Some(username.clone()), None),
        SmtpAuth::XOAuth2 { username, oauth } => (Some(username.clone()), Some(oauth)),
    };
    let p = &s.policy;
    let max_retry_delay = p.backoff.cap().map(millis_i64);
    let sql = match write {
        ChannelWrite::Replace => include_str!("replace_channel.sql"),
        ChannelWrite::Seed => include_str!("seed_channel.sql"),
    };
    Statement::fixed(sql)
        .set("@P1", text(channel))
        .set("@P2", text(&s.host))
        .set("@P3", Param::Int(Some(i32::from(s.port))))
        .set("@P4", text(s.tls.as_str()))
        .set("@P5", text(s.auth.mechanism()))
        .set("@P6", Param::Text(username))
        .set("@P7", Param::Text(password))
        .set("@P8", text(s.from_address.as_str()))
        .set("@P9", Param::BigInt(Some(p.max_retries)))
        .set("@P10", Param::BigInt(Some(millis_i64(p.retry_delay))))
        .set("@P11", text(p.backoff.as_str()))
        .set("@P12", Param::BigInt(max_retry_delay))
        .set("@P13", int(p.max_concurrent_connections))
        .set("@P14", Param::Float(p.rate_limit.map(|r| r.per_second())))
        .set(
            "@P15",
            Param::BigInt(p.rate_limit.map(|r| i64::from(r.burst()))),
        )
        .set("@P16", Param::BigInt(Some(millis_i64(s.timeout))))
        .set("@P17", Param::BigInt(Some(millis_i64(s.overall_timeout))))
        .set("@P18", Param::Text(oauth.map(|o| o.token_url.clone())))
        .set("@P19", Param::Text(oauth.map(|o| o.client_id.clone())))
        .set("@P20", Param::Text(client_secret))
        .set("@P21", Param::Text(oauth.map(|o| o.scope.clone())))
        .set("@P22", text(&SmtpRelay::list_text(&s.fallback_relays)))
}

/// Creates or replaces webhook channel `channel`'s settings (@P1): its pacing and retries
/// (@P2..@P9), or (a seed) stores them only if the channel has none. The relay columns stay
/// NULL (migration 0010).
pub(crate) fn replace_webhook_channel(
    write: ChannelWrite,
    channel: &str,
    s: &WebhookSettings,
) -> Statement {
    let p = &s.policy;
    let max_retry_delay = p.backoff.cap().map(millis_i64);
    let sql = match write {
        ChannelWrite::Replace => include_str!("replace_webhook_channel.sql"),
        ChannelWrite::Seed => include_str!("seed_webhook_channel.sql"),
    };
    Statement::fixed(sql)
        .set("@P1", text(channel))
        .set("@P2", Param::BigInt(Some(p.max_retries)))
        .set("@P3", Param::BigInt(Some(millis_i64(p.retry_delay))))
        .set("@P4", text(p.backoff.as_str()))
        .set("@P5", Param::BigInt(max_retry_delay))
        .set("@P6", int(p.max_concurrent_connections))
        .set("@P7", Param::Float(p.rate_limit.map(|r| r.per_second())))
        .set(
            "@P8",
            Param::BigInt(p.rate_limit.map(|r| i64::from(r.burst()))),
        )
        .set("@P9", Param::BigInt(Some(millis_i64(s.timeout))))
}

/// Deletes channel @P1's settings. Result: rows deleted.
pub(crate) fn delete_channel(channel: &str) -> Statement {
    Statement::fixed(include_str!("delete_channel.sql")).set("@P1", text(channel))
}

/// Every stored secret, for the start-up re-seal: lists' webhook secrets (first result), the
/// channels' password and OAuth client secret (second).
pub(crate) const SELECT_SECRETS: &str = include_str!("select_secrets.sql");

/// Replaces list @P1's webhook secret @P2 with @P3, only while it is still @P2: a replica that
/// stored a new secret meanwhile keeps it.
pub(crate) fn reseal_list_secret(name: &str, old: String, new: String) -> Statement {
    Statement::fixed(include_str!("reseal_list_secret.sql"))
        .set("@P1", text(name))
        .set("@P2", Param::Text(Some(old)))
        .set("@P3", Param::Text(Some(new)))
}

/// Replaces channel @P1's password @P2 with @P3 and its OAuth client secret @P4 with @P5, each
/// only while it is still the old value (a NULL old value leaves that column alone: NULL equals
/// nothing). Each secret is given as (old, new), or `None` to leave it.
pub(crate) fn reseal_channel_secrets(
    channel: &str,
    password: Option<(String, String)>,
    client_secret: Option<(String, String)>,
) -> Statement {
    let (old_password, new_password) = password.unzip();
    let (old_client_secret, new_client_secret) = client_secret.unzip();
    Statement::fixed(include_str!("reseal_channel_secrets.sql"))
        .set("@P1", text(channel))
        .set("@P2", Param::Text(old_password))
        .set("@P3", Param::Text(new_password))
        .set("@P4", Param::Text(old_client_secret))
        .set("@P5", Param::Text(new_client_secret))
}
