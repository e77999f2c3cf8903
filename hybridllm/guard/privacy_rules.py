"""The detection rules behind `hybridllm.guard.privacy`: validators (Luhn, IBAN mod 97, SSN ranges,
NINO prefixes, DNI letters, entropy, JWT headers), the patterns, and per pattern a check that
turns a match into a redacted hint or rejects it.

Patterns start with a literal or a character set, never with \\b or a lookbehind (those make
Python's regex engine try every position); number patterns run only around runs of digits and
keyword patterns only at their keywords (see `Detector`).
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import re
import string
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

Kind = str
Check = Callable[["re.Match[str]"], str | None]  # a hint when the match is real, else None

# ---- validators --------------------------------------------------------------------------------


def luhn_ok(digits: str) -> bool:
    total = 0
    for i, ch in enumerate(reversed(digits)):
        d = ord(ch) - 48
        if i % 2 == 1:
            d = d * 2 - 9 if d > 4 else d * 2
        total += d
    return total % 10 == 0


def _card_issuer_ok(d: str) -> bool:
    """Length and issuer prefix of the major networks (Visa, Mastercard, Amex, Discover, JCB,
    Diners, UnionPay, Maestro)."""
    n = len(d)
    if d[0] == "4":
        return n in (13, 16, 19)
    two, four, six = int(d[:2]), int(d[:4]), int(d[:6])
    if 51 <= two <= 55 or 2221 <= four <= 2720:
        return n == 16
    if two in (34, 37):
        return n == 15
    if two in (36, 38, 39) or 300 <= int(d[:3]) <= 305:
        return 14 <= n <= 19
    if d.startswith(("6011", "65")) or 644 <= int(d[:3]) <= 649 or 622126 <= six <= 622925:
        return 16 <= n <= 19
    if 3528 <= four <= 3589 or two == 62:
        return 16 <= n <= 19
    if two in (50, 56, 57, 58, 63, 67):
        return 12 <= n <= 19
    return False


IBAN_LENGTHS = {
    "AD": 24, "AE": 23, "AL": 28, "AT": 20, "AZ": 28, "BA": 20, "BE": 16, "BG": 22, "BH": 22,
    "BR": 29, "BY": 28, "CH": 21, "CR": 22, "CY": 28, "CZ": 24, "DE": 22, "DK": 18, "DO": 28,
    "EE": 20, "EG": 29, "ES": 24, "FI": 18, "FO": 18, "FR": 27, "GB": 22, "GE": 22, "GI": 23,
    "GL": 18, "GR": 27, "GT": 28, "HR": 21, "HU": 28, "IE": 22, "IL": 23, "IQ": 23, "IS": 26,
    "IT": 27, "JO": 30, "KW": 30, "KZ": 20, "LB": 28, "LC": 32, "LI": 21, "LT": 20, "LU": 20,
    "LV": 21, "MC": 27, "MD": 24, "ME": 22, "MK": 19, "MR": 27, "MT": 31, "MU": 30, "NL": 18,
    "NO": 15, "PK": 24, "PL": 28, "PS": 29, "PT": 25, "QA": 29, "RO": 24, "RS": 22, "SA": 24,
    "SC": 31, "SE": 24, "SI": 19, "SK": 24, "SM": 27, "ST": 25, "SV": 28, "TL": 23, "TN": 24,
    "TR": 26, "UA": 29, "VA": 22, "VG": 24, "XK": 20,
}  # fmt: skip


def iban_ok(iban: str) -> bool:
    if IBAN_LENGTHS.get(iban[:2]) != len(iban) or not iban[2:4].isdigit():
        return False
    moved = iban[4:] + iban[:4]
    number = "".join(str(int(ch, 36)) for ch in moved)
    return int(number) % 97 == 1


def ssn_ok(area: str, group: str, serial: str) -> bool:
    """US SSN: area 000, 666 and 900-999, group 00 and serial 0000 are never issued; two
    well-known advertising numbers are excluded too."""
    if area in ("000", "666") or area[0] == "9" or group == "00" or serial == "0000":
        return False
    return f"{area}{group}{serial}" not in ("078051120", "219099999")


_NINO_BAD_PREFIXES = frozenset({"BG", "GB", "KN", "NK", "NT", "TN", "ZZ"})
_DNI_LETTERS = "TRWAGMYFPDXBNJZSQVHLCKE"


def es_dni_ok(number: str, letter: str) -> bool:
    """Spanish DNI (8 digits) or NIE (X/Y/Z + 7 digits): the letter is the number mod 23."""
    lead = "XYZ".find(number[0])
    digits = (str(lead) + number[1:]) if lead >= 0 else number
    return _DNI_LETTERS[int(digits) % 23] == letter


def shannon_bits(s: str) -> float:
    """Entropy per character of `s` (bits)."""
    n = len(s)
    return -sum(c / n * math.log2(c / n) for c in Counter(s).values()) if n else 0.0


def _jwt_ok(token: str) -> bool:
    head = token.split(".", 1)[0]
    try:
        raw = base64.urlsafe_b64decode(head + "=" * (-len(head) % 4))
        header = json.loads(raw)
    except (binascii.Error, ValueError):
        return False
    return isinstance(header, dict) and ("alg" in header or "typ" in header)


# ---- detectors ---------------------------------------------------------------------------------


def _email(m: re.Match[str]) -> str | None:
    if m.group("local").lower() == "git":  # git@github.com:org/repo: an SSH remote
        return None
    return "email ***@***"


def _phone_digits(m: re.Match[str]) -> str:
    return re.sub(r"\D", "", m.group(0))


def _phone_intl(m: re.Match[str]) -> str | None:
    d = _phone_digits(m)
    if not 8 <= len(d) <= 15 or d[0] == "0":
        return None
    if d[0] == "1" and not _nanp_ok(d[1:]):
        return None
    return f"phone +{d[0]}***{d[-2:]}"


def _nanp_ok(d: str) -> bool:
    """North American numbering plan: area and exchange codes start with 2-9, no N11 area."""
    return len(d) == 10 and d[0] in "23456789" and d[3] in "23456789" and d[1:3] != "11"


def _phone_nanp(m: re.Match[str]) -> str | None:
    d = _phone_digits(m)
    return f"phone ***{d[-2:]}" if _nanp_ok(d[-10:]) else None


def _phone_national(m: re.Match[str]) -> str | None:
    d = _phone_digits(m)
    return f"phone ***{d[-2:]}" if 9 <= len(d) <= 11 else None


def _phone_labelled(m: re.Match[str]) -> str | None:
    d = re.sub(r"\D", "", m.group("num"))
    return f"phone ***{d[-2:]}" if 7 <= len(d) <= 15 else None


def _card(m: re.Match[str]) -> str | None:
    d = re.sub(r"[ -]", "", m.group(0))
    if not 12 <= len(d) <= 19 or not luhn_ok(d) or not _card_issuer_ok(d):
        return None
    return f"card ****{d[-4:]}"


def _iban(m: re.Match[str]) -> str | None:
    s = re.sub(r"[ ]", "", m.group(0)).upper()
    return f"iban {s[:2]}** ****{s[-4:]}" if iban_ok(s) else None


def _ssn(m: re.Match[str]) -> str | None:
    return "ssn ***-**-****" if ssn_ok(m.group("a"), m.group("g"), m.group("s")) else None


def _nino(m: re.Match[str]) -> str | None:
    return None if m.group("p").upper() in _NINO_BAD_PREFIXES else "uk_nino ** ** ** ** *"


def _dni(m: re.Match[str]) -> str | None:
    ok = es_dni_ok(m.group("n").upper(), m.group("l").upper())
    return "es_dni ********-*" if ok else None


def _key(label: str) -> Check:
    def check(m: re.Match[str]) -> str | None:
        return f"api_key ({label})"

    return check


def _jwt(m: re.Match[str]) -> str | None:
    return "api_key (jwt)" if _jwt_ok(m.group(0)) else None


_PLACEHOLDER = re.compile(
    r"(?i)^(?:x+|\*+|\.+|<.*>|\$\{.*\}|\{\{.*\}\}|%\(.*\)s|.*(?:your|example|placeholder|"
    r"changeme|dummy|xxxx|here|redacted|getenv|environ|secret_?key|api_?key|token|password).*)$"
)


def _assigned(m: re.Match[str]) -> str | None:
    value = m.group("v")
    if _PLACEHOLDER.match(value) or shannon_bits(value) < 3.5:
        return None
    classes = sum(
        bool(re.search(p, value)) for p in (r"[a-z]", r"[A-Z]", r"[0-9]", r"[^A-Za-z0-9]")
    )
    if classes < 2 or re.fullmatch(r"[0-9a-fA-F]+", value) and len(value) in (32, 40, 64):
        return None  # a bare hex digest (md5/sha1/sha256) is usually a checksum, not a key
    return f"api_key ({m.group('k').lower()}=...)"


def _private_key(m: re.Match[str]) -> str | None:
    return f"private_key ({(m.group('t') or '').strip() or 'PEM'})"


def _ci(*words: str) -> str:
    """Case-insensitive alternation spelled with character classes: unlike (?i), it keeps the
    pattern's first character a set, so the regex engine skips ahead fast."""
    return "|".join(
        "".join(f"[{c.lower()}{c.upper()}]" if c.isalpha() else re.escape(c) for c in w)
        for w in words
    )


