//! The rows most recently committed to `buffered`, kept in memory so that a replication stream
//! that keeps up copies them without reading them back from SQLite. Only a shortcut: a stream
//! that is behind, or asks about seqs this does not cover, reads the table as before.
//!
//! Invariants:
//! - It *covers* the seqs `after + 1 ..= after + rows.len()`, one entry per seq: every row
//!   committed to `buffered` with a seq in that span is here, or is a tombstone because its
//!   removal was announced. It claims nothing about seqs outside the span.
//! - Rows are added only after their commit, in commit order (the buffer adds them from the
//!   writer's follow-ups, see `group_commit::Database::write_then`). A row whose seq does not
//!   directly follow the span starts a new span at that row, so a seq the buffer handed out some
//!   other way is never inside a span. Every change to `buffered` other than a Send or a removal
//!   (a standby's batch, an adoption, the end of a hand-over) clears the span ([`Self::clear`]).
//! - A removal is marked here under the same lock as its announcement, so a reader either does
//!   not get the row or gets it before the removal it will also receive.
//! - A row leaves once every attached stream has taken it (each stream's cursor only moves
//!   forward), so a stream that keeps up holds a few milliseconds of Sends here and frees them
//!   itself once sent, while they are still in its cache. Beyond that, at most [`MAX_ROWS`]
//!   rows and about [`MAX_BYTES`] of them; the oldest leave first. Either way the span then
//!   starts later. Nothing is kept while no stream is attached, so a single node only pays a
//!   lock per Send.

use std::collections::VecDeque;
use std::sync::Arc;

use crate::domain::{BufferedNotification, Seq};

/// Rows kept for a stream that does not take them. A stream waits for its window of
/// unconfirmed batches, under full load ~1,500 rows at 25,000 Sends/s; 8,192 lets a standby
/// fall a few windows behind before it has to read the table.
pub(crate) const MAX_ROWS: usize = 8192;
/// Bytes of row text kept: a stream's window pins about as much (8 batches of 1 MiB), so a
/// stream the window holds back still finds its next rows here.
pub(crate) const MAX_BYTES: usize = 8 << 20;

/// An attached stream, as [`RecentRows::attach`] numbered it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ReaderId(u64);

#[derive(Debug, Default)]
pub(crate) struct RecentRows {
    /// The seq before the first entry; `None` when nothing is covered.
    after: Option<Seq>,
    /// One entry per seq from `after + 1`; `None` for a row that was removed since.
    rows: VecDeque<Option<Arc<BufferedNotification>>>,
    /// Approximate size of the live rows, see [`size_of_row`].
    bytes: usize,
    /// Replication streams attached, with how far each has taken rows (`None` before its
    /// first page from here); rows are kept only while there is one.
    readers: Vec<(ReaderId, Option<Seq>)>,
    next_reader: u64,
}

/// What [`RecentRows::after`] found.
#[derive(Debug)]
pub(crate) struct RecentPage {
    /// Live rows after the cursor, in seq order.
    pub rows: Vec<(Seq, Arc<BufferedNotification>)>,
    /// Every committed row up to here is in `rows`, before the cursor, or removed: where the
    /// cursor moves to.
    pub through: Seq,
    /// The page stopped at the row limit; there may be more.
    pub full: bool,
}

impl RecentRows {
    /// A stream starts reading; rows committed from now on are kept.
    pub(crate) fn attach(&mut self) -> ReaderId {
        let id = ReaderId(self.next_reader);
        self.next_reader += 1;
        self.readers.push((id, None));
        id
    }

    /// A stream stopped; the last one out frees the rows.
    pub(crate) fn detach(&mut self, reader: ReaderId) {
        self.readers.retain(|(id, _)| *id != reader);
        if self.readers.is_empty() {
            self.clear();
        } else {
            self.trim();
        }
    }

    /// Forgets every row: the span covers nothing until the next commit.
    pub(crate) fn clear(&mut self) {
        self.after = None;
        self.rows.clear();
        self.bytes = 0;
    }

    /// A Send committed `row` at `seq`. Called in commit order.
    pub(crate) fn committed(&mut self, seq: Seq, row: Arc<BufferedNotification>) {
        if self.readers.is_empty() {
            return;
        }
        let follows = self
            .after
            .is_some_and(|after| self.next_seq(after) == seq.0);
        if !follows {
            self.clear();
            self.after = Some(Seq(seq.0 - 1));
        }
        self.bytes += size_of_row(&row);
        self.rows.push_back(Some(row));
        while self.rows.len() > MAX_ROWS || (self.bytes > MAX_BYTES && self.rows.len() > 1) {
            self.pop_oldest();
        }
    }

    /// The rows at `seqs` left `buffered` (announced under the same lock).
    pub(crate) fn removed(&mut self, seqs: &[Seq]) {
        let Some(after) = self.after else { return };
        for seq in seqs {
            let Some(index) = self.index_of(after, *seq) else {
                continue;
            };
            if let Some(row) = self.rows[index].take() {
                self.bytes -= size_of_row(&row);
            }
        }
    }

