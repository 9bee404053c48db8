//! Builds the replace-the-whole-thing requests, `UpsertNotificationList` (`lists set`),
//! `UpsertSmtpConfig` (`smtp set`) and `UpsertWebhookConfig` (`webhook set`), from the command
//! line.
//!
//! Before anything is read or sent, [`check_list`] and [`smtp_auth`] refuse flags that
//! contradict each other or that central would silently ignore (OAuth flags without
//! `--auth xoauth2`, a burst without a rate, two secrets on one stdin), so an operator never
//! believes a setting was stored when it was dropped. What only central can judge (an address,
//! a URL, whether a stored secret can be kept, what is missing from a list) is left to it: its
//! INVALID_ARGUMENT names the field.
//!
//! Secrets follow the contract's write-only rule: not sending one keeps the stored one, and the
//! webhook secret alone can be removed (sent as "", `--clear-webhook-secret`). A secret is read
//! only for the mechanism that uses it: an exported `OUTBOX_SMTP_PASSWORD` does not leak into an
//! XOAUTH2 configuration, nor `OUTBOX_WEBHOOK_SECRET` into an email list.
//!
//! A list's flood consolidation is part of the list, so `lists set` without the
//! `--consolidate-*` flags turns it off; the three flags come together or not at all (one alone
//! would otherwise silently store a list without consolidation). Their limits are central's.

use outbox_proto::time::to_duration;
use outbox_proto::v1;

use crate::args::{AuthArg, BackoffArg, ChannelArg, ListSetArgs, SmtpSetArgs, WebhookSetArgs};
use crate::error::{CliError, Result};
use crate::secret::{OAUTH_CLIENT_SECRET_ENV, PASSWORD_ENV, Secrets, WEBHOOK_SECRET_ENV};

/// Refuses list flags that belong to the other channel, and a partial set of consolidation
/// flags. Nothing is read or sent.
pub(crate) fn check_list(args: &ListSetArgs) -> Result<()> {
    consolidation(args)?;
    escalation(args)?;
    match args.kind {
        ChannelArg::Email => {
            let webhook_flags = [
                ("--endpoint", !args.endpoints.is_empty()),
                ("--fallback-url", !args.fallback_urls.is_empty()),
                ("--webhook-format", args.webhook_format.is_some()),
                ("--webhook-secret-stdin", args.webhook_secret_stdin),
                ("--clear-webhook-secret", args.clear_webhook_secret),
            ];
            match first_given(&webhook_flags) {
                Some(flag) => Err(usage(format!(
                    "{flag} is for webhook lists: add --type webhook"
                ))),
                None => Ok(()),
            }
        }
        ChannelArg::Webhook if !args.recipients.is_empty() => Err(usage(
            "--recipient is for email lists: a webhook list takes --endpoint URL",
        )),
        ChannelArg::Webhook => Ok(()),
    }
}

/// The list's consolidation: all three `--consolidate-*` flags, or none (off).
fn consolidation(args: &ListSetArgs) -> Result<Option<v1::ListConsolidation>> {
    match (
        args.consolidate_threshold,
        args.consolidate_window,
        args.consolidate_max_per_digest,
    ) {
        (Some(threshold), Some(window), Some(max_per_digest)) => Ok(Some(v1::ListConsolidation {
            threshold,
            window: Some(to_duration(window)),
            max_per_digest,
        })),
        (None, None, None) => Ok(None),
        (threshold, window, max) => {
            let missing: Vec<&str> = [
                ("--consolidate-threshold", threshold.is_none()),
                ("--consolidate-window", window.is_none()),
                ("--consolidate-max-per-digest", max.is_none()),
            ]
            .iter()
            .filter(|(_, absent)| *absent)
            .map(|(flag, _)| *flag)
            .collect();
            Err(usage(format!(
                "flood consolidation needs --consolidate-threshold, --consolidate-window and \
                 --consolidate-max-per-digest together: add {} (or drop the others to turn it off)",
                missing.join(" and ")
            )))
        }
    }
}

