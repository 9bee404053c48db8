//! End-to-end tests of the notification outbox: real services on port-0 sockets (in-process, or
//! as real processes where a crash is the point), real SQLite files, a real SMTP server and real
//! gRPC clients. One test binary for the whole workspace keeps link time down.

// The harness functions are not #[test] fns, so clippy's allow-unwrap-in-tests does not reach
// them; a failed set-up step must fail the test loudly anyway.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod backend;
mod harness;

mod admin;
mod auth;
mod central_disk_full;
mod channels;
mod conditions;
mod console;
mod console_browser;
mod consolidation;
mod crash;
mod delivery;
mod disk_full;
mod docs;
mod escalation;
mod failover;
mod forwarding;
mod ingest;
mod leader;
mod lifecycle;
mod link_reset;
mod listeners;
mod mail;
mod operations;
mod ops_pack;
mod pair;
mod scheduled;
mod secrets;
mod self_alerts;
mod serve_order;
mod setting_inputs;
mod settings;
mod silent_link;
mod site_health;
mod site_status;
mod standby_lag;
mod status_callbacks;
mod tls;
