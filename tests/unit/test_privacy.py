"""The personal / secret data detector: each kind with valid and invalid examples (checksums,
number plans), a benign corpus with no findings, and redaction (no secret in any output)."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, strategies as st

from hybridllm.engines.base import GenerationRequest
from hybridllm.engines.options import OpenAIOptions
from hybridllm.errors import PrivacyBlockedError
from hybridllm.guard.guarded import GuardedEngine, RequestContext
from hybridllm.guard.privacy import iban_ok, kinds, luhn_ok, scan, scan_text
from hybridllm.testing import ScriptedEngine
from tests.privacy_corpus import BENIGN, SENSITIVE

JWT = (
    "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0."
    "dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U"
)
PEM = (
    "-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEA75Jk3dn8x3gYxDoNs8lsBCq9GZbC0lZN3aA1bcD\n"
    "-----END RSA PRIVATE KEY-----"
)

VALID = {
    "email": ["a.b@example.co.uk", "x+tag@mail.sub-domain.org", "Reach ME@Corp.IO today"],
    "phone": [
        "+1 415 555 2671",
        "+33 6 12 34 56 78",
        "+49 30 1234567",
        "+44 (0)20 7946 0958",
        "(415) 555-2671",
        "415.555.2671",
        "020 7946 0958",
        "06 12 34 56 78",
        "phone: 5552671234",
    ],
    "card": [
        "4111111111111111",
        "4111-1111-1111-1111",
        "5555 5555 5555 4444",
        "2223003122003222",
        "3782 822463 10005",
        "6011111111111117",
        "3530111333300000",
        "30569309025904",
    ],
    "iban": [
        "GB82 WEST 1234 5698 7654 32",
        "DE89370400440532013000",
        "FR14 2004 1010 0505 0001 3M02 606",
        "NL91ABNA0417164300",
    ],
    "ssn": ["123-45-6789", "123 45 6789", "SSN: 123456789"],
    "uk_nino": ["AB123456C", "JG 10 37 42 A"],
    "es_dni": ["12345678Z", "X1234567L", "DNI 00000000-T"],
    "api_key": [
        "sk-proj-Xk29dLq8Zr7Wm3Np5Tv1Yb6Hc4Js0Fg",
        "sk-ant-api03-Xk29dLq8Zr7Wm3Np5Tv1Yb6Hc4Js0Fg",
        "AKIAZ7QW3ER5TY8UI2OP",
        "ghp_" + "aB3dE5fG7hJ9kL1mN3pQ5rS7tU9vW1xY3zA5",
        "github_pat_11ABCDEFG0123456789_abcdefghijklmnopqrstuv",
        "xoxb-1234567890-abcdefghijKLMN",
        "AIzaSyA1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q",
        "sk_live_4eC39HqLyjWDarjtT1zdp7dc",
        JWT,
        "SECRET_KEY = 'q8Zr7Wm3Np5Tv1Yb6Hc4'",
        '"client_secret": "aZ9-xY8_wV7.uT6~sR5qP4"',
    ],
    "private_key": [PEM, PEM.replace("RSA ", "ENCRYPTED ")],
}

INVALID = {
    "email": ["@property", "user@localhost", "git@github.com:org/x.git", "pkg@1.2.3"],
    "phone": [
        "123-456-7890",  # no area code starts with 1
        "415-155-2671",  # nor an exchange
        "+1 123 456 7890",
        "2024-01-15",
        "1.2.3.4",
        "10 20 30",
        "order #415-555-2671",
        "5552671234",  # a bare digit run is not a phone number
        "hotel 5552671234",  # "tel" inside a word is no label
    ],
    "card": [
        "4111111111111112",  # Luhn fails
        "1234567812345670",  # Luhn holds, no issuer starts with 1
        "0000000000000000",
        "5555 5555 5555 4445",
    ],
    "iban": [
        "GB82 WEST 1234 5698 7654 33",  # mod 97 fails
        "DE89370400440532013001",
        "XX82WEST12345698765432",  # no such country
        "GB82WEST123456987654",  # wrong length for GB
    ],
    "ssn": [
        "000-12-3456",
        "666-12-3456",
        "912-34-5678",
        "123-00-4567",
        "123-45-0000",
        "078-05-1120",
        "123-45 6789",
        "123456789",
        "classn 123456789",
    ],
    "uk_nino": ["GB123456A", "QQ123456C", "AB123456E"],
    "es_dni": ["12345678A", "X1234567A"],
    "api_key": [
        "sk-short",
        "api_key = 'your_api_key_here'",
        "token = 'aaaaaaaaaaaaaaaaaaaa'",
        "eyJhbGciOi.eyJzdWIi.sig",
        "eyJ4IjoxfQ.eyJzdWIiOiIxMjM0In0.c2lnbmF0dXJlMTIz",  # header without alg / typ
        "checksum = 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
    ],
    "private_key": [
        "-----BEGIN PUBLIC KEY-----\nMIIBIjANBgkqhkiG9w0BAQEFAAOCAQ8AMIIBCgKCAQEA75Jk3dn8x3gY\n",
        "A PEM file starts with -----BEGIN RSA PRIVATE KEY----- and ends with END.",
    ],
}


@pytest.mark.parametrize(("kind", "text"), [(k, t) for k, ts in VALID.items() for t in ts])
def test_valid_examples_are_found(kind: str, text: str) -> None:
    assert kind in kinds(scan_text(text))


@pytest.mark.parametrize(("kind", "text"), [(k, t) for k, ts in INVALID.items() for t in ts])
def test_invalid_examples_are_not_found(kind: str, text: str) -> None:
    assert kind not in kinds(scan_text(text))


def test_text_whose_lowercase_is_longer_is_still_scanned() -> None:
    text = 'İstanbul: write to ayse.yilmaz@mail.com.tr, api_key="Zx9Qw2Lm8Rt4Yu6Io1Pa3Sd5"'
    assert len(text.lower()) != len(text)
    assert kinds(scan_text(text)) == ("api_key", "email")


def test_checksums() -> None:
    assert luhn_ok("79927398713") and not luhn_ok("79927398710")
    assert iban_ok("GB82WEST12345698765432") and not iban_ok("GB82WEST12345698765433")


@given(st.text(alphabet="0123456789", min_size=14, max_size=14), st.integers(0, 15))
def test_any_luhn_valid_visa_is_found_and_one_wrong_digit_is_not(body: str, pos: int) -> None:
    partial = "4" + body
    check = next(d for d in "0123456789" if luhn_ok(partial + d))
    number = partial + check
    assert kinds(scan_text(f"pay with {number} now")) == ("card",)
    changed = number[:pos] + str((int(number[pos]) + 1) % 10) + number[pos + 1 :]
    assert "card" not in kinds(scan_text(f"pay with {changed} now"))


@pytest.mark.parametrize("prompt", BENIGN)
def test_benign_prompts_have_no_findings(prompt: str) -> None:
    assert scan(prompt) == ()


@pytest.mark.parametrize(("prompt", "kind", "secret"), SENSITIVE)
def test_sensitive_prompts_are_found_with_spans(prompt: str, kind: str, secret: str) -> None:
    findings = scan([{"role": "user", "content": prompt}])
    assert kind in kinds(findings)
    f = next(f for f in findings if f.kind == kind)
    assert f.location == "messages[0].content"
    assert secret in prompt[f.start : f.end]


def _leaks(secret: str, out: str) -> bool:
    """Any 6 characters of the secret in a row (or its digits without separators)."""
    compact = re.sub(r"[\s-]", "", secret)
    pieces = {s[i : i + 6] for s in (secret, compact) for i in range(len(s) - 5)}
    return any(p in out for p in pieces)


@pytest.mark.parametrize(("prompt", "kind", "secret"), SENSITIVE)
def test_no_secret_in_repr_str_or_refusal(prompt: str, kind: str, secret: str) -> None:
    findings = scan(prompt)
    guard = GuardedEngine(ScriptedEngine("cloud", tokens=["x"]), privacy="keep-local")
    with pytest.raises(PrivacyBlockedError) as info:
        guard.check(GenerationRequest(messages=[{"role": "user", "content": prompt}]))
    outputs = [repr(findings), *map(str, findings), str(info.value), repr(info.value)]
    assert kind in str(info.value) and str(info.value).startswith("privacy:")
    assert not any(_leaks(secret, out) for out in outputs), outputs


def test_the_whole_request_is_scanned() -> None:
    guard = GuardedEngine(ScriptedEngine("cloud", tokens=["x"]), privacy="keep-local")
    clean = [{"role": "user", "content": "Continue the story."}]
    guard.check(GenerationRequest(messages=clean))
    for request in (
        GenerationRequest(messages=clean, assistant_prefix="Write to bob.jones@corp.example.org"),
        GenerationRequest(
            messages=[*clean, {"role": "system", "content": "card 4111111111111111"}]
        ),
        GenerationRequest(messages=clean, options=(OpenAIOptions(prediction="ssn 123-45-6789"),)),
        GenerationRequest(
            messages=clean, options=(OpenAIOptions(extra_body={"x": ["bob.jones@corp.org"]}),)
        ),
    ):
        with pytest.raises(PrivacyBlockedError):
            guard.check(request)
    # the request's context (its policy's mode), passed beside it, wins over the guard's
    off = GenerationRequest(messages=clean, assistant_prefix="bob.jones@corp.org")
    guard.check(off, RequestContext(privacy="off"))
    with pytest.raises(PrivacyBlockedError):
        guard.check(off, RequestContext(privacy="keep-local"))


SPLIT_EMAIL = [
    # (messages, what a user met: an email address split over two messages of a conversation)
    [("user", "Please write to ann.smith"), ("user", "@example.org about the invoice")],
    [("user", "My address is ann.smith@"), ("assistant", "example.org, right?")],
    [("user", "mail ann.smith@exam"), ("user", "ple.org now")],  # split inside the domain
]


@pytest.mark.parametrize("turns", SPLIT_EMAIL)
def test_a_value_split_over_messages_is_found_where_the_cloud_would_read_it(
    turns: list[tuple[str, str]],
) -> None:
    messages = [{"role": role, "content": text} for role, text in turns]
    assert all(not scan_text(m["content"]) for m in messages)  # no single message holds it
    found = scan(messages)
    assert kinds(found) == ("email",) and found[0].location == "conversation"
    guard = GuardedEngine(ScriptedEngine("cloud", tokens=["x"]), privacy="keep-local")
    with pytest.raises(PrivacyBlockedError):
        guard.check(GenerationRequest(messages=messages))


def test_splitting_does_not_invent_or_double_findings() -> None:
    benign = [{"role": "user", "content": text} for text in ("Order 12", "34 apples", "at noon")]
    assert scan(benign) == ()  # "1234" across a boundary is no identifier
    whole = [{"role": "user", "content": "write to ann.smith@example.org"}, {"role": "user",
             "content": "thanks"}]  # fmt: skip
    assert [f.location for f in scan(whole)] == ["messages[0].content"]  # found once, in place
