//! Secrets at rest: sealing and opening the credentials central keeps in its database (the SMTP
//! password, the OAuth2 client secret, webhook signing keys) with AES-256-GCM (ring).
//!
//! A sealed value is text, so it fits the existing columns on both backends:
//! `enc:v1:<key id>:<base64(nonce || ciphertext || tag)>`. The key id is the first four bytes of
//! the SHA-256 of the key, in hex: it is what start-up errors and logs name, and what rotation
//! looks up (decrypt with whichever configured key has the id, encrypt with the current one).
//! The version, the key id and the value's place (which column of which row) are authenticated
//! data: a sealed value edited, or copied into another row, fails to open instead of yielding a
//! wrong secret.
//!
//! Invariants:
//! - Nothing this module returns for storage is clear text: [`Keyring::seal`] fails with
//!   [`SecretsError::NoKey`] when no key is configured, so no configuration writes a secret in
//!   clear.
//! - A stored value without the `enc:` prefix is a legacy clear-text value written by an older
//!   release: it is read as it is, and [`Keyring::reseal`] seals it once a key is configured.
//! - Key material never appears in `Debug` output or error messages; only key ids do.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use ring::aead::{AES_256_GCM, Aad, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};
use ring::hmac;
use ring::rand::{SecureRandom, SystemRandom};
use serde::{Deserialize, Serialize};

use crate::domain::channel::Secret;

/// AES-256 takes a 32-byte key.
const KEY_LEN: usize = 32;
/// AES-GCM's tag, appended to the ciphertext by ring.
const TAG_LEN: usize = 16;
/// Bytes of the key's SHA-256 that name it: 32 bits tell a handful of keys apart, and a prefix
/// of the hash of a random 256-bit key reveals nothing about it.
const KEY_ID_LEN: usize = 4;
/// Marks a sealed value; anything else in a secret column is legacy clear text.
const SEALED_PREFIX: &str = "enc:";
/// The format this release writes and reads. A newer format is refused by name rather than
/// mistaken for clear text.
const VERSION: &str = "v1";
/// How a new key is made, for error messages and the docs.
const HOW_TO_GENERATE: &str = "generate one with `openssl rand -base64 32`";

/// The `[secrets]` configuration section: the key new secrets are sealed with, and earlier keys
/// still accepted for reading (rotation). Keys are base64 of 32 random bytes, in a file or (for
/// `key`, e.g. `OUTBOX_CENTRAL_SECRETS__KEY`) in the environment.
#[derive(Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SecretsConfig {
    /// File holding the current key (base64 of 32 bytes; whitespace around it is ignored).
    pub key_file: Option<PathBuf>,
    /// The current key itself, base64; meant for `OUTBOX_CENTRAL_SECRETS__KEY`, not the file.
    pub key: Option<String>,
    /// Files holding earlier keys: secrets sealed with them are read, and re-sealed with the
    /// current key at start-up.
    pub previous_key_files: Vec<PathBuf>,
    /// Earlier keys themselves, base64.
    pub previous_keys: Vec<String>,
}

impl fmt::Debug for SecretsConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SecretsConfig")
            .field("key_file", &self.key_file)
            .field("key", &self.key.as_ref().map(|_| "***"))
            .field("previous_key_files", &self.previous_key_files)
            .field("previous_keys", &self.previous_keys.len())
            .finish()
    }
}

/// Sealing or opening a secret failed. Messages name the secret's place and key ids, never a
/// key or a secret.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SecretsError {
    #[error(
        "cannot store the {slot}: no [secrets] key is configured, and secrets are never stored \
         in clear; set [secrets] key_file (or OUTBOX_CENTRAL_SECRETS__KEY) to a 32-byte key in \
         base64 ({HOW_TO_GENERATE})"
    )]
    NoKey { slot: String },
    #[error(
        "the {slot} is sealed with key id {key_id}, which is not configured ({configured}); add \
         the key with that id to [secrets] previous_key_files (or previous_keys)"
    )]
    UnknownKey {
        slot: String,
        key_id: KeyId,
        configured: String,
    },
    #[error(
        "the {slot} does not decrypt with key id {key_id}: the stored value was altered, or it \
         belongs to another row"
    )]
    Tampered { slot: String, key_id: KeyId },
    #[error("the {slot} is not a valid sealed value: {problem}")]
    Malformed { slot: String, problem: String },
    #[error("cannot seal the {slot}: {problem}")]
    Seal { slot: String, problem: String },
    /// A configuration key is wrong; `key` is its name (`secrets.key_file`).
    #[error("{key}: {problem}")]
    Config { key: String, problem: String },
}

