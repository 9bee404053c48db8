//! Conversions between `google.protobuf.Timestamp` and `chrono::DateTime<Utc>`, the one time
//! type the services use inside.

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

/// Decodes a protobuf timestamp; `None` if it is outside chrono's range or its nanos are invalid.
pub fn from_timestamp(ts: &Timestamp) -> Option<DateTime<Utc>> {
    let nanos = u32::try_from(ts.nanos).ok()?;
    DateTime::from_timestamp(ts.seconds, nanos)
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
    fn rejects_negative_nanos() {
        assert_eq!(
            from_timestamp(&Timestamp {
                seconds: 0,
                nanos: -1
            }),
            None
        );
    }
}
