//! Validated notification content and provenance: the rules every notification obeys, whichever
//! end checks it. Each type can only be built through a constructor that checks its rule, so a
//! value of the type is proof the rule holds. Errors name the wire field and the limit, because
//! they are shown verbatim to the script or operator who sent the bad value.
//!
//! Both services depend on this crate: a forwarder refuses at `Send` what central would reject,
//! so nothing unforwardable is ever buffered. It has no transport dependency (no tonic, prost or
//! rustls), so the rules cannot reach for one; `outbox_proto::submission` converts the wire
//! messages to and from these types.

pub mod limits;
mod priority;
pub mod schedule;

pub use priority::Priority;

use std::fmt;

use chrono::{DateTime, Utc};
use uuid::Uuid;

use crate::limits::{
    MAX_BODY_BYTES, MAX_CONDITION_KEY_CHARS, MAX_LIST_NAME_CHARS, MAX_SITE_ID_CHARS,
    MAX_SOURCE_FIELD_CHARS, MAX_SUBJECT_CHARS, MAX_TYPE_DATA_BYTES,
};

/// A value broke a content rule. `field` is the wire field name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {problem}")]
pub struct ContentError {
    pub field: &'static str,
    pub problem: String,
}

impl ContentError {
    pub fn new(field: &'static str, problem: impl Into<String>) -> Self {
        Self {
            field,
            problem: problem.into(),
        }
    }
}

pub type Result<T> = std::result::Result<T, ContentError>;

/// The idempotency key of a notification, generated at the site.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NotificationId(Uuid);

impl NotificationId {
    /// A fresh id. Version 7 UUIDs are time-ordered, which keeps index inserts near the end.
    pub fn generate() -> Self {
        Self(Uuid::now_v7())
    }

    /// Parses the hyphenated (or simple) text form; `field` names the wire field for the error.
    pub fn parse(text: &str, field: &'static str) -> Result<Self> {
        parse_uuid(text, field).map(Self)
    }

    pub fn from_uuid(uuid: Uuid) -> Self {
        Self(uuid)
    }

    pub fn as_uuid(&self) -> &Uuid {
        &self.0
    }
}

impl fmt::Display for NotificationId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.hyphenated().fmt(f)
    }
}

fn parse_uuid(text: &str, field: &'static str) -> Result<Uuid> {
    if text.is_empty() {
        return Err(ContentError::new(field, "is required (a UUID)"));
    }
    Uuid::try_parse(text).map_err(|_| {
        ContentError::new(
            field,
            format!("{:?} is not a UUID", truncate_for_message(text)),
        )
    })
}

/// Delivery channel; selects the adapter at central.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NotificationType {
    Email,
    Webhook,
}

impl NotificationType {
    /// The stable name stored in databases.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Email => "Email",
            Self::Webhook => "Webhook",
        }
    }

    /// Inverse of [`Self::as_str`].
    pub fn from_db(text: &str) -> Option<Self> {
        match text {
            "Email" => Some(Self::Email),
            "Webhook" => Some(Self::Webhook),
            _ => None,
        }
    }
}

impl fmt::Display for NotificationType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

macro_rules! text_newtype {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, Hash)]
        pub struct $name(String);

        impl $name {
            pub fn as_str(&self) -> &str {
                &self.0
            }

            pub fn into_string(self) -> String {
                self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }
    };
}

text_newtype!(
    /// Name of a notification list (the recipients are resolved from it at delivery time).
    ListName
);
text_newtype!(
    /// One-line subject.
    Subject
);
text_newtype!(
    /// Plain-text body.
    Body
);
text_newtype!(
    /// Channel-specific JSON object as text, or empty.
    TypeData
);
text_newtype!(
    /// Identifier of the site a notification came from.
    SiteId
);
text_newtype!(
    /// The condition a notification is about (e.g. `tank4.level.high`): a newer notification
    /// with the same key, list and site supersedes older undelivered ones, and clearing the key
    /// ends them.
    ConditionKey
);

impl ListName {
    pub fn parse(text: String) -> Result<Self> {
        const FIELD: &str = "list_name";
        require_non_empty(&text, FIELD)?;
        require_max_chars(&text, MAX_LIST_NAME_CHARS, FIELD)?;
        reject_control_chars(&text, FIELD)?;
        if text.trim() != text {
            return Err(ContentError::new(
                FIELD,
                "must not start or end with whitespace",
            ));
        }
        Ok(Self(text))
    }
}

