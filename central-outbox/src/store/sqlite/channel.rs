//! Notification lists and channel settings in the SQLite backend. Read on the read pool, written
//! through the group-commit writer like everything else. Each channel's settings are one
//! `ChannelConfig` row ('email', 'webhook'). A seed checks and writes in one writer job, inside
//! the writer's IMMEDIATE transaction, so a replica seeding the same file at once (another
//! process on the same file) finds the row the first one wrote.
//!
//! Secret columns (`NotificationLists.WebhookSecret`, `ChannelConfig.Password` and
//! `ChannelConfig.OAuthClientSecret`) are written only as values sealed by [`Keyring::seal`];
//! every read opens them, and [`reseal_secrets`] brings older rows (clear text from earlier
//! releases, or an earlier key) to the current key.

use chrono::{DateTime, Utc};
use rusqlite::{Connection, OptionalExtension, params};

use super::{at_ms, corrupt, duration_ms, ms};
use std::time::Duration;

use crate::domain::ListName;
use crate::domain::channel::{
    DeliveryPolicy, EmailAddress, ListTargets, NotificationList, OAuthClientCredentials, SmtpAuth,
    SmtpSettings, Stored, TlsMode, WebhookSettings,
};
use crate::domain::retry::Backoff;
use crate::domain::smtp_relay::SmtpRelay;
use crate::domain::webhook::WebhookUrl;
use crate::secrets::{Keyring, ResealReport, Resealed, Slot};
use crate::store::Result;
use crate::store::stored_list::StoredList;

/// The channel key of the email settings row in `ChannelConfig`.
const EMAIL_CHANNEL: &str = "email";
/// The channel key of the webhook settings row in `ChannelConfig` (migration 0008).
const WEBHOOK_CHANNEL: &str = "webhook";

pub(super) fn select_list(
    conn: &Connection,
    name: &ListName,
    secrets: &Keyring,
) -> Result<Option<Stored<NotificationList>>> {
    type ListRow = (
        String,
        Option<String>,
        Option<String>,
        i64,
        [Option<i64>; 3],
        Option<String>,
        Option<String>,
        Option<String>,
    );
    let row: Option<ListRow> = conn
        .prepare_cached(include_str!("sql/select_list.sql"))?
        .query_row([name.as_str()], |row| {
            Ok((
                row.get(0)?,
                row.get(1)?,
                row.get(2)?,
                row.get(3)?,
                [row.get(4)?, row.get(5)?, row.get(6)?],
                row.get(7)?,
                row.get(8)?,
                row.get(9)?,
            ))
        })
        .optional()?;
    let Some((
        kind,
        webhook_format,
        webhook_secret,
        updated_at,
        consolidation,
        escalation,
        webhook_fallbacks,
        status_callback,
    )) = row
    else {
        return Ok(None);
    };
    let stored = StoredList {
        name: name.clone(),
        kind,
        webhook_format,
        webhook_secret,
        webhook_fallbacks,
        targets: select_targets(conn, name)?,
        consolidation,
        escalation,
        status_callback,
    };
    Ok(Some(Stored {
        value: stored.decode(secrets)?,
        updated_at: at_ms("UpdatedAt", updated_at)?,
    }))
}

/// A list's recipient addresses or endpoint URLs, in a stable order.
fn select_targets(conn: &Connection, name: &ListName) -> Result<Vec<String>> {
    let mut stmt = conn.prepare_cached(include_str!("sql/select_list_targets.sql"))?;
    Ok(stmt
        .query_map([name.as_str()], |row| row.get::<_, String>(0))?
        .collect::<rusqlite::Result<Vec<_>>>()?)
}

pub(super) fn select_lists(
    conn: &Connection,
    secrets: &Keyring,
) -> Result<Vec<Stored<NotificationList>>> {
    let names = conn
        .prepare_cached(include_str!("sql/select_list_names.sql"))?
        .query_map([], |row| row.get::<_, String>(0))?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    let mut lists = Vec::with_capacity(names.len());
    for name in names {
        let name = ListName::parse(name).map_err(corrupt)?;
        if let Some(list) = select_list(conn, &name, secrets)? {
            lists.push(list);
        }
    }
    Ok(lists)
}

