//! How a notification's text becomes the text of a mail, so that any mail reader decodes exactly
//! what the script sent, and nothing on the wire can be read as something else.
//!
//! - **Subject.** Sent as written only when it is plain printable ASCII, holds no `=?` (a reader
//!   would take it for the start of an RFC 2047 encoded word and decode whatever follows), has no
//!   leading or trailing space (readers trim those) and folds at its own spaces into lines of at
//!   most 78 characters. Anything else goes as a run of RFC 2047 `B` encoded words of UTF-8, one
//!   per folded line; a reader joins adjacent encoded words without the folding whitespace, so the
//!   decoded text is the subject, character for character.
//! - **Body.** Every line break (CRLF, a lone LF, a lone CR) becomes CRLF, as RFC 2046 §4.1.1
//!   requires of `text/plain` and RFC 5321 §2.3.8 of anything in SMTP DATA, and the text ends with
//!   a line break (a mail body is a sequence of lines; SMTP ends the last one anyway). lettre then
//!   picks 7bit, quoted-printable or base64 for the canonical text.
//! - **DATA.** lettre writes `CRLF . CRLF` after the message whether or not it already ends in
//!   CRLF; RFC 5321 §4.1.1.4 counts that first CRLF as the end of the last line, so the message is
//!   handed over without its own final CRLF ([`smtp_data`]), or every mail would gain an empty
//!   last line.
//!
//! Every header value built here is printable ASCII whose only CRs and LFs are the `CRLF SP` of a
//! fold, which is what lets it go to lettre pre-encoded.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use lettre::message::header::{HeaderName, HeaderValue};
use outbox_domain::Priority;

const SUBJECT: HeaderName = HeaderName::new_from_ascii_str("Subject");
const TO: HeaderName = HeaderName::new_from_ascii_str("To");
const IMPORTANCE: HeaderName = HeaderName::new_from_ascii_str("Importance");
const X_PRIORITY: HeaderName = HeaderName::new_from_ascii_str("X-Priority");

/// What the first line of the header holds before the value.
const SUBJECT_PREFIX: usize = "Subject: ".len();
/// RFC 5322 §2.1.1: lines SHOULD be at most 78 characters (without the CRLF).
const MAX_LINE: usize = 78;
/// RFC 2047 §2 allows 75 characters per encoded word and 76 per line that holds one. The first
/// line is `Subject: ` (9) + `=?utf-8?b?` (10) + base64 + `?=` (2), so at most 55 characters of
/// base64, i.e. 52 (a multiple of 4, no padding mid-text), which carry 39 bytes of UTF-8.
/// Continuation lines are shorter (one space instead of `Subject: `), so the same size fits.
const ENCODED_WORD_BYTES: usize = 39;

/// The recipients are all in the envelope (BCC): the header shows an empty group, the form
/// RFC 5322 §3.6.3 suggests and relays and spam filters expect instead of no `To:` at all.
pub(crate) const UNDISCLOSED_RECIPIENTS: &str = "undisclosed-recipients:;";

/// The `Subject:` header for `subject`, encoded as the module doc describes.
pub(crate) fn subject_header(subject: &str) -> HeaderValue {
    HeaderValue::dangerous_new_pre_encoded(SUBJECT, subject.to_owned(), encode_subject(subject))
}

/// The headers mail readers show urgency by (Outlook's `Importance`, most others' `X-Priority`):
/// critical and high mails are flagged important, low ones unimportant, normal ones carry none
/// (so their mail is exactly what it was before priorities existed).
pub(crate) fn priority_headers(priority: Priority) -> Vec<HeaderValue> {
    let (importance, x_priority) = match priority {
        Priority::Critical => ("high", "1 (Highest)"),
        Priority::High => ("high", "2 (High)"),
        Priority::Normal => return Vec::new(),
        Priority::Low => ("low", "5 (Lowest)"),
    };
    vec![
        HeaderValue::new(IMPORTANCE, importance.to_owned()),
        HeaderValue::new(X_PRIORITY, x_priority.to_owned()),
    ]
}