impl SecretsError {
    /// Whether the operator fixes this in `[secrets]` (a key is missing), as opposed to damaged
    /// stored data: the admin API answers FAILED_PRECONDITION for these.
    pub fn needs_configuration(&self) -> bool {
        matches!(
            self,
            Self::NoKey { .. } | Self::UnknownKey { .. } | Self::Config { .. }
        )
    }
}

type Result<T> = std::result::Result<T, SecretsError>;

/// Names a key: the first bytes of its SHA-256, shown as lower-case hex. Compute it for a key
/// file with `base64 -d < FILE | sha256sum | cut -c1-8`.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct KeyId([u8; KEY_ID_LEN]);

impl KeyId {
    fn of(key: &[u8; KEY_LEN]) -> Self {
        let digest = ring::digest::digest(&ring::digest::SHA256, key);
        let mut id = [0; KEY_ID_LEN];
        id.copy_from_slice(&digest.as_ref()[..KEY_ID_LEN]);
        Self(id)
    }

    /// Exactly the form [`fmt::Display`] writes (lower-case hex), so one stored value has one
    /// spelling and the authenticated header is unambiguous.
    fn parse(text: &str) -> Option<Self> {
        if text.len() != 2 * KEY_ID_LEN
            || !text.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
        {
            return None;
        }
        let mut id = [0; KEY_ID_LEN];
        for (i, byte) in id.iter_mut().enumerate() {
            *byte = u8::from_str_radix(text.get(2 * i..2 * i + 2)?, 16).ok()?;
        }
        Some(Self(id))
    }
}

impl fmt::Display for KeyId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.iter().try_for_each(|b| write!(f, "{b:02x}"))
    }
}

impl fmt::Debug for KeyId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "KeyId({self})")
    }
}

/// Where a secret lives. Part of the authenticated data, so a sealed value opens only in its
/// own place, and named in errors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Slot<'a> {
    /// `ChannelConfig.Password` of the email channel.
    SmtpPassword,
    /// `ChannelConfig.OAuthClientSecret` of the email channel.
    OAuthClientSecret,
    /// `NotificationLists.WebhookSecret` of the named list.
    WebhookSecret(&'a str),
}

impl Slot<'_> {
    /// The authenticated data: the stored value's header and its place. Changing this text
    /// makes every stored secret unreadable, so it is fixed.
    fn aad(self, key_id: KeyId) -> String {
        let place = match self {
            Self::SmtpPassword => "channel/email/password".to_owned(),
            Self::OAuthClientSecret => "channel/email/oauth_client_secret".to_owned(),
            Self::WebhookSecret(list) => format!("list/{list}/webhook_secret"),
        };
        format!("{SEALED_PREFIX}{VERSION}:{key_id}:{place}")
    }
}

impl fmt::Display for Slot<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::SmtpPassword => f.write_str("SMTP password"),
            Self::OAuthClientSecret => f.write_str("SMTP OAuth client secret"),
            Self::WebhookSecret(list) => write!(f, "webhook secret of list {list:?}"),
        }
    }
}

struct Key {
    id: KeyId,
    aead: LessSafeKey,
    /// What other keys are derived from (see [`Keyring::derived`]), so a purpose other than
    /// sealing never uses the key itself.
    derive_root: hmac::Key,
}

impl Key {
    fn new(bytes: &[u8; KEY_LEN]) -> Result<Self> {
        let unbound = UnboundKey::new(&AES_256_GCM, bytes).map_err(|_| SecretsError::Config {
            key: "secrets".into(),
            problem: "ring refused a 32-byte AES-256-GCM key".into(),
        })?;
        Ok(Self {
            id: KeyId::of(bytes),
            aead: LessSafeKey::new(unbound),
            derive_root: hmac::Key::new(hmac::HMAC_SHA256, bytes),
        })
    }
}

