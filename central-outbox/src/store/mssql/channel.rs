//! Notification lists and channel settings in the MS SQL backend. A list and its targets are
//! written together in one transaction; targets are read back sorted by address, as the SQLite
//! backend returns them.
//!
//! Each channel's settings are one `ChannelConfig` row ('email', 'webhook'). A seed stores a
//! list or a channel's row only where none is, in one statement; a duplicate key (another
//! replica seeding the same item at that moment) means it was there.
//!
//! Secret columns (`WebhookSecret`, `Password`, `OAuthClientSecret`) are written only as values
//! sealed by the store's [`Keyring`]; every read opens them, and [`reseal_secrets`] brings older
//! rows (clear text from earlier releases, or an earlier key) to the current key.

use std::collections::BTreeMap;
use std::time::Duration;

use tiberius::Row;

use super::dispatch::single_count;
use super::{MsSqlStore, decode, result_set, sql};
use crate::domain::ListName;
use crate::domain::channel::{
    DeliveryPolicy, EmailAddress, ListTargets, NotificationList, OAuthClientCredentials, SmtpAuth,
    SmtpSettings, Stored, TlsMode, WebhookSettings,
};
use crate::domain::retry::Backoff;
use crate::domain::smtp_relay::SmtpRelay;
use crate::secrets::{Keyring, ResealReport, Resealed, Slot};
use crate::store::stored_list::StoredList;
use crate::store::{Result, StoreError};

/// The channel key of the email settings row in `ChannelConfig`.
const EMAIL_CHANNEL: &str = "email";
/// The channel key of the webhook settings row in `ChannelConfig` (migration 0010).
const WEBHOOK_CHANNEL: &str = "webhook";

fn corrupt(what: impl std::fmt::Display) -> StoreError {
    StoreError::Corrupt(what.to_string())
}

/// A list row with its targets (addresses or URLs, in any order).
fn read_list(
    row: &Row,
    mut targets: Vec<String>,
    secrets: &Keyring,
) -> Result<Stored<NotificationList>> {
    // Sorted as the SQLite backend reads them (ORDER BY Address: byte order, as here).
    targets.sort();
    let consolidation = |column| decode::opt::<i32>(row, column).map(|v| v.map(i64::from));
    let stored = StoredList {
        name: ListName::parse(decode::text(row, "Name")?).map_err(corrupt)?,
        kind: decode::text(row, "Type")?,
        webhook_format: decode::opt_text(row, "WebhookFormat")?,
        webhook_secret: decode::opt_text(row, "WebhookSecret")?,
        webhook_fallbacks: decode::opt_text(row, "WebhookFallbacks")?,
        status_callback: decode::opt_text(row, "StatusCallbackUrl")?,
        targets,
        consolidation: [
            consolidation("ConsolidateThreshold")?,
            consolidation("ConsolidateWindowSeconds")?,
            consolidation("ConsolidateMaxPerDigest")?,
        ],
        escalation: decode::opt_text(row, "Escalation")?,
    };
    Ok(Stored {
        value: stored.decode(secrets)?,
        updated_at: decode::time(row, "UpdatedAt")?,
    })
}

/// Targets by list name, from a `ListName, Address` result.
fn targets_by_list(rows: &[Row]) -> Result<BTreeMap<String, Vec<String>>> {
    let mut by_list: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for row in rows {
        by_list
            .entry(decode::text(row, "ListName")?)
            .or_default()
            .push(decode::text(row, "Address")?);
    }
    Ok(by_list)
}

pub(super) async fn list(
    store: &MsSqlStore,
    name: &ListName,
) -> Result<Option<Stored<NotificationList>>> {
    let stmt = sql::select_list(name.as_str());
    let mut results = store.batch("list", &stmt.sql, &stmt.params).await?;
    let lists = result_set(&mut results, 0, "list")?;
    let Some(row) = lists.first() else {
        return Ok(None);
    };
    let mut targets = targets_by_list(&result_set(&mut results, 1, "list")?)?;
    read_list(
        row,
        targets.remove(name.as_str()).unwrap_or_default(),
        &store.secrets,
    )
    .map(Some)
}

pub(super) async fn lists(store: &MsSqlStore) -> Result<Vec<Stored<NotificationList>>> {
    let mut results = store.batch("lists", sql::SELECT_LISTS, &[]).await?;
    let rows = result_set(&mut results, 0, "lists")?;
    let mut targets = targets_by_list(&result_set(&mut results, 1, "lists")?)?;
    rows.iter()
        .map(|row| {
            let name = decode::text(row, "Name")?;
            read_list(
                row,
                targets.remove(&name).unwrap_or_default(),
                &store.secrets,
            )
        })
        .collect()
}