/// `To: undisclosed-recipients:;`.
pub(crate) fn to_header() -> HeaderValue {
    HeaderValue::dangerous_new_pre_encoded(
        TO,
        UNDISCLOSED_RECIPIENTS.to_owned(),
        UNDISCLOSED_RECIPIENTS.to_owned(),
    )
}

/// The Subject header's value as it goes on the wire (folded, without the `Subject: ` prefix).
pub(crate) fn encode_subject(subject: &str) -> String {
    let plain = subject.bytes().all(|b| (b' '..=b'~').contains(&b))
        && !subject.contains("=?")
        && !subject.starts_with(' ')
        && !subject.ends_with(' ');
    if plain && let Some(folded) = fold_at_spaces(subject) {
        return folded;
    }
    encoded_words(subject)
}

/// `text` folded before some of its spaces (`CRLF` inserted, the space kept, so unfolding
/// restores it), or None when a word is too long for any line to stay within [`MAX_LINE`].
fn fold_at_spaces(text: &str) -> Option<String> {
    let mut out = String::with_capacity(text.len() + 8);
    let mut line = SUBJECT_PREFIX;
    // A fold may only follow a line with visible text: a line of only whitespace is obsolete
    // syntax (RFC 5322 §4.2) and some readers drop it.
    let mut line_has_text = false;
    for (i, word) in text.split(' ').enumerate() {
        if i > 0 {
            if line_has_text && line + 1 + word.len() > MAX_LINE {
                out.push_str("\r\n");
                line = 0;
                line_has_text = false;
            }
            out.push(' ');
            line += 1;
        }
        out.push_str(word);
        line += word.len();
        line_has_text |= !word.is_empty();
        if line > MAX_LINE {
            return None;
        }
    }
    Some(out)
}

/// `text` as `=?utf-8?b?...?=` words of at most [`ENCODED_WORD_BYTES`] bytes each, split only
/// between characters (a reader decodes each word on its own), joined by folds.
fn encoded_words(text: &str) -> String {
    let mut out = String::with_capacity(text.len() * 2 + 16);
    let mut rest = text;
    while !rest.is_empty() {
        let mut end = rest.len().min(ENCODED_WORD_BYTES);
        // A char is at most 4 bytes, so this stops at 36 at the lowest: every word makes progress.
        while !rest.is_char_boundary(end) {
            end -= 1;
        }
        let (chunk, tail) = rest.split_at(end);
        if !out.is_empty() {
            out.push_str("\r\n ");
        }
        out.push_str("=?utf-8?b?");
        BASE64.encode_string(chunk, &mut out);
        out.push_str("?=");
        rest = tail;
    }
    out
}

/// The body with every line break as CRLF and a final line break, which is what a reader
/// decodes (see the module doc).
pub(crate) fn canonical_body(body: &str) -> String {
    let mut out = String::with_capacity(body.len() + body.len() / 32 + 2);
    let mut rest = body;
    while let Some(at) = rest.find(['\r', '\n']) {
        out.push_str(&rest[..at]);
        out.push_str("\r\n");
        let skip = if rest[at..].starts_with("\r\n") { 2 } else { 1 };
        rest = &rest[at + skip..];
    }
    out.push_str(rest);
    if !out.ends_with("\r\n") {
        out.push_str("\r\n");
    }
    out
}

