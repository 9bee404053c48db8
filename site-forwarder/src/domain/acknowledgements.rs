//! Acknowledgements made at the site (`SiteNotify.Acknowledge`) whose central half is still to
//! do, and the rule that orders them among the notifications on the way to central.

use chrono::{DateTime, Utc};

use super::{ConditionKey, ContentError, Seq};

/// Longest actor an acknowledgement names, in characters (central keeps 128 of an actor).
pub const MAX_ACTOR_CHARS: usize = 128;

/// Who acknowledged at the site, as a script passed it: at most [`MAX_ACTOR_CHARS`] characters,
/// no control characters, surrounding blanks dropped (empty: unnamed).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct AckActor(String);

impl AckActor {
    /// `text` checked; the error names `field` and the rule.
    pub fn parse(text: &str, field: &'static str) -> Result<Self, ContentError> {
        let text = text.trim();
        let chars = text.chars().count();
        if chars > MAX_ACTOR_CHARS {
            return Err(ContentError::new(
                field,
                format!("is {chars} characters, the limit is {MAX_ACTOR_CHARS}"),
            ));
        }
        if text.chars().any(char::is_control) {
            return Err(ContentError::new(
                field,
                "must not contain control characters",
            ));
        }
        Ok(Self(text.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// An acknowledgement committed at this site that central is still to apply. At most one per
/// key: a later acknowledgement of the key moves `up_to` forward and names its own actor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingAck {
    pub condition_key: ConditionKey,
    /// The newest seq handed out when it was committed: every row buffered before it (the alarm
    /// it answers among them) has a seq up to here.
    pub up_to: Seq,
    /// When the (latest) acknowledgement of the key was committed.
    pub acknowledged_at: DateTime<Utc>,
    pub actor: AckActor,
}

/// The site's pending acknowledgements at one moment, oldest watermark first. The rule
/// ([`Self::due`]): central is asked to apply one only once every row with a seq up to its
/// `up_to` has left the buffer, so the alarm it answers has opened (or joined) its incident at
/// central by then. Unlike a clear, it holds no later row back: a later alarm of the key joins
/// the incident, acknowledged or not, and a new occurrence after the acknowledgement reached
/// central is a new alarm, as it should be.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PendingAcks(Vec<PendingAck>);

impl PendingAcks {
    pub fn new(mut acks: Vec<PendingAck>) -> Self {
        acks.sort_by_key(|a| a.up_to);
        Self(acks)
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn iter(&self) -> impl Iterator<Item = &PendingAck> {
        self.0.iter()
    }

    /// The acknowledgements central may apply now, given the oldest seq still buffered
    /// (`None`: the buffer is empty).
    pub fn due(&self, oldest_buffered: Option<Seq>) -> impl Iterator<Item = &PendingAck> {
        self.0
            .iter()
            .filter(move |a| oldest_buffered.is_none_or(|oldest| a.up_to < oldest))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ack(key: &str, up_to: i64) -> PendingAck {
        PendingAck {
            condition_key: ConditionKey::parse(key.into(), "condition_key").unwrap(),
            up_to: Seq(up_to),
            acknowledged_at: Utc::now(),
            actor: AckActor::default(),
        }
    }

    #[test]
    fn an_acknowledgement_is_due_once_every_row_before_it_has_left() {
        let acks = PendingAcks::new(vec![ack("b", 9), ack("a", 4)]);
        let keys = |oldest| {
            acks.due(oldest)
                .map(|a| a.condition_key.as_str().to_owned())
                .collect::<Vec<_>>()
        };
        assert_eq!(keys(None), ["a", "b"], "oldest watermark first");
        assert_eq!(keys(Some(Seq(4))), Vec::<String>::new());
        assert_eq!(keys(Some(Seq(5))), ["a"]);
        assert_eq!(keys(Some(Seq(10))), ["a", "b"]);
    }

    #[test]
    fn an_actor_is_checked_by_name() {
        assert_eq!(
            AckActor::parse("  Jo (HMI 2) ", "actor").unwrap().as_str(),
            "Jo (HMI 2)"
        );
        assert_eq!(AckActor::parse("", "actor").unwrap(), AckActor::default());
        let long = "é".repeat(129);
        assert_eq!(
            AckActor::parse(&long, "actor").unwrap_err().to_string(),
            "actor: is 129 characters, the limit is 128"
        );
        assert_eq!(
            AckActor::parse("a\u{7}b", "actor").unwrap_err().field,
            "actor"
        );
    }
}