impl Subject {
    pub fn parse(text: String) -> Result<Self> {
        const FIELD: &str = "subject";
        require_non_empty(&text, FIELD)?;
        require_max_chars(&text, MAX_SUBJECT_CHARS, FIELD)?;
        // CR or LF in a subject would let the sender inject extra mail headers.
        if text.contains(['\r', '\n']) {
            return Err(ContentError::new(
                FIELD,
                "must be one line (CR and LF are not allowed)",
            ));
        }
        reject_control_chars(&text, FIELD)?;
        Ok(Self(text))
    }
}

impl Body {
    pub fn parse(text: String) -> Result<Self> {
        const FIELD: &str = "body";
        require_non_empty(&text, FIELD)?;
        if text.len() > MAX_BODY_BYTES {
            return Err(ContentError::new(
                FIELD,
                format!(
                    "is {} bytes, the limit is {MAX_BODY_BYTES} bytes",
                    text.len()
                ),
            ));
        }
        if text.contains('\0') {
            return Err(ContentError::new(FIELD, "must not contain NUL characters"));
        }
        Ok(Self(text))
    }
}

impl TypeData {
    pub fn parse(text: String) -> Result<Self> {
        const FIELD: &str = "type_data";
        if text.is_empty() {
            return Ok(Self(text));
        }
        if text.len() > MAX_TYPE_DATA_BYTES {
            return Err(ContentError::new(
                FIELD,
                format!(
                    "is {} bytes, the limit is {MAX_TYPE_DATA_BYTES} bytes",
                    text.len()
                ),
            ));
        }
        match serde_json::from_str::<serde_json::Value>(&text) {
            Ok(serde_json::Value::Object(_)) => Ok(Self(text)),
            Ok(_) => Err(ContentError::new(FIELD, "must be a JSON object or empty")),
            Err(e) => Err(ContentError::new(FIELD, format!("is not valid JSON: {e}"))),
        }
    }

    pub fn empty() -> Self {
        Self(String::new())
    }
}

impl SiteId {
    /// The source of the notifications central sends about itself (its self-alerts). No site
    /// may use it: [`Self::parse`], which every id a site or its configuration supplies goes
    /// through, refuses it, so a row from this source was written by central.
    pub const CENTRAL: &'static str = "_central";

    /// A site's id: 1 to 64 ASCII letters, digits, '-', '_' and '.', and not
    /// [`Self::CENTRAL`].
    pub fn parse(text: String) -> Result<Self> {
        const FIELD: &str = "source_site_id";
        let id = Self::parse_stored(text)?;
        if id.is_central() {
            return Err(ContentError::new(
                FIELD,
                format!(
                    "{:?} is reserved for central's own notifications (self-alerts)",
                    Self::CENTRAL
                ),
            ));
        }
        Ok(id)
    }

    /// An id read back from central's own table, where [`Self::CENTRAL`] is the source of its
    /// self-alerts: the rules of [`Self::parse`] but the reservation.
    pub fn parse_stored(text: String) -> Result<Self> {
        const FIELD: &str = "source_site_id";
        require_non_empty(&text, FIELD)?;
        require_max_chars(&text, MAX_SITE_ID_CHARS, FIELD)?;
        if !text
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        {
            return Err(ContentError::new(
                FIELD,
                "may contain only ASCII letters, digits, '-', '_' and '.'",
            ));
        }
        Ok(Self(text))
    }

    /// The source of central's own notifications ([`Self::CENTRAL`]).
    pub fn central() -> Self {
        Self(Self::CENTRAL.to_owned())
    }

    /// Whether this is [`Self::CENTRAL`].
    pub fn is_central(&self) -> bool {
        self.0 == Self::CENTRAL
    }
}

impl ConditionKey {
    /// `field` names the wire field for the error (`condition_key` in a Send or submit).
    pub fn parse(text: String, field: &'static str) -> Result<Self> {
        require_non_empty(&text, field)?;
        require_max_chars(&text, MAX_CONDITION_KEY_CHARS, field)?;
        if !text
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | ':' | '/'))
        {
            return Err(ContentError::new(
                field,
                "may contain only ASCII letters, digits, '.', '_', '-', ':' and '/'",
            ));
        }
        Ok(Self(text))
    }

    /// An optional key as the wire carries it: empty means none.
    pub fn parse_optional(text: String, field: &'static str) -> Result<Option<Self>> {
        if text.is_empty() {
            Ok(None)
        } else {
            Self::parse(text, field).map(Some)
        }
    }
}

/// What is delivered: the channel, the list and the message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotificationContent {
    pub kind: NotificationType,
    pub list_name: ListName,
    pub subject: Subject,
    pub body: Body,
    pub type_data: TypeData,
}

