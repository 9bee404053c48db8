//! Every channel setting is safe whatever its value (issue 33, build item 4). A property test
//! draws values for every setting of both channels and of the lists: the SMTP relay (host, port,
//! TLS mode, sender, authentication), timeouts, retries, delays, backoff, connections, rate
//! limit and burst, the webhook channel's pacing, email and webhook lists (names, recipients,
//! endpoints, fallback URLs, formats, signing secrets, flood consolidation). Each value goes to
//! one central, running for the whole run, through the admin API over a real gRPC socket, and
//! the same value, written into a config file, through the config loader.
//!
//! Each draw is judged by the test's own model of the bounds docs/configuration.md states: the
//! fields out of bounds. Out of bounds, the answer must be INVALID_ARGUMENT whose message starts
//! with one of those fields (the config loader: an error naming one of those keys), and nothing
//! may change. Within bounds, the setting must be stored exactly as the model normalises it
//! (unset fields at their defaults) and read back so (the config: converted so), and then work:
//! a notification is sent through it. After the run, with sane settings restored, both channels
//! deliver to the real SMTP sink and webhook receiver, every notification sent during the run has
//! reached a final status or waits for a time its policy set (a retry, a consolidation window),
//! none is left pending, and no supervised task restarted (`outbox_task_restarts_total` 0).
//! Nothing panics or wedges on the way.
//!
//! The values are drawn at the bounds and beyond (each bound and one step past it, zero, the
//! largest numbers, NaN and infinities, negative and malformed protobuf durations, sub-millisecond
//! ones, control characters, over-long text), among ordinary ones. A fixed number of cases and a
//! fixed seed, so a run takes seconds and a failure replays.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use central_outbox::config::{Config as CentralConfig, ListConfig, Overrides, WebhookFormatKind};
use central_outbox::domain::channel::{ListTargets, SmtpAuth, TlsMode};
use central_outbox::domain::retry::Backoff;
use central_outbox::domain::webhook::WebhookFormat;
use outbox_proto::time::from_duration;
use outbox_proto::v1;
use outbox_proto::v1::notification_ingest_client::NotificationIngestClient;
use outbox_proto::v1::notification_outbox_client::NotificationOutboxClient;
use outbox_tests::smtp_sink::SmtpSink;
use outbox_tests::webhook_server::WebhookServer;
use proptest::prelude::*;
use proptest::test_runner::{Config, RngAlgorithm, TestCaseError, TestRng, TestRunner};
use tonic::Code;
use tonic::transport::Channel;

use crate::harness::{Central, DEADLINE, LIST, central_config, eventually, free_addr, submit};

/// Cases per run: every kind of input drawn many times over, in a few seconds. `PROPTEST_CASES`
/// asks for more (the same seed: the first cases are these).
const CASES: u32 = 96;

/// The webhook list the channel cases send through (the list cases may change it too).
const HOOK_LIST: &str = "prop-hook";

/// The key `central_config` configures, for the config files the loader reads.
const SECRETS_KEY: &str = "b3V0Ym94LXRlc3Qtc2VjcmV0cy1rZXktMzItYnl0ZXM=";

// The bounds as docs/configuration.md ("What a channel setting may hold") states them: the
// model's own copy, so a bound changed in the code without the docs (or the other way round) fails
// here.
const MIN_RATE: f64 = 0.001;
const MAX_RATE: f64 = 100_000.0;
const MAX_BURST: u32 = 100_000;
const MAX_RETRIES: u32 = 1_000;
const MAX_RETRY_DELAY: Duration = Duration::from_secs(24 * 3600);
const MAX_CONNECTIONS: u32 = 256;
const MAX_TIMEOUT: Duration = Duration::from_secs(600);
const MAX_OVERALL_TIMEOUT: Duration = Duration::from_secs(3600);
const MAX_THRESHOLD: u32 = 100_000;
const MIN_WINDOW: Duration = Duration::from_secs(1);
const MAX_WINDOW: Duration = Duration::from_secs(12 * 3600);
const MAX_PER_DIGEST: u32 = 500;
const MAX_TARGETS: usize = 1000;
/// Most fallback URLs one webhook list may name.
const MAX_FALLBACK_URLS: usize = 4;
const MAX_FALLBACK_RELAYS: usize = 4;
// The defaults an unset field takes (docs/configuration.md, "the database wins").
const DEFAULT_RETRIES: u32 = 10;
const DEFAULT_RETRY_DELAY: Duration = Duration::from_secs(60);
const DEFAULT_MAX_RETRY_DELAY: Duration = Duration::from_secs(3600);
const SMTP_DEFAULT_CONNECTIONS: u32 = 4;
const WEBHOOK_DEFAULT_CONNECTIONS: u32 = 8;
const SMTP_DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);
const SMTP_DEFAULT_OVERALL_TIMEOUT: Duration = Duration::from_secs(120);
const WEBHOOK_DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

// ---------------------------------------------------------------------------------------------
// What a client may send.

/// A protobuf duration as a client may send it: any seconds, any nanos.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Span {
    seconds: i64,
    nanos: i32,
}

/// What a [`Span`] stands for.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Meaning {
    /// Zero: "unset" on the wire, so the default.
    Unset,
    /// Negative, or nanos outside 0..1e9: no duration at all.
    Malformed,
    Value(Duration),
}

impl Span {
    const ZERO: Self = Self {
        seconds: 0,
        nanos: 0,
    };

    fn of(d: Duration) -> Self {
        Self {
            seconds: i64::try_from(d.as_secs()).unwrap(),
            nanos: i32::try_from(d.subsec_nanos()).unwrap(),
        }
    }

    fn meaning(self) -> Meaning {
        if self == Self::ZERO {
            Meaning::Unset
        } else {
            self.value().map_or(Meaning::Malformed, Meaning::Value)
        }
    }

    /// The duration it holds, zero included.
    fn value(self) -> Option<Duration> {
        let seconds = u64::try_from(self.seconds).ok()?;
        let nanos = u32::try_from(self.nanos)
            .ok()
            .filter(|n| *n < 1_000_000_000)?;
        Some(Duration::new(seconds, nanos))
    }

    fn wire(self) -> Option<prost_types::Duration> {
        Some(prost_types::Duration {
            seconds: self.seconds,
            nanos: self.nanos,
        })
    }

    /// As a config file value: a humantime string. A malformed span has no such form: it is
    /// written as a string the loader cannot read, which it must refuse naming the key.
    fn toml(self) -> String {
        match self.value() {
            Some(d) => toml_str(&humantime::format_duration(d).to_string()),
            None => toml_str("-1s"),
        }
    }
}

/// Whole milliseconds: what the stores keep of a duration.
fn whole_millis(d: Duration) -> bool {
    d.subsec_nanos().is_multiple_of(1_000_000)
}

/// How a case draws its values: `Tame` from within the bounds (so that settings get stored and
/// then used), `Wild` from anywhere, at the bounds and past them. Cases come both ways: drawn
/// wild field by field, nearly every case would be refused for one field or another.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Draw {
    Tame,
    Wild,
}

fn span(draw: Draw) -> BoxedStrategy<Span> {
    let millis = (1u64..=120_000).prop_map(|ms| Span::of(Duration::from_millis(ms)));
    match draw {
        Draw::Tame => prop_oneof![1 => Just(Span::ZERO), 3 => millis].boxed(),
        Draw::Wild => prop_oneof![
            3 => Just(Span::ZERO),
            4 => millis,
            2 => prop::sample::select(vec![1u64, 599, 600, 601, 3600, 3601, 43_200, 86_400, 86_401])
                .prop_map(|s| Span::of(Duration::from_secs(s))),
            1 => (0i64..=3, 1i32..1_000_000).prop_map(|(seconds, nanos)| Span { seconds, nanos }),
            2 => (any::<i64>(), any::<i32>()).prop_map(|(seconds, nanos)| Span { seconds, nanos }),
        ]
        .boxed(),
    }
}

/// A pacing and retry policy, as both channels' requests carry it.
#[derive(Debug, Clone)]
struct PolicyInput {
    max_retries: u32,
    retry_delay: Span,
    backoff: i32,
    max_retry_delay: Span,
    connections: u32,
    rate: Option<f64>,
    burst: u32,
}

fn rate(draw: Draw) -> BoxedStrategy<Option<f64>> {
    let within = prop_oneof![
        2 => (MIN_RATE..=MAX_RATE).prop_map(Some),
        1 => prop::sample::select(vec![MIN_RATE, MAX_RATE, 0.5, 10.0]).prop_map(Some),
    ];
    match draw {
        Draw::Tame => prop_oneof![1 => Just(None), 1 => within].boxed(),
        Draw::Wild => prop_oneof![
            3 => Just(None),
            3 => within,
            3 => prop::sample::select(vec![
                0.000_999_9, 100_000.01, 0.0, -0.0, -1.0, 1e-30, 1e30,
                f64::NAN, f64::INFINITY, f64::NEG_INFINITY, f64::MIN_POSITIVE,
            ])
            .prop_map(Some),
            1 => any::<f64>().prop_map(Some),
        ]
        .boxed(),
    }
}