/// The formatted message as it must be handed to lettre's DATA writer: without its final CRLF,
/// which lettre's `CRLF . CRLF` supplies (see the module doc).
pub(crate) fn smtp_data(mut formatted: Vec<u8>) -> Vec<u8> {
    if formatted.ends_with(b"\r\n") {
        formatted.truncate(formatted.len() - 2);
    }
    formatted
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What an RFC 2047 reader does with our output: unfold, then decode adjacent encoded words
    /// and drop the whitespace between them. Only handles what this module writes.
    fn decode(value: &str) -> String {
        let unfolded = value.replace("\r\n", "");
        if !unfolded.starts_with("=?") {
            return unfolded;
        }
        let mut bytes = Vec::new();
        for word in unfolded.split(' ') {
            let b64 = word
                .strip_prefix("=?utf-8?b?")
                .and_then(|w| w.strip_suffix("?="))
                .unwrap();
            bytes.extend(BASE64.decode(b64).unwrap());
        }
        String::from_utf8(bytes).unwrap()
    }

    fn assert_well_formed(value: &str) {
        for (i, line) in value.split("\r\n").enumerate() {
            let len = line.len() + if i == 0 { SUBJECT_PREFIX } else { 0 };
            assert!(len <= MAX_LINE, "line {i} is {len} long in {value:?}");
            assert!(
                line.bytes().all(|b| (b' '..=b'~').contains(&b)),
                "{value:?}"
            );
            if i > 0 {
                assert!(line.starts_with(' ') && line.trim() != "", "{value:?}");
            }
        }
        for word in value.split_whitespace().filter(|w| w.starts_with("=?")) {
            assert!(word.len() <= 75, "{word}");
        }
    }

    #[test]
    fn plain_ascii_subjects_go_as_written() {
        for subject in ["Tank 4 high level", "a  b", "100% = full?", "x"] {
            assert_eq!(encode_subject(subject), subject);
        }
    }

    #[test]
    fn look_alike_encoded_words_and_non_ascii_are_encoded() {
        for subject in [
            "Tank 4 =?utf-8?b?SGFja2Vk?= level",
            "a=?b",
            "Füllstand 97 %",
            "tab\there",
            " leading",
            "trailing ",
            "🦆",
        ] {
            let encoded = encode_subject(subject);
            assert!(
                encoded.starts_with("=?utf-8?b?"),
                "{subject:?}: {encoded:?}"
            );
            assert_well_formed(&encoded);
            assert_eq!(decode(&encoded), subject);
        }
    }

    #[test]
    fn long_subjects_fold_within_line_limits_and_decode_exactly() {
        let words = "Tank 4 high level at the north end of the farm ".repeat(10);
        let words = words.trim_end();
        let folded = encode_subject(words);
        assert!(folded.contains("\r\n "), "{folded:?}");
        assert!(!folded.starts_with("=?"));
        assert_well_formed(&folded);
        assert_eq!(decode(&folded), words);

        let spaces = format!("a{}b", " ".repeat(200));
        assert_eq!(decode(&encode_subject(&spaces)), spaces);
        assert_well_formed(&encode_subject(&spaces));

        // One word longer than a line cannot fold: encoded words split anywhere.
        let word = "x".repeat(100);
        let encoded = encode_subject(&word);
        assert!(encoded.starts_with("=?"));
        assert_well_formed(&encoded);
        assert_eq!(decode(&encoded), word);

        // Four-byte characters never straddle two encoded words.
        let ducks = "🦆é".repeat(166);
        let encoded = encode_subject(&ducks);
        assert_well_formed(&encoded);
        assert_eq!(decode(&encoded), ducks);
    }

    #[test]
    fn every_line_break_becomes_crlf_and_the_body_ends_with_one() {
        assert_eq!(canonical_body("line\r.\rnext"), "line\r\n.\r\nnext\r\n");
        assert_eq!(
            canonical_body("a\nb\r\nc\rd\n\re"),
            "a\r\nb\r\nc\r\nd\r\n\r\ne\r\n"
        );
        assert_eq!(canonical_body("open\n"), "open\r\n");
        assert_eq!(canonical_body("open\n\n"), "open\r\n\r\n");
        assert_eq!(canonical_body("\r"), "\r\n");
        assert_eq!(canonical_body("é\r\n"), "é\r\n");
    }

    #[test]
    fn smtp_data_drops_only_the_final_crlf() {
        assert_eq!(smtp_data(b"a\r\n\r\n".to_vec()), b"a\r\n");
        assert_eq!(smtp_data(b"YWJj".to_vec()), b"YWJj");
    }
}
