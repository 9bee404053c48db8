//! Test support for the notification outbox: the dev SMTP sink used by the tests and `make demo`,
//! an OAuth2 token endpoint and a webhook receiver, all real servers on loopback ports; a
//! throwaway certificate authority for the TLS tests ([`pki`]); a TCP link a test can cut to
//! stage a partition ([`link`]); a TCP link that delays every chunk and counts the client's
//! turns, to measure round trips ([`delay_link`]); the workspace's binaries,
//! built fresh for the tests and the bench that start them as processes ([`binaries`]); and
//! headless Chromium under chromedriver for the web console's browser test ([`browser`]).

pub mod binaries;
pub mod browser;
pub mod delay_link;
pub mod link;
pub mod oauth_server;
pub mod pki;
pub mod smtp_sink;
pub mod webhook_server;