pub(super) async fn replace_list(store: &MsSqlStore, list: &NotificationList) -> Result<()> {
    write_list(store, list, sql::ListWrite::Replace)
        .await
        .map(drop)
}

/// Stores `list` unless one of its name is stored; true if this one was stored.
pub(super) async fn seed_list(store: &MsSqlStore, list: &NotificationList) -> Result<bool> {
    write_list(store, list, sql::ListWrite::Seed).await
}

/// Replaces or seeds `list`; true if a seed stored it (always true for a replace).
async fn write_list(
    store: &MsSqlStore,
    list: &NotificationList,
    write: sql::ListWrite,
) -> Result<bool> {
    let (format, secret) = match &list.targets {
        ListTargets::Email(_) => (None, None),
        ListTargets::Webhook(target) => (
            Some(target.format.as_str().to_owned()),
            target
                .secret
                .as_ref()
                .map(|s| {
                    store
                        .secrets
                        .seal(s, Slot::WebhookSecret(list.name.as_str()))
                })
                .transpose()?,
        ),
    };
    // A list holds each target once (the SQLite backend's key enforces the same).
    let mut targets = list.target_names();
    targets.sort();
    targets.dedup();
    let stmt = sql::replace_list_with(
        write,
        list.name.as_str(),
        list.kind(),
        format,
        secret,
        list.consolidation,
        crate::store::stored_list::fallbacks_text(list),
        targets,
        list.escalation.as_ref(),
        list.status_callback.as_ref().map(ToString::to_string),
    );
    // Two replicas creating the same new list at once: the loser's insert fails on the key and
    // is rolled back. A replace runs again and updates the winner's row; a seed finds the list
    // stored, which is what it asks.
    match (store.batch_raw(&stmt.sql, &stmt.params).await, write) {
        (Err(e), sql::ListWrite::Replace)
            if super::error::classify(&e) == super::error::ErrorClass::DuplicateKey =>
        {
            store.batch("upsert list", &stmt.sql, &stmt.params).await?;
            Ok(true)
        }
        (Err(e), sql::ListWrite::Seed)
            if super::error::classify(&e) == super::error::ErrorClass::DuplicateKey =>
        {
            Ok(false)
        }
        (Ok(_), sql::ListWrite::Replace) => Ok(true),
        (Ok(mut results), sql::ListWrite::Seed) => {
            Ok(single_count(&mut results, "Inserted", "seed list")? > 0)
        }
        (Err(e), _) => Err(super::error::to_store_error("upsert list", &e)),
    }
}

pub(super) async fn delete_list(store: &MsSqlStore, name: &ListName) -> Result<bool> {
    let stmt = sql::delete_list(name.as_str());
    let mut results = store.batch("delete list", &stmt.sql, &stmt.params).await?;
    Ok(single_count(&mut results, "Deleted", "delete list")? > 0)
}

fn millis(v: i64) -> Duration {
    Duration::from_millis(u64::try_from(v).unwrap_or(0))
}

fn read_smtp(row: &Row, secrets: &Keyring) -> Result<Stored<SmtpSettings>> {
    let missing = |column: &str| corrupt(format!("ChannelConfig.{column} is NULL"));
    let username = decode::opt_text(row, "Username")?;
    let mechanism = decode::text(row, "AuthMechanism")?;
    let auth = match mechanism.as_str() {
        "none" => SmtpAuth::None,
        "password" => SmtpAuth::Password {
            username: username.ok_or_else(|| missing("Username"))?,
            password: secrets.open(
                &decode::opt_text(row, "Password")?.ok_or_else(|| missing("Password"))?,
                Slot::SmtpPassword,
            )?,
        },
        "xoauth2" => SmtpAuth::XOAuth2 {
            username: username.ok_or_else(|| missing("Username"))?,
            oauth: OAuthClientCredentials {
                token_url: decode::opt_text(row, "OAuthTokenUrl")?
                    .ok_or_else(|| missing("OAuthTokenUrl"))?,
                client_id: decode::opt_text(row, "OAuthClientId")?
                    .ok_or_else(|| missing("OAuthClientId"))?,
                client_secret: secrets.open(
                    &decode::opt_text(row, "OAuthClientSecret")?
                        .ok_or_else(|| missing("OAuthClientSecret"))?,
                    Slot::OAuthClientSecret,
                )?,
                scope: decode::opt_text(row, "OAuthScope")?.unwrap_or_default(),
            },
        },
        other => return Err(corrupt(format!("auth mechanism {other:?}"))),
    };
    let timeout = millis(decode::req::<i64>(row, "TimeoutMs")?);
    let tls = decode::text(row, "TlsMode")?;
    let port = decode::req::<i32>(row, "Port")?;
    Ok(Stored {
        value: SmtpSettings {
            host: decode::text(row, "Host")?,
            port: u16::try_from(port).map_err(|_| corrupt(format!("port {port}")))?,
            tls: TlsMode::parse(&tls).ok_or_else(|| corrupt(format!("TLS mode {tls:?}")))?,
            auth,
            from_address: EmailAddress::parse(&decode::text(row, "FromAddress")?, "from_address")
                .map_err(corrupt)?,
            timeout,
            overall_timeout: decode::opt::<i64>(row, "OverallTimeoutMs")?
                .map_or(timeout * 4, millis),
            policy: read_policy(row)?,
            fallback_relays: SmtpRelay::parse_list(
                decode::opt_text(row, "FallbackRelays")?
                    .as_deref()
                    .unwrap_or_default(),
            )
            .map_err(corrupt)?,
        },
        updated_at: decode::time(row, "UpdatedAt")?,
    })
}

