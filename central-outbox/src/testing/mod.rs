//! Test doubles for this crate's tests and for the tests outside it: an in-memory store that
//! keeps the dispatch capability of the store ([`MemoryStore`]), a [`Gate`] that holds store
//! calls until a test opens it, a ready-made notification ([`email`]), and the few internals
//! tests outside the crate drive directly (below).
//!
//! Compiled for this crate's unit tests and with the `test-support` feature, not for the service:
//! the store conformance suite (`tests/conformance`, an integration test: a crate of its own
//! that sees only public items) runs the memory store through the dispatch behaviours every
//! backend must show, so that it cannot drift from the real stores the dispatcher's
//! paused-clock tests stand in for, and the e2e tests drive a few internals. Both enable the
//! feature as a dev-dependency feature (this crate through a dev-dependency on itself), so a
//! build of the service or of the bench compiles none of it.

mod memory_store;

pub use memory_store::{Gate, MemoryStore, Row, email, webhook};

// Internals the tests outside this crate drive directly, named here so the modules that hold
// them stay crate-only: the e2e mail tests render messages with the email adapter; the e2e
// listener tests fill the console's connection cap.
pub use crate::console::CONSOLE_LIMITS;
pub use crate::delivery::{EmailAdapter, Turn};
