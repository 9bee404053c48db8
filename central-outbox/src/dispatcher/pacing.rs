//! Channel pacing: each channel's delivery slots, rate limit and queue of claimed rows, and the
//! rules that decide how many rows a sweep claims and which queued row starts next.
//!
//! Invariants: a channel never has more deliveries under way than its
//! `max_concurrent_connections` (at least one); a delivery starts only with a whole rate-limit
//! token, which it consumes; a sweep claims only when nothing of the channel is queued and no
//! claim of it is under way, so rows start in the order they were claimed (oldest due first),
//! and a channel has at most one claim under way; a queued row that waited past half
//! its claim is never started (see [`Pacing::start_next`]); a channel whose last claim found
//! fewer due rows than it asked for is not claimed again until something may have made more
//! rows due (see [`Pacing::due_may_have_changed`]), so finished deliveries do not each cost an
//! empty claim of an idle channel.
//!
//! Time is read from tokio's clock, which is the system clock except under a test's paused
//! clock: there, the pacing follows the test's time exactly.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use crate::delivery::ChannelSettings;
use crate::domain::NotificationType;
use crate::domain::rate::TokenBucket;
use crate::domain::serve_order::{ClaimLanes, LongestWaitingShare};
use crate::store::ClaimedNotification;

/// The channels, in the order a sweep serves them.
pub(super) const CHANNELS: [NotificationType; 2] =
    [NotificationType::Email, NotificationType::Webhook];

fn channel_index(kind: NotificationType) -> usize {
    match kind {
        NotificationType::Email => 0,
        NotificationType::Webhook => 1,
    }
}

/// Now, on tokio's clock (see the module documentation).
pub(super) fn now() -> Instant {
    tokio::time::Instant::now().into_std()
}

/// One channel's share of the dispatcher: its busy slots, its rate limit, rows claimed but not
/// yet started, and the settings of the last sweep (which those rows are delivered with).
#[derive(Debug, Default)]
struct ChannelState {
    in_flight: usize,
    bucket: Option<TokenBucket>,
    queue: VecDeque<(ClaimedNotification, Instant)>,
    settings: Option<ChannelSettings>,
    /// The last claim found fewer due rows than it asked for (or failed): none is left until a
    /// row is ingested, a retry comes due or another replica ingests (the poll timer).
    drained: bool,
    /// A claim of this channel is under way.
    claiming: bool,
    /// Something may have made rows due since the claim under way read the table, so a short
    /// answer does not mean nothing is left.
    due_changed_while_claiming: bool,
    /// Which of this channel's claimed rows go to the longest-waiting (`domain::serve_order`).
    share: LongestWaitingShare,
}

impl ChannelState {
    fn slots(&self) -> usize {
        self.settings
            .as_ref()
            .map_or(1, |s| s.policy().max_concurrent_connections.max(1) as usize)
    }
}

/// Every channel's pacing state.
#[derive(Debug, Default)]
pub(super) struct Pacing {
    channels: [ChannelState; CHANNELS.len()],
    /// Earliest instant a rate-limited channel gets a token again, if any is waiting for one.
    throttled_until: Option<tokio::time::Instant>,
}

impl Pacing {
    /// When the loop should next wake for a rate-limit token, if a channel waits for one.
    pub(super) fn throttled_until(&self) -> Option<tokio::time::Instant> {
        self.throttled_until
    }

    /// A sweep begins: it notes again whichever channel is still short of tokens.
    pub(super) fn sweep_begins(&mut self) {
        self.throttled_until = None;
    }

    /// Takes the settings a sweep read for `kind`. A changed rate limit starts a fresh bucket;
    /// an unchanged one keeps its tokens.
    pub(super) fn set_settings(&mut self, kind: NotificationType, channel: ChannelSettings) {
        let policy = channel.policy();
        let state = &mut self.channels[channel_index(kind)];
        match (policy.rate_limit, &state.bucket) {
            (None, _) => state.bucket = None,
            (Some(limit), Some(bucket)) if bucket.limit() == limit => {}
            (Some(limit), _) => state.bucket = Some(TokenBucket::new(limit, now())),
        }
        state.settings = Some(channel);
    }

    /// The settings of the last sweep for `kind`, which its queued rows are delivered with.
    pub(super) fn settings(&self, kind: NotificationType) -> Option<&ChannelSettings> {
        self.channels[channel_index(kind)].settings.as_ref()
    }

