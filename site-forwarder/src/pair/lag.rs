//! The standby lag of an active node, as it is at the moment it is read: the Sends this node
//! accepted that its standby has not confirmed (`standby_lag_rows`), and how long ago the
//! oldest of them was committed (`standby_lag_seconds`). That is the window a failover can
//! lose, so it must be true at any moment, not as of the last heartbeat.
//!
//! Invariants:
//! - Rows are `head - confirmed`, both read when the figures are: the head from the buffer's
//!   own watch (moved after each commit), `confirmed` from the replication stream (the
//!   standby's hello, then each confirmation). Seqs, not rows still buffered: a row forwarded
//!   and deleted since still counts until the standby confirms past it (an upper bound; such a
//!   row is at central already).
//! - The figures survive the replication stream: a standby that is cut off or frozen holds only
//!   what it confirmed, so the lag keeps growing with every Send until a standby confirms
//!   again. Only the stream attached last moves `confirmed` (an older one may linger until its
//!   connection is declared dead).
//! - Ages come from commit marks, `(seq, time)`: the head had reached `seq` by `time`, so every
//!   seq up to it was committed by then. The oldest unconfirmed Send is `confirmed + 1`; its
//!   age is read from the first mark above `confirmed`. Marks are taken by
//!   [`super::Pair::track_commits`] as the head moves (microseconds after each commit); marks
//!   at or below `confirmed` are dropped but the last of them. Marks closer than the current
//!   resolution (1 ms at first) share one, and past [`MAX_MARKS`] neighbours are merged and the
//!   resolution doubles: an age may read older than it is by at most the resolution, never
//!   younger than what the marks show, and memory stays bounded however long a standby is
//!   frozen.

use std::collections::VecDeque;
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::sync::watch;

use crate::domain::Seq;

/// Most commit marks kept. At the starting resolution (1 ms) this is four seconds of
/// back-to-back commits; a standby frozen for longer costs precision (the resolution doubles),
/// not memory: 4096 marks are 64 KiB.
pub(crate) const MAX_MARKS: usize = 4096;
/// Marks closer than this share one, until [`MAX_MARKS`] makes it coarser.
const FIRST_RESOLUTION: Duration = Duration::from_millis(1);

/// Which replication stream a confirmation comes from (see [`StandbyLag::attach`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct StreamId(u64);

/// The lag figures at one moment.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct LagFigures {
    pub rows: u64,
    pub age: Duration,
}

impl LagFigures {
    pub(crate) const NONE: LagFigures = LagFigures {
        rows: 0,
        age: Duration::ZERO,
    };
}

#[derive(Debug)]
pub(crate) struct StandbyLag {
    /// The buffer's head while this node is active; `None` otherwise (no lag to report).
    head: Option<watch::Receiver<Seq>>,
    /// Highest seq the standby is known to hold.
    confirmed: Seq,
    /// The stream whose confirmations count, and the number the next one gets.
    stream: StreamId,
    next_stream: u64,
    marks: VecDeque<(Seq, DateTime<Utc>)>,
    resolution: Duration,
}

impl Default for StandbyLag {
    fn default() -> Self {
        Self {
            head: None,
            confirmed: Seq::START,
            stream: StreamId(0),
            next_stream: 1,
            marks: VecDeque::new(),
            resolution: FIRST_RESOLUTION,
        }
    }
}

impl StandbyLag {
    /// This node became active with the buffer at `head`. Until a standby says otherwise, what
    /// is already buffered counts as on it (a restarted active does not know better; the
    /// standby's hello corrects it), committed by `now`.
    pub(crate) fn activate(&mut self, head: watch::Receiver<Seq>, now: DateTime<Utc>) {
        let at = *head.borrow();
        *self = Self {
            head: Some(head),
            confirmed: at,
            next_stream: self.next_stream,
            ..Self::default()
        };
        self.marks.push_back((at, now));
    }

    /// This node is no longer active: nothing to report.
    pub(crate) fn deactivate(&mut self) {
        *self = Self {
            next_stream: self.next_stream,
            ..Self::default()
        };
    }

    /// A standby attached a stream holding every seq up to `holds` (its resumed copy, or
    /// nothing for a full copy). From now on only this stream's confirmations count.
    pub(crate) fn attach(&mut self, holds: Seq) -> StreamId {
        let id = StreamId(self.next_stream);
        self.next_stream += 1;
        self.stream = id;
        self.confirmed = holds;
        self.prune();
        id
    }

    /// The standby of `stream` committed every seq up to `through`.
    pub(crate) fn confirmed(&mut self, stream: StreamId, through: Seq) {
        if stream == self.stream && through > self.confirmed {
            self.confirmed = through;
            self.prune();
        }
    }

    /// The head reached `seq` by `at`.
    pub(crate) fn committed(&mut self, seq: Seq, at: DateTime<Utc>) {
        if self.head.is_none() {
            return;
        }
        let resolution =
            chrono::Duration::from_std(self.resolution).unwrap_or(chrono::Duration::MAX);
        match self.marks.back_mut() {
            Some(last) if seq <= last.0 => return,
            // Claims `seq` a little earlier than it was: the age reads older, never younger.
            Some(last) if at - last.1 < resolution => {
                last.0 = seq;
                return;
            }
            _ => {}
        }
        self.marks.push_back((seq, at));
        if self.marks.len() > MAX_MARKS {
            self.coarsen();
        }
    }