/// The keys central seals and opens secrets with: the current one (sealing and opening) and
/// earlier ones (opening only). Cheap to clone; `Debug` shows key ids only.
#[derive(Clone)]
pub struct Keyring {
    inner: Arc<Keys>,
}

struct Keys {
    current: Option<Key>,
    previous: Vec<Key>,
}

impl fmt::Debug for Keyring {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Keyring")
            .field("current", &self.inner.current.as_ref().map(|k| k.id))
            .field(
                "previous",
                &self.inner.previous.iter().map(|k| k.id).collect::<Vec<_>>(),
            )
            .finish()
    }
}

/// What [`Keyring::reseal`] found a stored value to be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resealed {
    /// Sealed with the current key already (and it opens): leave it.
    Current,
    /// Legacy clear text or sealed with an earlier key: store this instead.
    Replace(String),
    /// Legacy clear text, and no key to seal it with: left as it is.
    InClear,
}

/// What a start-up pass over the stored secrets did, for the log.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ResealReport {
    /// Values newly sealed with the current key (clear text or an earlier key before).
    pub resealed: usize,
    /// Legacy clear-text values left as they are because no key is configured.
    pub in_clear: usize,
}

impl ResealReport {
    pub fn count(&mut self, outcome: &Resealed) {
        match outcome {
            Resealed::Current => {}
            Resealed::Replace(_) => self.resealed += 1,
            Resealed::InClear => self.in_clear += 1,
        }
    }

    /// Logs what the pass did: re-encryption at INFO, clear text left behind at WARN.
    pub fn log(&self, keyring: &Keyring) {
        if let Some(key_id) = keyring.current_key_id() {
            if self.resealed > 0 {
                tracing::info!(
                    count = self.resealed,
                    key_id = %key_id,
                    "stored secrets re-encrypted with the current key"
                );
            }
        } else if self.in_clear > 0 {
            tracing::warn!(
                count = self.in_clear,
                "stored secrets written by an older release are in clear text; configure a \
                 [secrets] key and restart to encrypt them"
            );
        }
    }
}

impl Keyring {
    /// The keys `[secrets]` names; no keys at all when the section is empty. Errors name the
    /// configuration key and never repeat a key.
    pub fn load(config: &SecretsConfig) -> Result<Self> {
        let current = match (&config.key_file, &config.key) {
            (Some(_), Some(_)) => {
                return Err(SecretsError::Config {
                    key: "secrets.key".into(),
                    problem: "set key_file or key (OUTBOX_CENTRAL_SECRETS__KEY), not both".into(),
                });
            }
            (Some(path), None) => Some(key_from_file(path, "secrets.key_file")?),
            (None, Some(text)) => Some(key_from_base64(text, "secrets.key")?),
            (None, None) => None,
        };
        let mut previous = Vec::new();
        for (i, path) in config.previous_key_files.iter().enumerate() {
            previous.push(key_from_file(
                path,
                &format!("secrets.previous_key_files[{i}]"),
            )?);
        }
        for (i, text) in config.previous_keys.iter().enumerate() {
            previous.push(key_from_base64(
                text,
                &format!("secrets.previous_keys[{i}]"),
            )?);
        }
        if current.is_none() && !previous.is_empty() {
            return Err(SecretsError::Config {
                key: "secrets.key_file".into(),
                problem: "previous keys are given without a current key; set key_file (or \
                          OUTBOX_CENTRAL_SECRETS__KEY) to the key new secrets are sealed with"
                    .into(),
            });
        }
        Self::from_keys(current, previous)
    }

    /// No keys: every secret write is refused, sealed values cannot be read, legacy clear text
    /// can.
    pub fn none() -> Self {
        Self {
            inner: Arc::new(Keys {
                current: None,
                previous: Vec::new(),
            }),
        }
    }

