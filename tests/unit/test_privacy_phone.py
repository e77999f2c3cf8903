"""Phone numbers read by `phonenumbers` (hybridllm.guard.privacy_phone) before the guard's own
patterns: national formats of the locale's region and of the default list, the locale read from
the environment, bad region settings refused with a typed error, and ordinary numbers in prose
and code left alone."""

from __future__ import annotations

import pytest

from hybridllm.errors import InvalidArgumentError
from hybridllm.guard import privacy_ner
from hybridllm.guard.privacy import kinds, scan
from hybridllm.guard.privacy_ner import PrivacyScanner
from hybridllm.guard.privacy_phone import (
    DEFAULT_REGIONS,
    PhoneFinder,
    available,
    check_regions,
    default_regions,
    locale_regions,
)
from tests.privacy_corpus import BENIGN

pytestmark = pytest.mark.skipif(not available(), reason="phonenumbers is not installed")


@pytest.mark.parametrize(
    "text",
    [
        "Call Jane Whitfield on 07400 123456 tomorrow.",  # UK mobile with a space (issue 31)
        "Llame a Pedro al 612 34 56 78 esta tarde.",  # Spain
        "Ruf mich an: 030 1234567",  # Germany, Berlin
        "Mi numero è 312 345 6789",  # Italy, mobile
        "携帯は 090-1234-5678 です",  # Japan
        "Mon portable : 06.12.34.56.78",  # France, dots
        "Whatsapp me on +91 98765 43210",  # India, international
        "Ring 0049 30 1234567 from abroad",  # Germany, 00 prefix
    ],
)
def test_national_and_international_formats_are_found(text: str) -> None:
    assert kinds(scan(text)) == ("phone",)


def test_the_hint_names_the_country_code_and_two_digits_only() -> None:
    (f,) = scan("Call Jane Whitfield on 07400 123456 tomorrow.")
    assert f.hint == "phone +44***56" and "07400" not in str(f)


def test_benign_numbers_in_prose_and_code_are_left_alone() -> None:
    assert [text for text in BENIGN if scan(text)] == []
    for text in (
        "Where is my order #123-456-7890?",
        "Reference ORD-2024-000123 shipped.",
        "for i in range(1000000): total += i * 31 % 1000000007",
    ):
        assert scan(text) == (), text


def test_regions_decide_which_national_formats_are_read() -> None:
    spanish = "Llame a Pedro al 612 34 56 78."
    assert kinds(PrivacyScanner(ner="off", regions=("ES",)).scan(spanish)) == ("phone",)
    assert PrivacyScanner(ner="off", regions=("GB",)).scan(spanish) == ()
    # an international number is read whatever the regions
    assert kinds(PrivacyScanner(ner="off", regions=("GB",)).scan("+34 612 34 56 78")) == ("phone",)


def test_the_locale_region_comes_first() -> None:
    assert locale_regions({"LANG": "en_GB.UTF-8"}) == ("GB",)
    assert locale_regions({"LC_ALL": "pt_BR", "LANG": "en_US.UTF-8"}) == ("BR",)
    assert locale_regions({"LANG": "C.UTF-8"}) == () and locale_regions({}) == ()
    assert default_regions({"LANG": "sv_SE.UTF-8"})[:2] == ("SE", "US")
    assert default_regions({"LANG": "fr_FR.UTF-8"}) == (
        "FR",
        *(r for r in DEFAULT_REGIONS if r != "FR"),
    )
    assert PhoneFinder(("gb", "GB", "fr")).regions == ("GB", "FR")


def test_bad_regions_are_a_typed_error_naming_the_argument() -> None:
    with pytest.raises(InvalidArgumentError, match=r"regions\[1\] must be a region code"):
        check_regions(["GB", "XQ"])
    with pytest.raises(InvalidArgumentError, match="regions must be a sequence"):
        check_regions("GB")
    with pytest.raises(InvalidArgumentError, match=r"regions\[0\]"):
        PrivacyScanner(ner="off", regions=(7,))  # type: ignore[arg-type]


def test_the_default_scanner_reads_its_regions_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(privacy_ner, "_default", None)
    monkeypatch.setenv(privacy_ner.REGIONS_ENV, "es, gb")
    assert privacy_ner.default_scanner().regions == ("ES", "GB")
    monkeypatch.setattr(privacy_ner, "_default", None)
    monkeypatch.setenv(privacy_ner.REGIONS_ENV, "GB,Narnia")
    with pytest.raises(InvalidArgumentError, match=r"\$HYBRIDLLM_PRIVACY_REGIONS\[1\]"):
        privacy_ner.default_scanner()
    monkeypatch.setattr(privacy_ner, "_default", None)


def test_after_a_phone_word_a_valid_number_counts_however_it_is_grouped() -> None:
    from hybridllm.guard.privacy import scan, scan_text

    # German numbering groups this mobile "01523 3819046"; people write it 4-4-4 too
    assert [f.kind for f in scan_text("Meine Handynummer ist 0152 3381 9046")] == ["phone"]
    assert scan_text("Bestellung 0152 3381 9046") == []  # no phone word: grouping checked
    split = [
        {"role": "user", "content": "Meine Handynummer beginnt mit 0152"},
        {"role": "assistant", "content": "Und weiter?"},
        {"role": "user", "content": "dann 3381 9046"},
    ]
    assert [f.hint for f in scan(split)] == ["phone *** (split)"]