impl NotificationContent {
    /// Checks each content field; the error names the first bad one.
    pub fn parse(
        kind: NotificationType,
        list_name: String,
        subject: String,
        body: String,
        type_data: String,
    ) -> Result<Self> {
        Ok(Self {
            kind,
            list_name: ListName::parse(list_name)?,
            subject: Subject::parse(subject)?,
            body: Body::parse(body)?,
            type_data: TypeData::parse(type_data)?,
        })
    }
}

/// Where a notification came from; used for audit and per-site KPIs, never for delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Provenance {
    pub source_site_id: SiteId,
    pub source_instance_id: String,
    pub source_script: String,
    pub origin_execution_id: Option<Uuid>,
    pub origin_parent_execution_id: Option<Uuid>,
    pub site_enqueued_at: DateTime<Utc>,
}

/// The script-supplied provenance fields, checked; the site adds its id and clock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScriptOrigin {
    pub source_instance_id: String,
    pub source_script: String,
    pub origin_execution_id: Option<Uuid>,
    pub origin_parent_execution_id: Option<Uuid>,
}

impl ScriptOrigin {
    pub fn parse(
        source_instance_id: String,
        source_script: String,
        origin_execution_id: Option<&str>,
        origin_parent_execution_id: Option<&str>,
    ) -> Result<Self> {
        for (value, field) in [
            (&source_instance_id, "source_instance_id"),
            (&source_script, "source_script"),
        ] {
            require_max_chars(value, MAX_SOURCE_FIELD_CHARS, field)?;
            reject_control_chars(value, field)?;
        }
        Ok(Self {
            source_instance_id,
            source_script,
            origin_execution_id: optional_uuid(origin_execution_id, "origin_execution_id")?,
            origin_parent_execution_id: optional_uuid(
                origin_parent_execution_id,
                "origin_parent_execution_id",
            )?,
        })
    }

    pub fn at_site(self, source_site_id: SiteId, site_enqueued_at: DateTime<Utc>) -> Provenance {
        Provenance {
            source_site_id,
            source_instance_id: self.source_instance_id,
            source_script: self.source_script,
            origin_execution_id: self.origin_execution_id,
            origin_parent_execution_id: self.origin_parent_execution_id,
            site_enqueued_at,
        }
    }
}

/// A complete, valid notification as submitted to central.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Submission {
    pub id: NotificationId,
    pub content: NotificationContent,
    pub provenance: Provenance,
    /// How urgent it is. Not content: a resubmit differing only in priority is the same
    /// notification, and the stored priority stands.
    pub priority: Priority,
    /// The condition it is about, if any. Not content, like the priority.
    pub condition_key: Option<ConditionKey>,
    /// Set when a ClearCondition at the site ended it while it was still buffered there:
    /// central stores it as Cleared and never delivers it.
    pub cleared_at_site: Option<DateTime<Utc>>,
    /// Not to be delivered before this instant (`schedule::deliver_after`: always after the
    /// site's enqueue time, at most `limits::MAX_DELIVER_AFTER` after it); `None`: due at
    /// once. Not content, like the priority.
    pub deliver_after: Option<DateTime<Utc>>,
}

fn optional_uuid(text: Option<&str>, field: &'static str) -> Result<Option<Uuid>> {
    match text {
        None | Some("") => Ok(None),
        Some(text) => parse_uuid(text, field).map(Some),
    }
}

fn require_non_empty(text: &str, field: &'static str) -> Result<()> {
    if text.is_empty() {
        return Err(ContentError::new(field, "must not be empty"));
    }
    Ok(())
}

fn require_max_chars(text: &str, max: usize, field: &'static str) -> Result<()> {
    // Byte length bounds char count from above, so most values skip the char walk.
    if text.len() > max {
        let chars = text.chars().count();
        if chars > max {
            return Err(ContentError::new(
                field,
                format!("is {chars} characters, the limit is {max}"),
            ));
        }
    }
    Ok(())
}

fn reject_control_chars(text: &str, field: &'static str) -> Result<()> {
    if text.chars().any(|c| c.is_control() && c != '\t') {
        return Err(ContentError::new(
            field,
            "must not contain control characters",
        ));
    }
    Ok(())
}