/// The list's escalation: `--escalate-after` and what goes with it, or nothing (off). The other
/// escalation flags alone would be dropped, so they are refused.
fn escalation(args: &ListSetArgs) -> Result<Option<v1::ListEscalation>> {
    let Some(first_wait) = args.escalate_after else {
        let given = [
            ("--escalation-step", !args.escalation_steps.is_empty()),
            (
                "--escalation-priority",
                !args.escalation_priorities.is_empty(),
            ),
            ("--escalation-repeat", args.escalation_repeat.is_some()),
            (
                "--escalation-repeat-from",
                args.escalation_repeat_from.is_some(),
            ),
            ("--no-escalate-on-park", args.no_escalate_on_park),
            ("--escalation-reminder", args.escalation_reminder.is_some()),
            (
                "--escalation-notify-acknowledgement",
                args.escalation_notify_acknowledgement,
            ),
        ];
        return match first_given(&given) {
            Some(flag) => Err(usage(format!(
                "{flag} needs --escalate-after DURATION (how long the alarm waits before the \
                 next step)"
            ))),
            None => Ok(None),
        };
    };
    Ok(Some(v1::ListEscalation {
        priorities: args
            .escalation_priorities
            .iter()
            .map(|p| (*p).into())
            .collect(),
        acknowledge_within: Some(to_duration(first_wait)),
        steps: args
            .escalation_steps
            .iter()
            .map(|(notify, wait)| v1::EscalationStep {
                notify: notify.clone(),
                wait: Some(to_duration(*wait)),
            })
            .collect(),
        repeat: args.escalation_repeat.unwrap_or(0),
        repeat_from_step: args.escalation_repeat_from.unwrap_or(0),
        escalate_on_park: args.no_escalate_on_park.then_some(false),
        acknowledgement_reminder: args.escalation_reminder.map(to_duration),
        notify_acknowledgement: args.escalation_notify_acknowledgement.then_some(true),
    }))
}

/// The list to store. Reads the webhook secret (stdin or `OUTBOX_WEBHOOK_SECRET`) for webhook
/// lists only; `--clear-webhook-secret` wins over the environment.
pub(crate) fn list_request(
    args: ListSetArgs,
    secrets: &mut impl Secrets,
) -> Result<v1::UpsertNotificationListRequest> {
    check_list(&args)?;
    let consolidation = consolidation(&args)?;
    let escalation = escalation(&args)?;
    let webhook_secret = match args.kind {
        ChannelArg::Email => None,
        ChannelArg::Webhook if args.clear_webhook_secret => Some(String::new()),
        ChannelArg::Webhook if args.webhook_secret_stdin => {
            Some(secrets.stdin("--webhook-secret-stdin")?)
        }
        ChannelArg::Webhook => secrets.env(WEBHOOK_SECRET_ENV),
    };
    Ok(v1::UpsertNotificationListRequest {
        list: Some(v1::NotificationList {
            name: args.name,
            r#type: args.kind.proto().into(),
            recipients: args.recipients,
            endpoints: args.endpoints,
            fallback_urls: args.fallback_urls,
            webhook_format: args
                .webhook_format
                .map_or(v1::WebhookFormat::Unspecified, |f| f.proto())
                .into(),
            webhook_secret,
            consolidation,
            escalation,
            status_callback_url: args.status_callback_url.unwrap_or_default(),
            ..Default::default()
        }),
    })
}

