//! Notification lists and channel settings in the SQLite backend. Read on the read pool, written
//! through the group-commit writer like everything else.

use chrono::{DateTime, Utc};
use rusqlite::{Connection, OptionalExtension, params};

use super::{at_ms, corrupt, duration_ms, ms};
use crate::domain::channel::{
    EmailAddress, NotificationList, Secret, SmtpAuth, SmtpSettings, Stored, TlsMode,
};
use crate::domain::{ListName, NotificationType};
use crate::store::Result;

/// The channel key of the email settings row in `ChannelConfig`.
const EMAIL_CHANNEL: &str = "email";

pub(super) fn select_list(
    conn: &Connection,
    name: &ListName,
) -> Result<Option<Stored<NotificationList>>> {
    let row: Option<(String, i64)> = conn
        .prepare_cached("SELECT Type, UpdatedAt FROM NotificationLists WHERE Name = ?1")?
        .query_row([name.as_str()], |row| Ok((row.get(0)?, row.get(1)?)))
        .optional()?;
    let Some((kind, updated_at)) = row else {
        return Ok(None);
    };
    let kind =
        NotificationType::from_db(&kind).ok_or_else(|| corrupt(format!("list type {kind:?}")))?;
    Ok(Some(Stored {
        value: NotificationList {
            name: name.clone(),
            kind,
            recipients: select_recipients(conn, name)?,
        },
        updated_at: at_ms(updated_at),
    }))
}

fn select_recipients(conn: &Connection, name: &ListName) -> Result<Vec<EmailAddress>> {
    let mut stmt = conn.prepare_cached(
        "SELECT Address FROM NotificationListRecipients WHERE ListName = ?1 ORDER BY Address",
    )?;
    stmt.query_map([name.as_str()], |row| row.get::<_, String>(0))?
        .map(|address| {
            let address = address?;
            EmailAddress::parse(&address, "recipients").map_err(corrupt)
        })
        .collect()
}

pub(super) fn select_lists(conn: &Connection) -> Result<Vec<Stored<NotificationList>>> {
    let names = conn
        .prepare_cached("SELECT Name FROM NotificationLists ORDER BY Name")?
        .query_map([], |row| row.get::<_, String>(0))?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    let mut lists = Vec::with_capacity(names.len());
    for name in names {
        let name = ListName::parse(name).map_err(corrupt)?;
        if let Some(list) = select_list(conn, &name)? {
            lists.push(list);
        }
    }
    Ok(lists)
}

pub(super) fn replace_list(
    conn: &Connection,
    list: &NotificationList,
    now: DateTime<Utc>,
) -> Result<()> {
    conn.prepare_cached(
        "INSERT INTO NotificationLists (Name, Type, UpdatedAt) VALUES (?1, ?2, ?3)
         ON CONFLICT (Name) DO UPDATE SET Type = excluded.Type, UpdatedAt = excluded.UpdatedAt",
    )?
    .execute(params![list.name.as_str(), list.kind.as_str(), ms(now)])?;
    conn.prepare_cached("DELETE FROM NotificationListRecipients WHERE ListName = ?1")?
        .execute([list.name.as_str()])?;
    let mut insert = conn.prepare_cached(
        "INSERT OR IGNORE INTO NotificationListRecipients (ListName, Address) VALUES (?1, ?2)",
    )?;
    for recipient in &list.recipients {
        insert.execute([list.name.as_str(), recipient.as_str()])?;
    }
    Ok(())
}

pub(super) fn delete_list(conn: &Connection, name: &ListName) -> Result<bool> {
    // Recipients go explicitly rather than by ON DELETE CASCADE, which needs foreign keys on.
    conn.prepare_cached("DELETE FROM NotificationListRecipients WHERE ListName = ?1")?
        .execute([name.as_str()])?;
    let deleted = conn
        .prepare_cached("DELETE FROM NotificationLists WHERE Name = ?1")?
        .execute([name.as_str()])?;
    Ok(deleted > 0)
}

