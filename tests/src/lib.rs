//! Test support for the notification outbox: the dev SMTP sink used by the tests and `make demo`.

pub mod smtp_sink;