    /// A key made up for this process, the same for every call: for stores opened by tests and
    /// tools, whose secrets need not outlive the process. A service's secrets must outlive it,
    /// so `run` always uses the configured keys.
    pub fn ephemeral() -> Result<Self> {
        static KEY: OnceLock<Option<[u8; KEY_LEN]>> = OnceLock::new();
        let key = KEY
            .get_or_init(|| {
                let mut key = [0; KEY_LEN];
                SystemRandom::new().fill(&mut key).ok().map(|()| key)
            })
            .ok_or_else(|| SecretsError::Config {
                key: "secrets".into(),
                problem: "the system random number generator failed".into(),
            })?;
        Self::from_keys(Some(key), Vec::new())
    }

    fn from_keys(current: Option<[u8; KEY_LEN]>, previous: Vec<[u8; KEY_LEN]>) -> Result<Self> {
        let current = current.as_ref().map(Key::new).transpose()?;
        let mut kept: Vec<Key> = Vec::new();
        for bytes in &previous {
            let key = Key::new(bytes)?;
            // The current key listed as previous too (a half-done rotation) is harmless.
            if current.as_ref().is_none_or(|c| c.id != key.id)
                && kept.iter().all(|k| k.id != key.id)
            {
                kept.push(key);
            }
        }
        Ok(Self {
            inner: Arc::new(Keys {
                current,
                previous: kept,
            }),
        })
    }

    /// The id of the key new secrets are sealed with, if any.
    pub fn current_key_id(&self) -> Option<KeyId> {
        self.inner.current.as_ref().map(|k| k.id)
    }

    /// Whether secrets can be stored (a current key is configured).
    pub fn can_seal(&self) -> bool {
        self.inner.current.is_some()
    }

    /// HMAC-SHA256 keys for `purpose` (e.g. signing acknowledgement links), derived from the
    /// configured keys, the current one first: HMAC of the purpose under each key, so one key
    /// is managed and rotated for everything, no derived key reveals the key or another
    /// purpose's key, and what was signed under an earlier key still verifies while that key
    /// is configured. Empty when no key is.
    pub fn derived(&self, purpose: &str) -> Vec<hmac::Key> {
        self.inner
            .current
            .iter()
            .chain(&self.inner.previous)
            .map(|key| {
                let tag = hmac::sign(&key.derive_root, purpose.as_bytes());
                hmac::Key::new(hmac::HMAC_SHA256, tag.as_ref())
            })
            .collect()
    }

    fn find(&self, id: KeyId) -> Option<&Key> {
        self.inner
            .current
            .iter()
            .chain(&self.inner.previous)
            .find(|k| k.id == id)
    }

    /// The configured key ids, for an error message.
    fn describe(&self) -> String {
        let previous: Vec<String> = self
            .inner
            .previous
            .iter()
            .map(|k| k.id.to_string())
            .collect();
        match &self.inner.current {
            None => "no [secrets] key is configured".into(),
            Some(current) if previous.is_empty() => format!("the current key is {}", current.id),
            Some(current) => format!(
                "the current key is {}, previous keys {}",
                current.id,
                previous.join(", ")
            ),
        }
    }