/// Keeps error messages short when someone sends a megabyte where a UUID belongs.
fn truncate_for_message(text: &str) -> &str {
    match text.char_indices().nth(64) {
        Some((end, _)) => &text[..end],
        None => text,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subject_rejects_line_breaks_and_names_the_field() {
        let err = Subject::parse("hi\r\nBcc: victim@example.com".into()).unwrap_err();
        assert_eq!(err.field, "subject");
        assert!(err.to_string().contains("CR and LF"));
        assert!(Subject::parse("bad\nsubject".into()).is_err());
        assert!(Subject::parse("Tank 4 high level".into()).is_ok());
    }

    #[test]
    fn condition_keys_are_short_tag_names() {
        assert_eq!(
            ConditionKey::parse("tank4.level.high".into(), "condition_key")
                .unwrap()
                .as_str(),
            "tank4.level.high"
        );
        assert!(ConditionKey::parse("plant/area-2:pump_7".into(), "condition_key").is_ok());
        for bad in ["", "tank 4", "tank4\nhigh", "tänk"] {
            let err = ConditionKey::parse(bad.into(), "condition_key").unwrap_err();
            assert_eq!(err.field, "condition_key", "{bad:?}");
        }
        let err = ConditionKey::parse("k".repeat(MAX_CONDITION_KEY_CHARS + 1), "condition_key")
            .unwrap_err();
        assert!(err.to_string().contains("the limit is 128"), "{err}");
        assert_eq!(
            ConditionKey::parse_optional(String::new(), "k").unwrap(),
            None
        );
    }

    #[test]
    fn limits_name_field_and_limit() {
        let err = Subject::parse("x".repeat(MAX_SUBJECT_CHARS + 1)).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!(
                "subject: is {} characters, the limit is {MAX_SUBJECT_CHARS}",
                MAX_SUBJECT_CHARS + 1
            )
        );
        // Multi-byte characters count as one each.
        assert!(Subject::parse("é".repeat(MAX_SUBJECT_CHARS)).is_ok());
        let err = Body::parse("b".repeat(MAX_BODY_BYTES + 1)).unwrap_err();
        assert_eq!(err.field, "body");
        assert!(ListName::parse("l".repeat(MAX_LIST_NAME_CHARS + 1)).is_err());
    }

    #[test]
    fn empty_values_are_rejected() {
        assert_eq!(
            ListName::parse(String::new()).unwrap_err().field,
            "list_name"
        );
        assert_eq!(Subject::parse(String::new()).unwrap_err().field, "subject");
        assert_eq!(Body::parse(String::new()).unwrap_err().field, "body");
        assert_eq!(
            SiteId::parse(String::new()).unwrap_err().field,
            "source_site_id"
        );
    }

    #[test]
    fn no_site_may_use_centrals_own_id() {
        let err = SiteId::parse(SiteId::CENTRAL.into()).unwrap_err();
        assert_eq!(err.field, "source_site_id");
        assert!(err.to_string().contains("reserved"), "{err}");
        // Only that exact id: others that look like it are ordinary site ids.
        for id in ["central", "_central2", "_Central", "x_central"] {
            assert!(SiteId::parse(id.into()).is_ok(), "{id}");
        }
        // Read back from central's table, it is central's.
        let stored = SiteId::parse_stored(SiteId::CENTRAL.into()).unwrap();
        assert!(stored.is_central());
        assert_eq!(stored, SiteId::central());
        assert!(SiteId::parse_stored("a b".into()).is_err());
    }

    #[test]
    fn ids_must_be_uuids() {
        let err = NotificationId::parse("not-a-uuid", "notification_id").unwrap_err();
        assert_eq!(err.field, "notification_id");
        let id = NotificationId::generate();
        assert_eq!(
            NotificationId::parse(&id.to_string(), "notification_id").unwrap(),
            id
        );
        let long = "z".repeat(10_000);
        let err = NotificationId::parse(&long, "notification_id").unwrap_err();
        assert!(err.to_string().len() < 200, "error text is bounded");
    }

    #[test]
    fn type_data_is_empty_or_a_json_object() {
        assert!(TypeData::parse(String::new()).is_ok());
        assert!(TypeData::parse(r#"{"priority":"high"}"#.into()).is_ok());
        assert_eq!(
            TypeData::parse("[1]".into()).unwrap_err().field,
            "type_data"
        );
        assert!(TypeData::parse("{".into()).is_err());
    }

    #[test]
    fn script_origin_checks_optional_uuids() {
        let err =
            ScriptOrigin::parse(String::new(), String::new(), Some("nope"), None).unwrap_err();
        assert_eq!(err.field, "origin_execution_id");
        let ok = ScriptOrigin::parse("i1".into(), "s.py".into(), Some(""), None).unwrap();
        assert_eq!(ok.origin_execution_id, None);
    }

    #[test]
    fn list_names_are_trimmed_identifiers() {
        assert!(ListName::parse(" ops".into()).is_err());
        assert!(ListName::parse("ops\u{7}".into()).is_err());
        assert!(ListName::parse("Ops On-Call".into()).is_ok());
    }
}
