//! Conversions between the protobuf well-known time types and the types the services use
//! inside: `Timestamp` <-> `chrono::DateTime<Utc>`, `Duration` <-> `std::time::Duration`.

use chrono::{DateTime, Utc};
use prost_types::Timestamp;

/// Encodes a UTC instant as a protobuf timestamp.
pub fn to_timestamp(at: DateTime<Utc>) -> Timestamp {
    Timestamp {
        seconds: at.timestamp(),
        // Always within 0..1e9, which fits an i32.
        nanos: i32::try_from(at.timestamp_subsec_nanos()).unwrap_or(0),
    }
}

/// The earliest instant a protobuf timestamp may hold: 0001-01-01T00:00:00Z.
const MIN_SECONDS: i64 = -62_135_596_800;
/// The latest: 9999-12-31T23:59:59.999999999Z. Also where MS SQL's `datetime2` ends, so an
/// instant the services accept can always be stored (a later one failed a whole batch).
const MAX_SECONDS: i64 = 253_402_300_799;

/// Decodes a protobuf timestamp; `None` outside the range the protobuf spec allows (years 1 to
/// 9999) or with nanos outside 0..1e9.
pub fn from_timestamp(ts: &Timestamp) -> Option<DateTime<Utc>> {
    if !(MIN_SECONDS..=MAX_SECONDS).contains(&ts.seconds) {
        return None;
    }
    let nanos = u32::try_from(ts.nanos)
        .ok()
        .filter(|&n| n < 1_000_000_000)?;
    DateTime::from_timestamp(ts.seconds, nanos)
}

/// Encodes a span as a protobuf duration (saturating at the protobuf maximum).
pub fn to_duration(span: std::time::Duration) -> prost_types::Duration {
    prost_types::Duration {
        seconds: i64::try_from(span.as_secs()).unwrap_or(i64::MAX),
        nanos: i32::try_from(span.subsec_nanos()).unwrap_or(0),
    }
}

/// Decodes a protobuf duration; `None` if it is negative or its nanos are invalid.
pub fn from_duration(d: &prost_types::Duration) -> Option<std::time::Duration> {
    let seconds = u64::try_from(d.seconds).ok()?;
    let nanos = u32::try_from(d.nanos).ok().filter(|n| *n < 1_000_000_000)?;
    Some(std::time::Duration::new(seconds, nanos))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_to_the_nanosecond() {
        let at = DateTime::from_timestamp(1_700_000_000, 123_456_789).unwrap();
        assert_eq!(from_timestamp(&to_timestamp(at)), Some(at));
    }

    #[test]
    fn takes_years_1_to_9999_and_nothing_beyond() {
        for (seconds, nanos) in [(MIN_SECONDS, 0), (MAX_SECONDS, 999_999_999)] {
            assert!(from_timestamp(&Timestamp { seconds, nanos }).is_some());
        }
        for (seconds, nanos) in [
            (MIN_SECONDS - 1, 0),
            (MAX_SECONDS + 1, 0),
            (i64::MAX, 0),
            (0, 1_000_000_000),
        ] {
            assert_eq!(from_timestamp(&Timestamp { seconds, nanos }), None);
        }
    }

    #[test]
    fn rejects_negative_nanos() {
        assert_eq!(
            from_timestamp(&Timestamp {
                seconds: 0,
                nanos: -1
            }),
            None
        );
    }

    #[test]
    fn durations_round_trip_and_negative_ones_are_refused() {
        let span = std::time::Duration::new(90, 5);
        assert_eq!(from_duration(&to_duration(span)), Some(span));
        assert_eq!(
            from_duration(&prost_types::Duration {
                seconds: -1,
                nanos: 0
            }),
            None
        );
    }
}
