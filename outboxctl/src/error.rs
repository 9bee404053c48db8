//! What can go wrong in `outboxctl`, as one line for a person and an exit status for a script.
//!
//! Invariant: every failure reaches the user as exactly one line on stderr, `outboxctl: ...`,
//! with exit status 2 for usage errors (nothing was sent, fix the command line) and 1 for
//! everything else. A gRPC error keeps central's message, which names the notification and the
//! rule, and adds the status code as a short word a script can match on.

use tonic::Code;

#[derive(Debug, thiserror::Error)]
pub(crate) enum CliError {
    /// The command line is wrong or incomplete; nothing was sent.
    #[error("{0}")]
    Usage(String),
    /// No connection to central could be made.
    #[error("cannot reach central at {addr}: {detail}")]
    Unreachable { addr: String, detail: String },
    /// The connection was made but no answer came within `--timeout`.
    #[error("central at {addr} did not answer within the timeout (see --timeout)")]
    NoAnswer { addr: String },
    /// Central answered with an error.
    #[error("{}", rpc_line(.addr, .status))]
    Rpc { addr: String, status: tonic::Status },
    /// The operator declined the confirmation prompt.
    #[error("aborted: nothing was changed")]
    Aborted,
    /// Reading stdin or writing stdout failed.
    #[error("{what}: {source}")]
    Io {
        what: &'static str,
        source: std::io::Error,
    },
}

pub(crate) type Result<T, E = CliError> = std::result::Result<T, E>;

impl CliError {
    pub(crate) fn exit_code(&self) -> u8 {
        match self {
            Self::Usage(_) => 2,
            _ => 1,
        }
    }

    /// Classifies a failed call: transport failures become `Unreachable`, because "central is
    /// down or the address is wrong" is what the operator needs to hear, not "UNAVAILABLE".
    pub(crate) fn from_status(addr: &str, status: tonic::Status) -> Self {
        let transport_failure =
            status.code() == Code::Unavailable && std::error::Error::source(&status).is_some();
        if is_client_timeout(&status) {
            Self::NoAnswer {
                addr: addr.to_owned(),
            }
        } else if transport_failure {
            Self::Unreachable {
                addr: addr.to_owned(),
                detail: one_line(status.message()),
            }
        } else {
            Self::Rpc {
                addr: addr.to_owned(),
                status,
            }
        }
    }
}

/// tonic reports its own client-side deadline as CANCELLED "Timeout expired".
fn is_client_timeout(status: &tonic::Status) -> bool {
    status.code() == Code::Cancelled && status.message().contains("Timeout expired")
}

fn rpc_line(addr: &str, status: &tonic::Status) -> String {
    let message = one_line(status.message());
    match status.code() {
        Code::Unimplemented => format!(
            "central at {addr} does not implement this call ({}); is it an older version?",
            code_word(Code::Unimplemented)
        ),
        code if message.is_empty() => format!("central answered {}", code_word(code)),
        code => format!("{message} ({})", code_word(code)),
    }
}

/// The canonical gRPC name of a code, as grpcurl and the gRPC docs spell it.
pub(crate) fn code_word(code: Code) -> &'static str {
    match code {
        Code::Ok => "OK",
        Code::Cancelled => "CANCELLED",
        Code::Unknown => "UNKNOWN",
        Code::InvalidArgument => "INVALID_ARGUMENT",
        Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
        Code::NotFound => "NOT_FOUND",
        Code::AlreadyExists => "ALREADY_EXISTS",
        Code::PermissionDenied => "PERMISSION_DENIED",
        Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
        Code::FailedPrecondition => "FAILED_PRECONDITION",
        Code::Aborted => "ABORTED",
        Code::OutOfRange => "OUT_OF_RANGE",
        Code::Unimplemented => "UNIMPLEMENTED",
        Code::Internal => "INTERNAL",
        Code::Unavailable => "UNAVAILABLE",
        Code::DataLoss => "DATA_LOSS",
        Code::Unauthenticated => "UNAUTHENTICATED",
    }
}

/// Keeps the one-line promise even when a message carries line breaks.
pub(crate) fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rpc_errors_keep_the_message_and_name_the_code() {
        let err = CliError::from_status(
            "http://c:50051",
            tonic::Status::failed_precondition(
                "notification 0190 is DELIVERED, only PARKED notifications can be retried",
            ),
        );
        assert_eq!(
            err.to_string(),
            "notification 0190 is DELIVERED, only PARKED notifications can be retried \
             (FAILED_PRECONDITION)"
        );
        assert_eq!(err.exit_code(), 1);
    }

    #[test]
    fn server_side_unavailable_is_not_mistaken_for_a_dead_server() {
        let err = CliError::from_status(
            "http://c:50051",
            tonic::Status::unavailable("the outbox database is unavailable;\nretry later"),
        );
        assert_eq!(
            err.to_string(),
            "the outbox database is unavailable; retry later (UNAVAILABLE)"
        );
    }

    #[test]
    fn usage_errors_exit_2() {
        assert_eq!(CliError::Usage("x".into()).exit_code(), 2);
    }
}
