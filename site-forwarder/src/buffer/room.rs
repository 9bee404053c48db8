//! Keeping room to drain: whether the buffer takes another Send, so that the deletes of what
//! central acks always fit on the buffer's disk.
//!
//! Why: SQLite needs free space to delete. A delete writes the pages it changes to the WAL
//! before they reach the database file, so on a full disk the commit of a delete fails like any
//! other. A buffer that filled its disk with Sends while central was away could then never
//! delete what central acked on its return, resent the same rows forever and took no Sends
//! until someone freed disk by hand. So Sends, and only Sends, are refused before the disk is
//! full: a Send is admitted only if, once stored, the buffer's filesystem would still have
//! `min_free_disk_bytes` free (and, when `max_buffer_bytes` is set, the buffer would hold no
//! more than that). That reserve is what deletes, and the checkpoints that follow them, use.
//! Nothing is held back from the disk up front: the reserve is counted against the
//! filesystem's free space, so it also protects the buffer from a disk that other programs fill
//! (Sends stop early; deletes have the reserve).
//!
//! How free space is counted, cheaply enough to do on every Send (one `statvfs` and one `stat`,
//! under a lock held for that long):
//! - the filesystem's available bytes (`statvfs`, what an unprivileged writer may use);
//! - plus the free pages inside the buffer file, which SQLite fills before it grows the file:
//!   after a drain the file keeps its size but its pages are reusable, which is how Sends work
//!   again by themselves once central has drained the buffer;
//! - minus what committed rows will still take: pages committed to the WAL beyond the end of the
//!   database file are appended to it by the next checkpoint;
//! - minus twice each admitted Send not yet committed, and twice the Send being admitted: a row
//!   is written once to the WAL and once, at the checkpoint, to the database file.
//!
//! The page figures come from the writer (after each Send and each settle, in its transaction)
//! and from a read once per [`ROOM_CHECK_INTERVAL`], so a refusal also lifts when space frees
//! with no Send to notice it (rows drained, another program deleted files).
//!
//! While Sends are refused the WAL is checkpointed and truncated ([`Room::checkpoint`]) after
//! each settle and at each check. SQLite checkpoints on its own only once the WAL holds 1000
//! pages (4 MiB); until then every row ever written and every delete since stays in the WAL,
//! on disk. On a small disk that point may never come, and on any disk the WAL keeps its peak
//! size: truncating it gives the drained rows' space back, which is what lets Sends resume.
//!
//! Invariants:
//! - Only Sends are refused. Deletes, rejections, clears and replication are never refused here:
//!   they shrink the buffer or are tiny, and the reserve exists for them.
//! - While a delete of acked rows fails for lack of space, Sends are refused too
//!   ([`NoRoom::DeletesFailing`]): they would compete for the last pages and fail in the same
//!   commit anyway.
//! - [`Room::status`] says whether Sends are refused and why, as of the last check; health,
//!   `GetBufferStats` and `/metrics` all read it.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use rusqlite::Connection;
use tokio::sync::watch;

/// How long a checkpoint waits for readers and the writer before it does what it can. Short:
/// it is tried again at the next check, and the writer waits on it meanwhile.
const CHECKPOINT_WAIT: Duration = Duration::from_millis(200);

/// How often the room is checked without a Send asking: a refusal lifts within this long after
/// space frees, and health follows. Two system calls and a small read each time.
pub(crate) const ROOM_CHECK_INTERVAL: Duration = Duration::from_secs(1);

/// The size a Send is assumed to have when the room is checked without one (for health and
/// stats): one page. A buffer that cannot take even that cannot take any Send.
const NOMINAL_ROW_BYTES: u64 = 4096;

/// Bytes a row takes beyond its text fields: its seq, times and priority, the id twice (the row
/// and the unique index on it), and the cell headers. Generous on purpose: the estimate only
/// needs to err on the side of refusing early.
const ROW_OVERHEAD_BYTES: u64 = 256;

