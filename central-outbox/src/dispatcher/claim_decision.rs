//! Whether a channel claims now, and how many rows: a pure function of what the channel knows
//! at one turn ([`ClaimState`]), and the little state that says whether rows may be due
//! ([`DueRows`]). The channel loop gathers the state, asks [`decide`], and acts on the answer;
//! nothing here reads a clock, a channel or the store.
//!
//! The rules, in the order they are asked (the first that holds answers):
//! 1. no claim while the channel's settings are being read (rows already queued go on starting
//!    with the settings they were claimed under);
//! 2. at most one claim under way;
//! 3. none while the channel is drained: its last claim found fewer due rows than it asked for
//!    (or failed) and nothing has since made rows due (a row ingested, the poll timer, a lease
//!    taken), so finished deliveries do not each cost an empty claim of an idle channel;
//! 4. none while the queue holds as many rows as the free slots plus the depth claimed ahead
//!    (`claim_ahead`); the depth counts as zero while the recorder's backlog is larger than it
//!    plus two rows per slot (the database is behind the deliveries);
//! 5. none without a rate-limit token for more than the queue holds (the channel then takes a
//!    turn when the next token comes).
//!
//! Otherwise it claims `claim_batch` rows, or enough to fill the free slots, two more per
//! connection and the depth ahead, less what is queued, bounded by the tokens.
//!
//! Nothing here runs without a lease: a channel whose node may not claim now does not take a
//! turn at all (it neither starts nor claims), so the lease is not one of the rules.

/// What a channel knows when it decides whether to claim; see the module documentation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct ClaimState {
    /// The channel's settings are current (a fresh copy at hand, or a read just answered).
    pub(super) settings_fresh: bool,
    /// A claim of this channel is under way.
    pub(super) claim_under_way: bool,
    /// The last claim came back short and nothing has made rows due since ([`DueRows`]).
    pub(super) drained: bool,
    /// Delivery slots free now.
    pub(super) free_slots: usize,
    /// Delivery slots in all (connections times the attempts each keeps under way).
    pub(super) slots: usize,
    /// The channel's connections (`max_concurrent_connections`, at least one).
    pub(super) connections: usize,
    /// Rows claimed and not yet started.
    pub(super) queued: usize,
    /// Rows to keep queued while the next claim is under way, as measured (`claim_ahead`).
    pub(super) ahead: usize,
    /// Outcomes handed to the recorder and not yet taken by a write.
    pub(super) recorder_backlog: usize,
    /// Whole rate-limit tokens available now; `None`: the channel has no rate limit.
    pub(super) tokens: Option<usize>,
    /// `dispatcher.claim_batch`: rows per claim, or `None` to size each claim by the above.
    pub(super) claim_batch: Option<usize>,
}

/// What [`decide`] answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Decision {
    /// Claim up to this many rows (at least one).
    Claim(usize),
    /// Claim nothing now, for this reason.
    Wait(NoClaim),
}

/// Why a channel claims nothing now (the rules of the module documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum NoClaim {
    /// The channel's settings are being read.
    SettingsUnread,
    /// A claim is under way already.
    ClaimUnderWay,
    /// The last claim came back short and nothing has made rows due since.
    Drained,
    /// The queue holds as many rows as the free slots plus the depth claimed ahead.
    QueueFull,
    /// No rate-limit token for more than the queue holds: take a turn when the next comes.
    Throttled,
}

/// Whether `state`'s channel claims now, and how many rows; see the module documentation.
pub(super) fn decide(state: &ClaimState) -> Decision {
    if !state.settings_fresh {
        return Decision::Wait(NoClaim::SettingsUnread);
    }
    if state.claim_under_way {
        return Decision::Wait(NoClaim::ClaimUnderWay);
    }
    if state.drained {
        return Decision::Wait(NoClaim::Drained);
    }
    // Outcomes waiting for the recorder mean the database is behind the deliveries: claiming
    // ahead would only make rows wait longer between their claim and their recorded outcome,
    // and a claim that runs out first is claimed again while its first send stands (a
    // duplicate mail). Then the channel claims only once its queue is empty.
    let ahead = if state.recorder_backlog > state.ahead + 2 * state.slots {
        0
    } else {
        state.ahead
    };
    if state.queued >= state.free_slots + ahead {
        return Decision::Wait(NoClaim::QueueFull);
    }
    let tokens = state.tokens.unwrap_or(usize::MAX);
    if tokens <= state.queued {
        return Decision::Wait(NoClaim::Throttled);
    }
    // Claiming ahead cuts the claims per delivery and hides their commit latency: without it
    // (a claim only once the queue ran dry) four connections waited for every claim, and a
    // server that spends more on a call than on a row (MS SQL, Babelfish above all) could not
    // keep up. The price: a row claimed but not yet started when this node dies shows an
    // InFlight attempt like one that was under way, so its redelivery is reported as a
    // possible duplicate.
    let rows = state.claim_batch.unwrap_or_else(|| {
        (state.free_slots + 2 * state.connections + ahead)
            .saturating_sub(state.queued)
            .min(tokens - state.queued)
    });
    Decision::Claim(rows)
}

