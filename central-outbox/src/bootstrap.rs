//! What central's config file does to the stored channel settings and lists at start-up.
//!
//! The database is the authority: the email channel's settings, the webhook channel's settings
//! and the notification lists are what is stored, changed at run time through the admin API
//! (`outboxctl`, the console). The file's `[smtp]`, `[webhook]` and `[[lists]]` only fill in
//! what the database lacks ([`ApplyChannels::SeedMissing`], every start): a stored item is
//! kept whatever the file says, so an operator's edit survives a restart, and replicas started
//! with different files do not take turns overwriting each other. Replacing stored items with
//! the file's is an explicit step, `central-outbox --apply-config`
//! ([`ApplyChannels::ReplaceStored`]), which writes every item the file names over the stored
//! one and leaves the rest alone. Every item is logged at INFO as seeded, kept or replaced.
//!
//! A seed is atomic in the store (`ChannelSettingsStore::seed_*`), so of two replicas starting
//! together on an empty database one stores its file's item and the other keeps it.

use crate::config::{ApplyChannels, Settings};
use crate::store::{ChannelSettingsStore, Result};

/// What start-up did with one item of the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Applied {
    /// The database had none: the file's is stored.
    Seeded,
    /// The database had one: it is kept, the file's is ignored.
    Kept,
    /// `--apply-config`: the file's is written over the stored one.
    Replaced,
}

impl Applied {
    fn as_str(self) -> &'static str {
        match self {
            Self::Seeded => "seeded from the config file",
            Self::Kept => "kept as stored (the database wins; --apply-config replaces it)",
            Self::Replaced => "replaced with the config file's (--apply-config)",
        }
    }

    fn seeded(stored: bool) -> Self {
        if stored { Self::Seeded } else { Self::Kept }
    }
}

/// Seeds (or, with `--apply-config`, replaces) the stored channel settings and lists with the
/// file's, and logs what became of each item.
pub async fn apply<S: ChannelSettingsStore>(store: &S, settings: &Settings) -> Result<()> {
    let replace = settings.apply_channels == ApplyChannels::ReplaceStored;
    if let Some(smtp) = settings.smtp.clone() {
        let applied = if replace {
            store.put_smtp_settings(smtp).await?;
            Applied::Replaced
        } else {
            Applied::seeded(store.seed_smtp_settings(smtp).await?)
        };
        tracing::info!(channel = "email", "SMTP settings: {}", applied.as_str());
    }
    if let Some(webhook) = settings.webhook.clone() {
        let applied = if replace {
            store.put_webhook_settings(webhook).await?;
            Applied::Replaced
        } else {
            Applied::seeded(store.seed_webhook_settings(webhook).await?)
        };
        tracing::info!(
            channel = "webhook",
            "webhook settings: {}",
            applied.as_str()
        );
    }
    for list in settings.lists.iter().cloned() {
        let name = list.name.clone();
        let applied = if replace {
            store.upsert_list(list).await?;
            Applied::Replaced
        } else {
            Applied::seeded(store.seed_list(list).await?)
        };
        tracing::info!(
            list = name.as_str(),
            "notification list: {}",
            applied.as_str()
        );
    }
    if replace {
        tracing::info!(
            "--apply-config: the config file's channel settings and lists replaced the stored \
             ones; start without the flag from now on, or the file wins again at every start"
        );
    }
    Ok(())
}
