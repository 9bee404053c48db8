//! Flood consolidation, opt-in per notification list: when more than `threshold` notifications
//! for a list arrive within one window of `window`, the ones over the threshold are held and go
//! out together when the window ends, as digests of at most `max_per_digest` (one mail, or one
//! webhook call, each). Critical notifications are never held.
//!
//! Windows are aligned to the Unix epoch (a 1-minute window runs from hh:mm:00 to hh:mm+1:00),
//! so every replica agrees on them without talking to the others, and all the rows held in one
//! window of a list are due at the same instant and go out together. Every consolidated
//! notification keeps its own row: it reaches Delivered (or is retried or parked) on its own,
//! with an attempt row that names the digest it went out in.

use std::time::Duration;

use chrono::{DateTime, Utc};

use super::{Body, ContentError, NotificationId, Priority, Subject};

/// Limits of the settings, with why.
pub mod limits {
    use std::time::Duration;

    /// A threshold this high is no consolidation at all.
    pub const MAX_THRESHOLD: u32 = 100_000;
    /// Shorter windows would make a digest of a handful of rows; longer ones hold alarms for
    /// more than a shift.
    pub const MIN_WINDOW: Duration = Duration::from_secs(1);
    pub const MAX_WINDOW: Duration = Duration::from_secs(12 * 3600);
    /// A digest lists each notification on a line of at most [`super::MAX_LINE_CHARS`]
    /// characters, so 500 of them stay far below the body limit (256 KiB).
    pub const MAX_PER_DIGEST: u32 = 500;
}

/// How long after its window's end a held notification is due. A row is counted into the
/// window of its submit's instant, but commits a little later, and on a server with concurrent
/// writers (MS SQL) a digest claimed the moment the window ends could miss a row of that window
/// still being committed, which would then go out alone in a second digest. Two seconds cover a
/// commit even on a loaded server; against windows of a minute or more they are nothing. (MS
/// SQL's submit procedure writes the same two seconds: migration 0007.)
pub const SETTLE: Duration = Duration::from_secs(2);

/// Longest subject quoted on a digest line, in characters; the rest is cut with an ellipsis.
const MAX_LINE_CHARS: usize = 200;
/// Longest subject quoted on a digest line, in bytes (UTF-8), ellipsis included: 200
/// characters of a 4-byte script (emoji) would be 800 bytes a line, and 500 such lines more
/// than the body limit. With it every digest fits; see [`MAX_DIGEST_BODY_BYTES`].
const MAX_LINE_SUBJECT_BYTES: usize = 360;
/// Most bytes a line takes besides its subject: a timestamp (29 bytes even for a 6-digit
/// year), a site id (ASCII, at most 64), a notification id in brackets (38), two-space gaps
/// and the newline.
const MAX_LINE_OVERHEAD_BYTES: usize =
    29 + 2 + outbox_domain::limits::MAX_SITE_ID_CHARS + 2 + 2 + 38 + 1;
/// Most bytes of a digest's opening sentence: a count, the list name (at most 128 characters
/// of up to 4 bytes) and the fixed words.
const MAX_HEADER_BYTES: usize = 20 + 4 * outbox_domain::limits::MAX_LIST_NAME_CHARS + 100;
/// The largest digest body: within the body limit by construction (checked at compile time),
/// so composing a digest never fails for its size, whatever its rows' subjects hold.
pub const MAX_DIGEST_BODY_BYTES: usize = MAX_HEADER_BYTES
    + limits::MAX_PER_DIGEST as usize * (MAX_LINE_OVERHEAD_BYTES + MAX_LINE_SUBJECT_BYTES);
const _: () = assert!(MAX_DIGEST_BODY_BYTES <= outbox_domain::limits::MAX_BODY_BYTES);

/// A list's consolidation settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Consolidation {
    threshold: u32,
    window: Duration,
    max_per_digest: u32,
}

impl Consolidation {
    /// Checks the settings; errors name the field (`consolidation.threshold`, ...).
    pub fn parse(
        threshold: u32,
        window: Duration,
        max_per_digest: u32,
    ) -> Result<Self, ContentError> {
        if threshold == 0 || threshold > limits::MAX_THRESHOLD {
            return Err(ContentError::new(
                "consolidation.threshold",
                format!("must be between 1 and {}", limits::MAX_THRESHOLD),
            ));
        }
        if window < limits::MIN_WINDOW || window > limits::MAX_WINDOW {
            return Err(ContentError::new(
                "consolidation.window",
                format!(
                    "must be between {}s and {}s",
                    limits::MIN_WINDOW.as_secs(),
                    limits::MAX_WINDOW.as_secs()
                ),
            ));
        }
        if window.subsec_nanos() != 0 {
            return Err(ContentError::new(
                "consolidation.window",
                "must be a whole number of seconds",
            ));
        }
        if !(2..=limits::MAX_PER_DIGEST).contains(&max_per_digest) {
            return Err(ContentError::new(
                "consolidation.max_per_digest",
                format!("must be between 2 and {}", limits::MAX_PER_DIGEST),
            ));
        }
        Ok(Self {
            threshold,
            window,
            max_per_digest,
        })
    }