    /// Up to `max_rows` live rows after `cursor` for `reader`, which will not ask for them (nor
    /// for anything before them) again; `None` when the span does not start at or before the
    /// cursor, so the rows after it must be read from the table.
    pub(crate) fn after(
        &mut self,
        reader: ReaderId,
        cursor: Seq,
        max_rows: usize,
    ) -> Option<RecentPage> {
        let page = self.page(cursor, max_rows);
        let taken = page.as_ref().map_or(cursor, |page| page.through);
        if let Some((_, at)) = self.readers.iter_mut().find(|(id, _)| *id == reader) {
            *at = Some(taken);
        }
        self.trim();
        page
    }

    fn page(&self, cursor: Seq, max_rows: usize) -> Option<RecentPage> {
        let after = self.after?;
        if cursor < after {
            return None;
        }
        let mut page = RecentPage {
            rows: Vec::new(),
            through: cursor.max(Seq(self.next_seq(after) - 1)),
            full: false,
        };
        let skip = usize::try_from(cursor.0 - after.0).unwrap_or(usize::MAX);
        for (offset, row) in self.rows.iter().enumerate().skip(skip) {
            let seq = Seq(after.0 + 1 + offset as i64);
            if let Some(row) = row {
                page.rows.push((seq, Arc::clone(row)));
                if page.rows.len() == max_rows {
                    page.through = seq;
                    page.full = true;
                    break;
                }
            }
        }
        Some(page)
    }

    /// Drops the rows every reader has taken. A reader that has not taken a page yet holds
    /// nothing back: it reads the table until it reaches the span.
    fn trim(&mut self) {
        let Some(taken) = self.readers.iter().filter_map(|(_, at)| *at).min() else {
            return;
        };
        while self.after.is_some_and(|after| after < taken) && !self.rows.is_empty() {
            self.pop_oldest();
        }
    }

    /// Drops the first row of the span, which then starts one seq later.
    fn pop_oldest(&mut self) {
        if let Some(Some(oldest)) = self.rows.pop_front() {
            self.bytes -= size_of_row(&oldest);
        }
        self.after = self.after.map(|after| Seq(after.0 + 1));
    }

    /// The seq right after the span.
    fn next_seq(&self, after: Seq) -> i64 {
        after.0 + 1 + self.rows.len() as i64
    }

    fn index_of(&self, after: Seq, seq: Seq) -> Option<usize> {
        let index = usize::try_from(seq.0 - after.0 - 1).ok()?;
        (index < self.rows.len()).then_some(index)
    }
}