fn policy(draw: Draw) -> BoxedStrategy<PolicyInput> {
    let (max_retries, backoff, connections, burst) = match draw {
        Draw::Tame => (
            (0..=MAX_RETRIES).boxed(),
            (0i32..=2).boxed(),
            (0..=MAX_CONNECTIONS).boxed(),
            prop_oneof![1 => Just(0u32), 1 => 1..=MAX_BURST].boxed(),
        ),
        Draw::Wild => (
            prop_oneof![2 => Just(0u32), 3 => 1..=MAX_RETRIES, 1 => Just(MAX_RETRIES + 1), 1 => any::<u32>()].boxed(),
            prop_oneof![5 => 0i32..=2, 1 => any::<i32>()].boxed(),
            prop_oneof![2 => Just(0u32), 3 => 1..=MAX_CONNECTIONS, 1 => Just(MAX_CONNECTIONS + 1), 1 => any::<u32>()].boxed(),
            prop_oneof![4 => Just(0u32), 2 => 1..=MAX_BURST, 1 => Just(MAX_BURST + 1), 1 => any::<u32>()].boxed(),
        ),
    };
    (
        max_retries,
        span(draw),
        backoff,
        span(draw),
        connections,
        rate(draw),
        burst,
    )
        .prop_map(
            move |(
                max_retries,
                retry_delay,
                backoff,
                max_retry_delay,
                connections,
                rate,
                burst,
            )| {
                PolicyInput {
                    max_retries,
                    retry_delay,
                    backoff,
                    max_retry_delay,
                    connections,
                    // Tame: a burst only with a rate, as the bounds want.
                    burst: if draw == Draw::Tame && rate.is_none() {
                        0
                    } else {
                        burst
                    },
                    rate,
                }
            },
        )
        .boxed()
}

/// A value from a pool the test labels valid or not by hand: the model's knowledge of rules
/// (addresses, URLs, names) that are not numeric bounds.
#[derive(Debug, Clone)]
struct Labelled {
    text: String,
    valid: bool,
}

fn labelled(valid: &[String], invalid: &[String], draw: Draw) -> BoxedStrategy<Labelled> {
    let label = |texts: &[String], valid: bool| -> Vec<Labelled> {
        texts
            .iter()
            .map(|text| Labelled {
                text: text.clone(),
                valid,
            })
            .collect()
    };
    let (good, bad) = (label(valid, true), label(invalid, false));
    match draw {
        Draw::Tame => prop::sample::select(good).boxed(),
        Draw::Wild => {
            prop_oneof![3 => prop::sample::select(good), 1 => prop::sample::select(bad)].boxed()
        }
    }
}

fn strings(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| (*s).to_owned()).collect()
}

/// The places the test's servers listen, and a port nothing listens on.
#[derive(Debug, Clone)]
struct Places {
    smtp: SocketAddr,
    hooks: SocketAddr,
    closed_port: u16,
}

impl Places {
    fn addresses() -> (Vec<String>, Vec<String>) {
        (
            strings(&[
                "ops@plant.example.test",
                "night.desk+alarms@plant.example.test",
                "UPPER@Example.TEST",
            ]),
            vec![
                String::new(),
                "no-at-sign".into(),
                "a b@plant.example.test".into(),
                "a@plant..test".into(),
                "a@plant.test\r\nBcc: x@evil.test".into(),
                format!("{}@plant.example.test", "a".repeat(250)),
            ],
        )
    }

    /// Relay hosts with whether each is this machine. Only addresses that answer (or refuse) at
    /// once: no name needs DNS, and no address lets a connection hang.
    fn hosts(&self) -> Vec<(Labelled, bool)> {
        let host = |text: &str, valid: bool, loopback: bool| {
            (
                Labelled {
                    text: text.to_owned(),
                    valid,
                },
                loopback,
            )
        };
        vec![
            host(&self.smtp.ip().to_string(), true, true),
            host(&self.smtp.ip().to_string(), true, true),
            host("localhost", true, true),
            host("LOCALHOST", true, true),
            host("::1", true, true),
            // Not loopback by its name, but a connection to it reaches this machine at once.
            host("0.0.0.0", true, false),
            host("", false, false),
            host("   ", false, false),
            host("re lay", false, false),
            host("relay\u{0}.test", false, false),
            host("\trelay", false, false),
            host(&"h".repeat(254), false, false),
            host(&"h".repeat(253), true, false),
        ]
    }

    /// Relay ports: the first ones valid.
    fn ports(&self) -> Vec<u32> {
        vec![
            u32::from(self.smtp.port()),
            u32::from(self.smtp.port()),
            u32::from(self.closed_port),
            1,
            65_535,
            0,
            65_536,
            u32::MAX,
        ]
    }

    fn token_urls(&self) -> (Vec<String>, Vec<String>) {
        let closed = self.closed_port;
        (
            vec![
                format!("http://127.0.0.1:{closed}/token"),
                format!("http://localhost:{closed}/token"),
                format!("https://127.0.0.1:{closed}/oauth2/v2.0/token"),
            ],
            vec![
                String::new(),
                "not a url".into(),
                format!("ftp://127.0.0.1:{closed}/token"),
                "http://10.1.2.3/token".into(),
            ],
        )
    }

    fn endpoints(&self) -> (Vec<String>, Vec<String>) {
        let (hooks, closed) = (self.hooks, self.closed_port);
        (
            vec![
                format!("http://{hooks}/hook"),
                format!("http://{hooks}/other"),
                format!("http://localhost:{}/hook", hooks.port()),
                format!("https://127.0.0.1:{closed}/x"),
            ],
            vec![
                "http://10.1.2.3/x".into(),
                format!("ftp://127.0.0.1:{closed}/x"),
                "not a url".into(),
                format!("https://user:pw@127.0.0.1:{closed}/x"),
                format!("https://127.0.0.1:{closed}/{}", "a".repeat(2100)),
            ],
        )
    }
}

/// SMTP authentication as the request carries it.
#[derive(Debug, Clone)]
struct AuthInput {
    mechanism: i32,
    username: String,
    password: Option<String>,
    token_url: Labelled,
    client_id: String,
    client_secret: Option<String>,
}

#[derive(Debug, Clone)]
struct SmtpInput {
    host: (Labelled, bool),
    port: u32,
    tls_mode: i32,
    from: Labelled,
    auth: AuthInput,
    timeout: Span,
    overall_timeout: Span,
    policy: PolicyInput,
    fallback_relays: Vec<RelayInput>,
}

/// A fallback relay as the admin gives it: a host, a port and a TLS mode.
#[derive(Debug, Clone)]
struct RelayInput {
    host: Labelled,
    port: u32,
    tls_mode: i32,
}

#[derive(Debug, Clone)]
struct WebhookInput {
    timeout: Span,
    policy: PolicyInput,
}

#[derive(Debug, Clone)]
struct ConsolidationInput {
    threshold: u32,
    window: Option<Span>,
    max_per_digest: u32,
}

#[derive(Debug, Clone)]
struct ListInput {
    name: Labelled,
    kind: i32,
    recipients: Vec<Labelled>,
    endpoints: Vec<Labelled>,
    /// Webhook lists: fallback URLs, in order.
    fallbacks: Vec<Labelled>,
    format: i32,
    secret: Option<String>,
    consolidation: Option<ConsolidationInput>,
}

/// One case: a change to one of the four things an admin sets.
#[derive(Debug, Clone)]
enum Case {
    Smtp(SmtpInput),
    Webhook(WebhookInput),
    List(ListInput),
}

fn auth(places: &Places, draw: Draw) -> BoxedStrategy<AuthInput> {
    let (urls, bad_urls) = places.token_urls();
    let valid_url = Labelled {
        text: urls[0].clone(),
        valid: true,
    };
    if draw == Draw::Tame {
        let auth =
            |mechanism, username: &str, password: Option<&str>, secret: Option<&str>| AuthInput {
                mechanism,
                username: username.into(),
                password: password.map(Into::into),
                token_url: valid_url.clone(),
                client_id: "outbox-client".into(),
                client_secret: secret.map(Into::into),
            };
        let user = "outbox@plant.example.test";
        return prop::sample::select(vec![
            auth(0, "", None, None),
            auth(1, "", None, None),
            auth(2, user, Some("pw-0123456789"), None),
            auth(0, user, Some("pw-0123456789"), None),
            // Keeps the stored password: refused unless one is stored for this user and relay.
            auth(2, user, None, None),
            auth(3, user, None, Some("client-secret-42")),
            auth(3, user, None, None),
        ])
        .boxed();
    }
    (
        prop_oneof![8 => 0i32..=3, 1 => any::<i32>()],
        prop::sample::select(vec![
            String::new(),
            "outbox@plant.example.test".into(),
            "outbox@plant.example.test".into(),
            "   ".into(),
            "u".repeat(256),
            "u".repeat(257),
        ]),
        prop::sample::select(vec![
            None,
            None,
            Some(String::new()),
            Some("pw-0123456789".into()),
        ]),
        labelled(&urls, &bad_urls, draw),
        prop::sample::select(vec![
            String::new(),
            "outbox-client".into(),
            "outbox-client".into(),
        ]),
        prop::sample::select(vec![
            None,
            None,
            Some(String::new()),
            Some("client-secret-42".into()),
        ]),
    )
        .prop_map(
            |(mechanism, username, password, token_url, client_id, client_secret)| AuthInput {
                mechanism,
                username,
                password,
                token_url,
                client_id,
                client_secret,
            },
        )
        .boxed()
}