pub(super) fn replace_list(
    conn: &Connection,
    list: &NotificationList,
    secrets: &Keyring,
    now: DateTime<Utc>,
) -> Result<()> {
    let (format, secret) = match &list.targets {
        ListTargets::Email(_) => (None, None),
        ListTargets::Webhook(target) => (
            Some(target.format.as_str()),
            target
                .secret
                .as_ref()
                .map(|s| secrets.seal(s, Slot::WebhookSecret(list.name.as_str())))
                .transpose()?,
        ),
    };
    conn.prepare_cached(include_str!("sql/replace_list.sql"))?
        .execute(params![
            list.name.as_str(),
            list.kind().as_str(),
            format,
            secret,
            ms(now),
            list.consolidation.map(|c| c.threshold()),
            list.consolidation
                .map(|c| i64::try_from(c.window().as_secs()).unwrap_or(i64::MAX)),
            list.consolidation.map(|c| c.max_per_digest()),
            list.escalation
                .as_ref()
                .map(crate::store::stored_policy::encode),
            crate::store::stored_list::fallbacks_text(list),
            list.status_callback.as_ref().map(WebhookUrl::as_str),
        ])?;
    conn.prepare_cached(include_str!("sql/delete_list_targets.sql"))?
        .execute([list.name.as_str()])?;
    let mut insert = conn.prepare_cached(include_str!("sql/insert_list_target.sql"))?;
    for target in list.target_names() {
        insert.execute([list.name.as_str(), target.as_str()])?;
    }
    Ok(())
}

pub(super) fn delete_list(conn: &Connection, name: &ListName) -> Result<bool> {
    // Recipients go explicitly rather than by ON DELETE CASCADE, which needs foreign keys on.
    conn.prepare_cached(include_str!("sql/delete_list_targets.sql"))?
        .execute([name.as_str()])?;
    let deleted = conn
        .prepare_cached(include_str!("sql/delete_list.sql"))?
        .execute([name.as_str()])?;
    Ok(deleted > 0)
}

/// A `ChannelConfig` row as stored (by `select_smtp_settings.sql`).
struct SmtpRow {
    host: String,
    port: u16,
    tls: String,
    mechanism: String,
    username: Option<String>,
    password: Option<String>,
    from: String,
    max_retries: i64,
    retry_delay_ms: i64,
    backoff: String,
    max_retry_delay_ms: Option<i64>,
    connections: u32,
    rate_per_second: Option<f64>,
    rate_burst: Option<u32>,
    timeout_ms: i64,
    overall_timeout_ms: Option<i64>,
    token_url: Option<String>,
    client_id: Option<String>,
    client_secret: Option<String>,
    scope: Option<String>,
    updated_at: i64,
    fallback_relays: Option<String>,
}

fn read_smtp(row: &rusqlite::Row<'_>) -> rusqlite::Result<SmtpRow> {
    Ok(SmtpRow {
        host: row.get(0)?,
        port: row.get(1)?,
        tls: row.get(2)?,
        mechanism: row.get(3)?,
        username: row.get(4)?,
        password: row.get(5)?,
        from: row.get(6)?,
        max_retries: row.get(7)?,
        retry_delay_ms: row.get(8)?,
        backoff: row.get(9)?,
        max_retry_delay_ms: row.get(10)?,
        connections: row.get(11)?,
        rate_per_second: row.get(12)?,
        rate_burst: row.get(13)?,
        timeout_ms: row.get(14)?,
        overall_timeout_ms: row.get(15)?,
        token_url: row.get(16)?,
        client_id: row.get(17)?,
        client_secret: row.get(18)?,
        scope: row.get(19)?,
        updated_at: row.get(20)?,
        fallback_relays: row.get(21)?,
    })
}

fn millis(v: i64) -> Duration {
    Duration::from_millis(u64::try_from(v).unwrap_or(0))
}