    /// The figures now.
    pub(crate) fn figures(&self, now: DateTime<Utc>) -> LagFigures {
        let Some(head) = &self.head else {
            return LagFigures::NONE;
        };
        let head = *head.borrow();
        let rows = u64::try_from(head.0.saturating_sub(self.confirmed.0)).unwrap_or(0);
        if rows == 0 {
            return LagFigures::NONE;
        }
        // No mark above `confirmed` yet: committed this very moment.
        let age = self
            .marks
            .iter()
            .find(|(seq, _)| *seq > self.confirmed)
            .map_or(Duration::ZERO, |(_, at)| {
                (now - *at).to_std().unwrap_or_default()
            });
        LagFigures { rows, age }
    }

    /// Drops the marks at or below `confirmed` but the last of them, which still dates every
    /// seq below it should a later stream hold less.
    fn prune(&mut self) {
        while self.marks.len() > 1 && self.marks[1].0 <= self.confirmed {
            self.marks.pop_front();
        }
    }

    /// Halves the marks: each pair becomes one with the later seq and the earlier time.
    fn coarsen(&mut self) {
        let old = std::mem::take(&mut self.marks);
        let mut marks = old.into_iter();
        while let Some((seq, at)) = marks.next() {
            let seq = marks.next().map_or(seq, |(later, _)| later);
            self.marks.push_back((seq, at));
        }
        self.resolution = self.resolution.saturating_mul(2);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(ms: i64) -> DateTime<Utc> {
        DateTime::from_timestamp_millis(1_700_000_000_000 + ms).unwrap()
    }

    fn active(head: i64) -> (StandbyLag, watch::Sender<Seq>) {
        let (tx, rx) = watch::channel(Seq(head));
        let mut lag = StandbyLag::default();
        lag.activate(rx, at(0));
        (lag, tx)
    }

    #[test]
    fn rows_are_what_the_head_passed_since_the_last_confirmation_and_age_the_oldest() {
        let (mut lag, head) = active(10);
        assert_eq!(
            lag.figures(at(5)),
            LagFigures::NONE,
            "all buffered counts as held"
        );
        let stream = lag.attach(Seq(10));
        for (seq, ms) in [(11, 100), (12, 200), (15, 300)] {
            head.send_replace(Seq(seq));
            lag.committed(Seq(seq), at(ms));
        }
        let figures = lag.figures(at(1_100));
        assert_eq!(figures.rows, 5);
        assert_eq!(figures.age, Duration::from_millis(1_000));
        // Nothing confirmed: the age grows with the clock, the rows with the head.
        head.send_replace(Seq(16));
        assert_eq!(lag.figures(at(2_100)).rows, 6);
        assert_eq!(lag.figures(at(2_100)).age, Duration::from_secs(2));

        lag.confirmed(stream, Seq(12));
        assert_eq!(
            lag.figures(at(2_100)),
            LagFigures {
                rows: 4,
                age: Duration::from_millis(1_800)
            }
        );
        lag.confirmed(stream, Seq(16));
        assert_eq!(lag.figures(at(2_100)), LagFigures::NONE);
    }

    #[test]
    fn only_the_latest_stream_counts_and_a_lower_hello_dates_from_the_marks_kept() {
        let (mut lag, head) = active(0);
        let old = lag.attach(Seq(0));
        for seq in 1..=4 {
            head.send_replace(Seq(seq));
            lag.committed(Seq(seq), at(seq * 100));
        }
        lag.confirmed(old, Seq(4));
        // The standby reconnects and says it holds less (its last commits were lost).
        let new = lag.attach(Seq(2));
        lag.confirmed(old, Seq(4));
        let figures = lag.figures(at(1_000));
        assert_eq!(figures.rows, 2);
        // Seq 3 was committed by 300 ms at the latest; the kept mark says by 400 ms.
        assert_eq!(figures.age, Duration::from_millis(600));
        lag.confirmed(new, Seq(4));
        assert_eq!(lag.figures(at(1_000)), LagFigures::NONE);
    }

    #[test]
    fn marks_stay_bounded_and_ages_never_read_younger() {
        let (mut lag, head) = active(0);
        let stream = lag.attach(Seq(0));
        let n = (MAX_MARKS * 3) as i64;
        for seq in 1..=n {
            lag.committed(Seq(seq), at(seq * 2));
        }
        head.send_replace(Seq(n));
        assert!(lag.marks.len() <= MAX_MARKS);
        for confirmed in [0, n / 3, n / 2, n - 1] {
            lag.confirmed(stream, Seq(confirmed));
            let committed_at = (confirmed + 1) * 2;
            let age = lag.figures(at(n * 2 + 1_000)).age;
            let truth = Duration::from_millis((n * 2 + 1_000 - committed_at) as u64);
            assert!(age >= truth, "confirmed {confirmed}: {age:?} < {truth:?}");
            assert!(
                age <= truth + lag.resolution * 2,
                "confirmed {confirmed}: {age:?} vs {truth:?}"
            );
        }
    }

    #[test]
    fn a_node_that_is_not_active_reports_nothing() {
        let (mut lag, head) = active(3);
        head.send_replace(Seq(9));
        assert_eq!(lag.figures(at(10)).rows, 6);
        lag.deactivate();
        lag.committed(Seq(10), at(20));
        assert_eq!(lag.figures(at(30)), LagFigures::NONE);
    }
}