/// How much of its disk the buffer may fill with Sends (config: `min_free_disk_bytes`,
/// `max_buffer_bytes`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpaceLimits {
    /// Bytes the buffer's filesystem must keep free after a Send is stored: the room deletes
    /// and checkpoints need.
    pub min_free_disk_bytes: u64,
    /// Most live data the buffer file may hold (its pages in use); `None`: bounded by the disk.
    pub max_buffer_bytes: Option<u64>,
}

impl SpaceLimits {
    /// No limit of its own: Sends are refused only when the disk could not hold them at all.
    pub const NONE: Self = Self {
        min_free_disk_bytes: 0,
        max_buffer_bytes: None,
    };
}

/// Why the buffer takes no Send now. The message names the setting and its limit.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NoRoom {
    #[error(
        "min_free_disk_bytes: the buffer's filesystem ({dir}) would have {left} bytes free, \
         the limit keeps at least {limit} bytes free to delete what central acks"
    )]
    DiskLow { dir: String, left: u64, limit: u64 },
    #[error("max_buffer_bytes: the buffer would hold {would_hold} bytes, the limit is {limit}")]
    BufferFull { would_hold: u64, limit: u64 },
    #[error(
        "the buffer's disk is full: deleting the rows central acked failed ({detail}); Sends \
         wait until those deletes succeed"
    )]
    DeletesFailing { detail: String },
}

impl NoRoom {
    /// A short, stable name for the reason (logs, a metric label).
    pub fn kind(&self) -> &'static str {
        match self {
            Self::DiskLow { .. } => "min_free_disk_bytes",
            Self::BufferFull { .. } => "max_buffer_bytes",
            Self::DeletesFailing { .. } => "deletes_failing",
        }
    }
}

/// Whether the buffer takes Sends, as of the last check, with the figures behind it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct RoomStatus {
    /// Set while Sends are refused: why.
    pub refusing: Option<NoRoom>,
    /// Bytes available to the buffer on its filesystem (`statvfs`); `None` if it cannot be read.
    pub disk_available_bytes: Option<u64>,
    /// Live data in the buffer file: its pages in use.
    pub buffer_bytes: u64,
}

/// The buffer file's pages, as SQLite counts them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Pages {
    pub page_size: u64,
    pub page_count: u64,
    pub freelist: u64,
}

impl Pages {
    /// Reads the figures on `conn` (the writer, inside its transaction, or a reader). Page 1's
    /// header, which SQLite keeps in memory: cheap.
    pub(crate) fn read(conn: &Connection) -> rusqlite::Result<Self> {
        let pragma = |name: &str| -> rusqlite::Result<u64> {
            let value: i64 = conn
                .prepare_cached(&format!("PRAGMA {name}"))?
                .query_row([], |r| r.get(0))?;
            Ok(u64::try_from(value).unwrap_or(0))
        };
        Ok(Self {
            page_size: pragma("page_size")?,
            page_count: pragma("page_count")?,
            freelist: pragma("freelist_count")?,
        })
    }

    /// Bytes in pages that hold data.
    fn used_bytes(&self) -> u64 {
        self.page_count
            .saturating_sub(self.freelist)
            .saturating_mul(self.page_size)
    }
}

/// What the disk and the file look like at one moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Disk {
    /// The filesystem's bytes available to this process.
    pub available: u64,
    /// The database file's length (not its WAL).
    pub db_file_len: u64,
}