/// About what a row takes in memory and on the wire: its text plus a fixed part for the id,
/// times and the rest.
fn size_of_row(row: &BufferedNotification) -> usize {
    let c = &row.content;
    let p = &row.provenance;
    128 + c.list_name.as_str().len()
        + c.subject.as_str().len()
        + c.body.as_str().len()
        + c.type_data.as_str().len()
        + p.source_site_id.as_str().len()
        + p.source_instance_id.len()
        + p.source_script.len()
        + row.condition_key.as_ref().map_or(0, |k| k.as_str().len())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::buffer::tests::notification;

    fn row(subject: &str) -> Arc<BufferedNotification> {
        Arc::new(notification(subject))
    }

    fn seqs(page: &RecentPage) -> Vec<i64> {
        page.rows.iter().map(|(seq, _)| seq.0).collect()
    }

    /// Rows with one reader attached, and a second reader that only looks (it never takes a
    /// page, so it holds nothing back); `peek` asks as a third that takes nothing.
    struct Fixture {
        recent: RecentRows,
        reader: ReaderId,
    }

    impl Fixture {
        fn new() -> Self {
            let mut recent = RecentRows::default();
            let reader = recent.attach();
            Self { recent, reader }
        }

        fn commit(&mut self, seq: i64) {
            self.recent.committed(Seq(seq), row(&format!("row {seq}")));
        }

        fn take(&mut self, cursor: i64, max_rows: usize) -> Option<RecentPage> {
            self.recent.after(self.reader, Seq(cursor), max_rows)
        }

        /// What a reader at `cursor` would get, without moving this fixture's reader.
        fn peek(&self, cursor: i64, max_rows: usize) -> Option<RecentPage> {
            self.recent.page(Seq(cursor), max_rows)
        }
    }

    #[test]
    fn nothing_is_kept_or_covered_without_a_reader() {
        let mut recent = RecentRows::default();
        recent.committed(Seq(1), row("a"));
        assert!(recent.page(Seq::START, 10).is_none());
        assert!(recent.page(Seq(1), 10).is_none());
        assert!(recent.rows.is_empty());
    }

    #[test]
    fn a_span_starts_at_the_first_row_committed_after_attaching() {
        let mut f = Fixture::new();
        assert!(f.peek(4, 10).is_none(), "nothing covered yet");
        f.commit(5);
        f.commit(6);
        assert!(
            f.peek(3, 10).is_none(),
            "seq 4 is not covered: read the table"
        );
        let page = f.take(4, 10).unwrap();
        assert_eq!(seqs(&page), vec![5, 6]);
        assert_eq!((page.through, page.full), (Seq(6), false));
        let page = f.take(6, 10).unwrap();
        assert!(page.rows.is_empty());
        assert_eq!(page.through, Seq(6));
    }

    #[test]
    fn a_page_stops_at_the_row_limit() {
        let mut f = Fixture::new();
        for seq in 1..=5 {
            f.commit(seq);
        }
        let page = f.take(0, 2).unwrap();
        assert_eq!(seqs(&page), vec![1, 2]);
        assert_eq!((page.through, page.full), (Seq(2), true));
        let page = f.take(page.through.0, 10).unwrap();
        assert_eq!(seqs(&page), vec![3, 4, 5]);
        assert_eq!((page.through, page.full), (Seq(5), false));
    }

    #[test]
    fn removed_rows_are_skipped_but_the_cursor_passes_them() {
        let mut f = Fixture::new();
        for seq in 1..=4 {
            f.commit(seq);
        }
        f.recent.removed(&[Seq(2), Seq(4), Seq(99), Seq(-3)]);
        let page = f.take(0, 10).unwrap();
        assert_eq!(seqs(&page), vec![1, 3]);
        assert_eq!(page.through, Seq(4), "the removed last row is passed too");
    }

    #[test]
    fn a_gap_in_the_seqs_starts_a_new_span() {
        let mut f = Fixture::new();
        f.commit(1);
        f.commit(2);
        // Seqs 3 and 4 were handed out some other way (an adoption that did not clear).
        f.commit(5);
        assert!(f.peek(2, 10).is_none(), "3 and 4 are unknown");
        assert!(f.peek(0, 10).is_none());
        assert_eq!(seqs(&f.peek(4, 10).unwrap()), vec![5]);
    }

    #[test]
    fn clearing_covers_nothing_until_the_next_commit() {
        let mut f = Fixture::new();
        f.commit(1);
        f.recent.clear();
        assert!(f.peek(0, 10).is_none());
        assert!(f.peek(1, 10).is_none());
        // A commit that happens to follow the old span still starts afresh.
        f.commit(2);
        assert!(f.peek(0, 10).is_none());
        assert_eq!(seqs(&f.peek(1, 10).unwrap()), vec![2]);
    }

    #[test]
    fn taken_rows_leave_once_every_reader_has_them() {
        let mut f = Fixture::new();
        let slow = f.recent.attach();
        for seq in 1..=4 {
            f.commit(seq);
        }
        assert_eq!(seqs(&f.take(0, 3).unwrap()), vec![1, 2, 3]);
        assert!(f.peek(0, 10).is_none(), "seqs 1 to 3 left");
        assert_eq!(
            seqs(&f.peek(3, 10).unwrap()),
            vec![4],
            "a reader that never took a page holds nothing back"
        );
        // The slow one has read the table up to seq 1: it reads on from there, and from now
        // on holds back what it has not passed.
        assert!(f.recent.after(slow, Seq(1), 10).is_none());
        f.commit(5);
        assert_eq!(seqs(&f.take(3, 10).unwrap()), vec![4, 5]);
        assert_eq!(f.recent.rows.len(), 2, "kept for the slow reader");
        assert_eq!(
            seqs(&f.recent.after(slow, Seq(4), 10).unwrap()),
            vec![5],
            "it reached the span"
        );
        assert!(f.recent.rows.is_empty(), "both readers passed everything");
        f.commit(6);
        f.recent.detach(slow);
        assert_eq!(seqs(&f.take(5, 10).unwrap()), vec![6], "and on it goes");
        assert!(f.recent.rows.is_empty());
    }

    #[test]
    fn rows_nobody_takes_are_dropped_oldest_first() {
        let mut f = Fixture::new();
        let total = i64::try_from(MAX_ROWS).unwrap() + 3;
        for seq in 1..=total {
            f.commit(seq);
        }
        assert!(f.peek(2, 10).is_none(), "seq 3 was dropped");
        assert_eq!(seqs(&f.peek(3, 1).unwrap()), vec![4]);
        let page = f.take(3, MAX_ROWS + 1).unwrap();
        assert_eq!(page.rows.len(), MAX_ROWS);
        assert_eq!(page.through, Seq(total));
    }

    #[test]
    fn the_last_reader_out_frees_the_rows() {
        let mut f = Fixture::new();
        let other = f.recent.attach();
        f.commit(1);
        f.recent.detach(other);
        assert!(f.peek(0, 10).is_some(), "one reader is left");
        f.recent.detach(f.reader);
        assert!(f.peek(0, 10).is_none());
        assert!(f.recent.rows.is_empty());
        f.commit(2);
        assert!(f.recent.rows.is_empty(), "nobody reads: nothing is kept");
    }
}