/// Whether rows may be due: a channel whose claim came back short is drained until something
/// may have made rows due. Something that did so while a claim was under way keeps the channel
/// claiming, since that claim may have read the table before the new rows were there.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(super) struct DueRows {
    drained: bool,
    woken_during_claim: bool,
}

impl DueRows {
    /// Something may have made rows due (a row ingested, the poll timer, a lease taken; a
    /// finished delivery or a lease renewal does not count).
    pub(super) fn woken(&mut self, claim_under_way: bool) {
        self.drained = false;
        self.woken_during_claim = claim_under_way;
    }

    /// A claim was sent: it reads the table as it is from now on.
    pub(super) fn claim_sent(&mut self) {
        self.woken_during_claim = false;
    }

    /// The claim under way answered; `short`: it found fewer due rows than it asked for (or
    /// failed, so a failing database is tried again at the next ingest or poll, not on every
    /// finished delivery).
    pub(super) fn claim_answered(&mut self, short: bool) {
        self.drained = short && !self.woken_during_claim;
    }

    /// No row is due until something may have made one so.
    pub(super) fn drained(&self) -> bool {
        self.drained
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A channel of 4 connections with one slot each, all free, nothing queued, no rate limit,
    /// nothing measured ahead and nothing waiting for the recorder: it claims.
    fn ready() -> ClaimState {
        ClaimState {
            settings_fresh: true,
            claim_under_way: false,
            drained: false,
            free_slots: 4,
            slots: 4,
            connections: 4,
            queued: 0,
            ahead: 0,
            recorder_backlog: 0,
            tokens: None,
            claim_batch: None,
        }
    }

    #[test]
    fn a_ready_channel_claims_its_free_slots_and_two_rows_per_connection() {
        assert_eq!(decide(&ready()), Decision::Claim(4 + 2 * 4));
    }

    #[test]
    fn the_depth_ahead_is_claimed_too_less_what_is_queued() {
        let state = ClaimState {
            ahead: 10,
            queued: 6,
            free_slots: 1,
            ..ready()
        };
        // 1 free + 8 for the connections + 10 ahead, 6 of them queued already.
        assert_eq!(decide(&state), Decision::Claim(13));
    }

    #[test]
    fn no_claim_while_the_settings_are_being_read() {
        let state = ClaimState {
            settings_fresh: false,
            ..ready()
        };
        assert_eq!(decide(&state), Decision::Wait(NoClaim::SettingsUnread));
    }

    #[test]
    fn one_claim_under_way_at_a_time() {
        let state = ClaimState {
            claim_under_way: true,
            ..ready()
        };
        assert_eq!(decide(&state), Decision::Wait(NoClaim::ClaimUnderWay));
    }

    #[test]
    fn a_drained_channel_claims_nothing_until_woken() {
        let state = ClaimState {
            drained: true,
            ..ready()
        };
        assert_eq!(decide(&state), Decision::Wait(NoClaim::Drained));
    }

    #[test]
    fn no_free_slot_and_nothing_measured_ahead_claims_nothing() {
        let busy = ClaimState {
            free_slots: 0,
            ..ready()
        };
        assert_eq!(decide(&busy), Decision::Wait(NoClaim::QueueFull));
        // Once a depth ahead is measured, the channel claims while every slot is busy.
        let ahead = ClaimState { ahead: 2, ..busy };
        assert_eq!(decide(&ahead), Decision::Claim(8 + 2));
    }

    #[test]
    fn the_queue_is_topped_up_to_the_free_slots_plus_the_depth_ahead() {
        let full = ClaimState {
            free_slots: 2,
            ahead: 3,
            queued: 5,
            ..ready()
        };
        assert_eq!(decide(&full), Decision::Wait(NoClaim::QueueFull));
        let one_short = ClaimState { queued: 4, ..full };
        assert_eq!(decide(&one_short), Decision::Claim(2 + 8 + 3 - 4));
    }

    #[test]
    fn a_recorder_backlog_stops_claiming_ahead() {
        let state = ClaimState {
            free_slots: 1,
            ahead: 5,
            queued: 2,
            ..ready()
        };
        // Up to the depth ahead plus two per slot (5 + 8) waiting: still claims ahead.
        let keeping_up = ClaimState {
            recorder_backlog: 13,
            ..state
        };
        assert_eq!(decide(&keeping_up), Decision::Claim(1 + 8 + 5 - 2));
        // One more: the database is behind; the channel claims only once its queue is empty.
        let behind = ClaimState {
            recorder_backlog: 14,
            ..state
        };
        assert_eq!(decide(&behind), Decision::Wait(NoClaim::QueueFull));
        let behind_empty = ClaimState {
            queued: 0,
            ..behind
        };
        assert_eq!(decide(&behind_empty), Decision::Claim(1 + 8));
    }

    #[test]
    fn no_token_beyond_the_queue_is_throttled() {
        let none = ClaimState {
            tokens: Some(0),
            ..ready()
        };
        assert_eq!(decide(&none), Decision::Wait(NoClaim::Throttled));
        let all_queued = ClaimState {
            tokens: Some(2),
            queued: 2,
            ..ready()
        };
        assert_eq!(decide(&all_queued), Decision::Wait(NoClaim::Throttled));
    }

    #[test]
    fn the_tokens_bound_the_claim() {
        let state = ClaimState {
            tokens: Some(5),
            queued: 2,
            ..ready()
        };
        assert_eq!(decide(&state), Decision::Claim(3));
    }

    #[test]
    fn claim_batch_sets_the_size_whatever_the_slots_and_tokens() {
        let state = ClaimState {
            claim_batch: Some(50),
            tokens: Some(3),
            ..ready()
        };
        assert_eq!(decide(&state), Decision::Claim(50));
        // It does not override a reason to wait.
        let throttled = ClaimState {
            tokens: Some(0),
            ..state
        };
        assert_eq!(decide(&throttled), Decision::Wait(NoClaim::Throttled));
    }

    #[test]
    fn the_first_reason_answers() {
        let everything = ClaimState {
            settings_fresh: false,
            claim_under_way: true,
            drained: true,
            free_slots: 0,
            queued: 1,
            tokens: Some(0),
            ..ready()
        };
        assert_eq!(decide(&everything), Decision::Wait(NoClaim::SettingsUnread));
        let fresh = ClaimState {
            settings_fresh: true,
            ..everything
        };
        assert_eq!(decide(&fresh), Decision::Wait(NoClaim::ClaimUnderWay));
        let idle = ClaimState {
            claim_under_way: false,
            ..fresh
        };
        assert_eq!(decide(&idle), Decision::Wait(NoClaim::Drained));
        let woken = ClaimState {
            drained: false,
            ..idle
        };
        assert_eq!(decide(&woken), Decision::Wait(NoClaim::QueueFull));
    }

    #[test]
    fn a_short_answer_drains_an_idle_channel_until_it_is_woken() {
        let mut due = DueRows::default();
        assert!(!due.drained(), "a new channel claims");
        due.claim_sent();
        due.claim_answered(true);
        assert!(due.drained());
        due.woken(false);
        assert!(!due.drained());
    }

    #[test]
    fn a_full_answer_leaves_the_channel_claiming() {
        let mut due = DueRows::default();
        due.claim_sent();
        due.claim_answered(false);
        assert!(!due.drained());
    }

    #[test]
    fn woken_during_a_claim_a_short_answer_does_not_drain() {
        let mut due = DueRows::default();
        due.claim_sent();
        due.woken(true);
        due.claim_answered(true);
        assert!(
            !due.drained(),
            "rows made due meanwhile may not have been read"
        );
        // The next claim reads them: a short answer to it drains.
        due.claim_sent();
        due.claim_answered(true);
        assert!(due.drained());
    }
}
