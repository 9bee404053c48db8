//! Mail fidelity: what central's real email adapter puts on the wire to a real SMTP server, and
//! what an independent reader makes of it. The reader is Python's `email` package
//! (`tests/decode_mail.py`, one `python3` process per test, asked message by message), so the
//! checks do not share a decoder, or a misunderstanding, with the code under test.
//!
//! The contract (central's `delivery::mail_format`): a reader decodes exactly the subject sent,
//! and the body sent with every line break as CRLF and a final line break; the wire is 7-bit and
//! never carries a bare CR or LF; `To:` says `undisclosed-recipients:;` and the recipients are
//! only in the envelope.

use std::cell::RefCell;
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use central_outbox::domain::channel::{
    DeliveryPolicy, EmailAddress, SmtpAuth, SmtpSettings, TlsMode,
};
use central_outbox::domain::retry::Backoff;
use central_outbox::domain::{NotificationContent, NotificationId, NotificationType, Priority};
use central_outbox::testing::{EmailAdapter, Turn};
use outbox_domain::limits::{MAX_BODY_BYTES, MAX_SUBJECT_CHARS};
use outbox_tests::smtp_sink::{ReceivedMail, SmtpSink};
use proptest::prelude::*;
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};

use crate::harness::{LIST, RECIPIENTS};

/// Email settings pointing at `sink`: plain SMTP, no auth.
fn settings(sink: &SmtpSink) -> SmtpSettings {
    SmtpSettings {
        host: sink.addr().ip().to_string(),
        port: sink.addr().port(),
        tls: TlsMode::None,
        auth: SmtpAuth::None,
        from_address: EmailAddress::parse("outbox@plant.example.test", "from_address").unwrap(),
        timeout: Duration::from_secs(10),
        overall_timeout: Duration::from_secs(30),
        fallback_relays: vec![],
        policy: DeliveryPolicy {
            max_retries: 0,
            retry_delay: Duration::from_secs(1),
            backoff: Backoff::Fixed,
            max_concurrent_connections: 1,
            rate_limit: None,
        },
    }
}

/// Sends one notification through the real adapter and returns what the sink received.
async fn deliver(
    adapter: &EmailAdapter,
    sink: &SmtpSink,
    subject: &str,
    body: &str,
) -> ReceivedMail {
    deliver_at(adapter, sink, subject, body, Priority::Normal).await
}

/// [`deliver`], at `priority`.
async fn deliver_at(
    adapter: &EmailAdapter,
    sink: &SmtpSink,
    subject: &str,
    body: &str,
    priority: Priority,
) -> ReceivedMail {
    let content = NotificationContent::parse(
        NotificationType::Email,
        LIST.into(),
        subject.into(),
        body.into(),
        String::new(),
    )
    .expect("the contract accepts the content");
    let recipients: Vec<_> = RECIPIENTS
        .iter()
        .map(|r| EmailAddress::parse(r, "recipient").unwrap())
        .collect();
    let id = NotificationId::generate();
    adapter
        .deliver(
            &settings(sink),
            id,
            &content,
            priority,
            &recipients,
            None,
            Turn::first(),
        )
        .await
        .expect("delivered");
    // The sink records a message before it answers the final ".", so it is there now.
    let id = id.to_string();
    sink.messages()
        .into_iter()
        .find(|m| m.message_id().is_some_and(|mid| mid.contains(&id)))
        .expect("the sink recorded the message")
}

/// What is wrong with the raw DATA as it crossed the wire, if anything: it must be 7-bit ASCII
/// whose CRs and LFs all come in CRLF pairs (RFC 5321 §2.3.8).
fn wire_problem(raw: &str) -> Option<String> {
    if let Some(c) = raw.chars().find(|c| !c.is_ascii()) {
        return Some(format!("non-ASCII {c:?} on the wire"));
    }
    let bytes = raw.as_bytes();
    for (i, &b) in bytes.iter().enumerate() {
        let bare_cr = b == b'\r' && bytes.get(i + 1) != Some(&b'\n');
        let bare_lf = b == b'\n' && (i == 0 || bytes[i - 1] != b'\r');
        if bare_cr || bare_lf {
            let from = i.saturating_sub(20);
            return Some(format!(
                "bare {} at byte {i}: {:?}",
                if bare_cr { "CR" } else { "LF" },
                &raw[from..(i + 20).min(raw.len())]
            ));
        }
    }
    None
}