    pub fn threshold(&self) -> u32 {
        self.threshold
    }

    pub fn window(&self) -> Duration {
        self.window
    }

    pub fn max_per_digest(&self) -> u32 {
        self.max_per_digest
    }

    /// The window `at` falls in: its start (inclusive) and end (exclusive), aligned to the
    /// Unix epoch.
    pub fn window_of(&self, at: DateTime<Utc>) -> (DateTime<Utc>, DateTime<Utc>) {
        let window_ms = i64::try_from(self.window.as_millis()).unwrap_or(i64::MAX);
        let at_ms = at.timestamp_millis();
        let start_ms = at_ms - at_ms.rem_euclid(window_ms);
        let start = DateTime::from_timestamp_millis(start_ms).unwrap_or(at);
        let end = DateTime::from_timestamp_millis(start_ms.saturating_add(window_ms)).unwrap_or(at);
        (start, end)
    }

    /// When a notification held at `at` is due: [`SETTLE`] after the end of its window.
    pub fn held_until(&self, at: DateTime<Utc>) -> DateTime<Utc> {
        let (_, end) = self.window_of(at);
        end + chrono::Duration::from_std(SETTLE).unwrap_or_default()
    }

    /// Whether a notification of `priority` is held, being the `arrived`th (counting from 1)
    /// of its list in this window.
    pub fn holds(&self, priority: Priority, arrived: u64) -> bool {
        priority != Priority::Critical && arrived > u64::from(self.threshold)
    }
}

/// One notification as a digest lists it.
#[derive(Debug, Clone)]
pub struct DigestLine<'a> {
    pub enqueued_at: DateTime<Utc>,
    pub site: &'a str,
    pub subject: &'a str,
    pub id: NotificationId,
}

/// What one digest says: a subject with how many and from which sites, and a body with one line
/// per notification (time at the site, site, subject, id), oldest first. Within the content
/// limits by construction (a count, a list name and at most five site ids in the subject; at
/// most [`limits::MAX_PER_DIGEST`] lines of bounded length in the body), so an error here is a
/// bug, reported rather than panicked on.
pub fn digest_text(
    list_name: &str,
    mut lines: Vec<DigestLine<'_>>,
) -> Result<(Subject, Body), ContentError> {
    let mut sites: Vec<&str> = lines.iter().map(|l| l.site).collect();
    sites.sort_unstable();
    sites.dedup();
    let count = lines.len();
    // Up to five sites by name, fewer where a long list name and long site ids would pass the
    // subject limit: the count and the list name always fit.
    let subject = (0..=sites.len().min(5))
        .rev()
        .map(|named| {
            let shown = sites[..named].join(", ");
            let from = match (named, sites.len() - named) {
                (0, n) => format!("{n} sites"),
                (_, 0) => shown,
                (_, more) => format!("{shown} and {more} more"),
            };
            format!("{count} notifications for {list_name} from {from}")
        })
        .find(|s| s.chars().count() <= outbox_domain::limits::MAX_SUBJECT_CHARS)
        .unwrap_or_else(|| format!("{count} notifications"));
    lines.sort_by_key(|l| (l.enqueued_at, l.id));
    let mut body = format!(
        "{count} notifications for {list_name} arrived faster than the list's flood threshold \
         and are sent together:\n\n"
    );
    for line in lines {
        let quoted = quote(line.subject);
        body.push_str(&format!(
            "{}  {}  {}  ({})\n",
            line.enqueued_at.format("%Y-%m-%d %H:%M:%S%.3fZ"),
            line.site,
            quoted,
            line.id
        ));
    }
    Ok((Subject::parse(subject)?, Body::parse(body)?))
}

