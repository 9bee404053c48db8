//! The site's outgoing links: to central (`central_url`) and, in a pair, to the peer
//! (`pair.peer_url`). Each endpoint gets TLS from `[tls]` for an `https://` URL (the files are
//! read here, so a bad one fails start-up), a connect timeout that bounds the handshake too, and
//! HTTP/2 keepalive pings that go while idle: without them a peer that vanished (cable pulled, VM
//! frozen, a proxy that stops passing packets) looks like a quiet stream until TCP gives up, which
//! can take many minutes. A [`LinkError`] names the setting at fault.

use tonic::transport::Endpoint;

use crate::config::{Config, PairConfig};
use crate::tls::TlsError;

/// Why a link's endpoint cannot be built; the message starts with the setting's key.
#[derive(Debug, thiserror::Error)]
pub enum LinkError {
    #[error("{key} {url:?} is not usable: {source}")]
    BadUrl {
        key: &'static str,
        url: String,
        source: tonic::transport::Error,
    },
    #[error(transparent)]
    Tls(#[from] TlsError),
    #[error("{key} {url:?}: cannot use the TLS configuration: {source}")]
    TlsConfig {
        key: &'static str,
        url: String,
        source: tonic::transport::Error,
    },
}

/// Central's endpoint, pinging after `central.keepalive_interval` without a byte and dropping
/// the connection when a ping goes unanswered for `central.keepalive_timeout`. No per-request
/// timeout: the submit stream lives for as long as the link does.
pub(crate) fn central_endpoint(config: &Config) -> Result<Endpoint, LinkError> {
    let key = "central_url";
    let url = &config.central_url;
    let mut endpoint = parse(key, url)?;
    if let Some(tls) = config.tls.client_config(url, config.connect_timeout)? {
        endpoint = with_tls(key, url, endpoint, tls)?;
    }
    Ok(endpoint
        .connect_timeout(config.connect_timeout)
        .tcp_nodelay(true)
        .http2_keep_alive_interval(config.central.keepalive_interval)
        .keep_alive_timeout(config.central.keepalive_timeout)
        .keep_alive_while_idle(true))
}

/// The peer's `SitePair` endpoint. Pings after a heartbeat interval without a byte, answered
/// within `link_timeout`: a dead replication connection is dropped well before the standby
/// would promote itself, so a new one gets a chance first.
pub(crate) fn peer_endpoint(config: &Config, pair: &PairConfig) -> Result<Endpoint, LinkError> {
    let key = "pair.peer_url";
    let url = &pair.peer_url;
    let mut endpoint = parse(key, url)?;
    if let Some(tls) =
        config
            .tls
            .client_config_for(url, pair.peer_domain.as_deref(), config.connect_timeout)?
    {
        endpoint = with_tls(key, url, endpoint, tls)?;
    }
    Ok(endpoint
        .connect_timeout(config.connect_timeout)
        .tcp_nodelay(true)
        .http2_keep_alive_interval(pair.heartbeat_interval())
        .keep_alive_timeout(pair.link_timeout())
        .keep_alive_while_idle(true))
}

fn parse(key: &'static str, url: &str) -> Result<Endpoint, LinkError> {
    Endpoint::from_shared(url.to_owned()).map_err(|source| LinkError::BadUrl {
        key,
        url: url.to_owned(),
        source,
    })
}

fn with_tls(
    key: &'static str,
    url: &str,
    endpoint: Endpoint,
    tls: tonic::transport::ClientTlsConfig,
) -> Result<Endpoint, LinkError> {
    endpoint
        .tls_config(tls)
        .map_err(|source| LinkError::TlsConfig {
            key,
            url: url.to_owned(),
            source,
        })
}

/// An error and its sources on one line (one copy for every crate, in the contract's crate).
pub(crate) use outbox_proto::error_chain;

#[cfg(test)]
mod tests {
    use super::*;

    fn pair(peer_url: &str) -> PairConfig {
        PairConfig {
            node_name: "b".into(),
            initial_role: crate::domain::Role::Standby,
            listen: "127.0.0.1:0".parse().unwrap(),
            peer_url: peer_url.into(),
            peer_domain: None,
            send_addr: None,
            failover_timeout: std::time::Duration::from_secs(2),
        }
    }

    #[test]
    fn a_bad_url_is_reported_under_its_own_key() {
        let mut config = Config::new("site-a");
        config.central_url = "not a url".into();
        let central = central_endpoint(&config).unwrap_err().to_string();
        assert!(
            central.starts_with("central_url \"not a url\" is not usable"),
            "{central}"
        );

        let config = Config::new("site-a");
        let peer = peer_endpoint(&config, &pair("peer b"))
            .unwrap_err()
            .to_string();
        assert!(
            peer.starts_with("pair.peer_url \"peer b\" is not usable"),
            "{peer}"
        );
        assert!(peer_endpoint(&config, &pair("http://127.0.0.1:7001")).is_ok());
    }
}
