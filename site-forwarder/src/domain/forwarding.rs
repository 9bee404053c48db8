//! The forwarding link's figures at one moment, as `GetBufferStats`, health reports and
//! `/metrics` read them: plain data, so those readers need not know the forwarder.

use chrono::{DateTime, Utc};

/// Whether central is reachable, what is in flight, and when the last ack arrived.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ForwardSnapshot {
    pub central_reachable: bool,
    pub in_flight: u64,
    pub last_forward_at: Option<DateTime<Utc>>,
}