/// A subject as a digest line quotes it: whole if it is at most [`MAX_LINE_CHARS`] characters
/// and [`MAX_LINE_SUBJECT_BYTES`] bytes, else cut at a character boundary and ended with an
/// ellipsis, within both.
fn quote(subject: &str) -> std::borrow::Cow<'_, str> {
    if subject.len() <= MAX_LINE_SUBJECT_BYTES && subject.chars().count() <= MAX_LINE_CHARS {
        return subject.into();
    }
    let room = MAX_LINE_SUBJECT_BYTES - '\u{2026}'.len_utf8();
    let mut cut = String::new();
    for c in subject.chars().take(MAX_LINE_CHARS - 1) {
        if cut.len() + c.len_utf8() > room {
            break;
        }
        cut.push(c);
    }
    cut.push('\u{2026}');
    cut.into()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(text: &str) -> DateTime<Utc> {
        text.parse().unwrap()
    }

    #[test]
    fn settings_are_checked_by_name() {
        let minute = Duration::from_secs(60);
        assert!(Consolidation::parse(10, minute, 100).is_ok());
        for (threshold, window, max, field) in [
            (0, minute, 100, "consolidation.threshold"),
            (10, Duration::ZERO, 100, "consolidation.window"),
            (10, Duration::from_millis(1500), 100, "consolidation.window"),
            (
                10,
                Duration::from_secs(13 * 3600),
                100,
                "consolidation.window",
            ),
            (10, minute, 1, "consolidation.max_per_digest"),
            (10, minute, 501, "consolidation.max_per_digest"),
        ] {
            let err = Consolidation::parse(threshold, window, max).unwrap_err();
            assert_eq!(err.field, field, "{threshold} {window:?} {max}");
        }
    }

    #[test]
    fn windows_are_aligned_and_only_rows_over_the_threshold_are_held() {
        let c = Consolidation::parse(3, Duration::from_secs(60), 100).unwrap();
        let (start, end) = c.window_of(at("2026-11-24T10:15:42.500Z"));
        assert_eq!(start, at("2026-11-24T10:15:00Z"));
        assert_eq!(end, at("2026-11-24T10:16:00Z"));
        assert_eq!(c.window_of(end).0, end, "the end starts the next window");
        assert_eq!(
            c.held_until(at("2026-11-24T10:15:42.500Z")),
            at("2026-11-24T10:16:02Z"),
            "due two seconds after the window ends"
        );
        assert!(!c.holds(Priority::Normal, 3));
        assert!(c.holds(Priority::Normal, 4));
        assert!(c.holds(Priority::Low, 400));
        assert!(!c.holds(Priority::Critical, 400), "critical is never held");
    }

    #[test]
    fn a_digest_says_how_many_from_which_sites_and_lists_each() {
        let ids: Vec<NotificationId> = (0..3).map(|_| NotificationId::generate()).collect();
        let long = "x".repeat(300);
        let lines = vec![
            DigestLine {
                enqueued_at: at("2026-11-24T10:15:02Z"),
                site: "site-b",
                subject: "Pump 7 tripped",
                id: ids[1],
            },
            DigestLine {
                enqueued_at: at("2026-11-24T10:15:01Z"),
                site: "site-a",
                subject: "Tank 4 high level",
                id: ids[0],
            },
            DigestLine {
                enqueued_at: at("2026-11-24T10:15:03Z"),
                site: "site-a",
                subject: &long,
                id: ids[2],
            },
        ];
        let (subject, body) = digest_text("operators", lines).unwrap();
        assert_eq!(
            subject.as_str(),
            "3 notifications for operators from site-a, site-b"
        );
        let listed: Vec<&str> = body.as_str().lines().skip(2).collect();
        assert_eq!(
            listed[0],
            format!(
                "2026-11-24 10:15:01.000Z  site-a  Tank 4 high level  ({})",
                ids[0]
            )
        );
        assert!(listed[1].contains("Pump 7 tripped"));
        assert!(listed[2].contains(&format!("{}\u{2026}", "x".repeat(199))));
    }

    /// Issue 33: 400 subjects of 200 emoji each made a 350,097-byte body, over the limit, and
    /// the digest could never be composed. Every line is bounded in bytes now.
    #[test]
    fn the_largest_digest_of_the_widest_characters_fits() {
        let emoji = "\u{1F525}".repeat(outbox_domain::limits::MAX_SUBJECT_CHARS);
        let site = "s".repeat(outbox_domain::limits::MAX_SITE_ID_CHARS);
        let list = "\u{1F4E3}".repeat(outbox_domain::limits::MAX_LIST_NAME_CHARS);
        let lines: Vec<DigestLine> = (0..limits::MAX_PER_DIGEST as usize)
            .map(|_| DigestLine {
                enqueued_at: at("+99999-12-31T23:59:59.999Z"),
                site: &site,
                subject: &emoji,
                id: NotificationId::generate(),
            })
            .collect();
        let (subject, body) = digest_text(&list, lines).unwrap();
        assert!(body.as_str().len() <= MAX_DIGEST_BODY_BYTES);
        assert!(subject.as_str().starts_with("500 notifications for"));
        let line = body.as_str().lines().nth(2).unwrap();
        assert!(line.ends_with(')') && line.contains('\u{2026}'), "{line}");
    }

    #[test]
    fn quoting_cuts_at_a_character_boundary_within_both_limits() {
        assert_eq!(quote("Tank 4 high level"), "Tank 4 high level");
        for text in [
            "x".repeat(300),
            "\u{e9}".repeat(300),
            "\u{1F525}".repeat(300),
        ] {
            let q = quote(&text);
            assert!(q.len() <= MAX_LINE_SUBJECT_BYTES, "{}", q.len());
            assert!(q.chars().count() <= MAX_LINE_CHARS);
            assert!(q.ends_with('\u{2026}'));
        }
    }

    #[test]
    fn many_sites_are_summed_up_and_the_largest_digest_fits() {
        let sites: Vec<String> = (0..8).map(|i| format!("site-{i}")).collect();
        let long = "y".repeat(500);
        let lines: Vec<DigestLine> = (0..limits::MAX_PER_DIGEST as usize)
            .map(|i| DigestLine {
                enqueued_at: at("2026-11-24T10:15:00Z"),
                site: &sites[i % 8],
                subject: &long,
                id: NotificationId::generate(),
            })
            .collect();
        let (subject, _) = digest_text(&"l".repeat(128), lines).unwrap();
        assert!(
            subject.as_str().ends_with("site-4 and 3 more"),
            "{}",
            subject.as_str()
        );
    }
}
