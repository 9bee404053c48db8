#!/usr/bin/env python3
"""Reads mail the way an independent mail client does, for the end-to-end tests (tests/e2e/mail.rs).

Each line on stdin is a JSON object {"raw": "<base64 of one message as it crossed the wire>"}; each
is answered with one JSON line on stdout saying what Python's `email` package (policy.default,
the modern parser that decodes RFC 2047 words and transfer encodings) makes of it:

    {"subject": str|null, "to": str|null, "content_type": str, "charset": str|null,
     "transfer_encoding": str|null, "body": str, "defects": [str], "error": str|null}

Answers are flushed one at a time, so a test can keep one process open and ask case by case, or
write everything and read the answers afterwards. A message the parser chokes on is answered with
"error" set rather than ending the process.
"""

import base64
import email
import email.policy
import json
import sys


def header(msg, name, defects):
    value = msg[name]
    if value is None:
        return None
    defects.extend(f"{name}: {type(d).__name__}: {d}" for d in value.defects)
    return str(value)


def decode(raw):
    msg = email.message_from_bytes(raw, policy=email.policy.default)
    defects = [f"{type(d).__name__}: {d}" for d in msg.defects]
    answer = {
        "subject": header(msg, "subject", defects),
        "to": header(msg, "to", defects),
        "content_type": msg.get_content_type(),
        "charset": msg.get_content_charset(),
        "transfer_encoding": header(msg, "content-transfer-encoding", defects),
        "body": msg.get_content(),
        "error": None,
    }
    answer["defects"] = defects
    return answer


def main():
    for line in iter(sys.stdin.readline, ""):
        try:
            answer = decode(base64.b64decode(json.loads(line)["raw"]))
        except Exception as e:  # noqa: BLE001 - reported to the test, which fails on it
            answer = {"error": f"{type(e).__name__}: {e}"}
        print(json.dumps(answer), flush=True)


if __name__ == "__main__":
    main()