fn smtp(places: &Places, draw: Draw) -> BoxedStrategy<SmtpInput> {
    let (addresses, bad_addresses) = Places::addresses();
    let (hosts, ports, tls_mode) = match draw {
        // Tame: hosts, ports and TLS modes that pass (credentials in clear go to loopback only,
        // and all the valid hosts but 0.0.0.0 are).
        Draw::Tame => (
            places
                .hosts()
                .into_iter()
                .filter(|(host, loopback)| host.valid && *loopback)
                .collect(),
            places.ports()[..5].to_vec(),
            (1i32..=3).boxed(),
        ),
        Draw::Wild => (
            places.hosts(),
            places.ports(),
            prop_oneof![6 => 1i32..=3, 1 => Just(0), 1 => any::<i32>()].boxed(),
        ),
    };
    // Fallback relays: valid ones most of the time (so a count past the bound is judged on its
    // own), any of the hosts, ports and modes otherwise; up to the bound (4) when tame, one past
    // it when wild.
    let relay = |hosts: Vec<Labelled>, ports: Vec<u32>, tls_mode: BoxedStrategy<i32>| {
        (
            prop::sample::select(hosts),
            prop::sample::select(ports),
            tls_mode,
        )
            .prop_map(|(host, port, tls_mode)| RelayInput {
                host,
                port,
                tls_mode,
            })
    };
    let valid_hosts: Vec<Labelled> = places
        .hosts()
        .into_iter()
        .map(|(host, _)| host)
        .filter(|host| host.valid)
        .collect();
    let valid = relay(
        valid_hosts,
        places.ports()[..5].to_vec(),
        (1i32..=3).boxed(),
    );
    let relays = match draw {
        Draw::Tame => prop::collection::vec(valid, 0..=2).boxed(),
        Draw::Wild => {
            let any = relay(
                hosts.iter().map(|(host, _)| host.clone()).collect(),
                ports.clone(),
                tls_mode.clone(),
            );
            prop_oneof![
                3 => prop::collection::vec(valid, 0..=MAX_FALLBACK_RELAYS + 1),
                1 => prop::collection::vec(any, 0..=MAX_FALLBACK_RELAYS + 1),
            ]
            .boxed()
        }
    };
    (
        prop::sample::select(hosts),
        prop::sample::select(ports),
        tls_mode,
        labelled(&addresses, &bad_addresses, draw),
        auth(places, draw),
        span(draw),
        span(draw),
        policy(draw),
        relays,
    )
        .prop_map(
            |(host, port, tls_mode, from, auth, timeout, overall_timeout, policy, relays)| {
                SmtpInput {
                    host,
                    port,
                    tls_mode,
                    from,
                    auth,
                    timeout,
                    overall_timeout,
                    policy,
                    fallback_relays: relays,
                }
            },
        )
        .boxed()
}

fn webhook(draw: Draw) -> BoxedStrategy<WebhookInput> {
    (span(draw), policy(draw))
        .prop_map(|(timeout, policy)| WebhookInput { timeout, policy })
        .boxed()
}

fn consolidation(draw: Draw) -> BoxedStrategy<Option<ConsolidationInput>> {
    let within = (
        1..=MAX_THRESHOLD,
        prop::sample::select(vec![1u64, 60, 300, 43_200])
            .prop_map(|s| Some(Span::of(Duration::from_secs(s)))),
        2..=MAX_PER_DIGEST,
    );
    let settings = match draw {
        Draw::Tame => within.boxed(),
        Draw::Wild => {
            let window = prop_oneof![
                3 => prop::sample::select(vec![1u64, 60, 300, 43_200])
                    .prop_map(|s| Some(Span::of(Duration::from_secs(s)))),
                1 => Just(None),
                2 => prop::sample::select(vec![0u64, 43_201]).prop_map(|s| Some(Span::of(Duration::from_secs(s)))),
                1 => Just(Some(Span::of(Duration::from_millis(1500)))),
                1 => span(Draw::Wild).prop_map(Some),
            ];
            (
                prop_oneof![3 => 1..=MAX_THRESHOLD, 1 => Just(0u32), 1 => Just(MAX_THRESHOLD + 1), 1 => any::<u32>()],
                window,
                prop_oneof![3 => 2..=MAX_PER_DIGEST, 1 => prop::sample::select(vec![0u32, 1, MAX_PER_DIGEST + 1]), 1 => any::<u32>()],
            )
                .boxed()
        }
    };
    prop_oneof![
        2 => Just(None),
        3 => settings.prop_map(|(threshold, window, max_per_digest)| Some(ConsolidationInput {
            threshold,
            window,
            max_per_digest,
        })),
    ]
    .boxed()
}

fn list_names(names: &[&str], draw: Draw) -> BoxedStrategy<Labelled> {
    let mut valid = strings(names);
    // A tab is allowed, as in a subject; other control characters are not.
    valid.push("x".repeat(128));
    valid.push("tab\tname".into());
    labelled(
        &valid,
        &[
            String::new(),
            " leading".into(),
            "trailing ".into(),
            "x".repeat(129),
            "bell\u{7}name".into(),
            "nul\u{0}name".into(),
        ],
        draw,
    )
}

fn email_list(draw: Draw) -> BoxedStrategy<ListInput> {
    let (addresses, bad_addresses) = Places::addresses();
    let (kind, recipients, with_endpoint) = match draw {
        Draw::Tame => (
            (0i32..=1).boxed(),
            prop::collection::vec(labelled(&addresses, &bad_addresses, draw), 1..4).boxed(),
            Just(false).boxed(),
        ),
        Draw::Wild => (
            prop_oneof![4 => 0i32..=1, 1 => Just(7)].boxed(),
            prop_oneof![
                8 => prop::collection::vec(labelled(&addresses, &bad_addresses, draw), 0..4),
                1 => Just(
                    (0..=MAX_TARGETS)
                        .map(|i| Labelled {
                            text: format!("member{i}@plant.example.test"),
                            valid: true,
                        })
                        .collect()
                ),
            ]
            .boxed(),
            prop_oneof![8 => Just(false), 1 => Just(true)].boxed(),
        ),
    };
    (
        list_names(&["prop-mail", "prop-mail", "Prop Mail 2"], draw),
        kind,
        recipients,
        with_endpoint,
        consolidation(draw),
    )
        .prop_map(
            |(name, kind, recipients, with_endpoint, consolidation)| ListInput {
                name,
                kind,
                recipients,
                endpoints: if with_endpoint {
                    vec![Labelled {
                        text: "https://127.0.0.1:9/x".into(),
                        valid: true,
                    }]
                } else {
                    Vec::new()
                },
                fallbacks: Vec::new(),
                format: 0,
                secret: None,
                consolidation,
            },
        )
        .boxed()
}

fn webhook_list(places: &Places, draw: Draw) -> BoxedStrategy<ListInput> {
    let (endpoints, bad_endpoints) = places.endpoints();
    let secrets = |tame: bool| {
        let mut secrets = vec![
            None,
            None,
            Some(String::new()),
            Some("hook-secret-0123456789".into()),
        ];
        if !tame {
            secrets.push(Some("too-short".into()));
        }
        prop::sample::select(secrets)
    };
    // Most lists have none; a few as many as allowed, or one more.
    let fallbacks = prop_oneof![
        3 => Just(Vec::new()),
        2 => prop::collection::vec(labelled(&endpoints, &bad_endpoints, draw), 1..3),
        1 => prop::collection::vec(labelled(&endpoints, &bad_endpoints, draw), 4..6),
    ];
    let (endpoints, with_recipient, format, secret) = match draw {
        Draw::Tame => (
            prop::collection::vec(labelled(&endpoints, &bad_endpoints, draw), 1..4).boxed(),
            Just(false).boxed(),
            (0i32..=3).boxed(),
            secrets(true),
        ),
        Draw::Wild => (
            prop::collection::vec(labelled(&endpoints, &bad_endpoints, draw), 0..4).boxed(),
            prop_oneof![8 => Just(false), 1 => Just(true)].boxed(),
            prop_oneof![6 => 0i32..=3, 1 => any::<i32>()].boxed(),
            secrets(false),
        ),
    };
    (
        list_names(&[HOOK_LIST, HOOK_LIST], draw),
        (endpoints, fallbacks),
        with_recipient,
        format,
        secret,
        consolidation(draw),
    )
        .prop_map(
            |(name, (endpoints, fallbacks), with_recipient, format, secret, consolidation)| {
                ListInput {
                    name,
                    kind: 2,
                    recipients: if with_recipient {
                        vec![Labelled {
                            text: "ops@plant.example.test".into(),
                            valid: true,
                        }]
                    } else {
                        Vec::new()
                    },
                    endpoints,
                    fallbacks,
                    format,
                    secret,
                    consolidation,
                }
            },
        )
        .boxed()
}

fn case(places: &Places) -> impl Strategy<Value = Case> + use<> {
    let (tame, wild) = (Draw::Tame, Draw::Wild);
    prop_oneof![
        2 => smtp(places, tame).prop_map(Case::Smtp),
        2 => smtp(places, wild).prop_map(Case::Smtp),
        1 => webhook(tame).prop_map(Case::Webhook),
        1 => webhook(wild).prop_map(Case::Webhook),
        1 => email_list(tame).prop_map(Case::List),
        1 => email_list(wild).prop_map(Case::List),
        1 => webhook_list(places, tame).prop_map(Case::List),
        1 => webhook_list(places, wild).prop_map(Case::List),
    ]
}