/// The decision, as a plain function of the figures (so it is tested with numbers).
/// `in_flight`: row bytes of admitted Sends not committed yet; `row`: the Send's own.
pub(crate) fn assess(
    limits: &SpaceLimits,
    dir: &Path,
    disk: Option<Disk>,
    pages: Pages,
    in_flight: u64,
    row: u64,
) -> Result<(), NoRoom> {
    if let Some(limit) = limits.max_buffer_bytes {
        let would_hold = pages
            .used_bytes()
            .saturating_add(in_flight)
            .saturating_add(row);
        if would_hold > limit {
            return Err(NoRoom::BufferFull { would_hold, limit });
        }
    }
    if let Some(disk) = disk {
        // Signed and wide: the terms below may well exceed what is free.
        let logical = i128::from(pages.page_count) * i128::from(pages.page_size);
        let pending_growth = (logical - i128::from(disk.db_file_len)).max(0);
        let reusable = i128::from(pages.freelist) * i128::from(pages.page_size);
        let written_twice = 2 * (i128::from(in_flight) + i128::from(row));
        let left = i128::from(disk.available) + reusable - pending_growth - written_twice;
        if left < i128::from(limits.min_free_disk_bytes) {
            return Err(NoRoom::DiskLow {
                dir: dir.display().to_string(),
                left: u64::try_from(left.max(0)).unwrap_or(u64::MAX),
                limit: limits.min_free_disk_bytes,
            });
        }
    }
    Ok(())
}

/// The bytes a row is counted as: its text fields plus [`ROW_OVERHEAD_BYTES`].
pub(crate) fn row_bytes(text_fields: &[&str]) -> u64 {
    text_fields
        .iter()
        .map(|field| u64::try_from(field.len()).unwrap_or(u64::MAX))
        .fold(ROW_OVERHEAD_BYTES, u64::saturating_add)
}

/// The buffer's admission state. One per buffer, shared by its clones.
#[derive(Debug)]
pub(crate) struct Room {
    limits: SpaceLimits,
    db_path: PathBuf,
    /// Where `statvfs` looks: the directory holding the file (the file itself may not exist
    /// yet in a test that removes it; the directory always does once the buffer is open).
    dir: PathBuf,
    ledger: Mutex<Ledger>,
    status: watch::Sender<RoomStatus>,
}

#[derive(Debug, Default)]
struct Ledger {
    pages: Pages,
    /// Row bytes of Sends admitted and not yet answered.
    in_flight: u64,
    /// Set while a delete of acked rows fails for lack of space (its error).
    deletes_failing: Option<String>,
    /// Whether an unreadable `statvfs` was already logged (once is enough).
    statvfs_error_logged: bool,
}

/// A Send's place in [`Room`]'s in-flight count, given back when dropped (after its commit was
/// answered, or when the caller went away).
#[derive(Debug)]
pub(crate) struct Admitted {
    room: Arc<Room>,
    bytes: u64,
}

impl Drop for Admitted {
    fn drop(&mut self) {
        let mut ledger = self.room.ledger();
        ledger.in_flight = ledger.in_flight.saturating_sub(self.bytes);
    }
}

impl Room {
    pub(crate) fn new(db_path: &Path, limits: SpaceLimits, pages: Pages) -> Arc<Self> {
        let dir = match db_path.parent() {
            Some(dir) if !dir.as_os_str().is_empty() => dir.to_path_buf(),
            _ => PathBuf::from("."),
        };
        let room = Arc::new(Self {
            limits,
            db_path: db_path.to_path_buf(),
            dir,
            ledger: Mutex::new(Ledger {
                pages,
                ..Ledger::default()
            }),
            status: watch::Sender::new(RoomStatus::default()),
        });
        room.reassess();
        room
    }

    fn ledger(&self) -> MutexGuard<'_, Ledger> {
        // The ledger is plain numbers, consistent after every statement: a panic elsewhere
        // while it was held leaves nothing half-done.
        self.ledger.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Admits a Send of `row` bytes (see [`row_bytes`]), or says why not.
    pub(crate) fn admit(self: &Arc<Self>, row: u64) -> Result<Admitted, NoRoom> {
        let mut ledger = self.ledger();
        let disk = self.measure(&mut ledger);
        let decision = match &ledger.deletes_failing {
            Some(detail) => Err(NoRoom::DeletesFailing {
                detail: detail.clone(),
            }),
            None => assess(
                &self.limits,
                &self.dir,
                disk,
                ledger.pages,
                ledger.in_flight,
                row,
            ),
        };
        // A refused Send of a large row says nothing about smaller ones: the published status
        // is always the nominal one, so health does not flap with the size of what is sent.
        let nominal = if decision.is_ok() {
            Ok(())
        } else {
            self.nominal(&ledger, disk)
        };
        self.publish(&ledger, disk, nominal);
        decision?;
        ledger.in_flight = ledger.in_flight.saturating_add(row);
        Ok(Admitted {
            room: Arc::clone(self),
            bytes: row,
        })
    }