impl SmtpRow {
    fn decode(self, secrets: &Keyring) -> Result<Stored<SmtpSettings>> {
        let missing = |column: &str| corrupt(format!("ChannelConfig.{column} is NULL"));
        let auth = match self.mechanism.as_str() {
            "none" => SmtpAuth::None,
            "password" => SmtpAuth::Password {
                username: self.username.ok_or_else(|| missing("Username"))?,
                password: secrets.open(
                    &self.password.ok_or_else(|| missing("Password"))?,
                    Slot::SmtpPassword,
                )?,
            },
            "xoauth2" => SmtpAuth::XOAuth2 {
                username: self.username.ok_or_else(|| missing("Username"))?,
                oauth: OAuthClientCredentials {
                    token_url: self.token_url.ok_or_else(|| missing("OAuthTokenUrl"))?,
                    client_id: self.client_id.ok_or_else(|| missing("OAuthClientId"))?,
                    client_secret: secrets.open(
                        &self
                            .client_secret
                            .ok_or_else(|| missing("OAuthClientSecret"))?,
                        Slot::OAuthClientSecret,
                    )?,
                    scope: self.scope.unwrap_or_default(),
                },
            },
            other => return Err(corrupt(format!("auth mechanism {other:?}"))),
        };
        let retry_delay = millis(self.retry_delay_ms);
        let backoff = decode_backoff(&self.backoff, retry_delay, self.max_retry_delay_ms)?;
        let timeout = millis(self.timeout_ms);
        Ok(Stored {
            value: SmtpSettings {
                host: self.host,
                port: self.port,
                tls: TlsMode::parse(&self.tls)
                    .ok_or_else(|| corrupt(format!("TLS mode {:?}", self.tls)))?,
                auth,
                from_address: EmailAddress::parse(&self.from, "from_address").map_err(corrupt)?,
                timeout,
                // Rows written before the column existed bound a delivery by four commands' time.
                overall_timeout: self.overall_timeout_ms.map_or(timeout * 4, millis),
                policy: DeliveryPolicy {
                    max_retries: self.max_retries,
                    retry_delay,
                    backoff,
                    max_concurrent_connections: self.connections,
                    rate_limit: self.rate_per_second.map(|per_second| {
                        super::super::stored_rate_limit(per_second, self.rate_burst)
                    }),
                },
                fallback_relays: SmtpRelay::parse_list(
                    self.fallback_relays.as_deref().unwrap_or_default(),
                )
                .map_err(corrupt)?,
            },
            updated_at: at_ms("UpdatedAt", self.updated_at)?,
        })
    }
}

/// A stored backoff: an exponential one's cap, where a row lacks it, is its base delay.
fn decode_backoff(backoff: &str, retry_delay: Duration, cap_ms: Option<i64>) -> Result<Backoff> {
    match backoff {
        "fixed" => Ok(Backoff::Fixed),
        "exponential" => Ok(Backoff::Exponential {
            cap: cap_ms.map_or(retry_delay, millis),
        }),
        other => Err(corrupt(format!("backoff {other:?}"))),
    }
}

pub(super) fn select_smtp_settings(
    conn: &Connection,
    secrets: &Keyring,
) -> Result<Option<Stored<SmtpSettings>>> {
    conn.prepare_cached(include_str!("sql/select_smtp_settings.sql"))?
        .query_row([EMAIL_CHANNEL], read_smtp)
        .optional()?
        .map(|row| row.decode(secrets))
        .transpose()
}