// ---------------------------------------------------------------------------------------------
// The model: which fields are out of bounds, and what is stored otherwise.

/// The fields out of bounds, by their name in the admin API's requests.
type Bad = BTreeSet<&'static str>;

/// A duration setting: unset takes `default`; malformed, above `max` or finer than a
/// millisecond (the stores keep milliseconds, so it would not read back as given) is out.
fn duration_setting(
    span: Span,
    default: Duration,
    max: Duration,
    field: &'static str,
    bad: &mut Bad,
) -> Duration {
    match span.meaning() {
        Meaning::Unset => default,
        Meaning::Malformed => {
            bad.insert(field);
            default
        }
        Meaning::Value(d) => {
            if d > max || !whole_millis(d) {
                bad.insert(field);
            }
            d
        }
    }
}

/// A policy as the model expects it stored.
#[derive(Debug, Clone, PartialEq)]
struct PolicyModel {
    max_retries: u32,
    retry_delay: Duration,
    /// `None`: fixed; the cap of exponential backoff.
    exponential: Option<Duration>,
    connections: u32,
    rate: Option<(f64, u32)>,
}

fn policy_model(
    p: &PolicyInput,
    exponential_by_default: bool,
    default_connections: u32,
    bad: &mut Bad,
) -> PolicyModel {
    let retry_delay = duration_setting(
        p.retry_delay,
        DEFAULT_RETRY_DELAY,
        MAX_RETRY_DELAY,
        "retry_delay",
        bad,
    );
    let exponential = match p.backoff {
        0 => exponential_by_default,
        1 => false,
        2 => true,
        _ => {
            bad.insert("backoff");
            false
        }
    };
    // A malformed duration is no duration, whatever the backoff; a value counts only as the cap
    // of exponential backoff (with fixed backoff it is not used, and not stored).
    let cap = match p.max_retry_delay.meaning() {
        Meaning::Malformed => {
            bad.insert("max_retry_delay");
            DEFAULT_MAX_RETRY_DELAY
        }
        Meaning::Unset => DEFAULT_MAX_RETRY_DELAY,
        Meaning::Value(d) => {
            if exponential && (d > MAX_RETRY_DELAY || !whole_millis(d)) {
                bad.insert("max_retry_delay");
            }
            d
        }
    };
    if p.max_retries > MAX_RETRIES {
        bad.insert("max_retries");
    }
    if p.connections > MAX_CONNECTIONS {
        bad.insert("max_concurrent_connections");
    }
    let rate = match (p.rate, p.burst) {
        (None, 0) => None,
        (None, _) => {
            bad.insert("rate_limit_burst");
            None
        }
        (Some(rate), burst) => {
            if !(MIN_RATE..=MAX_RATE).contains(&rate) {
                bad.insert("rate_limit_per_second");
            }
            if burst > MAX_BURST {
                bad.insert("rate_limit_burst");
            }
            // Unset: one second's worth.
            let burst = if burst == 0 {
                rate.ceil().clamp(1.0, f64::from(MAX_BURST)) as u32
            } else {
                burst
            };
            Some((rate, burst))
        }
    };
    PolicyModel {
        max_retries: if p.max_retries == 0 {
            DEFAULT_RETRIES
        } else {
            p.max_retries
        },
        retry_delay,
        exponential: exponential.then_some(cap),
        connections: if p.connections == 0 {
            default_connections
        } else {
            p.connections
        },
        rate,
    }
}

#[derive(Debug, Clone, PartialEq)]
enum AuthModel {
    None,
    Password {
        username: String,
    },
    XOAuth2 {
        username: String,
        token_url: String,
        client_id: String,
    },
}

#[derive(Debug, Clone, PartialEq)]
struct SmtpModel {
    host: String,
    port: u32,
    tls_mode: i32,
    from: String,
    auth: AuthModel,
    timeout: Duration,
    overall_timeout: Duration,
    policy: PolicyModel,
    /// Each fallback relay's host, port and TLS mode, in order.
    fallback_relays: Vec<(String, u32, i32)>,
}

/// The relay a stored secret was given for (what the view shows of it).
fn same_relay(stored: Option<&v1::SmtpConfig>, host: &str, port: u32, tls_mode: i32) -> bool {
    stored.is_some_and(|s| {
        s.host.eq_ignore_ascii_case(host) && s.port == port && s.tls_mode == tls_mode
    })
}

fn username_ok(username: &str) -> bool {
    !username.trim().is_empty() && username.len() <= 256
}

/// The model of an SMTP change, given what is stored now (for the secrets it may keep).
fn smtp_model(input: &SmtpInput, stored: Option<&v1::SmtpConfig>) -> (SmtpModel, Bad) {
    let mut bad = Bad::new();
    let (host, loopback) = (&input.host.0, input.host.1);
    if !host.valid {
        bad.insert("host");
    }
    if !(1..=65_535).contains(&input.port) {
        bad.insert("port");
    }
    if !(1..=3).contains(&input.tls_mode) {
        bad.insert("tls_mode");
    }
    if !input.from.valid {
        bad.insert("from_address");
    }
    let a = &input.auth;
    let relay = same_relay(stored, &host.text, input.port, input.tls_mode);
    let stored_mechanism = stored.map(|s| s.auth_mechanism);
    let auth = match a.mechanism {
        0 if a.username.is_empty() => Some(1),
        0 => Some(2),
        m @ 1..=3 => Some(m),
        _ => None,
    };
    let auth = match auth {
        None => {
            bad.insert("auth_mechanism");
            AuthModel::None
        }
        Some(1) => {
            if !a.username.is_empty() || a.password.is_some() {
                bad.insert("password");
            }
            AuthModel::None
        }
        Some(2) => {
            if !username_ok(&a.username) {
                bad.insert("username");
            }
            match &a.password {
                Some(p) if p.is_empty() => {
                    bad.insert("password");
                }
                Some(_) => {}
                // Kept only for the same user and relay.
                None => {
                    let keeps = stored_mechanism == Some(v1::SmtpAuthMechanism::Password.into())
                        && stored.is_some_and(|s| s.username == a.username)
                        && relay;
                    if !keeps {
                        bad.insert("password");
                    }
                }
            }
            AuthModel::Password {
                username: a.username.clone(),
            }
        }
        Some(_) => {
            if !username_ok(&a.username) {
                bad.insert("username");
            }
            if !a.token_url.valid {
                bad.insert("oauth_token_url");
            }
            if a.client_id.is_empty() {
                bad.insert("oauth_client_id");
            }
            match &a.client_secret {
                Some(s) if s.is_empty() => {
                    bad.insert("oauth_client_secret");
                }
                Some(_) => {}
                // Kept only for the same client, token endpoint and relay.
                None => {
                    let keeps = stored_mechanism == Some(v1::SmtpAuthMechanism::Xoauth2.into())
                        && stored.is_some_and(|s| {
                            s.oauth_client_id == a.client_id
                                && s.oauth_token_url == a.token_url.text
                        })
                        && relay;
                    if !keeps {
                        bad.insert("oauth_client_secret");
                    }
                }
            }
            AuthModel::XOAuth2 {
                username: a.username.clone(),
                token_url: a.token_url.text.clone(),
                client_id: a.client_id.clone(),
            }
        }
    };
    // Credentials in clear only to this machine.
    if input.tls_mode == 1 && auth != AuthModel::None && !loopback {
        bad.insert("tls_mode");
    }
    let timeout = duration_setting(
        input.timeout,
        SMTP_DEFAULT_TIMEOUT,
        MAX_TIMEOUT,
        "timeout",
        &mut bad,
    );
    let overall_timeout = duration_setting(
        input.overall_timeout,
        SMTP_DEFAULT_OVERALL_TIMEOUT,
        MAX_OVERALL_TIMEOUT,
        "overall_timeout",
        &mut bad,
    );
    if overall_timeout < timeout {
        bad.insert("overall_timeout");
    }
    let policy = policy_model(&input.policy, false, SMTP_DEFAULT_CONNECTIONS, &mut bad);
    // Reached without authentication, so any TLS mode goes to any host.
    let relays_ok = input.fallback_relays.len() <= MAX_FALLBACK_RELAYS
        && input.fallback_relays.iter().all(|r| {
            r.host.valid && (1..=65_535).contains(&r.port) && (1..=3).contains(&r.tls_mode)
        });
    if !relays_ok {
        bad.insert("fallback_relays");
    }
    let model = SmtpModel {
        host: host.text.clone(),
        port: input.port,
        tls_mode: input.tls_mode,
        from: input.from.text.clone(),
        auth,
        timeout,
        overall_timeout,
        policy,
        fallback_relays: input
            .fallback_relays
            .iter()
            .map(|r| (r.host.text.clone(), r.port, r.tls_mode))
            .collect(),
    };
    (model, bad)
}

#[derive(Debug, Clone, PartialEq)]
struct WebhookModel {
    timeout: Duration,
    policy: PolicyModel,
}