    /// How many rows a sweep should claim for `kind` now: none while rows are queued or a claim
    /// is under way, no slot is free or no token is left (then the loop is told when the next
    /// token comes). Otherwise
    /// `claim_batch`, or the free slots plus two rows per connection, bounded by the tokens.
    pub(super) fn claim_size(
        &mut self,
        kind: NotificationType,
        claim_batch: Option<usize>,
    ) -> usize {
        let now = now();
        let state = &mut self.channels[channel_index(kind)];
        let slots = state.slots();
        let free = slots.saturating_sub(state.in_flight);
        if !state.queue.is_empty() || state.claiming || free == 0 || state.drained {
            return 0;
        }
        let tokens = state
            .bucket
            .as_mut()
            .map_or(usize::MAX, |b| b.available(now));
        if tokens == 0 {
            // Nothing was queued to start, so note when a token comes.
            self.note_throttle(kind, now);
            return 0;
        }
        // Claiming ahead halves the claims per delivery and hides their commit latency (in
        // `make bench`, about 1,800 -> 2,400 deliveries/s with four connections). The price: a
        // row claimed but not yet started when this node dies shows an InFlight attempt like
        // one that was under way, so its redelivery is reported as a possible duplicate.
        claim_batch.unwrap_or_else(|| (free + 2 * slots).min(tokens))
    }

    /// A claim of `wanted` rows of `kind` is sent, split between the orders of
    /// `domain::serve_order`; until [`Pacing::claim_answered`], no other claim of it is.
    pub(super) fn claim_sent(&mut self, kind: NotificationType, wanted: usize) -> ClaimLanes {
        let state = &mut self.channels[channel_index(kind)];
        state.claiming = true;
        state.due_changed_while_claiming = false;
        state.share.split(wanted)
    }

    /// The claim of `kind` under way answered: with the rows it took out of `wanted` (queued,
    /// stamped with when they were claimed), or `None` when it failed or its rows are not to be
    /// worked (another node held the lease since). A short or failed claim leaves the channel
    /// drained, unless something made rows due meanwhile, so a failing database is retried on
    /// the next ingest or poll, not on every finished delivery.
    pub(super) fn claim_answered(
        &mut self,
        kind: NotificationType,
        wanted: usize,
        claimed: Option<Vec<ClaimedNotification>>,
    ) {
        let claimed_at = now();
        let state = &mut self.channels[channel_index(kind)];
        state.claiming = false;
        let short = claimed.as_ref().is_none_or(|rows| rows.len() < wanted);
        state.drained = short && !state.due_changed_while_claiming;
        if let Some(claimed) = claimed {
            state.share.claimed(claimed.len());
            state
                .queue
                .extend(claimed.into_iter().map(|n| (n, claimed_at)));
        }
    }

    /// Something may have made rows due (a row ingested, the poll timer, a lease taken): every
    /// channel claims again at its next sweep. A finished delivery or a lease renewal does not
    /// count: it makes nothing due.
    pub(super) fn due_may_have_changed(&mut self) {
        for state in &mut self.channels {
            state.drained = false;
            state.due_changed_while_claiming = state.claiming;
        }
    }

    /// The next queued row of `kind` to start, if the channel has a free slot and a rate-limit
    /// token (which this takes, and the slot with it). A row that waited longer than
    /// `stale_after` could not finish before its claim runs out: it is dropped here (its token
    /// spent) and becomes due again when its claim expires.
    pub(super) fn start_next(
        &mut self,
        kind: NotificationType,
        stale_after: Duration,
    ) -> Option<ClaimedNotification> {
        loop {
            let now = now();
            let state = &mut self.channels[channel_index(kind)];
            if state.in_flight >= state.slots() || state.queue.is_empty() {
                return None;
            }
            if let Some(bucket) = state.bucket.as_mut() {
                if bucket.available(now) == 0 {
                    self.note_throttle(kind, now);
                    return None;
                }
                bucket.take(1, now);
            }
            let (notification, claimed_at) = state.queue.pop_front()?;
            if now.duration_since(claimed_at) > stale_after {
                tracing::warn!(
                    id = %notification.id,
                    "claimed row waited too long to start; it is retried after its claim expires"
                );
                continue;
            }
            state.in_flight += 1;
            return Some(notification);
        }
    }

    /// A delivery of `kind` finished: its slot is free.
    pub(super) fn finished(&mut self, kind: NotificationType) {
        let state = &mut self.channels[channel_index(kind)];
        state.in_flight = state.in_flight.saturating_sub(1);
    }

    /// No delivery is under way any more (all were aborted or lost): every slot is free.
    pub(super) fn free_all_slots(&mut self) {
        for state in &mut self.channels {
            state.in_flight = 0;
        }
    }

    /// Drops every queued row and frees every slot: the work was claimed under an epoch that
    /// another node has held since. The rows are due again when their claims expire.
    pub(super) fn drop_all(&mut self) {
        self.free_all_slots();
        for state in &mut self.channels {
            state.queue.clear();
        }
    }

    /// Remembers when the channel's next rate-limit token arrives, to sweep again then.
    fn note_throttle(&mut self, kind: NotificationType, now: Instant) {
        if let Some(bucket) = self.channels[channel_index(kind)].bucket.as_mut() {
            let ready = tokio::time::Instant::now() + bucket.wait_for_one(now);
            self.throttled_until = Some(self.throttled_until.map_or(ready, |t| t.min(ready)));
        }
    }
}
