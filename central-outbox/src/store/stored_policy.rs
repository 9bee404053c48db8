//! An escalation policy as both backends store it: one JSON text, in the list's `Escalation`
//! column and, as the snapshot an incident keeps, in `Incidents.Policy`. Decoding runs the
//! domain's checks again, so a stored value that breaks a rule (a hand edit, a restore) is
//! named rather than run.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::domain::Priority;
use crate::domain::escalation::{EscalationPolicy, PolicyInput};

/// The stored form. Durations are whole seconds (the domain allows no other).
#[derive(Serialize, Deserialize)]
struct StoredPolicy {
    priorities: Vec<String>,
    acknowledge_within_s: u64,
    steps: Vec<StoredStep>,
    repeat: u32,
    repeat_from_step: u32,
    escalate_on_park: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    reminder_s: Option<u64>,
    /// Absent in what was stored before the option existed: off.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    notify_acknowledgement: bool,
}

#[derive(Serialize, Deserialize)]
struct StoredStep {
    notify: Vec<String>,
    wait_s: u64,
}

/// The policy's stored text.
pub(crate) fn encode(policy: &EscalationPolicy) -> String {
    let input = policy.to_input();
    let stored = StoredPolicy {
        priorities: input
            .priorities
            .iter()
            .map(|p| p.as_str().to_owned())
            .collect(),
        acknowledge_within_s: input.acknowledge_within.as_secs(),
        steps: input
            .steps
            .into_iter()
            .map(|(notify, wait)| StoredStep {
                notify,
                wait_s: wait.as_secs(),
            })
            .collect(),
        repeat: input.repeat,
        repeat_from_step: input.repeat_from_step.unwrap_or(1),
        escalate_on_park: input.escalate_on_park.unwrap_or(true),
        reminder_s: input.acknowledgement_reminder.map(|r| r.as_secs()),
        notify_acknowledgement: input.notify_acknowledgement.unwrap_or(false),
    };
    // A struct of strings, numbers and vectors always serializes.
    serde_json::to_string(&stored).unwrap_or_default()
}

/// The policy a stored text holds; the error says what is wrong with it.
pub(crate) fn decode(text: &str) -> Result<EscalationPolicy, String> {
    let stored: StoredPolicy =
        serde_json::from_str(text).map_err(|e| format!("escalation policy {text:?}: {e}"))?;
    let priorities = stored
        .priorities
        .iter()
        .map(|p| Priority::parse_name(p).ok_or_else(|| format!("escalation priority {p:?}")))
        .collect::<Result<Vec<_>, _>>()?;
    EscalationPolicy::parse(PolicyInput {
        priorities,
        acknowledge_within: Duration::from_secs(stored.acknowledge_within_s),
        steps: stored
            .steps
            .into_iter()
            .map(|s| (s.notify, Duration::from_secs(s.wait_s)))
            .collect(),
        repeat: stored.repeat,
        repeat_from_step: Some(stored.repeat_from_step),
        escalate_on_park: Some(stored.escalate_on_park),
        acknowledgement_reminder: stored.reminder_s.map(Duration::from_secs),
        notify_acknowledgement: Some(stored.notify_acknowledgement),
    })
    .map_err(|e| format!("escalation policy: {}: {}", e.field, e.problem))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_policy_round_trips_and_a_broken_text_is_named() {
        let policy = EscalationPolicy::parse(PolicyInput {
            priorities: vec![Priority::Normal],
            acknowledge_within: Duration::from_secs(600),
            steps: vec![(vec!["supervisors".into()], Duration::from_secs(900))],
            repeat: 2,
            repeat_from_step: Some(2),
            escalate_on_park: Some(false),
            acknowledgement_reminder: Some(Duration::from_secs(3600)),
            notify_acknowledgement: Some(true),
        })
        .unwrap();
        assert_eq!(decode(&encode(&policy)).unwrap(), policy);
        let broken = encode(&policy).replace("\"repeat\":2", "\"repeat\":99");
        let e = decode(&broken).unwrap_err();
        assert!(e.contains("escalation.repeat"), "{e}");
        assert!(decode("{").unwrap_err().starts_with("escalation policy"));
    }
}