/// The body as a reader must decode it: every line break (CRLF, LF, lone CR) as CRLF, ending
/// with one. Written independently of central's `canonical_body`, on purpose.
fn expected_body(body: &str) -> String {
    let mut out = body
        .replace("\r\n", "\n")
        .replace('\r', "\n")
        .replace('\n', "\r\n");
    if !out.ends_with("\r\n") {
        out.push_str("\r\n");
    }
    out
}

/// One message as Python's `email` package reads it.
#[derive(Debug)]
struct Decoded {
    subject: Option<String>,
    to: Option<String>,
    content_type: String,
    charset: Option<String>,
    body: String,
    defects: Vec<String>,
}

/// One `python3 tests/decode_mail.py` process, asked one message at a time.
struct PythonReader {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl PythonReader {
    fn start() -> Self {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("decode_mail.py");
        let mut child = Command::new("python3")
            .arg(&script)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("python3 runs (make test needs it anyway)");
        let stdin = child.stdin.take().unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        Self {
            child,
            stdin,
            stdout,
        }
    }

    fn read(&mut self, raw: &str) -> Decoded {
        let request = serde_json::json!({ "raw": BASE64.encode(raw) });
        writeln!(self.stdin, "{request}").unwrap();
        self.stdin.flush().unwrap();
        let mut line = String::new();
        self.stdout.read_line(&mut line).unwrap();
        assert!(
            !line.is_empty(),
            "decode_mail.py exited early (its stderr is above)"
        );
        let answer: serde_json::Value = serde_json::from_str(&line).unwrap();
        if let Some(error) = answer["error"].as_str() {
            panic!("Python could not read the mail: {error}\n{raw}");
        }
        let text = |key: &str| answer[key].as_str().map(str::to_owned);
        Decoded {
            subject: text("subject"),
            to: text("to"),
            content_type: text("content_type").unwrap_or_default(),
            charset: text("charset"),
            body: text("body").unwrap_or_default(),
            defects: answer["defects"]
                .as_array()
                .unwrap()
                .iter()
                .map(|d| d.as_str().unwrap_or_default().to_owned())
                .collect(),
        }
    }
}

impl Drop for PythonReader {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Everything a reader must see for any message, whatever its content.
fn assert_well_formed(mail: &ReceivedMail, decoded: &Decoded) {
    if let Some(problem) = wire_problem(&mail.raw) {
        panic!("{problem}\n{}", mail.raw);
    }
    assert!(
        decoded.defects.is_empty(),
        "{:?}\n{}",
        decoded.defects,
        mail.raw
    );
    assert_eq!(decoded.content_type, "text/plain");
    assert_eq!(decoded.charset.as_deref(), Some("utf-8"));
}

/// Mail readers see how urgent a notification is: critical and high mails are flagged
/// important, low ones unimportant, and a normal one carries neither header (its mail is the
/// same as before priorities existed). The mail stays well formed for an independent reader.
#[tokio::test]
async fn the_priority_shows_in_the_mail_headers_and_normal_adds_none() {
    let sink = SmtpSink::start().await.unwrap();
    let adapter = EmailAdapter::new();
    let mut python = PythonReader::start();
    for (priority, importance, x_priority) in [
        (Priority::Critical, Some("high"), Some("1 (Highest)")),
        (Priority::High, Some("high"), Some("2 (High)")),
        (Priority::Normal, None, None),
        (Priority::Low, Some("low"), Some("5 (Lowest)")),
    ] {
        let mail = deliver_at(&adapter, &sink, "Tank 4 high level", "Level 97%", priority).await;
        assert_eq!(
            mail.header("Importance").as_deref(),
            importance,
            "{priority}"
        );
        assert_eq!(
            mail.header("X-Priority").as_deref(),
            x_priority,
            "{priority}"
        );
        let decoded = python.read(&mail.raw);
        assert_well_formed(&mail, &decoded);
        assert_eq!(decoded.subject.as_deref(), Some("Tank 4 high level"));
    }
}

#[tokio::test]
async fn subjects_that_look_encoded_or_are_not_ascii_decode_exactly_as_sent() {
    let sink = SmtpSink::start().await.unwrap();
    let adapter = EmailAdapter::new();
    let mut python = PythonReader::start();

    let spoof = "Tank 4 =?utf-8?b?SGFja2Vk?= level";
    let mail = deliver(&adapter, &sink, spoof, "Level 97%").await;
    let decoded = python.read(&mail.raw);
    assert_well_formed(&mail, &decoded);
    assert_eq!(
        decoded.subject.as_deref(),
        Some(spoof),
        "not \"Tank 4 Hacked level\""
    );
    let header = mail.header("Subject").unwrap();
    assert!(
        header.starts_with("=?utf-8?b?") && !header.contains("SGFja2Vk?= level"),
        "the look-alike is itself encoded: {header}"
    );

    let longest = format!("{} ende", "Füllstand 🦆 Tank\t4".repeat(40));
    let longest: String = longest.chars().take(MAX_SUBJECT_CHARS).collect();
    for subject in [
        "Füllstand Tank 4: 97 %",
        "=?",
        " leading and trailing spaces ",
        "a  run   of    spaces",
        "Ünïcödé\u{2028}line separator, \u{a0}no-break space, \u{200b}zero width",
        &longest,
    ] {
        let mail = deliver(&adapter, &sink, subject, "Level 97%").await;
        let decoded = python.read(&mail.raw);
        assert_well_formed(&mail, &decoded);
        assert_eq!(decoded.subject.as_deref(), Some(subject), "{}", mail.raw);
    }

    // Plain ASCII stays readable on the wire, folded at spaces when long.
    let plain = "Tank 4 high level ".repeat(20);
    let plain = plain.trim_end();
    let mail = deliver(&adapter, &sink, plain, "Level 97%").await;
    let decoded = python.read(&mail.raw);
    assert_well_formed(&mail, &decoded);
    assert_eq!(decoded.subject.as_deref(), Some(plain));
    assert_eq!(mail.header("Subject").as_deref(), Some(plain));
}

#[tokio::test]
async fn bodies_never_put_a_bare_cr_or_lf_on_the_wire_and_gain_no_blank_line() {
    let sink = SmtpSink::start().await.unwrap();
    let adapter = EmailAdapter::new();
    let mut python = PythonReader::start();

    let line = "Level 97% at sensor 12, valve V-12 open.\n";
    let mut largest = line.repeat(MAX_BODY_BYTES / line.len() + 1);
    largest.truncate(MAX_BODY_BYTES);
    let cases = [
        // A lone CR, dot-stuffing bait included: each CR becomes a line break.
        ("line\r.\rnext", "line\r\n.\r\nnext\r\n"),
        // A final newline arrives as one line break, not two.
        (
            "Level 97%\nValve V-12 open\n",
            "Level 97%\r\nValve V-12 open\r\n",
        ),
        ("Level 97%", "Level 97%\r\n"),
        (
            "two blank\n\n\nlines\n\n",
            "two blank\r\n\r\n\r\nlines\r\n\r\n",
        ),
        (
            "mixed\r\nbreaks\nand\rlone\n\rones",
            "mixed\r\nbreaks\r\nand\r\nlone\r\n\r\nones\r\n",
        ),
        (".\n..\r\n.", ".\r\n..\r\n.\r\n"),
        (
            "Füllstand 97 %\r\nVentil geöffnet\r",
            "Füllstand 97 %\r\nVentil geöffnet\r\n",
        ),
        ("trailing space \ntab\t\n", "trailing space \r\ntab\t\r\n"),
    ];
    for (body, want) in cases {
        assert_eq!(expected_body(body), want, "the test's own rule");
        let mail = deliver(&adapter, &sink, "Tank 4", body).await;
        let decoded = python.read(&mail.raw);
        assert_well_formed(&mail, &decoded);
        assert_eq!(decoded.body, want, "{body:?} as sent:\n{}", mail.raw);
    }

    let mail = deliver(&adapter, &sink, "Tank 4", &largest).await;
    let decoded = python.read(&mail.raw);
    assert_well_formed(&mail, &decoded);
    assert!(decoded.body == expected_body(&largest), "the largest body");
}

#[tokio::test]
async fn the_mail_is_to_undisclosed_recipients_who_are_only_in_the_envelope() {
    let sink = SmtpSink::start().await.unwrap();
    let adapter = EmailAdapter::new();
    let mut python = PythonReader::start();

    let mail = deliver(&adapter, &sink, "Tank 4 high level", "Level 97%").await;
    let decoded = python.read(&mail.raw);
    assert_well_formed(&mail, &decoded);
    assert_eq!(decoded.to.as_deref(), Some("undisclosed-recipients:;"));
    let mut rcpt = mail.rcpt_to.clone();
    rcpt.sort();
    assert_eq!(rcpt, RECIPIENTS);
    assert_eq!(mail.mail_from, "outbox@plant.example.test");
    assert_eq!(mail.header("Bcc"), None);
    for recipient in RECIPIENTS {
        assert!(
            !mail.raw.contains(recipient),
            "{recipient} is not in the headers"
        );
    }
}

// ---- Property: anything the contract accepts arrives as sent ------------------------------

/// Pieces of a subject: plain ASCII words, what RFC 2047 and folding could trip on, and any
/// character the contract allows (not a control character, except tab).
fn subject_piece() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => "[ -~]{1,12}",
        2 => prop::sample::select(vec![
            "=?", "?=", "=?utf-8?b?SGFja2Vk?=", "=?iso-8859-1?q?caf=E9?=", " ", "   ", "\t",
            "é", "🦆", "\u{a0}", "\u{2028}", "\u{3000}", "\u{feff}", "\u{200b}", "Ω",
        ])
        .prop_map(str::to_owned),
        1 => "[a-zA-Z0-9]{70,90}",
        2 => prop::collection::vec(
            any::<char>().prop_filter("no control characters but tab", |c| {
                !c.is_control() || *c == '\t'
            }),
            1..6,
        )
        .prop_map(|chars| chars.into_iter().collect()),
    ]
}