fn webhook_model(input: &WebhookInput) -> (WebhookModel, Bad) {
    let mut bad = Bad::new();
    let timeout = duration_setting(
        input.timeout,
        WEBHOOK_DEFAULT_TIMEOUT,
        MAX_TIMEOUT,
        "timeout",
        &mut bad,
    );
    let policy = policy_model(&input.policy, true, WEBHOOK_DEFAULT_CONNECTIONS, &mut bad);
    (WebhookModel { timeout, policy }, bad)
}

#[derive(Debug, Clone, PartialEq)]
struct ListModel {
    name: String,
    webhook: bool,
    recipients: Vec<String>,
    endpoints: Vec<String>,
    /// In their order (not a set: the order is the failover's).
    fallbacks: Vec<String>,
    /// 1 generic, 2 teams, 3 slack.
    format: i32,
    secret_set: bool,
    /// (threshold, window, max per digest)
    consolidation: Option<(u32, Duration, u32)>,
}

/// A list's targets as a set: a list holds each target once, and the stores give them back
/// sorted.
fn targets(items: impl IntoIterator<Item = String>) -> Vec<String> {
    let mut targets: Vec<String> = items.into_iter().collect();
    targets.sort();
    targets.dedup();
    targets
}

/// Scheme, host and port of an endpoint URL.
fn receiver(endpoint: &str) -> Option<url::Origin> {
    url::Url::parse(endpoint).ok().map(|u| u.origin())
}

/// The model of a list change, given the list of that name stored now.
fn list_model(input: &ListInput, stored: Option<&v1::NotificationList>) -> (ListModel, Bad) {
    let mut bad = Bad::new();
    if !input.name.valid {
        bad.insert("list.name");
    }
    let webhook = match input.kind {
        0 | 1 => false,
        2 => true,
        _ => {
            bad.insert("list.type");
            false
        }
    };
    let targets_ok = |items: &[Labelled]| {
        !items.is_empty() && items.len() <= MAX_TARGETS && items.iter().all(|i| i.valid)
    };
    let mut secret_set = false;
    if webhook {
        if !input.recipients.is_empty() {
            bad.insert("list.recipients");
        }
        if !targets_ok(&input.endpoints) {
            bad.insert("list.endpoints");
        }
        // Fallbacks: at most 4, each a valid endpoint URL, beside exactly one endpoint, none of
        // them that endpoint or an earlier fallback (the pool's URLs are written as the URL
        // parser writes them, so equal text is the same URL).
        let fallbacks_ok = input.fallbacks.is_empty()
            || (input.fallbacks.len() <= MAX_FALLBACK_URLS
                && input.endpoints.len() == 1
                && input.fallbacks.iter().all(|f| f.valid)
                && input.fallbacks.iter().enumerate().all(|(i, f)| {
                    f.text != input.endpoints[0].text
                        && input.fallbacks[..i].iter().all(|e| e.text != f.text)
                }));
        if !fallbacks_ok {
            bad.insert("list.fallback_urls");
        }
        if !(0..=3).contains(&input.format) {
            bad.insert("list.webhook_format");
        }
        secret_set = match &input.secret {
            Some(s) if s.is_empty() => false,
            Some(s) if s.len() < 16 => {
                bad.insert("list.webhook_secret");
                false
            }
            Some(_) => true,
            // Kept only while every endpoint and fallback goes to a receiver the stored ones
            // went to.
            None => match stored {
                Some(s) if s.r#type == 2 && s.webhook_secret_set => {
                    let known: Vec<_> = s
                        .endpoints
                        .iter()
                        .chain(&s.fallback_urls)
                        .filter_map(|e| receiver(e))
                        .collect();
                    let same = input
                        .endpoints
                        .iter()
                        .chain(&input.fallbacks)
                        .all(|e| receiver(&e.text).is_some_and(|r| known.contains(&r)));
                    if !same && targets_ok(&input.endpoints) {
                        bad.insert("list.webhook_secret");
                    }
                    true
                }
                _ => false,
            },
        };
    } else {
        if !input.endpoints.is_empty() {
            bad.insert("list.endpoints");
        }
        if !targets_ok(&input.recipients) {
            bad.insert("list.recipients");
        }
    }
    let consolidation = input.consolidation.as_ref().map(|c| {
        if c.threshold == 0 || c.threshold > MAX_THRESHOLD {
            bad.insert("list.consolidation.threshold");
        }
        let window = c.window.and_then(Span::value);
        let window_ok =
            window.is_some_and(|w| (MIN_WINDOW..=MAX_WINDOW).contains(&w) && w.subsec_nanos() == 0);
        if !window_ok {
            bad.insert("list.consolidation.window");
        }
        if !(2..=MAX_PER_DIGEST).contains(&c.max_per_digest) {
            bad.insert("list.consolidation.max_per_digest");
        }
        (c.threshold, window.unwrap_or_default(), c.max_per_digest)
    });
    let texts = |items: &[Labelled]| targets(items.iter().map(|i| i.text.clone()));
    let model = ListModel {
        name: input.name.text.clone(),
        webhook,
        recipients: texts(&input.recipients),
        endpoints: texts(&input.endpoints),
        fallbacks: if webhook {
            input.fallbacks.iter().map(|f| f.text.clone()).collect()
        } else {
            Vec::new()
        },
        format: if input.format == 0 { 1 } else { input.format },
        secret_set,
        consolidation,
    };
    (model, bad)
}

// ---------------------------------------------------------------------------------------------
// Requests.

fn policy_fields(
    p: &PolicyInput,
) -> (
    u32,
    Option<prost_types::Duration>,
    i32,
    Option<prost_types::Duration>,
    u32,
    Option<f64>,
    u32,
) {
    (
        p.max_retries,
        p.retry_delay.wire(),
        p.backoff,
        p.max_retry_delay.wire(),
        p.connections,
        p.rate,
        p.burst,
    )
}

fn smtp_request(input: &SmtpInput) -> v1::UpsertSmtpConfigRequest {
    let (max_retries, retry_delay, backoff, max_retry_delay, connections, rate, burst) =
        policy_fields(&input.policy);
    let a = &input.auth;
    let mut request = v1::UpsertSmtpConfigRequest {
        host: input.host.0.text.clone(),
        port: input.port,
        tls_mode: input.tls_mode,
        from_address: input.from.text.clone(),
        auth_mechanism: a.mechanism,
        username: a.username.clone(),
        timeout: input.timeout.wire(),
        overall_timeout: input.overall_timeout.wire(),
        max_retries,
        retry_delay,
        backoff,
        max_retry_delay,
        max_concurrent_connections: connections,
        rate_limit_per_second: rate,
        rate_limit_burst: burst,
        fallback_relays: input
            .fallback_relays
            .iter()
            .map(|r| v1::SmtpRelay {
                host: r.host.text.clone(),
                port: r.port,
                tls_mode: r.tls_mode,
            })
            .collect(),
        ..Default::default()
    };
    if a.mechanism == 3 {
        request.oauth_token_url = a.token_url.text.clone();
        request.oauth_client_id = a.client_id.clone();
        request.oauth_client_secret = a.client_secret.clone();
    } else {
        request.password = a.password.clone();
    }
    request
}

fn webhook_request(input: &WebhookInput) -> v1::UpsertWebhookConfigRequest {
    let (max_retries, retry_delay, backoff, max_retry_delay, connections, rate, burst) =
        policy_fields(&input.policy);
    v1::UpsertWebhookConfigRequest {
        timeout: input.timeout.wire(),
        max_retries,
        retry_delay,
        backoff,
        max_retry_delay,
        max_concurrent_connections: connections,
        rate_limit_per_second: rate,
        rate_limit_burst: burst,
    }
}

fn list_request(input: &ListInput) -> v1::UpsertNotificationListRequest {
    let texts = |items: &[Labelled]| items.iter().map(|i| i.text.clone()).collect();
    v1::UpsertNotificationListRequest {
        list: Some(v1::NotificationList {
            name: input.name.text.clone(),
            r#type: input.kind,
            recipients: texts(&input.recipients),
            endpoints: texts(&input.endpoints),
            fallback_urls: texts(&input.fallbacks),
            webhook_format: input.format,
            webhook_secret: input.secret.clone(),
            consolidation: input.consolidation.as_ref().map(|c| v1::ListConsolidation {
                threshold: c.threshold,
                window: c.window.and_then(Span::wire),
                max_per_digest: c.max_per_digest,
            }),
            ..Default::default()
        }),
    }
}

// ---------------------------------------------------------------------------------------------
// The config file with the same values.

/// A TOML basic string: quotes, backslashes and control characters escaped.
/// A TLS mode's name in the config file; one it does not know for a mode the API does not.
fn tls_name(tls_mode: i32) -> &'static str {
    match tls_mode {
        1 => "none",
        2 => "starttls",
        3 => "tls",
        _ => "ssl",
    }
}

