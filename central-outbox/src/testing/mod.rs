//! Test doubles for this crate's tests and for the tests outside it: an in-memory store that
//! keeps the dispatch capability of the store ([`MemoryStore`]), a [`Gate`] that holds store
//! calls until a test opens it, and a ready-made notification ([`email`]).
//!
//! Compiled into the library, not behind `#[cfg(test)]`, because the store conformance suite
//! (`tests/conformance`, an integration test: a crate of its own that sees only public items)
//! runs the memory store through the dispatch behaviours every backend must show, so that it
//! cannot drift from the real stores the dispatcher's paused-clock tests stand in for. Nothing
//! in the service uses this module; the binary links none of it.

mod memory_store;

pub use memory_store::{Gate, MemoryStore, Row, email};
