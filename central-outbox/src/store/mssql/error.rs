//! What a driver error means for the MS SQL backend, decided by error number and driver error
//! kind, never by message text: whether the unit of work may simply run again (deadlock victim),
//! whether a duplicate key was hit (the idempotent insert's signal), whether the connection is
//! unusable and must be discarded, and whether a failed connect is worth retrying.

use tiberius::error::{Error, IoErrorKind};

use crate::store::StoreError;

/// Violation of a PRIMARY KEY or UNIQUE constraint.
pub(super) const UNIQUE_CONSTRAINT_VIOLATION: u32 = 2627;
/// Duplicate key row in a unique index.
pub(super) const UNIQUE_INDEX_VIOLATION: u32 = 2601;
/// Chosen as the deadlock victim: the whole batch was rolled back and may run again.
pub(super) const DEADLOCK_VICTIM: u32 = 1205;
/// Errors of this severity or higher close the session on the server side.
const FATAL_SEVERITY: u8 = 20;

/// Server error numbers a connect may recover from by trying again shortly: the database is
/// starting, recovering or failing over (Azure SQL and availability groups), or the service is
/// throttling new sessions.
const TRANSIENT_CONNECT_CODES: &[u32] = &[
    233,   // no process is on the other end of the pipe (server restarting)
    4060,  // cannot open database: still recovering after a restart or failover
    4221,  // login to a readable secondary is waiting for redo
    10053, // transport-level error: connection aborted
    10054, // transport-level error: connection reset
    10060, // transport-level error: connection timed out
    10928, // resource limit reached (Azure)
    10929, // minimum guarantee not available (Azure)
    40197, // the service encountered an error processing the request (Azure failover)
    40501, // the service is busy (Azure)
    40613, // database not currently available (Azure failover)
    49918, // not enough resources to process the request (Azure)
    49919, // too many create or update operations in progress (Azure)
    49920, // too many operations in progress (Azure)
];

/// What an error means to the caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ErrorClass {
    /// 2627 or 2601: the row exists.
    DuplicateKey,
    /// 1205: rolled back as a deadlock victim; running the same batch again is safe.
    Deadlock,
    /// No answer in time (the driver's command timeout, or ours around the whole batch). The
    /// batch may or may not have committed, and the connection is out of step with the server.
    Timeout,
    /// IO, TLS or protocol failure, or a fatal server error: the connection is gone.
    ConnectionLost,
    /// Any other server error (permissions, a constraint, a bug in a statement).
    Server,
    /// A value could not be converted between SQL and Rust.
    Conversion,
}

/// Classifies a driver error.
pub(super) fn classify(error: &Error) -> ErrorClass {
    match error {
        Error::Server(token) => classify_server(token.code(), token.class()),
        Error::Io { kind, .. } if *kind == IoErrorKind::TimedOut => ErrorClass::Timeout,
        Error::Conversion(_) | Error::Utf8 | Error::Utf16 | Error::ParseInt(_) => {
            ErrorClass::Conversion
        }
        Error::BulkInput(_) => ErrorClass::Server,
        // Io, Protocol, Encoding, Tls, Routing (a redirect not followed): the stream is either
        // closed or in an unknown state.
        _ => ErrorClass::ConnectionLost,
    }
}

/// Classifies a server error by its number and severity.
pub(super) fn classify_server(code: u32, severity: u8) -> ErrorClass {
    match code {
        UNIQUE_CONSTRAINT_VIOLATION | UNIQUE_INDEX_VIOLATION => ErrorClass::DuplicateKey,
        DEADLOCK_VICTIM => ErrorClass::Deadlock,
        _ if severity >= FATAL_SEVERITY => ErrorClass::ConnectionLost,
        _ => ErrorClass::Server,
    }
}

/// Whether a connection that returned this error must be discarded rather than reused.
pub(super) fn breaks_connection(error: &Error) -> bool {
    matches!(
        classify(error),
        ErrorClass::Timeout | ErrorClass::ConnectionLost
    )
}

