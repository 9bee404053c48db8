//! Test support for the notification outbox: the dev SMTP sink used by the tests and `make demo`,
//! an OAuth2 token endpoint and a webhook receiver, all real servers on loopback ports; and a
//! throwaway certificate authority for the TLS tests ([`pki`]).

pub mod oauth_server;
pub mod pki;
pub mod smtp_sink;
pub mod webhook_server;