/// The authentication `smtp set` asks for (`--auth`, else password with a username and none
/// without, as central decides), once the flags are known to fit it. Nothing is read or sent.
pub(crate) fn smtp_auth(args: &SmtpSetArgs) -> Result<AuthArg> {
    if args.password_stdin && args.oauth_client_secret_stdin {
        return Err(usage(
            "--password-stdin and --oauth-client-secret-stdin both read stdin, which can be \
             read only once; a configuration needs one of them (the password for --auth \
             password, the client secret for --auth xoauth2)",
        ));
    }
    let auth = args.auth.unwrap_or(if args.username.is_some() {
        AuthArg::Password
    } else {
        AuthArg::None
    });
    match auth {
        AuthArg::None if args.username.is_some() => {
            return Err(usage(
                "--auth none takes no --username: drop it, or use --auth password or xoauth2",
            ));
        }
        AuthArg::Password if args.username.is_none() => {
            return Err(usage("--auth password needs --username"));
        }
        AuthArg::Xoauth2 => {
            let required = [
                ("--username", args.username.is_none()),
                ("--oauth-token-url", args.oauth_token_url.is_none()),
                ("--oauth-client-id", args.oauth_client_id.is_none()),
            ];
            let missing: Vec<&str> = required
                .iter()
                .filter(|(_, absent)| *absent)
                .map(|(flag, _)| *flag)
                .collect();
            if !missing.is_empty() {
                return Err(usage(format!(
                    "--auth xoauth2 needs {}",
                    missing.join(", ")
                )));
            }
            if args.password_stdin {
                return Err(usage(format!(
                    "--password-stdin is for --auth password: XOAUTH2 authenticates with the \
                     OAuth client secret (--oauth-client-secret-stdin or \
                     ${OAUTH_CLIENT_SECRET_ENV})"
                )));
            }
        }
        AuthArg::None | AuthArg::Password => {}
    }
    if auth != AuthArg::Xoauth2 {
        let oauth_flags = [
            ("--oauth-token-url", args.oauth_token_url.is_some()),
            ("--oauth-client-id", args.oauth_client_id.is_some()),
            ("--oauth-scope", args.oauth_scope.is_some()),
            (
                "--oauth-client-secret-stdin",
                args.oauth_client_secret_stdin,
            ),
        ];
        if let Some(flag) = first_given(&oauth_flags) {
            return Err(usage(format!("{flag} applies only with --auth xoauth2")));
        }
    }
    if args.max_retry_delay.is_some() && args.backoff != Some(BackoffArg::Exponential) {
        return Err(usage(
            "--max-retry-delay applies only with --backoff exponential",
        ));
    }
    if args.rate_limit_burst.is_some() && args.rate_limit_per_second.is_none() {
        return Err(usage(
            "--rate-limit-burst needs --rate-limit-per-second (the burst is an allowance \
             above a rate)",
        ));
    }
    Ok(auth)
}

/// The whole SMTP configuration. Unset optional settings are sent as zero or unset, which central
/// reads as "its default", so `smtp set` always describes everything. The secret the mechanism
/// uses comes from stdin when its flag says so, else from its environment variable, else is not
/// sent (central keeps the stored one for the same username or client id going to the same
/// relay and token endpoint, and otherwise refuses the change naming the secret).
pub(crate) fn smtp_request(
    args: SmtpSetArgs,
    secrets: &mut impl Secrets,
) -> Result<v1::UpsertSmtpConfigRequest> {
    let auth = smtp_auth(&args)?;
    let password = match auth {
        AuthArg::Password if args.password_stdin => Some(secrets.stdin("--password-stdin")?),
        AuthArg::Password => secrets.env(PASSWORD_ENV),
        AuthArg::None | AuthArg::Xoauth2 => None,
    };
    let oauth_client_secret = match auth {
        AuthArg::Xoauth2 if args.oauth_client_secret_stdin => {
            Some(secrets.stdin("--oauth-client-secret-stdin")?)
        }
        AuthArg::Xoauth2 => secrets.env(OAUTH_CLIENT_SECRET_ENV),
        AuthArg::None | AuthArg::Password => None,
    };
    Ok(v1::UpsertSmtpConfigRequest {
        host: args.host,
        port: u32::from(args.port),
        tls_mode: args.tls.proto().into(),
        username: args.username.unwrap_or_default(),
        password,
        from_address: args.from_address,
        max_retries: args.max_retries.unwrap_or(0),
        retry_delay: args.retry_delay.map(to_duration),
        max_concurrent_connections: args.max_connections.unwrap_or(0),
        timeout: args.session_timeout.map(to_duration),
        auth_mechanism: auth.proto().into(),
        oauth_token_url: args.oauth_token_url.unwrap_or_default(),
        oauth_client_id: args.oauth_client_id.unwrap_or_default(),
        oauth_client_secret,
        oauth_scope: args.oauth_scope.unwrap_or_default(),
        backoff: args
            .backoff
            .map_or(v1::RetryBackoff::Unspecified, BackoffArg::proto)
            .into(),
        max_retry_delay: args.max_retry_delay.map(to_duration),
        rate_limit_per_second: args.rate_limit_per_second,
        rate_limit_burst: args.rate_limit_burst.unwrap_or(0),
        overall_timeout: args.overall_timeout.map(to_duration),
        fallback_relays: args.fallback_relays,
    })
}