    /// `value` sealed with the current key for `slot`, as it is stored.
    pub fn seal(&self, value: &Secret, slot: Slot<'_>) -> Result<String> {
        let key = self
            .inner
            .current
            .as_ref()
            .ok_or_else(|| SecretsError::NoKey {
                slot: slot.to_string(),
            })?;
        // A random 96-bit nonce per value: safe for far more values than central ever seals
        // under one key (NIST's bound for random nonces is 2^32), and no counter to keep.
        let mut nonce = [0; NONCE_LEN];
        SystemRandom::new()
            .fill(&mut nonce)
            .map_err(|_| SecretsError::Seal {
                slot: slot.to_string(),
                problem: "the system random number generator failed".into(),
            })?;
        let mut sealed = value.expose().as_bytes().to_vec();
        key.aead
            .seal_in_place_append_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(slot.aad(key.id)),
                &mut sealed,
            )
            .map_err(|_| SecretsError::Seal {
                slot: slot.to_string(),
                problem: "the value is too long for AES-GCM".into(),
            })?;
        let mut blob = Vec::with_capacity(NONCE_LEN + sealed.len());
        blob.extend_from_slice(&nonce);
        blob.extend_from_slice(&sealed);
        Ok(format!(
            "{SEALED_PREFIX}{VERSION}:{}:{}",
            key.id,
            BASE64.encode(blob)
        ))
    }

    /// The secret a stored value holds: opened with the key its id names, or (legacy clear
    /// text, without the `enc:` prefix) as it is.
    pub fn open(&self, stored: &str, slot: Slot<'_>) -> Result<Secret> {
        match parse(stored, slot)? {
            None => Ok(Secret::new(stored.to_owned())),
            Some(sealed) => self.open_sealed(&sealed, slot),
        }
    }

    fn open_sealed(&self, sealed: &Sealed, slot: Slot<'_>) -> Result<Secret> {
        let key = self
            .find(sealed.key_id)
            .ok_or_else(|| SecretsError::UnknownKey {
                slot: slot.to_string(),
                key_id: sealed.key_id,
                configured: self.describe(),
            })?;
        let malformed = |problem: &str| SecretsError::Malformed {
            slot: slot.to_string(),
            problem: problem.to_owned(),
        };
        if sealed.blob.len() < NONCE_LEN + TAG_LEN {
            return Err(malformed("too short to hold a nonce and a tag"));
        }
        let (nonce, ciphertext) = sealed.blob.split_at(NONCE_LEN);
        let nonce = Nonce::try_assume_unique_for_key(nonce)
            .map_err(|_| malformed("the nonce has the wrong length"))?;
        let mut buffer = ciphertext.to_vec();
        let plain = key
            .aead
            .open_in_place(nonce, Aad::from(slot.aad(key.id)), &mut buffer)
            .map_err(|_| SecretsError::Tampered {
                slot: slot.to_string(),
                key_id: key.id,
            })?;
        let text = String::from_utf8(plain.to_vec()).map_err(|_| malformed("not UTF-8 text"))?;
        Ok(Secret::new(text))
    }

    /// What to do with a stored value at start-up: keep it (sealed with the current key, and it
    /// opens), replace it (legacy clear text, or an earlier key), or leave it in clear (no key
    /// configured). Fails, naming the key id, if it cannot be opened.
    pub fn reseal(&self, stored: &str, slot: Slot<'_>) -> Result<Resealed> {
        let secret = match parse(stored, slot)? {
            None if !self.can_seal() => return Ok(Resealed::InClear),
            None => Secret::new(stored.to_owned()),
            Some(sealed) => {
                let secret = self.open_sealed(&sealed, slot)?;
                if Some(sealed.key_id) == self.current_key_id() {
                    return Ok(Resealed::Current);
                }
                secret
            }
        };
        self.seal(&secret, slot).map(Resealed::Replace)
    }
}

/// A sealed stored value, split up.
struct Sealed {
    key_id: KeyId,
    /// Nonce, ciphertext and tag.
    blob: Vec<u8>,
}

/// `None` for legacy clear text; the parts of a sealed value otherwise.
fn parse(stored: &str, slot: Slot<'_>) -> Result<Option<Sealed>> {
    let Some(rest) = stored.strip_prefix(SEALED_PREFIX) else {
        return Ok(None);
    };
    let malformed = |problem: String| SecretsError::Malformed {
        slot: slot.to_string(),
        problem,
    };
    let mut parts = rest.splitn(3, ':');
    let (Some(version), Some(key_id), Some(encoded)) = (parts.next(), parts.next(), parts.next())
    else {
        return Err(malformed(format!(
            "expected {SEALED_PREFIX}{VERSION}:<key id>:<base64>"
        )));
    };
    if version != VERSION {
        return Err(malformed(format!(
            "format {version:?} is not known to this release (it writes {VERSION}); was the \
             database written by a newer central-outbox?"
        )));
    }
    let key_id = KeyId::parse(key_id)
        .ok_or_else(|| malformed(format!("{key_id:?} is not a key id (8 hex digits)")))?;
    let blob = BASE64
        .decode(encoded)
        .map_err(|e| malformed(format!("not base64: {e}")))?;
    Ok(Some(Sealed { key_id, blob }))
}

