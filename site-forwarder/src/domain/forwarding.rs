//! The forwarding link's figures at one moment, as `GetBufferStats`, health reports and
//! `/metrics` read them: plain data, so those readers need not know the forwarder.

use chrono::{DateTime, Utc};

/// Whether central is reachable, what is in flight, when the last ack arrived, and whether
/// central refuses this node's submits.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ForwardSnapshot {
    pub central_reachable: bool,
    pub in_flight: u64,
    pub last_forward_at: Option<DateTime<Utc>>,
    /// Central's reason, while it ends this node's submit streams with PERMISSION_DENIED (its
    /// client certificate names another site than `site_id`, say): the buffer keeps every row
    /// and the forwarder retries with a backoff. Cleared by central's next ack.
    pub refused: Option<String>,
}