/// Refuses `webhook set` flags central would ignore. Webhooks back off exponentially unless told
/// otherwise, so --max-retry-delay is refused only beside --backoff fixed.
pub(crate) fn check_webhook(args: &WebhookSetArgs) -> Result<()> {
    if args.max_retry_delay.is_some() && args.backoff == Some(BackoffArg::Fixed) {
        return Err(usage(
            "--max-retry-delay applies only to exponential backoff, not --backoff fixed",
        ));
    }
    if args.rate_limit_burst.is_some() && args.rate_limit_per_second.is_none() {
        return Err(usage(
            "--rate-limit-burst needs --rate-limit-per-second (the burst is an allowance \
             above a rate)",
        ));
    }
    Ok(())
}

/// The whole webhook channel configuration; unset settings go as zero or unset, central's
/// defaults.
pub(crate) fn webhook_request(args: WebhookSetArgs) -> Result<v1::UpsertWebhookConfigRequest> {
    check_webhook(&args)?;
    Ok(v1::UpsertWebhookConfigRequest {
        timeout: args.post_timeout.map(to_duration),
        max_retries: args.max_retries.unwrap_or(0),
        retry_delay: args.retry_delay.map(to_duration),
        backoff: args
            .backoff
            .map_or(v1::RetryBackoff::Unspecified, BackoffArg::proto)
            .into(),
        max_retry_delay: args.max_retry_delay.map(to_duration),
        max_concurrent_connections: args.max_connections.unwrap_or(0),
        rate_limit_per_second: args.rate_limit_per_second,
        rate_limit_burst: args.rate_limit_burst.unwrap_or(0),
    })
}

fn first_given<'a>(flags: &[(&'a str, bool)]) -> Option<&'a str> {
    flags
        .iter()
        .find(|(_, given)| *given)
        .map(|(flag, _)| *flag)
}