fn key_from_base64(text: &str, key: &str) -> Result<[u8; KEY_LEN]> {
    let bad = || SecretsError::Config {
        key: key.to_owned(),
        problem: format!("is not a 32-byte key in base64 ({HOW_TO_GENERATE})"),
    };
    let bytes = BASE64.decode(text.trim()).map_err(|_| bad())?;
    <[u8; KEY_LEN]>::try_from(bytes.as_slice()).map_err(|_| bad())
}

fn key_from_file(path: &Path, key: &str) -> Result<[u8; KEY_LEN]> {
    let text = std::fs::read_to_string(path).map_err(|e| SecretsError::Config {
        key: key.to_owned(),
        problem: format!("cannot read {}: {e}", path.display()),
    })?;
    warn_if_readable_by_others(path, key);
    key_from_base64(&text, key).map_err(|_| SecretsError::Config {
        key: key.to_owned(),
        problem: format!(
            "{} does not hold a 32-byte key in base64 ({HOW_TO_GENERATE})",
            path.display()
        ),
    })
}

/// A key file anyone on the host can read protects nothing; say so (but run: the operator may
/// have reasons, such as a container whose only user is central).
fn warn_if_readable_by_others(path: &Path, key: &str) {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        if let Ok(meta) = std::fs::metadata(path)
            && meta.permissions().mode() & 0o077 != 0
        {
            tracing::warn!(
                key,
                path = %path.display(),
                "the secrets key file is readable by group or others; chmod 600 it"
            );
        }
    }
    #[cfg(not(unix))]
    let _ = (path, key);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(byte: u8) -> String {
        BASE64.encode([byte; KEY_LEN])
    }

    fn ring(current: u8, previous: &[u8]) -> Keyring {
        Keyring::load(&SecretsConfig {
            key: Some(key(current)),
            previous_keys: previous.iter().map(|b| key(*b)).collect(),
            ..Default::default()
        })
        .unwrap()
    }

    fn id_of(byte: u8) -> KeyId {
        KeyId::of(&[byte; KEY_LEN])
    }

    const HOOK: Slot<'static> = Slot::WebhookSecret("hooks");

    #[test]
    fn a_sealed_secret_round_trips_and_holds_no_clear_text() {
        let keys = ring(1, &[]);
        let secret = Secret::new("correct-horse-battery-staple".into());
        let sealed = keys.seal(&secret, Slot::SmtpPassword).unwrap();
        assert!(
            sealed.starts_with(&format!("enc:v1:{}:", id_of(1))),
            "{sealed}"
        );
        assert!(!sealed.contains("horse"), "{sealed}");
        assert_eq!(keys.open(&sealed, Slot::SmtpPassword).unwrap(), secret);
        // A fresh nonce each time: equal secrets do not look equal at rest.
        assert_ne!(keys.seal(&secret, Slot::SmtpPassword).unwrap(), sealed);
        // Empty and non-ASCII values too.
        for text in ["", "päss wört ✓"] {
            let secret = Secret::new(text.into());
            let sealed = keys.seal(&secret, HOOK).unwrap();
            assert_eq!(keys.open(&sealed, HOOK).unwrap(), secret);
        }
    }

    #[test]
    fn derived_keys_differ_by_purpose_and_key_and_survive_a_rotation() {
        let sign = |k: &hmac::Key| hmac::sign(k, b"message").as_ref().to_vec();
        let before = ring(1, &[]);
        let links = before.derived("links");
        assert_eq!(links.len(), 1);
        assert_ne!(sign(&links[0]), sign(&before.derived("other")[0]));
        assert_ne!(sign(&links[0]), sign(&ring(2, &[]).derived("links")[0]));
        // After rotating to key 2, key 1's derived key is still there, after the current one.
        let after = ring(2, &[1]);
        let rotated = after.derived("links");
        assert_eq!(rotated.len(), 2);
        assert_eq!(sign(&rotated[1]), sign(&links[0]));
        assert!(Keyring::none().derived("links").is_empty());
    }

    #[test]
    fn a_tampered_value_or_one_moved_to_another_place_does_not_open() {
        let keys = ring(1, &[]);
        let sealed = keys
            .seal(&Secret::new("hook-secret-0123456789".into()), HOOK)
            .unwrap();
        let (header, encoded) = sealed.rsplit_once(':').unwrap();
        let mut blob = BASE64.decode(encoded).unwrap();
        for i in [0, NONCE_LEN, blob.len() - 1] {
            blob[i] ^= 0x01;
            let tampered = format!("{header}:{}", BASE64.encode(&blob));
            blob[i] ^= 0x01;
            let err = keys.open(&tampered, HOOK).unwrap_err();
            assert!(matches!(err, SecretsError::Tampered { .. }), "{err}");
            assert!(err.to_string().contains(&id_of(1).to_string()), "{err}");
        }
        // The same bytes in another list's row, or in the password column.
        for other in [Slot::WebhookSecret("other"), Slot::SmtpPassword] {
            let err = keys.open(&sealed, other).unwrap_err();
            assert!(matches!(err, SecretsError::Tampered { .. }), "{err}");
        }
        for bad in [
            "enc:v1:zz:AAAA",
            "enc:v1:0102",
            "enc:v1:01020304:not base64!",
            "enc:v1:01020304:AAAA",
            "enc:v9:01020304:AAAA",
        ] {
            let err = ring(1, &[]).open(bad, HOOK).unwrap_err();
            assert!(
                matches!(
                    err,
                    SecretsError::Malformed { .. } | SecretsError::UnknownKey { .. }
                ),
                "{bad}: {err}"
            );
        }
        let err = keys.open(&format!("{header}:AAAA"), HOOK).unwrap_err();
        assert!(matches!(err, SecretsError::Malformed { .. }), "{err}");
    }

    #[test]
    fn a_wrong_key_fails_naming_the_key_id_it_needs_and_the_configured_ones() {
        let sealed = ring(1, &[])
            .seal(&Secret::new("s3cret".into()), Slot::OAuthClientSecret)
            .unwrap();
        let err = ring(2, &[3])
            .open(&sealed, Slot::OAuthClientSecret)
            .unwrap_err();
        assert!(err.needs_configuration());
        let text = err.to_string();
        assert!(text.contains(&format!("key id {}", id_of(1))), "{text}");
        assert!(text.contains(&id_of(2).to_string()), "{text}");
        assert!(text.contains(&id_of(3).to_string()), "{text}");
        assert!(text.contains("previous_key_files"), "{text}");
        assert!(text.contains("SMTP OAuth client secret"), "{text}");
        let err = Keyring::none()
            .open(&sealed, Slot::OAuthClientSecret)
            .unwrap_err();
        assert!(err.to_string().contains("no [secrets] key"), "{err}");
    }

    #[test]
    fn rotation_opens_with_a_previous_key_and_reseals_with_the_current_one() {
        let old = ring(1, &[]);
        let secret = Secret::new("hook-secret-0123456789".into());
        let sealed = old.seal(&secret, HOOK).unwrap();

        let rotated = ring(2, &[1]);
        assert_eq!(rotated.open(&sealed, HOOK).unwrap(), secret);
        let Resealed::Replace(resealed) = rotated.reseal(&sealed, HOOK).unwrap() else {
            panic!("a value sealed with a previous key must be resealed");
        };
        assert!(resealed.starts_with(&format!("enc:v1:{}:", id_of(2))));
        assert_eq!(rotated.reseal(&resealed, HOOK).unwrap(), Resealed::Current);
        // With the old key dropped, the resealed value still opens; the old one does not.
        let done = ring(2, &[]);
        assert_eq!(done.open(&resealed, HOOK).unwrap(), secret);
        assert!(matches!(
            done.open(&sealed, HOOK),
            Err(SecretsError::UnknownKey { .. })
        ));
    }

    #[test]
    fn legacy_clear_text_is_read_and_sealed_once_a_key_is_configured() {
        let keys = ring(1, &[]);
        assert_eq!(
            keys.open("plain-old-password", Slot::SmtpPassword)
                .unwrap()
                .expose(),
            "plain-old-password"
        );
        let Resealed::Replace(sealed) = keys
            .reseal("plain-old-password", Slot::SmtpPassword)
            .unwrap()
        else {
            panic!("clear text must be sealed");
        };
        assert_eq!(
            keys.open(&sealed, Slot::SmtpPassword).unwrap().expose(),
            "plain-old-password"
        );
        let none = Keyring::none();
        assert_eq!(
            none.reseal("plain-old-password", Slot::SmtpPassword)
                .unwrap(),
            Resealed::InClear
        );
        assert_eq!(
            none.open("plain-old-password", Slot::SmtpPassword)
                .unwrap()
                .expose(),
            "plain-old-password"
        );
        let mut report = ResealReport::default();
        report.count(&Resealed::InClear);
        report.count(&Resealed::Replace(String::new()));
        report.count(&Resealed::Current);
        assert_eq!(
            report,
            ResealReport {
                resealed: 1,
                in_clear: 1
            }
        );
    }

    #[test]
    fn without_a_key_nothing_is_sealed_and_the_error_says_how_to_configure_one() {
        let err = Keyring::none()
            .seal(&Secret::new("x".into()), Slot::SmtpPassword)
            .unwrap_err();
        assert!(err.needs_configuration());
        let text = err.to_string();
        assert!(text.contains("[secrets]"), "{text}");
        assert!(text.contains("openssl rand -base64 32"), "{text}");
        assert!(!Keyring::none().can_seal());
    }

    #[test]
    fn keys_load_from_files_and_the_environment_and_errors_name_the_key() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("current.key");
        std::fs::write(&file, format!("{}\n", key(7))).unwrap();
        let keys = Keyring::load(&SecretsConfig {
            key_file: Some(file.clone()),
            previous_keys: vec![key(7), key(8), key(8)],
            ..Default::default()
        })
        .unwrap();
        assert_eq!(keys.current_key_id(), Some(id_of(7)));
        // The current key and a repeat are not listed twice.
        assert_eq!(
            format!("{keys:?}"),
            format!(
                "Keyring {{ current: Some(KeyId({})), previous: [KeyId({})] }}",
                id_of(7),
                id_of(8)
            )
        );

        let cases = [
            (
                SecretsConfig {
                    key_file: Some(dir.path().join("missing.key")),
                    ..Default::default()
                },
                "secrets.key_file",
            ),
            (
                SecretsConfig {
                    key: Some(BASE64.encode([1; 16])),
                    ..Default::default()
                },
                "secrets.key",
            ),
            (
                SecretsConfig {
                    key: Some(key(1)),
                    key_file: Some(file.clone()),
                    ..Default::default()
                },
                "secrets.key",
            ),
            (
                SecretsConfig {
                    key: Some(key(1)),
                    previous_keys: vec![key(2), "not a key".into()],
                    ..Default::default()
                },
                "secrets.previous_keys[1]",
            ),
            (
                SecretsConfig {
                    previous_keys: vec![key(2)],
                    ..Default::default()
                },
                "secrets.key_file",
            ),
        ];
        for (config, named) in cases {
            let err = Keyring::load(&config).unwrap_err();
            assert!(err.to_string().starts_with(named), "{named}: {err}");
            assert!(!err.to_string().contains(&key(1)), "{err}");
        }
        let garbage = dir.path().join("garbage.key");
        std::fs::write(&garbage, "hunter2").unwrap();
        let err = Keyring::load(&SecretsConfig {
            key_file: Some(garbage),
            ..Default::default()
        })
        .unwrap_err();
        assert!(err.to_string().contains("openssl rand"), "{err}");
        assert!(!err.to_string().contains("hunter2"), "{err}");
    }

    #[test]
    fn debug_output_shows_no_key_material() {
        let config = SecretsConfig {
            key: Some(key(9)),
            previous_keys: vec![key(10)],
            ..Default::default()
        };
        let shown = format!("{config:?} {:?}", Keyring::load(&config).unwrap());
        assert!(
            !shown.contains(&key(9)) && !shown.contains(&key(10)),
            "{shown}"
        );
    }

    #[test]
    fn the_ephemeral_key_is_one_per_process() {
        let a = Keyring::ephemeral().unwrap();
        let b = Keyring::ephemeral().unwrap();
        assert_eq!(a.current_key_id(), b.current_key_id());
        let sealed = a.seal(&Secret::new("s".into()), HOOK).unwrap();
        assert_eq!(b.open(&sealed, HOOK).unwrap().expose(), "s");
    }
}