pub(super) fn replace_smtp_settings(
    conn: &Connection,
    s: &SmtpSettings,
    secrets: &Keyring,
    now: DateTime<Utc>,
) -> Result<()> {
    let (username, password, oauth) = match &s.auth {
        SmtpAuth::None => (None, None, None),
        SmtpAuth::Password { username, password } => (
            Some(username.as_str()),
            Some(secrets.seal(password, Slot::SmtpPassword)?),
            None,
        ),
        SmtpAuth::XOAuth2 { username, oauth } => (Some(username.as_str()), None, Some(oauth)),
    };
    let client_secret = oauth
        .map(|o| secrets.seal(&o.client_secret, Slot::OAuthClientSecret))
        .transpose()?;
    let p = &s.policy;
    let max_retry_delay = p.backoff.cap().map(duration_ms);
    conn.prepare_cached(include_str!("sql/replace_smtp_settings.sql"))?
        .execute(params![
            EMAIL_CHANNEL,
            s.host,
            s.port,
            s.tls.as_str(),
            s.auth.mechanism(),
            username,
            password,
            s.from_address.as_str(),
            p.max_retries,
            duration_ms(p.retry_delay),
            p.backoff.as_str(),
            max_retry_delay,
            p.max_concurrent_connections,
            p.rate_limit.map(|r| r.per_second()),
            p.rate_limit.map(|r| r.burst()),
            duration_ms(s.timeout),
            duration_ms(s.overall_timeout),
            oauth.map(|o| o.token_url.as_str()),
            oauth.map(|o| o.client_id.as_str()),
            client_secret,
            oauth.map(|o| o.scope.as_str()),
            ms(now),
            SmtpRelay::list_text(&s.fallback_relays),
        ])?;
    Ok(())
}

/// The webhook channel's row (`select_webhook_settings.sql`), decoded.
fn read_webhook(row: &rusqlite::Row<'_>) -> rusqlite::Result<WebhookRow> {
    Ok(WebhookRow {
        max_retries: row.get(0)?,
        retry_delay_ms: row.get(1)?,
        backoff: row.get(2)?,
        max_retry_delay_ms: row.get(3)?,
        connections: row.get(4)?,
        rate_per_second: row.get(5)?,
        rate_burst: row.get(6)?,
        timeout_ms: row.get(7)?,
        updated_at: row.get(8)?,
    })
}

/// The webhook channel's `ChannelConfig` row as stored.
struct WebhookRow {
    max_retries: i64,
    retry_delay_ms: i64,
    backoff: String,
    max_retry_delay_ms: Option<i64>,
    connections: u32,
    rate_per_second: Option<f64>,
    rate_burst: Option<u32>,
    timeout_ms: i64,
    updated_at: i64,
}

impl WebhookRow {
    fn decode(self) -> Result<Stored<WebhookSettings>> {
        let retry_delay = millis(self.retry_delay_ms);
        Ok(Stored {
            value: WebhookSettings {
                timeout: millis(self.timeout_ms),
                policy: DeliveryPolicy {
                    max_retries: self.max_retries,
                    retry_delay,
                    backoff: decode_backoff(&self.backoff, retry_delay, self.max_retry_delay_ms)?,
                    max_concurrent_connections: self.connections,
                    rate_limit: self.rate_per_second.map(|per_second| {
                        super::super::stored_rate_limit(per_second, self.rate_burst)
                    }),
                },
            },
            updated_at: at_ms("UpdatedAt", self.updated_at)?,
        })
    }
}

pub(super) fn select_webhook_settings(
    conn: &Connection,
) -> Result<Option<Stored<WebhookSettings>>> {
    conn.prepare_cached(include_str!("sql/select_webhook_settings.sql"))?
        .query_row([WEBHOOK_CHANNEL], read_webhook)
        .optional()?
        .map(WebhookRow::decode)
        .transpose()
}

pub(super) fn replace_webhook_settings(
    conn: &Connection,
    s: &WebhookSettings,
    now: DateTime<Utc>,
) -> Result<()> {
    let p = &s.policy;
    let max_retry_delay = p.backoff.cap().map(duration_ms);
    conn.prepare_cached(include_str!("sql/replace_webhook_settings.sql"))?
        .execute(params![
            WEBHOOK_CHANNEL,
            p.max_retries,
            duration_ms(p.retry_delay),
            p.backoff.as_str(),
            max_retry_delay,
            p.max_concurrent_connections,
            p.rate_limit.map(|r| r.per_second()),
            p.rate_limit.map(|r| r.burst()),
            duration_ms(s.timeout),
            ms(now),
        ])?;
    Ok(())
}

