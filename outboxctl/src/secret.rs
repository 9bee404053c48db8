//! Where write-only secrets come from: the first line of stdin, or an environment variable.
//! Never argv, which every local user can read through `ps` and which lands in shell history.
//!
//! Invariants: stdin is read at most once per run (a second `--*-stdin` flag is refused before
//! anything is read, see `upsert`); a secret is never empty (removing one is a flag of its own);
//! an empty environment variable counts as unset; no error message contains a secret.

use std::io::BufRead;

use crate::error::{CliError, Result};

/// The SMTP password when `--password-stdin` is not given.
pub(crate) const PASSWORD_ENV: &str = "OUTBOX_SMTP_PASSWORD";
/// The XOAUTH2 client secret when `--oauth-client-secret-stdin` is not given.
pub(crate) const OAUTH_CLIENT_SECRET_ENV: &str = "OUTBOX_SMTP_OAUTH_CLIENT_SECRET";
/// A webhook list's signing secret when `--webhook-secret-stdin` is not given.
pub(crate) const WEBHOOK_SECRET_ENV: &str = "OUTBOX_WEBHOOK_SECRET";

/// Where secrets are read from: the process's stdin and environment ([`Process`]), or a test's
/// values.
pub(crate) trait Secrets {
    /// The first line of stdin; `flag` is the option that asked for it.
    fn stdin(&mut self, flag: &'static str) -> Result<String>;
    /// The variable's value, if set and not empty.
    fn env(&self, var: &'static str) -> Option<String>;
}

/// This process's stdin and environment.
#[derive(Debug)]
pub(crate) struct Process;

impl Secrets for Process {
    fn stdin(&mut self, flag: &'static str) -> Result<String> {
        read_stdin(flag)
    }

    fn env(&self, var: &'static str) -> Option<String> {
        from_env(var)
    }
}

/// The first line of stdin, without its line ending (`printf 'pw' |` and `echo pw |` both
/// work). `flag` names the option that asked, for the error messages.
fn read_stdin(flag: &'static str) -> Result<String> {
    let mut line = String::new();
    std::io::stdin()
        .lock()
        .read_line(&mut line)
        .map_err(|source| CliError::Io {
            what: "reading a secret from stdin",
            source,
        })?;
    first_line(&line, flag)
}

fn first_line(text: &str, flag: &str) -> Result<String> {
    let secret = text.trim_end_matches(['\r', '\n']);
    if secret.is_empty() {
        return Err(CliError::Usage(format!(
            "{flag}: stdin gave an empty secret"
        )));
    }
    Ok(secret.to_owned())
}

/// The variable's value, or `None` when it is unset, empty or not UTF-8.
fn from_env(var: &'static str) -> Option<String> {
    std::env::var(var).ok().filter(|value| !value.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_line_is_the_secret() {
        assert_eq!(first_line("s3cret\r\n", "--x-stdin").unwrap(), "s3cret");
        assert_eq!(first_line("s3cret", "--x-stdin").unwrap(), "s3cret");
        let err = first_line("\n", "--password-stdin").unwrap_err();
        assert_eq!(err.exit_code(), 2);
        assert_eq!(
            err.to_string(),
            "--password-stdin: stdin gave an empty secret"
        );
    }
}