fn usage(message: impl Into<String>) -> CliError {
    CliError::Usage(message.into())
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::time::Duration;

    use super::*;
    use crate::args::channel::{TlsArg, WebhookFormatArg};

    /// A test's stdin and environment; counts stdin reads to prove there is at most one.
    #[derive(Default)]
    struct Given {
        stdin: Option<&'static str>,
        env: HashMap<&'static str, &'static str>,
        stdin_reads: Vec<&'static str>,
    }

    impl Given {
        fn stdin(line: &'static str) -> Self {
            Self {
                stdin: Some(line),
                ..Self::default()
            }
        }

        fn env(var: &'static str, value: &'static str) -> Self {
            Self {
                env: HashMap::from([(var, value)]),
                ..Self::default()
            }
        }
    }

    impl Secrets for Given {
        fn stdin(&mut self, flag: &'static str) -> Result<String> {
            self.stdin_reads.push(flag);
            self.stdin
                .map(str::to_owned)
                .ok_or_else(|| usage(format!("{flag}: stdin gave an empty secret")))
        }

        fn env(&self, var: &'static str) -> Option<String> {
            self.env.get(var).map(|v| (*v).to_owned())
        }
    }

    fn smtp_args() -> SmtpSetArgs {
        SmtpSetArgs {
            host: "relay.example.test".into(),
            port: 587,
            tls: TlsArg::Starttls,
            from_address: "outbox@example.test".into(),
            auth: None,
            username: Some("relay-user".into()),
            password_stdin: false,
            oauth_token_url: None,
            oauth_client_id: None,
            oauth_scope: None,
            oauth_client_secret_stdin: false,
            max_retries: None,
            retry_delay: Some(Duration::from_secs(90)),
            backoff: None,
            max_retry_delay: None,
            max_connections: None,
            rate_limit_per_second: None,
            rate_limit_burst: None,
            session_timeout: None,
            overall_timeout: None,
            fallback_relays: Vec::new(),
        }
    }

    fn xoauth2_args() -> SmtpSetArgs {
        SmtpSetArgs {
            auth: Some(AuthArg::Xoauth2),
            username: Some("outbox@plant.test".into()),
            oauth_token_url: Some("https://login.example.test/token".into()),
            oauth_client_id: Some("client-1".into()),
            oauth_scope: Some("smtp".into()),
            ..smtp_args()
        }
    }

    fn list_args(kind: ChannelArg) -> ListSetArgs {
        ListSetArgs {
            name: "hooks".into(),
            kind,
            recipients: vec![],
            endpoints: vec![],
            fallback_urls: vec![],
            status_callback_url: None,
            webhook_format: None,
            webhook_secret_stdin: false,
            clear_webhook_secret: false,
            consolidate_threshold: None,
            consolidate_window: None,
            consolidate_max_per_digest: None,
            escalate_after: None,
            escalation_steps: vec![],
            escalation_priorities: vec![],
            escalation_repeat: None,
            escalation_repeat_from: None,
            no_escalate_on_park: false,
            escalation_notify_acknowledgement: false,
            escalation_reminder: None,
        }
    }

    #[test]
    fn escalation_is_sent_with_escalate_after_and_refused_without_it() {
        let mut args = list_args(ChannelArg::Email);
        args.recipients = vec!["shift@plant.test".into()];
        args.escalation_steps = vec![(vec!["supervisors".into()], Duration::from_secs(900))];
        let refused = usage_message(list_request(args, &mut Given::default()));
        assert!(
            refused.contains("--escalation-step needs --escalate-after"),
            "{refused}"
        );

        let mut args = list_args(ChannelArg::Email);
        args.recipients = vec!["shift@plant.test".into()];
        args.escalate_after = Some(Duration::from_secs(600));
        args.escalation_steps = vec![(
            vec!["supervisors".into(), "manager".into()],
            Duration::from_secs(900),
        )];
        args.escalation_repeat = Some(2);
        args.no_escalate_on_park = true;
        let sent = list_request(args, &mut Given::default())
            .unwrap()
            .list
            .unwrap();
        let escalation = sent.escalation.unwrap();
        assert_eq!(
            escalation.acknowledge_within,
            Some(to_duration(Duration::from_secs(600)))
        );
        assert_eq!(escalation.steps[0].notify, ["supervisors", "manager"]);
        assert_eq!(escalation.repeat, 2);
        assert_eq!(escalation.escalate_on_park, Some(false));
        // Without the flags, the list is stored without escalation.
        let mut args = list_args(ChannelArg::Email);
        args.recipients = vec!["shift@plant.test".into()];
        assert!(
            list_request(args, &mut Given::default())
                .unwrap()
                .list
                .unwrap()
                .escalation
                .is_none()
        );
    }

    fn usage_message(result: Result<impl std::fmt::Debug>) -> String {
        let err = result.unwrap_err();
        assert_eq!(err.exit_code(), 2, "{err}");
        err.to_string()
    }

    #[test]
    fn smtp_set_sends_the_env_password_only_with_a_username() {
        let mut env = Given::env(PASSWORD_ENV, "pw");
        let request = smtp_request(smtp_args(), &mut env).unwrap();
        assert_eq!(request.password.as_deref(), Some("pw"));
        assert_eq!(request.auth_mechanism(), v1::SmtpAuthMechanism::Password);
        assert_eq!(request.tls_mode(), v1::SmtpTlsMode::Starttls);
        assert_eq!(request.retry_delay.unwrap().seconds, 90);
        assert_eq!(request.max_retries, 0, "0 asks for central's default");
        assert_eq!(request.backoff(), v1::RetryBackoff::Unspecified);
        assert_eq!(request.rate_limit_per_second, None, "no rate limit");

        let no_user = SmtpSetArgs {
            username: None,
            ..smtp_args()
        };
        let request = smtp_request(no_user, &mut env).unwrap();
        assert_eq!(request.password, None);
        assert_eq!(request.username, "");
        assert_eq!(request.auth_mechanism(), v1::SmtpAuthMechanism::None);
    }

    #[test]
    fn smtp_set_without_a_password_keeps_the_stored_one() {
        let request = smtp_request(smtp_args(), &mut Given::default()).unwrap();
        assert_eq!(request.password, None);
    }

    #[test]
    fn xoauth2_takes_the_client_secret_from_stdin_or_env_and_never_the_password() {
        let mut given = Given::env(PASSWORD_ENV, "relay-pw");
        given
            .env
            .insert(OAUTH_CLIENT_SECRET_ENV, "env-client-secret");
        let request = smtp_request(xoauth2_args(), &mut given).unwrap();
        assert_eq!(request.auth_mechanism(), v1::SmtpAuthMechanism::Xoauth2);
        assert_eq!(
            request.oauth_client_secret.as_deref(),
            Some("env-client-secret")
        );
        assert_eq!(request.password, None, "the password is not XOAUTH2's");
        assert_eq!(request.username, "outbox@plant.test");
        assert_eq!(request.oauth_token_url, "https://login.example.test/token");
        assert_eq!(request.oauth_client_id, "client-1");
        assert_eq!(request.oauth_scope, "smtp");

        let mut stdin = Given::stdin("stdin-client-secret");
        stdin
            .env
            .insert(OAUTH_CLIENT_SECRET_ENV, "env-client-secret");
        let args = SmtpSetArgs {
            oauth_client_secret_stdin: true,
            ..xoauth2_args()
        };
        let request = smtp_request(args, &mut stdin).unwrap();
        assert_eq!(
            request.oauth_client_secret.as_deref(),
            Some("stdin-client-secret"),
            "stdin wins over the environment"
        );
        assert_eq!(stdin.stdin_reads, ["--oauth-client-secret-stdin"]);

        let request = smtp_request(xoauth2_args(), &mut Given::default()).unwrap();
        assert_eq!(request.oauth_client_secret, None, "keeps the stored one");
    }

    #[test]
    fn the_client_secret_env_is_ignored_without_xoauth2() {
        let mut given = Given::env(OAUTH_CLIENT_SECRET_ENV, "env-client-secret");
        let request = smtp_request(smtp_args(), &mut given).unwrap();
        assert_eq!(request.oauth_client_secret, None);
    }

    #[test]
    fn backoff_rate_limit_and_overall_timeout_are_sent() {
        let args = SmtpSetArgs {
            backoff: Some(BackoffArg::Exponential),
            max_retry_delay: Some(Duration::from_secs(3600)),
            rate_limit_per_second: Some(2.5),
            rate_limit_burst: Some(5),
            overall_timeout: Some(Duration::from_secs(120)),
            ..smtp_args()
        };
        let request = smtp_request(args, &mut Given::default()).unwrap();
        assert_eq!(request.backoff(), v1::RetryBackoff::Exponential);
        assert_eq!(request.max_retry_delay.unwrap().seconds, 3600);
        assert_eq!(request.rate_limit_per_second, Some(2.5));
        assert_eq!(request.rate_limit_burst, 5);
        assert_eq!(request.overall_timeout.unwrap().seconds, 120);
    }

    #[test]
    fn two_secrets_on_one_stdin_are_refused_before_reading_it() {
        let args = SmtpSetArgs {
            password_stdin: true,
            oauth_client_secret_stdin: true,
            ..xoauth2_args()
        };
        let mut given = Given::stdin("whatever");
        let message = usage_message(smtp_request(args, &mut given));
        assert!(message.contains("can be read only once"), "{message}");
        assert!(given.stdin_reads.is_empty(), "stdin was read");
    }

    #[test]
    fn flags_that_do_not_fit_the_mechanism_are_usage_errors() {
        let cases = [
            (
                SmtpSetArgs {
                    auth: Some(AuthArg::None),
                    ..smtp_args()
                },
                "--auth none takes no --username",
            ),
            (
                SmtpSetArgs {
                    auth: Some(AuthArg::Password),
                    username: None,
                    ..smtp_args()
                },
                "--auth password needs --username",
            ),
            (
                SmtpSetArgs {
                    oauth_token_url: None,
                    oauth_client_id: None,
                    ..xoauth2_args()
                },
                "--auth xoauth2 needs --oauth-token-url, --oauth-client-id",
            ),
            (
                SmtpSetArgs {
                    password_stdin: true,
                    ..xoauth2_args()
                },
                "--password-stdin is for --auth password",
            ),
            (
                SmtpSetArgs {
                    oauth_scope: Some("smtp".into()),
                    ..smtp_args()
                },
                "--oauth-scope applies only with --auth xoauth2",
            ),
            (
                SmtpSetArgs {
                    max_retry_delay: Some(Duration::from_secs(60)),
                    backoff: Some(BackoffArg::Fixed),
                    ..smtp_args()
                },
                "--max-retry-delay applies only with --backoff exponential",
            ),
            (
                SmtpSetArgs {
                    rate_limit_burst: Some(10),
                    ..smtp_args()
                },
                "--rate-limit-burst needs --rate-limit-per-second",
            ),
        ];
        for (args, want) in cases {
            let message = usage_message(smtp_auth(&args));
            assert!(message.starts_with(want), "{message}");
        }
    }

    #[test]
    fn any_list_may_name_a_status_callback_and_leaving_it_out_removes_it() {
        let args = ListSetArgs {
            recipients: vec!["ops@example.test".into()],
            status_callback_url: Some("https://erp.example.test/status".into()),
            ..list_args(ChannelArg::Email)
        };
        let list = list_request(args, &mut Given::default())
            .unwrap()
            .list
            .unwrap();
        assert_eq!(list.status_callback_url, "https://erp.example.test/status");
        let args = ListSetArgs {
            recipients: vec!["ops@example.test".into()],
            ..list_args(ChannelArg::Email)
        };
        let list = list_request(args, &mut Given::default())
            .unwrap()
            .list
            .unwrap();
        assert_eq!(
            list.status_callback_url, "",
            "a set replaces the whole list"
        );
    }

    #[test]
    fn webhook_lists_take_endpoints_format_and_a_secret_from_stdin() {
        let args = ListSetArgs {
            endpoints: vec!["https://hooks.example.test/a".into()],
            fallback_urls: vec!["https://backup.example.test/a".into()],
            webhook_format: Some(WebhookFormatArg::Slack),
            webhook_secret_stdin: true,
            ..list_args(ChannelArg::Webhook)
        };
        let mut given = Given::stdin("0123456789abcdef-signing");
        given.env.insert(WEBHOOK_SECRET_ENV, "from-the-environment");
        let request = list_request(args, &mut given).unwrap();
        let list = request.list.unwrap();
        assert_eq!(list.r#type(), v1::NotificationType::Webhook);
        assert_eq!(list.endpoints, ["https://hooks.example.test/a"]);
        assert_eq!(list.fallback_urls, ["https://backup.example.test/a"]);
        assert_eq!(list.webhook_format(), v1::WebhookFormat::Slack);
        assert_eq!(
            list.webhook_secret.as_deref(),
            Some("0123456789abcdef-signing")
        );
        assert!(list.recipients.is_empty());
    }

    #[test]
    fn webhook_secret_unset_keeps_clear_removes_env_sets() {
        let keep = list_request(list_args(ChannelArg::Webhook), &mut Given::default()).unwrap();
        assert_eq!(keep.list.unwrap().webhook_secret, None);

        let mut env = Given::env(WEBHOOK_SECRET_ENV, "from-the-environment");
        let set = list_request(list_args(ChannelArg::Webhook), &mut env).unwrap();
        assert_eq!(
            set.list.unwrap().webhook_secret.as_deref(),
            Some("from-the-environment")
        );

        let clear = ListSetArgs {
            clear_webhook_secret: true,
            ..list_args(ChannelArg::Webhook)
        };
        let cleared = list_request(clear, &mut env).unwrap();
        assert_eq!(
            cleared.list.unwrap().webhook_secret.as_deref(),
            Some(""),
            "an explicit clear wins over the environment"
        );
    }

    #[test]
    fn email_lists_ignore_the_webhook_secret_env_and_refuse_webhook_flags() {
        let email = ListSetArgs {
            recipients: vec!["ops@plant.test".into()],
            ..list_args(ChannelArg::Email)
        };
        let mut env = Given::env(WEBHOOK_SECRET_ENV, "from-the-environment");
        let request = list_request(email, &mut env).unwrap();
        let list = request.list.unwrap();
        assert_eq!(list.webhook_secret, None);
        assert_eq!(list.webhook_format(), v1::WebhookFormat::Unspecified);

        let with_endpoint = ListSetArgs {
            endpoints: vec!["https://hooks.example.test/a".into()],
            ..list_args(ChannelArg::Email)
        };
        let message = usage_message(check_list(&with_endpoint));
        assert_eq!(
            message,
            "--endpoint is for webhook lists: add --type webhook"
        );
        let with_recipient = ListSetArgs {
            recipients: vec!["ops@plant.test".into()],
            ..list_args(ChannelArg::Webhook)
        };
        let message = usage_message(check_list(&with_recipient));
        assert!(
            message.starts_with("--recipient is for email lists"),
            "{message}"
        );
    }

    #[test]
    fn consolidation_is_sent_with_all_three_flags_and_off_without_them() {
        let args = ListSetArgs {
            recipients: vec!["ops@plant.test".into()],
            consolidate_threshold: Some(20),
            consolidate_window: Some(Duration::from_secs(60)),
            consolidate_max_per_digest: Some(100),
            ..list_args(ChannelArg::Email)
        };
        let list = list_request(args, &mut Given::default())
            .unwrap()
            .list
            .unwrap();
        let c = list.consolidation.unwrap();
        assert_eq!((c.threshold, c.max_per_digest), (20, 100));
        assert_eq!(c.window.unwrap().seconds, 60);

        let off = list_request(list_args(ChannelArg::Webhook), &mut Given::default()).unwrap();
        assert_eq!(off.list.unwrap().consolidation, None, "set replaces: off");
    }

    #[test]
    fn a_partial_set_of_consolidation_flags_is_refused_naming_the_missing_ones() {
        let only_threshold = ListSetArgs {
            consolidate_threshold: Some(20),
            ..list_args(ChannelArg::Email)
        };
        let message = usage_message(check_list(&only_threshold));
        assert!(
            message.ends_with(
                "add --consolidate-window and --consolidate-max-per-digest (or drop the \
                 others to turn it off)"
            ),
            "{message}"
        );
        assert!(!message.contains('\n'), "one line: {message}");
        let no_max = ListSetArgs {
            consolidate_threshold: Some(20),
            consolidate_window: Some(Duration::from_secs(60)),
            endpoints: vec!["https://hooks.example.test/a".into()],
            webhook_secret_stdin: true,
            ..list_args(ChannelArg::Webhook)
        };
        let mut given = Given::stdin("0123456789abcdef-signing");
        let message = usage_message(list_request(no_max, &mut given));
        assert!(
            message.contains("add --consolidate-max-per-digest ("),
            "{message}"
        );
        assert!(given.stdin_reads.is_empty(), "refused before reading stdin");
    }
}