/// Whether channel `channel`'s settings row is stored.
fn channel_exists(conn: &Connection, channel: &str) -> Result<bool> {
    Ok(conn
        .prepare_cached(include_str!("sql/channel_exists.sql"))?
        .query_row([channel], |row| row.get(0))?)
}

/// Stores the email settings unless a row is stored; true if stored. Run as one writer job.
pub(super) fn seed_smtp_settings(
    conn: &Connection,
    s: &SmtpSettings,
    secrets: &Keyring,
    now: DateTime<Utc>,
) -> Result<bool> {
    if channel_exists(conn, EMAIL_CHANNEL)? {
        return Ok(false);
    }
    replace_smtp_settings(conn, s, secrets, now)?;
    Ok(true)
}

/// Stores the webhook settings unless a row is stored; true if stored. Run as one writer job.
pub(super) fn seed_webhook_settings(
    conn: &Connection,
    s: &WebhookSettings,
    now: DateTime<Utc>,
) -> Result<bool> {
    if channel_exists(conn, WEBHOOK_CHANNEL)? {
        return Ok(false);
    }
    replace_webhook_settings(conn, s, now)?;
    Ok(true)
}

/// Stores a list unless one of its name is stored; true if stored. Run as one writer job.
pub(super) fn seed_list(
    conn: &Connection,
    list: &NotificationList,
    secrets: &Keyring,
    now: DateTime<Utc>,
) -> Result<bool> {
    let exists: bool = conn
        .prepare_cached(include_str!("sql/list_exists.sql"))?
        .query_row([list.name.as_str()], |row| row.get(0))?;
    if exists {
        return Ok(false);
    }
    replace_list(conn, list, secrets, now)?;
    Ok(true)
}

pub(super) fn delete_smtp_settings(conn: &Connection) -> Result<bool> {
    let deleted = conn
        .prepare_cached(include_str!("sql/delete_smtp_settings.sql"))?
        .execute([EMAIL_CHANNEL])?;
    Ok(deleted > 0)
}

/// Seals every stored secret that is not sealed with the current key yet (legacy clear text, or
/// an earlier key), in one transaction, and checks that the others open. Fails, naming the key
/// id, on a value sealed with a key that is not configured. UpdatedAt is left alone: the
/// settings did not change, only how they are kept.
pub(super) fn reseal_secrets(conn: &Connection, secrets: &Keyring) -> Result<ResealReport> {
    let mut report = ResealReport::default();
    let lists = conn
        .prepare_cached(include_str!("sql/select_list_secrets.sql"))?
        .query_map([], |row| {
            Ok((row.get::<_, String>(0)?, row.get::<_, String>(1)?))
        })?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    let mut update_list = conn.prepare_cached(include_str!("sql/reseal_list_secret.sql"))?;
    for (name, stored) in lists {
        let outcome = secrets.reseal(&stored, Slot::WebhookSecret(&name))?;
        report.count(&outcome);
        if let Resealed::Replace(sealed) = outcome {
            update_list.execute(params![name, sealed])?;
        }
    }
    let channel: Option<(Option<String>, Option<String>)> = conn
        .prepare_cached(include_str!("sql/select_smtp_secrets.sql"))?
        .query_row([EMAIL_CHANNEL], |row| Ok((row.get(0)?, row.get(1)?)))
        .optional()?;
    let Some((password, client_secret)) = channel else {
        return Ok(report);
    };
    for (update, slot, stored) in [
        (
            include_str!("sql/reseal_smtp_password.sql"),
            Slot::SmtpPassword,
            password,
        ),
        (
            include_str!("sql/reseal_oauth_client_secret.sql"),
            Slot::OAuthClientSecret,
            client_secret,
        ),
    ] {
        let Some(stored) = stored else { continue };
        let outcome = secrets.reseal(&stored, slot)?;
        report.count(&outcome);
        if let Resealed::Replace(sealed) = outcome {
            conn.prepare_cached(update)?
                .execute(params![EMAIL_CHANNEL, sealed])?;
        }
    }
    Ok(report)
}