/// Any subject the contract accepts, 1 to 500 characters: plain ASCII words (sent as written,
/// folded when long), any printable ASCII, or a mix of the pieces above.
fn subject() -> impl Strategy<Value = String> {
    let limit = |text: String| text.chars().take(MAX_SUBJECT_CHARS).collect::<String>();
    prop_oneof![
        1 => prop::collection::vec(("[a-zA-Z0-9.,:%!()-]{1,15}", " {1,2}"), 1..60)
            .prop_map(move |words| {
                let text: String = words.into_iter().map(|(w, s)| w + &s).collect();
                limit(text.trim_end().to_owned())
            }),
        1 => "[ -~]{1,200}",
        2 => prop::collection::vec(subject_piece(), 1..40).prop_map(move |p| limit(p.concat())),
    ]
}

/// Pieces of a body: text, every kind of line break and SMTP/MIME bait, long lines, and any
/// character but NUL.
fn body_piece() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => "[ -~]{1,20}",
        3 => prop::sample::select(vec![
            "\r", "\n", "\r\n", "\n\r", "\r\r\n", ".", "\r\n.\r\n", ".\r\n", "\n.\n", "\r.\r",
            " \n", "\t\r\n", " ", "From ", "=", "=20", "=?utf-8?b?SGk=?=", "\u{85}", "\u{2028}",
            "\x0b", "\x0c", "\x1b", "\x7f", "é", "🦆",
        ])
        .prop_map(str::to_owned),
        1 => "[a-z]{80,200}",
        2 => prop::collection::vec(
            any::<char>().prop_filter("no NUL", |c| *c != '\0'),
            1..8,
        )
        .prop_map(|chars| chars.into_iter().collect()),
    ]
}