/// A channel row's pacing and retries (the columns both channels' rows have).
fn read_policy(row: &Row) -> Result<DeliveryPolicy> {
    let retry_delay = millis(decode::req::<i64>(row, "RetryDelayMs")?);
    let backoff = decode::text(row, "Backoff")?;
    let backoff = match backoff.as_str() {
        "fixed" => Backoff::Fixed,
        "exponential" => Backoff::Exponential {
            cap: decode::opt::<i64>(row, "MaxRetryDelayMs")?.map_or(retry_delay, millis),
        },
        other => return Err(corrupt(format!("backoff {other:?}"))),
    };
    let connections = decode::req::<i32>(row, "MaxConcurrentConnections")?;
    let rate = decode::opt::<f64>(row, "RateLimitPerSecond")?;
    let burst = decode::opt::<i64>(row, "RateLimitBurst")?;
    Ok(DeliveryPolicy {
        max_retries: decode::req::<i64>(row, "MaxRetries")?,
        retry_delay,
        backoff,
        max_concurrent_connections: u32::try_from(connections)
            .map_err(|_| corrupt(format!("connections {connections}")))?,
        rate_limit: rate.map(|per_second| {
            let burst = burst.map(|b| u32::try_from(b).unwrap_or(u32::MAX));
            super::super::stored_rate_limit(per_second, burst)
        }),
    })
}

/// The webhook channel's row: its POST timeout and policy (its relay columns are NULL).
fn read_webhook(row: &Row) -> Result<Stored<WebhookSettings>> {
    Ok(Stored {
        value: WebhookSettings {
            timeout: millis(decode::req::<i64>(row, "TimeoutMs")?),
            policy: read_policy(row)?,
        },
        updated_at: decode::time(row, "UpdatedAt")?,
    })
}

pub(super) async fn webhook_settings(
    store: &MsSqlStore,
) -> Result<Option<Stored<WebhookSettings>>> {
    let stmt = sql::select_channel(WEBHOOK_CHANNEL);
    let mut results = store
        .batch("webhook settings", &stmt.sql, &stmt.params)
        .await?;
    result_set(&mut results, 0, "webhook settings")?
        .first()
        .map(read_webhook)
        .transpose()
}

/// Replaces the webhook channel's settings, or (a seed) stores them only if none are; true if
/// these were stored.
pub(super) async fn write_webhook_settings(
    store: &MsSqlStore,
    s: &WebhookSettings,
    write: sql::ChannelWrite,
) -> Result<bool> {
    let stmt = sql::replace_webhook_channel(write, WEBHOOK_CHANNEL, s);
    write_channel(store, stmt, write, "webhook settings").await
}

/// Runs a channel row's replace or seed. A duplicate key is another replica's first insert at
/// the same moment: a replace runs again and updates it, a seed finds the row stored.
async fn write_channel(
    store: &MsSqlStore,
    stmt: sql::Statement,
    write: sql::ChannelWrite,
    context: &str,
) -> Result<bool> {
    match (store.batch_raw(&stmt.sql, &stmt.params).await, write) {
        (Err(e), sql::ChannelWrite::Replace)
            if super::error::classify(&e) == super::error::ErrorClass::DuplicateKey =>
        {
            store.batch(context, &stmt.sql, &stmt.params).await?;
            Ok(true)
        }
        (Err(e), sql::ChannelWrite::Seed)
            if super::error::classify(&e) == super::error::ErrorClass::DuplicateKey =>
        {
            Ok(false)
        }
        (Ok(_), sql::ChannelWrite::Replace) => Ok(true),
        (Ok(mut results), sql::ChannelWrite::Seed) => {
            Ok(single_count(&mut results, "Inserted", context)? > 0)
        }
        (Err(e), _) => Err(super::error::to_store_error(context, &e)),
    }
}