    /// Checks again with no Send asking, and publishes the outcome.
    pub(crate) fn reassess(&self) {
        let mut ledger = self.ledger();
        let disk = self.measure(&mut ledger);
        let nominal = self.nominal(&ledger, disk);
        self.publish(&ledger, disk, nominal);
    }

    /// New page figures from a write or a read.
    pub(crate) fn pages(&self, pages: Pages) {
        self.ledger().pages = pages;
    }

    /// A delete of acked rows failed for lack of space: Sends are refused until one succeeds.
    pub(crate) fn deletes_failing(&self, detail: String) {
        let mut ledger = self.ledger();
        ledger.deletes_failing = Some(detail);
        let disk = self.measure(&mut ledger);
        let nominal = self.nominal(&ledger, disk);
        self.publish(&ledger, disk, nominal);
    }

    /// A settle committed: deletes fit again.
    pub(crate) fn deletes_succeeded(&self) {
        let was_failing = self.ledger().deletes_failing.take().is_some();
        if was_failing {
            self.reassess();
        }
    }

    /// Copies the WAL into the database file and truncates it to nothing, giving its space
    /// back to the filesystem; whatever a reader still needs stays (the WAL is then truncated
    /// at a later call). Blocking: a short write on a connection of its own, since the
    /// writer's is always inside a transaction.
    pub(crate) fn checkpoint(&self) -> rusqlite::Result<()> {
        let conn = Connection::open_with_flags(
            &self.db_path,
            rusqlite::OpenFlags::SQLITE_OPEN_READ_WRITE | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )?;
        conn.busy_timeout(CHECKPOINT_WAIT)?;
        // (busy, WAL frames, frames checkpointed): busy only means "not all of it this time".
        let (busy, frames, done): (i64, i64, i64) =
            conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |r| {
                Ok((r.get(0)?, r.get(1)?, r.get(2)?))
            })?;
        tracing::debug!(
            busy,
            frames,
            done,
            "site buffer WAL checkpointed to make room"
        );
        Ok(())
    }

    /// Whether Sends are refused as of the last check.
    pub(crate) fn refusing(&self) -> bool {
        self.status.borrow().refusing.is_some()
    }

    /// The status as of the last check.
    pub(crate) fn status(&self) -> RoomStatus {
        self.status.borrow().clone()
    }

    /// Changes of [`Self::status`]'s `refusing` (not of its figures).
    pub(crate) fn watch(&self) -> watch::Receiver<RoomStatus> {
        self.status.subscribe()
    }

    fn nominal(&self, ledger: &Ledger, disk: Option<Disk>) -> Result<(), NoRoom> {
        if let Some(detail) = &ledger.deletes_failing {
            return Err(NoRoom::DeletesFailing {
                detail: detail.clone(),
            });
        }
        assess(
            &self.limits,
            &self.dir,
            disk,
            ledger.pages,
            ledger.in_flight,
            NOMINAL_ROW_BYTES,
        )
    }

    fn publish(&self, ledger: &Ledger, disk: Option<Disk>, decision: Result<(), NoRoom>) {
        let refusing = decision.err();
        let buffer_bytes = ledger.pages.used_bytes();
        self.status.send_if_modified(|status| {
            let changed = status.refusing != refusing;
            if changed {
                match &refusing {
                    Some(why) => tracing::warn!(
                        reason = %why, "the site buffer refuses Sends to keep room for draining"
                    ),
                    None => tracing::info!("the site buffer takes Sends again"),
                }
            }
            *status = RoomStatus {
                refusing,
                disk_available_bytes: disk.map(|d| d.available),
                buffer_bytes,
            };
            // Watchers (health) care about the decision only; the figures are read on demand.
            changed
        });
    }

    /// The disk now. `None` when `statvfs` fails: the disk rule is then skipped (logged once)
    /// rather than refusing every Send for a reason that is not a full disk.
    fn measure(&self, ledger: &mut Ledger) -> Option<Disk> {
        let fs = match rustix::fs::statvfs(&self.dir) {
            Ok(fs) => fs,
            Err(error) => {
                if !ledger.statvfs_error_logged {
                    ledger.statvfs_error_logged = true;
                    tracing::warn!(
                        dir = %self.dir.display(), %error,
                        "cannot read the free space of the buffer's filesystem; \
                         min_free_disk_bytes is not enforced until it can be read"
                    );
                }
                return None;
            }
        };
        // A file not there yet (or gone) has no length to count: every page is still to write.
        let db_file_len = std::fs::metadata(&self.db_path).map_or(0, |m| m.len());
        Some(Disk {
            available: fs.f_bavail.saturating_mul(fs.f_frsize),
            db_file_len,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn pages(count: u64, free: u64) -> Pages {
        Pages {
            page_size: 4096,
            page_count: count,
            freelist: free,
        }
    }

    fn limits(min_free: u64, max: Option<u64>) -> SpaceLimits {
        SpaceLimits {
            min_free_disk_bytes: min_free,
            max_buffer_bytes: max,
        }
    }

    fn disk(available: u64, db_file_len: u64) -> Option<Disk> {
        Some(Disk {
            available,
            db_file_len,
        })
    }

    #[test]
    fn a_send_that_would_eat_into_the_reserve_is_refused_naming_the_setting() {
        let dir = Path::new("/var/outbox");
        let l = limits(2 * MIB, None);
        // 3 MiB free, nothing pending: a 256 KiB row costs 512 KiB (WAL and file), fits.
        assert_eq!(
            assess(&l, dir, disk(3 * MIB, 0), pages(0, 0), 0, 256 * 1024),
            Ok(())
        );
        // With 768 KiB of admitted rows in flight (1.5 MiB on disk) it no longer does.
        let err = assess(
            &l,
            dir,
            disk(3 * MIB, 0),
            pages(0, 0),
            768 * 1024,
            256 * 1024,
        )
        .unwrap_err();
        assert_eq!(
            err,
            NoRoom::DiskLow {
                dir: "/var/outbox".into(),
                left: MIB,
                limit: 2 * MIB
            }
        );
        assert_eq!(
            err.to_string(),
            "min_free_disk_bytes: the buffer's filesystem (/var/outbox) would have 1048576 \
             bytes free, the limit keeps at least 2097152 bytes free to delete what central acks"
        );
    }

    #[test]
    fn free_pages_in_the_file_count_as_room_and_pending_growth_does_not() {
        let dir = Path::new("d");
        let l = limits(2 * MIB, None);
        // The disk itself is below the reserve, but 1024 free pages (4 MiB) inside the file
        // take the next rows: the state after a drain.
        assert_eq!(
            assess(&l, dir, disk(MIB, 8 * MIB), pages(2048, 1024), 0, 4096),
            Ok(())
        );
        // Committed pages past the end of the file (in the WAL) still need the disk.
        assert!(matches!(
            assess(&l, dir, disk(3 * MIB, 0), pages(512, 0), 0, 4096),
            Err(NoRoom::DiskLow { .. })
        ));
        assert_eq!(
            assess(&l, dir, disk(3 * MIB, 2 * MIB), pages(512, 0), 0, 4096),
            Ok(())
        );
    }

    #[test]
    fn max_buffer_bytes_caps_the_live_data_only() {
        let dir = Path::new("d");
        let l = limits(0, Some(4 * MIB));
        // 1024 pages, 512 of them free: 2 MiB live.
        assert_eq!(
            assess(&l, dir, None, pages(1024, 512), MIB, MIB),
            Ok(()),
            "exactly at the limit"
        );
        assert_eq!(
            assess(&l, dir, None, pages(1024, 512), MIB, MIB + 1)
                .unwrap_err()
                .to_string(),
            "max_buffer_bytes: the buffer would hold 4194305 bytes, the limit is 4194304"
        );
    }

    #[test]
    fn without_limits_only_a_disk_that_cannot_hold_the_row_refuses() {
        let dir = Path::new("d");
        assert_eq!(
            assess(&SpaceLimits::NONE, dir, disk(MIB, 0), pages(0, 0), 0, 1000),
            Ok(())
        );
        assert!(
            assess(&SpaceLimits::NONE, dir, disk(MIB, 0), pages(0, 0), 0, MIB).is_err(),
            "a row written twice needs twice its size"
        );
        assert_eq!(
            assess(&SpaceLimits::NONE, dir, None, pages(0, 0), 0, u64::MAX),
            Ok(()),
            "an unreadable disk is not a full one"
        );
    }

    /// A notification whose body is `kib` KiB, for filling a buffer.
    fn large(kib: usize) -> crate::domain::BufferedNotification {
        use crate::domain::Body;
        crate::domain::BufferedNotification {
            content: crate::domain::NotificationContent {
                body: Body::parse("x".repeat(kib * 1024)).unwrap(),
                ..crate::buffer::tests::notification("fill").content
            },
            ..crate::buffer::tests::notification("fill")
        }
    }

    /// Enqueues `kib` KiB rows until one is refused; the seqs stored and the refusal.
    async fn fill(buffer: &crate::buffer::Buffer, kib: usize) -> (Vec<crate::domain::Seq>, NoRoom) {
        let mut seqs = Vec::new();
        for _ in 0..10_000 {
            match buffer.intake().enqueue(large(kib)).await {
                Ok(seq) => seqs.push(seq),
                Err(crate::buffer::BufferError::NoRoom(why)) => return (seqs, why),
                Err(other) => panic!("after {} rows: not a refusal: {other}", seqs.len()),
            }
        }
        panic!("10000 rows and no refusal");
    }

    #[tokio::test]
    async fn max_buffer_bytes_refuses_sends_until_acked_rows_are_deleted() {
        let dir = tempfile::tempdir().unwrap();
        let limits = limits(0, Some(MIB));
        let path = dir.path().join("buffer.db");
        let buffer = crate::buffer::Buffer::open_with(
            &path,
            limits,
            tokio_util::sync::CancellationToken::new(),
        )
        .unwrap();
        assert_eq!(buffer.status().room_status().refusing, None);

        let (seqs, why) = fill(&buffer, 16).await;
        assert!(
            matches!(why, NoRoom::BufferFull { limit, .. } if limit == MIB),
            "{why}"
        );
        assert!(why.to_string().starts_with("max_buffer_bytes: "), "{why}");
        assert!(
            seqs.len() > 10,
            "a 1 MiB buffer holds dozens of 16 KiB rows"
        );
        let depth = buffer.status().stats().await.unwrap().depth;
        assert_eq!(depth, seqs.len() as u64, "the refused Send stored nothing");
        // Checked against an estimate of each row: past the limit by a few pages at most.
        assert!(buffer.status().room_status().buffer_bytes < MIB + MIB / 16);

        // Central acks everything: the deletes go through and Sends are taken again, with no
        // other step; the file keeps its size, its free pages take the new rows.
        assert_eq!(
            buffer.forwarding().remove(seqs.clone()).await.unwrap(),
            seqs.len()
        );
        assert_eq!(buffer.status().room_status().refusing, None);
        let (again, _) = fill(&buffer, 16).await;
        assert!(
            again.len() + 2 >= seqs.len(),
            "the freed room holds as much again ({} then {})",
            seqs.len(),
            again.len()
        );
        drop(buffer);

        // The rows stored survive a restart, and the limit applies from the start.
        let reopened = crate::buffer::Buffer::open_with(
            &path,
            limits,
            tokio_util::sync::CancellationToken::new(),
        )
        .unwrap();
        assert_eq!(
            reopened.status().stats().await.unwrap().depth,
            again.len() as u64
        );
        assert!(matches!(
            reopened.intake().enqueue(large(16)).await,
            Err(crate::buffer::BufferError::NoRoom(
                NoRoom::BufferFull { .. }
            ))
        ));
    }

    /// A tmpfs mounted on a temporary directory for the test's lifetime, unmounted (lazily, so
    /// a writer thread still closing its file cannot stop it) when dropped, failure included.
    struct Tmpfs {
        dir: tempfile::TempDir,
    }

    impl Tmpfs {
        /// `None`, with the reason printed, when this process may not mount (not root, no
        /// `mount`, a container without the capability).
        fn mount(size: &str) -> Option<Self> {
            let dir = tempfile::tempdir().unwrap();
            let mounted = std::process::Command::new("mount")
                .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
                .arg(dir.path())
                .output();
            match mounted {
                Ok(out) if out.status.success() => Some(Self { dir }),
                Ok(out) => {
                    eprintln!(
                        "SKIPPED: cannot mount a {size} tmpfs (needs root): {}",
                        String::from_utf8_lossy(&out.stderr).trim()
                    );
                    None
                }
                Err(e) => {
                    eprintln!("SKIPPED: cannot run mount for a {size} tmpfs: {e}");
                    None
                }
            }
        }
    }

    impl Drop for Tmpfs {
        fn drop(&mut self) {
            let _ = std::process::Command::new("umount")
                .arg("-l")
                .arg(self.dir.path())
                .status();
        }
    }

    /// The whole cycle on a real, small filesystem: Sends are refused before the disk is full,
    /// every delete of the stored rows still commits, and Sends are taken again afterwards.
    #[tokio::test]
    async fn a_small_disk_refuses_sends_in_time_to_delete_and_then_takes_them_again() {
        let Some(tmpfs) = Tmpfs::mount("4m") else {
            return;
        };
        let limits = limits(MIB, None);
        let buffer = crate::buffer::Buffer::open_with(
            &tmpfs.dir.path().join("buffer.db"),
            limits,
            tokio_util::sync::CancellationToken::new(),
        )
        .unwrap();
        for round in 0..2 {
            let (seqs, why) = fill(&buffer, 32).await;
            assert!(
                matches!(&why, NoRoom::DiskLow { limit, .. } if *limit == MIB),
                "round {round}: {why}"
            );
            assert!(why.to_string().starts_with("min_free_disk_bytes: "));
            assert!(!seqs.is_empty(), "round {round}");
            // Smaller rows still fit for a while; once those are refused too, so is a page,
            // and the status says so.
            let (small, _) = fill(&buffer, 2).await;
            let status = buffer.status().room_status();
            assert!(
                matches!(status.refusing, Some(NoRoom::DiskLow { .. })),
                "{status:?}"
            );
            assert!(status.disk_available_bytes.is_some());
            let seqs: Vec<_> = seqs.into_iter().chain(small).collect();

            // One settle per row, as acks trickle in: each must commit.
            for seq in &seqs {
                assert_eq!(
                    buffer.forwarding().remove(vec![*seq]).await.unwrap(),
                    1,
                    "round {round}"
                );
            }
            assert_eq!(buffer.status().stats().await.unwrap().depth, 0);
            assert_eq!(
                buffer.status().room_status().refusing,
                None,
                "round {round}"
            );
        }
        drop(buffer);
    }

    #[test]
    fn row_bytes_counts_the_text_and_the_overhead() {
        assert_eq!(row_bytes(&[]), ROW_OVERHEAD_BYTES);
        assert_eq!(row_bytes(&["abc", "de"]), ROW_OVERHEAD_BYTES + 5);
    }
}