/// Any body the contract accepts (non-empty, no NUL; far below the size limit, which the
/// example test above covers): short ASCII lines with every kind of line break (sent 7bit), or a
/// mix of the pieces above.
fn body() -> impl Strategy<Value = String> {
    prop_oneof![
        1 => prop::collection::vec(("[ -~]{0,60}", "\r\n|\n|\r|\n\n"), 1..30)
            .prop_map(|lines| lines.into_iter().map(|(l, br)| l + &br).collect()),
        2 => prop::collection::vec(body_piece(), 1..60).prop_map(|pieces| pieces.concat()),
    ]
}

#[test]
fn any_accepted_subject_and_body_decode_exactly_as_sent() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let sink = runtime.block_on(SmtpSink::start()).unwrap();
    let adapter = EmailAdapter::new();
    let python = RefCell::new(PythonReader::start());
    let config = Config {
        cases: 64,
        // Seed-stable (below) and nothing written to the source tree.
        failure_persistence: None,
        ..Config::default()
    };
    let mut runner =
        TestRunner::new_with_rng(config, TestRng::deterministic_rng(RngAlgorithm::ChaCha));
    let result = runner.run(&(subject(), body()), |(subject, body)| {
        let mail = runtime.block_on(deliver(&adapter, &sink, &subject, &body));
        prop_assert_eq!(wire_problem(&mail.raw), None, "{}", mail.raw);
        let decoded = python.borrow_mut().read(&mail.raw);
        prop_assert!(decoded.defects.is_empty(), "{:?}", decoded.defects);
        prop_assert_eq!(decoded.subject.as_deref(), Some(subject.as_str()));
        prop_assert_eq!(&decoded.body, &expected_body(&body));
        prop_assert_eq!(decoded.to.as_deref(), Some("undisclosed-recipients:;"));
        Ok(())
    });
    if let Err(e) = result {
        panic!("{e}");
    }
}