# Patterns start with a literal or a character set (never \b or a lookbehind, which make Python's
# regex engine try every position); the left edge is checked right after the first character.
_L = r"(?<![\w@.+#/-].)"  # after the first character: it did not follow a word/number/address
_E = r"(?![\w@-])"  # right edge
_KEY_NAMES = (
    "api_key", "api-key", "apikey", "secret", "token", "passwd", "password", "access_key",
    "access-key", "private_key", "private-key", "auth",
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class Detector:
    kind: Kind
    pattern: re.Pattern[str]
    check: Check
    # where to try the pattern: everywhere (default); at each occurrence of an anchor in the
    # lower-cased text, after walking back over `back` characters; or only around runs of digits
    anchors: tuple[str, ...] = ()
    back: str = ""
    digits: bool = False


DETECTORS: tuple[Detector, ...] = (
    Detector(
        "private_key",
        re.compile(
            r"-----BEGIN (?P<t>(?:[A-Z0-9]+ )*)PRIVATE KEY(?: BLOCK)?-----"
            r"[\s\S]{0,400}?[A-Za-z0-9+/]{40}"
            r"(?:[\s\S]*?-----END [A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----|[A-Za-z0-9+/=\s]*)"
        ),
        _private_key,
    ),
    Detector("api_key", re.compile(r"s(?<![\w-]s)k-ant-[A-Za-z0-9_-]{20,}"), _key("anthropic")),
    Detector(
        "api_key",
        re.compile(r"s(?<![\w-]s)k-(?:proj-|svcacct-|admin-)?[A-Za-z0-9_-]{20,}"),
        _key("openai"),
    ),
    Detector("api_key", re.compile(r"A(?<!\wA)(?:KIA|SIA|BIA|CCA)[A-Z0-9]{16}\b"), _key("aws")),
    Detector("api_key", re.compile(r"g(?<!\wg)h[pousr]_[A-Za-z0-9]{36,}\b"), _key("github")),
    Detector("api_key", re.compile(r"g(?<!\wg)ithub_pat_[A-Za-z0-9_]{22,}"), _key("github")),
    Detector("api_key", re.compile(r"x(?<!\wx)ox[abposr]-[A-Za-z0-9-]{10,}"), _key("slack")),
    Detector("api_key", re.compile(r"A(?<!\wA)Iza[0-9A-Za-z_-]{35}"), _key("google")),
    Detector("api_key", re.compile(r"[sr](?<!\w[sr])k_live_[0-9A-Za-z]{20,}"), _key("stripe")),
    Detector(
        "api_key",
        re.compile(r"e(?<!\we)yJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}"),
        _jwt,
    ),
    Detector(
        "api_key",
        re.compile(
            r"(?P<k>" + _ci(*_KEY_NAMES) + r")[A-Za-z0-9_]*['\"]?\s*[:=]\s*['\"]?"
            r"(?P<v>[A-Za-z0-9_+/=.~-]{16,})"
        ),
        _assigned,
        anchors=_KEY_NAMES,
    ),
    Detector(
        "iban",
        re.compile(
            r"[A-Z](?<!\w[A-Z])[A-Z]\d{2}"
            r"(?:[A-Z0-9]{11,30}|(?: [A-Z0-9]{4}){2,7}(?: [A-Z0-9]{1,3})?)\b"
        ),
        _iban,
    ),
    Detector(
        "card",
        re.compile(
            r"\d" + _L + r"(?:\d{3}(?:[ -]\d{4}){2,3}(?:[ -]\d{1,3})?|\d{3}[ -]\d{6}[ -]\d{4,5}"
            r"|\d{11,18})" + _E
        ),
        _card,
        digits=True,
    ),
    Detector(
        "ssn",
        re.compile(r"(?P<a>\d" + _L + r"\d\d)(?P<sep>[- ])(?P<g>\d{2})(?P=sep)(?P<s>\d{4})" + _E),
        _ssn,
        digits=True,
    ),
    Detector(
        "ssn",
        re.compile(
            r"(?<![A-Za-z])(?:" + _ci("ssn", "social security") + r")(?: [nN]umber)?\W{0,3}"
            r"(?P<a>\d{3})(?P<g>\d{2})(?P<s>\d{4})\b"
        ),
        _ssn,
        anchors=("ssn", "social security"),
    ),
    Detector(
        "uk_nino",
        re.compile(
            r"(?P<p>[A-CEGHJ-PR-TW-Z](?<!\w[A-Z])[A-CEGHJ-NPR-TW-Z]) ?\d{2} ?\d{2} ?\d{2} ?[A-D]\b"
        ),
        _nino,
    ),
    Detector(
        "es_dni",
        re.compile(r"(?P<n>[0-9XYZ](?<!\w[0-9XYZ])\d{7}|\d(?<!\w\d)\d{7})-?(?P<l>[A-Z])\b"),
        _dni,
        digits=True,
    ),
    Detector(
        "email",
        re.compile(
            r"(?P<local>[A-Za-z0-9](?<![\w.+-][A-Za-z0-9])[A-Za-z0-9._%+-]{0,63})@"
            r"(?:[A-Za-z0-9](?:[A-Za-z0-9-]{0,62})\.)+[A-Za-z]{2,24}\b"
        ),
        _email,
        anchors=("@",),
        back=string.ascii_letters + string.digits + "._%+-",
    ),
    Detector(
        "phone",
        re.compile(r"\+" + r"(?<![\w@.+#/-]\+)\d{1,3}(?:[ .-]?\(?\d{1,4}\)?){2,5}" + _E),
        _phone_intl,
        digits=True,
    ),
    Detector(
        "phone",
        re.compile(r"[(\d]" + _L + r"(?:(?<=\()\d{3}\) ?|(?<=\d)\d\d[-. ])\d{3}[-. ]\d{4}" + _E),
        _phone_nanp,
        digits=True,
    ),
    Detector(  # European national formats: 0 + groups (UK 020 7946 0958, FR 06 12 34 56 78)
        "phone",
        re.compile(r"0" + _L + r"\d{1,4}(?:[ /]\d{2,4}){2,4}" + _E),
        _phone_national,
        digits=True,
    ),
    Detector(
        "phone",
        re.compile(
            r"(?<![A-Za-z])(?:"
            + _ci("phone", "tel", "telephone", "mobile", "cell", "whatsapp", "call me")
            + r")\b(?: at| on)?\.?(?: [nN]umber)?\s*[:#-]?\s*(?P<num>\+?\d[\d ().-]{5,20}\d)"
        ),
        _phone_labelled,
        anchors=("phone", "tel", "mobile", "cell", "whatsapp", "call me"),
    ),
)

DIGIT_RUN = re.compile(r"\d[\d ()./-]{5,}\d")