/// Whether a failed connect attempt is worth repeating after a pause: the network or the
/// server's availability, not the credentials or the configuration.
pub(super) fn is_transient_connect(error: &Error) -> bool {
    match error {
        Error::Server(token) => TRANSIENT_CONNECT_CODES.contains(&token.code()),
        Error::Io { kind, .. } => matches!(
            kind,
            IoErrorKind::ConnectionRefused
                | IoErrorKind::ConnectionReset
                | IoErrorKind::ConnectionAborted
                | IoErrorKind::NotConnected
                | IoErrorKind::BrokenPipe
                | IoErrorKind::TimedOut
                | IoErrorKind::UnexpectedEof
                | IoErrorKind::Interrupted
        ),
        _ => false,
    }
}

/// A store operation's failure, as the store trait reports it.
pub(super) fn to_store_error(context: &str, error: &Error) -> StoreError {
    match classify(error) {
        ErrorClass::Conversion => StoreError::Corrupt(format!("{context}: {error}")),
        _ => StoreError::Unavailable(format!("{context}: {error}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn duplicate_keys_and_deadlocks_are_recognised_by_number() {
        assert_eq!(classify_server(2627, 14), ErrorClass::DuplicateKey);
        assert_eq!(classify_server(2601, 14), ErrorClass::DuplicateKey);
        assert_eq!(classify_server(1205, 13), ErrorClass::Deadlock);
        // Permission denied, invalid object name, string truncation: plain server errors that
        // leave the connection usable.
        for code in [229, 208, 2628, 547] {
            assert_eq!(classify_server(code, 16), ErrorClass::Server, "{code}");
        }
        // Severity 20 and above ends the session.
        assert_eq!(classify_server(824, 24), ErrorClass::ConnectionLost);
    }

    #[test]
    fn timeouts_and_transport_failures_break_the_connection() {
        let timed_out = Error::Io {
            kind: IoErrorKind::TimedOut,
            message: "no response within the command timeout".into(),
        };
        assert_eq!(classify(&timed_out), ErrorClass::Timeout);
        assert!(breaks_connection(&timed_out));
        let reset = Error::Io {
            kind: IoErrorKind::ConnectionReset,
            message: "reset".into(),
        };
        assert_eq!(classify(&reset), ErrorClass::ConnectionLost);
        assert!(breaks_connection(&reset));
        for error in [
            Error::Protocol("unexpected token".into()),
            Error::Tls("handshake".into()),
            Error::Routing {
                host: "replica".into(),
                port: 1433,
            },
        ] {
            assert!(breaks_connection(&error), "{error}");
        }
        let conversion = Error::Conversion("not a bigint".into());
        assert_eq!(classify(&conversion), ErrorClass::Conversion);
        assert!(!breaks_connection(&conversion));
        assert!(matches!(
            to_store_error("claim", &conversion),
            StoreError::Corrupt(_)
        ));
        assert!(matches!(
            to_store_error("claim", &reset),
            StoreError::Unavailable(_)
        ));
    }

    #[test]
    fn only_network_and_availability_failures_are_retried_at_connect() {
        for kind in [
            IoErrorKind::ConnectionRefused,
            IoErrorKind::TimedOut,
            IoErrorKind::ConnectionReset,
        ] {
            let error = Error::Io {
                kind,
                message: String::new(),
            };
            assert!(is_transient_connect(&error), "{kind:?}");
        }
        let denied = Error::Io {
            kind: IoErrorKind::PermissionDenied,
            message: String::new(),
        };
        assert!(!is_transient_connect(&denied));
        assert!(!is_transient_connect(&Error::Tls("bad certificate".into())));
        assert!(TRANSIENT_CONNECT_CODES.contains(&40613));
        // 18456 (login failed) must not be retried: it would only lock the account out.
        assert!(!TRANSIENT_CONNECT_CODES.contains(&18456));
    }
}