pub(super) async fn smtp_settings(store: &MsSqlStore) -> Result<Option<Stored<SmtpSettings>>> {
    let stmt = sql::select_channel(EMAIL_CHANNEL);
    let mut results = store
        .batch("SMTP settings", &stmt.sql, &stmt.params)
        .await?;
    result_set(&mut results, 0, "SMTP settings")?
        .first()
        .map(|row| read_smtp(row, &store.secrets))
        .transpose()
}

/// Replaces the email channel's settings, or (a seed) stores them only if none are; true if
/// these were stored.
pub(super) async fn write_smtp_settings(
    store: &MsSqlStore,
    s: &SmtpSettings,
    write: sql::ChannelWrite,
) -> Result<bool> {
    let (password, oauth) = match &s.auth {
        SmtpAuth::None => (None, None),
        SmtpAuth::Password { password, .. } => (
            Some(store.secrets.seal(password, Slot::SmtpPassword)?),
            None,
        ),
        SmtpAuth::XOAuth2 { oauth, .. } => (None, Some(oauth)),
    };
    let client_secret = oauth
        .map(|o| {
            store
                .secrets
                .seal(&o.client_secret, Slot::OAuthClientSecret)
        })
        .transpose()?;
    let stmt = sql::replace_channel(write, EMAIL_CHANNEL, s, password, client_secret);
    write_channel(store, stmt, write, "SMTP settings").await
}

pub(super) async fn delete_smtp_settings(store: &MsSqlStore) -> Result<bool> {
    let stmt = sql::delete_channel(EMAIL_CHANNEL);
    let mut results = store
        .batch("SMTP settings", &stmt.sql, &stmt.params)
        .await?;
    Ok(single_count(&mut results, "Deleted", "SMTP settings")? > 0)
}

/// Seals every stored secret that is not sealed with the current key yet (legacy clear text, or
/// an earlier key) and checks that the others open. Every value is checked before anything is
/// written, so a value sealed with a key that is not configured fails the pass (naming the key
/// id) with nothing changed. Each replacement applies only while the stored value is still the
/// one read, so a replica starting at the same time, or an operator's write, is never
/// overwritten with an older secret. UpdatedAt is left alone: the settings did not change.
pub(super) async fn reseal_secrets(store: &MsSqlStore) -> Result<ResealReport> {
    let secrets = &store.secrets;
    let mut report = ResealReport::default();
    let mut updates: Vec<sql::Statement> = Vec::new();
    let mut results = store.batch("secrets", sql::SELECT_SECRETS, &[]).await?;
    for row in result_set(&mut results, 0, "secrets")? {
        let name = decode::text(&row, "Name")?;
        let stored = decode::text(&row, "WebhookSecret")?;
        let outcome = secrets.reseal(&stored, Slot::WebhookSecret(&name))?;
        report.count(&outcome);
        if let Resealed::Replace(sealed) = outcome {
            updates.push(sql::reseal_list_secret(&name, stored, sealed));
        }
    }
    for row in result_set(&mut results, 1, "secrets")? {
        let channel = decode::text(&row, "Channel")?;
        // (old, new) for each column, or (NULL, NULL) to leave it alone.
        let mut replace = |column: &str, slot: Slot<'_>| -> Result<Option<(String, String)>> {
            let Some(stored) = decode::opt_text(&row, column)? else {
                return Ok(None);
            };
            let outcome = secrets.reseal(&stored, slot)?;
            report.count(&outcome);
            Ok(match outcome {
                Resealed::Replace(sealed) => Some((stored, sealed)),
                Resealed::Current | Resealed::InClear => None,
            })
        };
        let password = replace("Password", Slot::SmtpPassword)?;
        let client_secret = replace("OAuthClientSecret", Slot::OAuthClientSecret)?;
        if password.is_none() && client_secret.is_none() {
            continue;
        }
        updates.push(sql::reseal_channel_secrets(
            &channel,
            password,
            client_secret,
        ));
    }
    for stmt in updates {
        store.batch("secrets", &stmt.sql, &stmt.params).await?;
    }
    Ok(report)
}