fn toml_str(text: &str) -> String {
    let mut out = String::from("\"");
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() => {
                let _ = write!(out, "\\u{:04X}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

fn toml_float(x: f64) -> String {
    if x.is_nan() {
        "nan".into()
    } else if x.is_infinite() {
        if x > 0.0 { "inf".into() } else { "-inf".into() }
    } else {
        format!("{x:?}")
    }
}

fn toml_list(items: &[Labelled]) -> String {
    let quoted: Vec<String> = items.iter().map(|i| toml_str(&i.text)).collect();
    format!("[{}]", quoted.join(", "))
}

/// The policy keys; unset (zero) values are left out, as zero means unset on the wire.
fn policy_toml(p: &PolicyInput, out: &mut String) {
    if p.max_retries != 0 {
        let _ = writeln!(out, "max_retries = {}", p.max_retries);
    }
    if p.retry_delay != Span::ZERO {
        let _ = writeln!(out, "retry_delay = {}", p.retry_delay.toml());
    }
    match p.backoff {
        0 => {}
        1 => out.push_str("backoff = \"fixed\"\n"),
        2 => out.push_str("backoff = \"exponential\"\n"),
        _ => out.push_str("backoff = \"linear\"\n"),
    }
    if p.max_retry_delay != Span::ZERO {
        let _ = writeln!(out, "max_retry_delay = {}", p.max_retry_delay.toml());
    }
    if p.connections != 0 {
        let _ = writeln!(out, "max_concurrent_connections = {}", p.connections);
    }
    if let Some(rate) = p.rate {
        let _ = writeln!(out, "rate_limit_per_second = {}", toml_float(rate));
    }
    if p.burst != 0 {
        let _ = writeln!(out, "rate_limit_burst = {}", p.burst);
    }
}

/// `[smtp]` with the input's values; `None` when the file cannot say what the request says (a
/// stored secret kept, or credentials with mechanism NONE or an unknown one).
fn smtp_toml(input: &SmtpInput) -> Option<String> {
    let a = &input.auth;
    let mechanism = match a.mechanism {
        0 if a.username.is_empty() => 1,
        0 => 2,
        m => m,
    };
    let mut out = String::from("[smtp]\n");
    let _ = writeln!(out, "host = {}", toml_str(&input.host.0.text));
    let _ = writeln!(out, "port = {}", input.port);
    let _ = writeln!(out, "tls = {}", toml_str(tls_name(input.tls_mode)));
    let _ = writeln!(out, "from_address = {}", toml_str(&input.from.text));
    if input.timeout != Span::ZERO {
        let _ = writeln!(out, "timeout = {}", input.timeout.toml());
    }
    if input.overall_timeout != Span::ZERO {
        let _ = writeln!(out, "overall_timeout = {}", input.overall_timeout.toml());
    }
    if !input.fallback_relays.is_empty() {
        // The file's form, `host:port tls`, an IPv6 address in brackets.
        let relays: Vec<String> = input
            .fallback_relays
            .iter()
            .map(|r| {
                let host = if r.host.text.contains(':') {
                    format!("[{}]", r.host.text)
                } else {
                    r.host.text.clone()
                };
                toml_str(&format!("{host}:{} {}", r.port, tls_name(r.tls_mode)))
            })
            .collect();
        let _ = writeln!(out, "fallback_relays = [{}]", relays.join(", "));
    }
    policy_toml(&input.policy, &mut out);
    match mechanism {
        1 if a.username.is_empty() && a.password.is_none() => {}
        2 => {
            let password = a.password.as_ref()?;
            let _ = writeln!(out, "username = {}", toml_str(&a.username));
            let _ = writeln!(out, "password = {}", toml_str(password));
        }
        3 => {
            let secret = a.client_secret.as_ref()?;
            let _ = writeln!(out, "username = {}", toml_str(&a.username));
            out.push_str("[smtp.oauth]\n");
            let _ = writeln!(out, "token_url = {}", toml_str(&a.token_url.text));
            let _ = writeln!(out, "client_id = {}", toml_str(&a.client_id));
            let _ = writeln!(out, "client_secret = {}", toml_str(secret));
        }
        _ => return None,
    }
    Some(out)
}

fn webhook_toml(input: &WebhookInput) -> String {
    let mut out = String::from("[webhook]\n");
    if input.timeout != Span::ZERO {
        let _ = writeln!(out, "timeout = {}", input.timeout.toml());
    }
    policy_toml(&input.policy, &mut out);
    out
}

fn list_toml(input: &ListInput) -> String {
    let mut out = String::from("[[lists]]\n");
    let _ = writeln!(out, "name = {}", toml_str(&input.name.text));
    match input.kind {
        0 => {}
        1 => out.push_str("type = \"email\"\n"),
        2 => out.push_str("type = \"webhook\"\n"),
        _ => out.push_str("type = \"sms\"\n"),
    }
    if !input.recipients.is_empty() {
        let _ = writeln!(out, "recipients = {}", toml_list(&input.recipients));
    }
    if !input.endpoints.is_empty() {
        let _ = writeln!(out, "endpoints = {}", toml_list(&input.endpoints));
    }
    if !input.fallbacks.is_empty() {
        let _ = writeln!(out, "fallback_urls = {}", toml_list(&input.fallbacks));
    }
    match input.format {
        0 => {}
        1 => out.push_str("webhook_format = \"generic\"\n"),
        2 => out.push_str("webhook_format = \"teams\"\n"),
        3 => out.push_str("webhook_format = \"slack\"\n"),
        _ => out.push_str("webhook_format = \"discord\"\n"),
    }
    if let Some(secret) = &input.secret {
        let _ = writeln!(out, "webhook_secret = {}", toml_str(secret));
    }
    if let Some(c) = &input.consolidation {
        let mut keys = vec![
            format!("threshold = {}", c.threshold),
            format!("max_per_digest = {}", c.max_per_digest),
        ];
        if let Some(window) = c.window {
            keys.push(format!("window = {}", window.toml()));
        }
        let _ = writeln!(out, "consolidation = {{ {} }}", keys.join(", "));
    }
    out
}

/// The config file's key for a request field of `section`.
fn config_key(section: &str, field: &str) -> String {
    let key = match field {
        "tls_mode" => "tls",
        "oauth_token_url" => "oauth.token_url",
        "oauth_client_id" => "oauth.client_id",
        "oauth_client_secret" => "oauth.client_secret",
        other => other.strip_prefix("list.").unwrap_or(other),
    };
    format!("{section}.{key}")
}

/// Loads `text` as central's config file, as `central-outbox --config` does.
fn load_config(dir: &Path, text: &str) -> anyhow::Result<central_outbox::config::Settings> {
    let path = dir.join("central.toml");
    let file = format!(
        "database = \"sqlite://{}\"\n[secrets]\nkey = \"{SECRETS_KEY}\"\n{text}",
        dir.join("unused.db").display()
    );
    std::fs::write(&path, file)?;
    CentralConfig::load(Some(&path), Overrides::default())?.validate()
}

/// The config loader's verdict must match the model: refused naming one of the keys out of
/// bounds (`section` is the table: `smtp`, `webhook`, `lists[0]`), or accepted with what
/// `accepted` checks.
fn check_config<T>(
    loaded: anyhow::Result<T>,
    section: &str,
    bad: &Bad,
    file: &str,
    accepted: impl FnOnce(T) -> Result<(), TestCaseError>,
) -> Result<(), TestCaseError> {
    match loaded {
        Ok(value) => {
            prop_assert!(
                bad.is_empty(),
                "the config loader accepted {bad:?} out of bounds:\n{file}"
            );
            accepted(value)
        }
        Err(e) => {
            let error = format!("{e:#}");
            prop_assert!(
                !bad.is_empty(),
                "the config loader refused a valid file: {error}\n{file}"
            );
            // A check's message starts with the key; a value the file format cannot read is
            // reported by the loader with the key's path in it.
            let names_one = bad.iter().any(|field| {
                let key = config_key(section, field);
                let last = key.rsplit('.').next().unwrap_or(&key);
                error.starts_with(&format!("{key}:"))
                    || (error.starts_with("invalid configuration") && error.contains(last))
            });
            prop_assert!(names_one, "{error} names none of {bad:?}:\n{file}");
            Ok(())
        }
    }
}

fn backoff_model(b: Backoff) -> Option<Duration> {
    match b {
        Backoff::Fixed => None,
        Backoff::Exponential { cap } => Some(cap),
    }
}

fn policy_of(p: &central_outbox::domain::channel::DeliveryPolicy) -> PolicyModel {
    PolicyModel {
        max_retries: u32::try_from(p.max_retries).unwrap(),
        retry_delay: p.retry_delay,
        exponential: backoff_model(p.backoff),
        connections: p.max_concurrent_connections,
        rate: p.rate_limit.map(|r| (r.per_second(), r.burst())),
    }
}

fn config_smtp(settings: &central_outbox::config::Settings) -> SmtpModel {
    let s = settings.smtp.as_ref().unwrap();
    SmtpModel {
        host: s.host.clone(),
        port: u32::from(s.port),
        tls_mode: match s.tls {
            TlsMode::None => 1,
            TlsMode::StartTls => 2,
            TlsMode::Implicit => 3,
        },
        from: s.from_address.as_str().to_owned(),
        auth: match &s.auth {
            SmtpAuth::None => AuthModel::None,
            SmtpAuth::Password { username, .. } => AuthModel::Password {
                username: username.clone(),
            },
            SmtpAuth::XOAuth2 { username, oauth } => AuthModel::XOAuth2 {
                username: username.clone(),
                token_url: oauth.token_url.clone(),
                client_id: oauth.client_id.clone(),
            },
        },
        timeout: s.timeout,
        overall_timeout: s.overall_timeout,
        policy: policy_of(&s.policy),
        fallback_relays: s
            .fallback_relays
            .iter()
            .map(|r| {
                let tls_mode = match r.tls() {
                    TlsMode::None => 1,
                    TlsMode::StartTls => 2,
                    TlsMode::Implicit => 3,
                };
                (r.host().to_owned(), u32::from(r.port()), tls_mode)
            })
            .collect(),
    }
}

fn config_list(settings: &central_outbox::config::Settings) -> ListModel {
    let list = &settings.lists[0];
    let (webhook, recipients, (endpoints, fallbacks), format, secret_set) = match &list.targets {
        ListTargets::Email(r) => (
            false,
            targets(r.iter().map(ToString::to_string)),
            (Vec::new(), Vec::new()),
            1,
            false,
        ),
        ListTargets::Webhook(t) => (
            true,
            Vec::new(),
            (
                targets(t.endpoints.iter().map(ToString::to_string)),
                t.fallbacks.iter().map(ToString::to_string).collect(),
            ),
            match t.format {
                WebhookFormat::Generic => 1,
                WebhookFormat::Teams => 2,
                WebhookFormat::Slack => 3,
            },
            t.secret.is_some(),
        ),
    };
    ListModel {
        name: list.name.as_str().to_owned(),
        webhook,
        recipients,
        endpoints,
        fallbacks,
        format,
        secret_set,
        consolidation: list
            .consolidation
            .map(|c| (c.threshold(), c.window(), c.max_per_digest())),
    }
}

// ---------------------------------------------------------------------------------------------
// What the admin API stored.

fn view_duration(d: Option<&prost_types::Duration>) -> Duration {
    d.and_then(from_duration).unwrap()
}

/// The pacing and retry fields, which `SmtpConfig` and `WebhookConfig` both carry under the
/// same names, as the model holds them.
macro_rules! view_policy {
    ($v:expr) => {{
        let v = $v;
        PolicyModel {
            max_retries: v.max_retries,
            retry_delay: view_duration(v.retry_delay.as_ref()),
            exponential: (v.backoff == 2).then(|| view_duration(v.max_retry_delay.as_ref())),
            connections: v.max_concurrent_connections,
            rate: v.rate_limit_per_second.map(|r| (r, v.rate_limit_burst)),
        }
    }};
}

fn smtp_view(v: &v1::SmtpConfig) -> SmtpModel {
    SmtpModel {
        host: v.host.clone(),
        port: v.port,
        tls_mode: v.tls_mode,
        from: v.from_address.clone(),
        auth: match v.auth_mechanism {
            2 => AuthModel::Password {
                username: v.username.clone(),
            },
            3 => AuthModel::XOAuth2 {
                username: v.username.clone(),
                token_url: v.oauth_token_url.clone(),
                client_id: v.oauth_client_id.clone(),
            },
            _ => AuthModel::None,
        },
        timeout: view_duration(v.timeout.as_ref()),
        overall_timeout: view_duration(v.overall_timeout.as_ref()),
        policy: view_policy!(v),
        fallback_relays: v
            .fallback_relays
            .iter()
            .map(|r| (r.host.clone(), r.port, r.tls_mode))
            .collect(),
    }
}

fn webhook_view(v: &v1::WebhookConfig) -> WebhookModel {
    WebhookModel {
        timeout: view_duration(v.timeout.as_ref()),
        policy: view_policy!(v),
    }
}

fn list_view(v: &v1::NotificationList) -> ListModel {
    ListModel {
        name: v.name.clone(),
        webhook: v.r#type == 2,
        recipients: targets(v.recipients.clone()),
        endpoints: targets(v.endpoints.clone()),
        fallbacks: v.fallback_urls.clone(),
        format: if v.r#type == 2 { v.webhook_format } else { 1 },
        secret_set: v.webhook_secret_set,
        consolidation: v.consolidation.as_ref().map(|c| {
            (
                c.threshold,
                view_duration(c.window.as_ref()),
                c.max_per_digest,
            )
        }),
    }
}

/// The admin API's answer must match the model: INVALID_ARGUMENT naming one of the fields out
/// of bounds, or the stored setting as the model has it. Returns `None` when stored, else the
/// field the refusal named.
fn check_answer<T>(
    answer: Result<T, tonic::Status>,
    bad: &Bad,
    what: &dyn std::fmt::Debug,
    stored_as: impl FnOnce(&T) -> Result<(), TestCaseError>,
) -> Result<Option<&'static str>, TestCaseError> {
    match answer {
        Ok(view) => {
            prop_assert!(
                bad.is_empty(),
                "accepted with {bad:?} out of bounds: {what:?}"
            );
            stored_as(&view)?;
            Ok(None)
        }
        Err(status) => {
            prop_assert_eq!(
                status.code(),
                Code::InvalidArgument,
                "{:?}: {:?}",
                status,
                what
            );
            let named = bad
                .iter()
                .find(|field| status.message().starts_with(&format!("{field}:")));
            prop_assert!(
                named.is_some(),
                "{:?} names none of {:?} (out of bounds): {:?}",
                status.message(),
                bad,
                what
            );
            Ok(named.copied())
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The run.

/// The running central and its clients, shared by every case.
struct Rig {
    central: Central,
    admin: NotificationOutboxClient<Channel>,
    ingest: NotificationIngestClient<Channel>,
    config_dir: tempfile::TempDir,
    /// Every notification sent through a stored setting.
    sent: Vec<String>,
    /// What the cases came to, by kind: "smtp stored", "smtp refused: port", ...
    tally: BTreeMap<String, usize>,
}

impl Rig {
    async fn smtp(&mut self) -> Option<v1::SmtpConfig> {
        match self
            .admin
            .get_smtp_config(v1::GetSmtpConfigRequest {})
            .await
        {
            Ok(view) => Some(view.into_inner()),
            Err(status) if status.code() == Code::NotFound => None,
            Err(status) => panic!("GetSmtpConfig: {status:?}"),
        }
    }

    async fn webhook(&mut self) -> v1::WebhookConfig {
        self.admin
            .get_webhook_config(v1::GetWebhookConfigRequest {})
            .await
            .unwrap()
            .into_inner()
    }

    async fn list(&mut self, name: &str) -> Option<v1::NotificationList> {
        match self
            .admin
            .get_notification_list(v1::GetNotificationListRequest { name: name.into() })
            .await
        {
            Ok(view) => Some(view.into_inner()),
            Err(status) if matches!(status.code(), Code::NotFound | Code::InvalidArgument) => None,
            Err(status) => panic!("GetNotificationList: {status:?}"),
        }
    }

    /// Sends one notification to `list` through the channel of `kind`.
    async fn send(&mut self, list: &str, kind: v1::NotificationType) {
        let msg = v1::NotificationSubmit {
            r#type: kind.into(),
            list_name: list.into(),
            ..submit("Setting under test", "sent through a stored setting")
        };
        let id = msg.notification_id.clone();
        let ack = self
            .ingest
            .submit_notification(msg)
            .await
            .unwrap()
            .into_inner();
        assert_eq!(ack.outcome(), v1::SubmitOutcome::Accepted, "{ack:?}");
        self.sent.push(id);
    }

    async fn run_case(&mut self, case: Case) -> Result<(), TestCaseError> {
        match case {
            Case::Smtp(input) => self.smtp_case(&input).await,
            Case::Webhook(input) => self.webhook_case(&input).await,
            Case::List(input) => self.list_case(&input).await,
        }
    }

    /// Counts what a case of `kind` came to: stored, or refused naming `named`.
    fn count(&mut self, kind: &str, named: Option<&str>) {
        let outcome = match named {
            None => format!("{kind} stored"),
            Some(field) => format!("{kind} refused: {field}"),
        };
        *self.tally.entry(outcome).or_default() += 1;
    }

    async fn smtp_case(&mut self, input: &SmtpInput) -> Result<(), TestCaseError> {
        let before = self.smtp().await;
        let (model, bad) = smtp_model(input, before.as_ref());
        let answer = self
            .admin
            .upsert_smtp_config(smtp_request(input))
            .await
            .map(tonic::Response::into_inner);
        let named = check_answer(answer, &bad, input, |view| {
            prop_assert_eq!(&smtp_view(view), &model, "{:?}", input);
            let secret_set = view.password_set || view.oauth_client_secret_set;
            prop_assert_eq!(secret_set, model.auth != AuthModel::None);
            Ok(())
        })?;
        self.count("smtp", named);
        if named.is_none() {
            self.send(LIST, v1::NotificationType::Email).await;
        } else {
            prop_assert_eq!(
                &self.smtp().await,
                &before,
                "a refused change changed nothing"
            );
        }
        // The same values in a config file. The loader checks values before any secret is
        // sealed, so a kept secret is no question for it: such a case has no file form.
        if let Some(text) = smtp_toml(input) {
            let (model, bad) = smtp_model(input, None);
            let loaded = load_config(self.config_dir.path(), &text);
            check_config(loaded, "smtp", &bad, &text, |settings| {
                prop_assert_eq!(&config_smtp(&settings), &model, "{}", text);
                Ok(())
            })?;
        }
        Ok(())
    }

    async fn webhook_case(&mut self, input: &WebhookInput) -> Result<(), TestCaseError> {
        let before = self.webhook().await;
        let (model, bad) = webhook_model(input);
        let answer = self
            .admin
            .upsert_webhook_config(webhook_request(input))
            .await
            .map(tonic::Response::into_inner);
        let named = check_answer(answer, &bad, input, |view| {
            prop_assert_eq!(&webhook_view(view), &model, "{:?}", input);
            Ok(())
        })?;
        self.count("webhook", named);
        if named.is_none() {
            self.send(HOOK_LIST, v1::NotificationType::Webhook).await;
        } else {
            prop_assert_eq!(
                &self.webhook().await,
                &before,
                "a refused change changed nothing"
            );
        }
        let text = webhook_toml(input);
        let loaded = load_config(self.config_dir.path(), &text);
        check_config(loaded, "webhook", &bad, &text, |settings| {
            let s = settings.webhook.unwrap();
            let loaded = WebhookModel {
                timeout: s.timeout,
                policy: policy_of(&s.policy),
            };
            prop_assert_eq!(&loaded, &model, "{}", text);
            Ok(())
        })
    }

    async fn list_case(&mut self, input: &ListInput) -> Result<(), TestCaseError> {
        let name = input.name.text.clone();
        let before = if input.name.valid {
            self.list(&name).await
        } else {
            None
        };
        let (model, bad) = list_model(input, before.as_ref());
        let answer = self
            .admin
            .upsert_notification_list(list_request(input))
            .await
            .map(tonic::Response::into_inner);
        let named = check_answer(answer, &bad, input, |view| {
            prop_assert_eq!(&list_view(view), &model, "{:?}", input);
            Ok(())
        })?;
        let kind = if input.kind == 2 {
            "webhook list"
        } else {
            "email list"
        };
        self.count(kind, named);
        if named.is_none() {
            let kind = if model.webhook {
                v1::NotificationType::Webhook
            } else {
                v1::NotificationType::Email
            };
            self.send(&name, kind).await;
        } else if input.name.valid {
            prop_assert_eq!(
                &self.list(&name).await,
                &before,
                "a refused change changed nothing"
            );
        }
        // In a file there is nothing stored to keep: no secret is no secret, and "" is a secret
        // too short rather than a removal.
        let (mut model, mut bad) = list_model(input, None);
        bad.remove("list.webhook_secret");
        if model.webhook && input.secret.as_ref().is_some_and(|s| s.len() < 16) {
            bad.insert("list.webhook_secret");
        }
        model.secret_set = model.webhook && input.secret.is_some();
        let text = list_toml(input);
        let loaded = load_config(self.config_dir.path(), &text);
        check_config(loaded, "lists[0]", &bad, &text, |settings| {
            prop_assert_eq!(&config_list(&settings), &model, "{}", text);
            Ok(())
        })
    }
}

/// Every `outbox_task_restarts_total` series on the `/metrics` page at `addr`.
async fn task_restarts(addr: SocketAddr) -> Vec<(String, f64)> {
    let page = metrics_endpoint::get(addr, "/metrics").await.unwrap().body;
    page.lines()
        .filter(|l| l.starts_with("outbox_task_restarts_total"))
        .map(|l| {
            let (series, value) = l.rsplit_once(' ').unwrap();
            (series.to_owned(), value.parse().unwrap())
        })
        .collect()
}

#[test]
fn any_channel_setting_is_refused_by_name_or_stored_and_then_works() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (sink, hooks, metrics, closed_port) = runtime.block_on(async {
        let sink = SmtpSink::start().await.unwrap();
        let hooks = WebhookServer::start().await.unwrap();
        let metrics = free_addr().await;
        // Free a moment ago and bound by nothing after: a relay or endpoint that refuses.
        let closed_port = free_addr().await.port();
        (sink, hooks, metrics, closed_port)
    });
    let places = Places {
        smtp: sink.addr(),
        hooks: hooks.addr(),
        closed_port,
    };
    let mut config = central_config(dir.path(), Some(sink.addr()));
    config.metrics_listen = Some(metrics);
    config.lists.push(ListConfig::webhook(
        HOOK_LIST,
        vec![hooks.url("/hook")],
        WebhookFormatKind::Generic,
    ));
    let rig = runtime.block_on(async {
        let central = Central::start(config).await;
        Rig {
            admin: central.outbox().await,
            ingest: central.ingest().await,
            central,
            config_dir: tempfile::tempdir().unwrap(),
            sent: Vec::new(),
            tally: BTreeMap::new(),
        }
    });
    let rig = RefCell::new(rig);

    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(CASES);
    let config = Config {
        cases,
        // Seed-stable (below) and nothing written to the source tree.
        failure_persistence: None,
        ..Config::default()
    };
    let mut runner =
        TestRunner::new_with_rng(config, TestRng::deterministic_rng(RngAlgorithm::ChaCha));
    let result = runner.run(&case(&places), |case| {
        runtime.block_on(rig.borrow_mut().run_case(case))
    });
    if let Err(e) = result {
        panic!("{e}");
    }

    let mut rig = rig.into_inner();
    // What the run covered (`--nocapture` shows it); each kind both stored and refused, or the
    // strategies have gone lopsided.
    eprintln!("setting inputs, {cases} cases:");
    for (outcome, n) in &rig.tally {
        eprintln!("  {n:4}  {outcome}");
    }
    for kind in ["smtp", "webhook", "email list", "webhook list"] {
        for outcome in ["stored", "refused"] {
            assert!(
                rig.tally
                    .keys()
                    .any(|k| k.starts_with(&format!("{kind} {outcome}"))),
                "no {kind} case was {outcome}: {:?}",
                rig.tally
            );
        }
    }
    runtime.block_on(async {
        // Sane settings back: the channels deliver at once, to the real servers.
        let sane = |d: u64| Some(outbox_proto::time::to_duration(Duration::from_millis(d)));
        rig.admin
            .upsert_smtp_config(v1::UpsertSmtpConfigRequest {
                host: sink.addr().ip().to_string(),
                port: u32::from(sink.addr().port()),
                tls_mode: v1::SmtpTlsMode::None.into(),
                from_address: "outbox@plant.example.test".into(),
                max_retries: 3,
                retry_delay: sane(300),
                timeout: sane(5000),
                overall_timeout: sane(5000),
                ..Default::default()
            })
            .await
            .unwrap();
        rig.admin
            .upsert_webhook_config(v1::UpsertWebhookConfigRequest {
                max_retries: 3,
                retry_delay: sane(300),
                backoff: v1::RetryBackoff::Fixed.into(),
                timeout: sane(5000),
                ..Default::default()
            })
            .await
            .unwrap();
        rig.admin
            .upsert_notification_list(v1::UpsertNotificationListRequest {
                list: Some(v1::NotificationList {
                    name: HOOK_LIST.into(),
                    r#type: v1::NotificationType::Webhook.into(),
                    endpoints: vec![hooks.url("/hook")],
                    webhook_secret: Some(String::new()),
                    ..Default::default()
                }),
            })
            .await
            .unwrap();
        let run = rig.sent.clone();
        let mails = sink.messages().len();
        let posts = hooks.requests().len();
        rig.send(LIST, v1::NotificationType::Email).await;
        rig.send(HOOK_LIST, v1::NotificationType::Webhook).await;
        let fresh: Vec<String> = rig.sent[run.len()..].to_vec();
        for id in &fresh {
            crate::harness::wait_for_status(&rig.central.db, id, "Delivered").await;
        }
        let mail = sink.wait_for_messages(mails + 1, DEADLINE).await;
        assert!(
            mail.iter()
                .any(|m| m.message_id().is_some_and(|mid| mid.contains(&fresh[0]))),
            "no mail for {}",
            fresh[0]
        );
        assert!(
            hooks
                .wait_for_requests(posts + 1, DEADLINE)
                .await
                .iter()
                .any(|r| r.idempotency_key() == Some(fresh[1].as_str())),
            "no POST for {}",
            fresh[1]
        );

        // Every notification sent during the run is final, or waits for a time its policy set
        // (a retry after a recorded failure, a consolidation window); none is left pending.
        let mut admin = rig.admin.clone();
        eventually("every notification of the run settles", || {
            let (run, mut admin) = (run.clone(), admin.clone());
            async move {
                let now = chrono::Utc::now();
                for id in &run {
                    let status = admin
                        .get_notification_status(v1::GetNotificationStatusRequest {
                            notification_id: id.clone(),
                        })
                        .await
                        .unwrap()
                        .into_inner();
                    let waits_for_its_time = status
                        .next_attempt_at
                        .as_ref()
                        .and_then(outbox_proto::time::from_timestamp)
                        .is_some_and(|at| at > now);
                    let settled = match status.status() {
                        v1::NotificationStatus::Delivered | v1::NotificationStatus::Parked => true,
                        v1::NotificationStatus::Retrying => {
                            waits_for_its_time && !status.last_error.is_empty()
                        }
                        v1::NotificationStatus::Held => waits_for_its_time,
                        _ => false,
                    };
                    if !settled {
                        return None;
                    }
                }
                Some(())
            }
        })
        .await;
        let _ = admin.get_kpis(v1::GetKpisRequest::default()).await.unwrap();

        // Nothing panicked, nothing was restarted.
        let restarts = task_restarts(metrics).await;
        assert!(
            !restarts.is_empty(),
            "no outbox_task_restarts_total on /metrics"
        );
        assert!(
            restarts.iter().all(|(_, n)| *n == 0.0),
            "supervised tasks restarted: {restarts:?}"
        );
    });
    let Rig { central, .. } = rig;
    runtime.block_on(central.stop());
}