pub(super) fn select_smtp_settings(conn: &Connection) -> Result<Option<Stored<SmtpSettings>>> {
    let mut stmt = conn.prepare_cached(
        "SELECT Host, Port, TlsMode, Username, Password, FromAddress, MaxRetries, RetryDelayMs,
                MaxConcurrentConnections, TimeoutMs, UpdatedAt
         FROM ChannelConfig WHERE Channel = ?1",
    )?;
    let row = stmt
        .query_row([EMAIL_CHANNEL], |row| {
            Ok((
                (
                    row.get::<_, String>(0)?,
                    row.get::<_, u16>(1)?,
                    row.get::<_, String>(2)?,
                ),
                (
                    row.get::<_, Option<String>>(3)?,
                    row.get::<_, Option<String>>(4)?,
                ),
                row.get::<_, String>(5)?,
                (row.get::<_, i64>(6)?, row.get::<_, i64>(7)?),
                (row.get::<_, u32>(8)?, row.get::<_, i64>(9)?),
                row.get::<_, i64>(10)?,
            ))
        })
        .optional()?;
    let Some(((host, port, tls), (user, password), from, (retries, delay), (conns, timeout), at)) =
        row
    else {
        return Ok(None);
    };
    let auth = match (user, password) {
        (Some(username), Some(password)) => SmtpAuth::Password {
            username,
            password: Secret::new(password),
        },
        _ => SmtpAuth::None,
    };
    let millis = |v: i64| std::time::Duration::from_millis(u64::try_from(v).unwrap_or(0));
    Ok(Some(Stored {
        value: SmtpSettings {
            host,
            port,
            tls: TlsMode::parse(&tls).ok_or_else(|| corrupt(format!("TLS mode {tls:?}")))?,
            auth,
            from_address: EmailAddress::parse(&from, "from_address").map_err(corrupt)?,
            max_retries: retries,
            retry_delay: millis(delay),
            max_concurrent_connections: conns,
            timeout: millis(timeout),
        },
        updated_at: at_ms(at),
    }))
}

pub(super) fn replace_smtp_settings(
    conn: &Connection,
    s: &SmtpSettings,
    now: DateTime<Utc>,
) -> Result<()> {
    let (username, password) = match &s.auth {
        SmtpAuth::None => (None, None),
        SmtpAuth::Password { username, password } => {
            (Some(username.as_str()), Some(password.expose()))
        }
    };
    conn.prepare_cached(
        "INSERT INTO ChannelConfig (Channel, Host, Port, TlsMode, Username, Password, FromAddress,
             MaxRetries, RetryDelayMs, MaxConcurrentConnections, TimeoutMs, UpdatedAt)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)
         ON CONFLICT (Channel) DO UPDATE SET
             Host = excluded.Host, Port = excluded.Port, TlsMode = excluded.TlsMode,
             Username = excluded.Username, Password = excluded.Password,
             FromAddress = excluded.FromAddress, MaxRetries = excluded.MaxRetries,
             RetryDelayMs = excluded.RetryDelayMs,
             MaxConcurrentConnections = excluded.MaxConcurrentConnections,
             TimeoutMs = excluded.TimeoutMs, UpdatedAt = excluded.UpdatedAt",
    )?
    .execute(params![
        EMAIL_CHANNEL,
        s.host,
        s.port,
        s.tls.as_str(),
        username,
        password,
        s.from_address.as_str(),
        s.max_retries,
        duration_ms(s.retry_delay),
        s.max_concurrent_connections,
        duration_ms(s.timeout),
        ms(now),
    ])?;
    Ok(())
}

pub(super) fn delete_smtp_settings(conn: &Connection) -> Result<bool> {
    let deleted = conn
        .prepare_cached("DELETE FROM ChannelConfig WHERE Channel = ?1")?
        .execute([EMAIL_CHANNEL])?;
    Ok(deleted > 0)
}
