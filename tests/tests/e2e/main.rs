//! End-to-end tests of the notification outbox: real services on port-0 sockets (in-process, or
//! as real processes where a crash is the point), real SQLite files, a real SMTP server and real
//! gRPC clients. One test binary for the whole workspace keeps link time down.

mod harness;

mod crash;
mod delivery;
mod forwarding;
mod ingest;
