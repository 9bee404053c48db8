//! Test doubles for this crate's tests and for the tests outside it: an in-memory store that
//! keeps the dispatch capability of the store ([`MemoryStore`]), a [`Gate`] that holds store
//! calls until a test opens it, a ready-made notification ([`email`]), and the few internals
//! tests outside the crate drive directly (below).
//!
//! Compiled into the library, not behind `#[cfg(test)]`, because the store conformance suite
//! (`tests/conformance`, an integration test: a crate of its own that sees only public items)
//! runs the memory store through the dispatch behaviours every backend must show, so that it
//! cannot drift from the real stores the dispatcher's paused-clock tests stand in for. Nothing
//! in the service uses this module; the binary links none of it.

mod memory_store;

pub use memory_store::{Gate, MemoryStore, Row, email};

// Internals the tests outside this crate drive directly, named here so the modules that hold
// them stay crate-only: the e2e mail tests render messages with the email adapter, the bench
// holds the dispatcher's lease from a second replica and submits through ingest's conversion;
// the e2e listener tests fill the console's connection cap.
pub use crate::console::CONSOLE_LIMITS;
pub use crate::delivery::{EmailAdapter, Turn};
pub use crate::dispatcher::DISPATCHER_LEASE;
pub use crate::grpc::convert::submission;
