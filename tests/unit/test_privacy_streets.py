"""The address rule's street types from postal standards (hybridllm.guard.privacy_streets): the
whole of USPS Publication 28's suffix table, Royal Mail's descriptors and the French types are
read, an address with any of them is found (the issue-31 leak: a US address whose type was
missing from the old hand-picked list), and suffixes that are also ordinary words are matched
only as an address writes them."""

from __future__ import annotations

import pytest

from hybridllm.guard.privacy_ner_rules import find
from hybridllm.guard.privacy_streets import english_types, french_types, street_types


def addresses(text: str) -> list[str]:
    return [text[s:e] for kind, s, e in find(text) if kind == "address"]


def test_the_usps_table_is_shipped_whole() -> None:
    types = english_types()
    # a few rows of USPS Pub 28 C1: primary name, a common spelling, the standard abbreviation
    for word in ("trail", "trl", "circle", "crcl", "crossing", "xing", "stravenue", "strvnue"):
        assert word in types
    assert len(types) > 540  # C1 lists about 550 names and abbreviations
    names, abbreviations = french_types()
    assert {"rue", "impasse", "allée", "chemin"} <= names and {"imp", "che", "bd"} <= abbreviations


@pytest.mark.parametrize(
    ("text", "address"),
    [
        ("Ship it to 4821 Copper Creek Trail, Boise, ID 83709.", "4821 Copper Creek Trail"),
        ("Deliver to 77 Quail Run Cir by Friday", "77 Quail Run Cir"),
        ("Pick me up at 1200 Mill Creek XING", "1200 Mill Creek XING"),
        ("The box is at 15 Harbour Close", "15 Harbour Close"),
        ("send it to 310 West 72nd street", "310 West 72nd street"),
        ("j'habite 12, impasse des Lilas à Lyon", "12, impasse des Lilas"),
        ("au 3 Bd Voltaire", "3 Bd Voltaire"),
    ],
)
def test_addresses_with_any_standard_street_type_are_found(text: str, address: str) -> None:
    assert addresses(text) == [address]


@pytest.mark.parametrize(
    "text",
    [
        "The 3 Musketeers is a novel by Dumas.",
        "Send 2 Files via email, please.",
        "I have 2 Big Dogs way too many for this flat.",
        "Chapter 12 Run the tests again.",
        "Python 3 Key features are listed below.",
    ],
)
def test_suffixes_that_are_ordinary_words_need_an_address_s_capitals(text: str) -> None:
    assert addresses(text) == []


def test_the_alternation_tries_longer_types_first() -> None:
    pattern = street_types()
    assert pattern.index("Streets|STREETS") < pattern.index("[sS][tT][rR][eE][eE][tT]")
