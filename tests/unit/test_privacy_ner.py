"""The privacy scan's NER layer: its context rules (plain regexes, no model), its configuration
and fallback when Presidio or a spaCy model is missing, and where it runs (only for requests that
could reach the cloud). The real pipelines on real prompts: tests/integration/
test_privacy_ner_integration.py; the corpus figures: benchmarks/bench_privacy.py."""

from __future__ import annotations

import os
import sys
import threading
import warnings
from collections.abc import Collection, Mapping, Sequence

import anyio
import pytest

from hybridllm import ConfigError, HybridClient, Policy
from hybridllm.engines.base import GenerationRequest
from hybridllm.guard import privacy_ner
from hybridllm.guard.guarded import GuardedEngine
from hybridllm.guard.privacy import kinds
from hybridllm.guard.privacy_ner import (
    NerLayer,
    PrivacyNerUnavailableWarning,
    PrivacyScanner,
    default_scanner,
)
from hybridllm.guard.privacy_ner_rules import detect_languages, find, named_alone, nir_ok
from hybridllm.runtime.gather import Gatherer
from hybridllm.testing import ScriptedEngine
from tests.parts import HAS_NER, needs

pytestmark = pytest.mark.anyio


def found(text: str) -> list[tuple[str, str]]:
    return [(kind, text[s:e]) for kind, s, e in find(text)]


@pytest.mark.parametrize(
    ("text", "kind", "value"),
    [
        ("I was born on 14 March 1987 in Leeds.", "date_of_birth", "14 March 1987"),
        ("DOB: 03/11/1992, am I old enough?", "date_of_birth", "03/11/1992"),
        ("Je suis née le 14 juillet 1990 à Lyon.", "date_of_birth", "14 juillet 1990"),
        ("Ich bin am 3. März 1985 geboren.", "date_of_birth", "3. März 1985"),
        ("Nací el 5 de mayo de 1990.", "date_of_birth", "5 de mayo de 1990"),
        ("My passport number is 533380006.", "passport", "533380006"),
        ("Mon numéro de passeport est 12AB34567.", "passport", "12AB34567"),
        ("Book it for Anna, passport 72 3456789.", "passport", "72 3456789"),
        ("Mi DNI es 12345678Z, ¿qué hago?", "national_id", "12345678Z"),
        ("Personalausweis: L01X00T47, verloren", "national_id", "L01X00T47"),
        (
            "numéro de sécurité sociale 1 85 03 75 123 456 41",
            "national_id",
            "1 85 03 75 123 456 41",
        ),
        ("I live at 42 Baker Street, London.", "address", "42 Baker Street"),
        ("Recipient: 310 West 72nd Street, New York", "address", "310 West 72nd Street"),
        ("j'habite au 12 rue de la Paix, Paris", "address", "12 rue de la Paix"),
        ("wohne in der Hauptstraße 5, Berlin", "address", "Hauptstraße 5"),
        ("vivo en Calle Mayor 10, Madrid", "address", "Calle Mayor 10"),
        ("my name is kevin stuart and i need help", "person", "kevin stuart"),
        ("Nom : Sandrine Faure", "person", "Sandrine Faure"),
    ],
)
def test_context_rules_find_values_next_to_their_cue(text: str, kind: str, value: str) -> None:
    assert (kind, value) in found(text)


@pytest.mark.parametrize(
    "text",
    [
        "How do I format a street address in an HTML form?",
        "What is a passport number used for?",
        "What does DOB mean on a medical form?",
        "The meeting is on 2024-03-15 at 14:00 UTC in room 42.",
        "Comment est calculée la clé d'un numéro de sécurité sociale, en général ?",
        "Upgrade numpy from 1.26.4 to 2.0.1 and pin scipy>=1.13.0,<1.14.",
        "My name is not important here.",
    ],
)
def test_context_rules_leave_general_mentions_alone(text: str) -> None:
    assert [k for k, _ in found(text) if k != "person"] == []


def test_a_french_nir_without_cue_needs_its_key() -> None:
    assert nir_ok("1 85 03 75 123 456 41") and nir_ok("2 84 11 2A 004 021 27".replace("2A", "13"))
    assert not nir_ok("1 85 03 75 123 456 42")
    assert found("dossier 185037512345641 complet") == [("national_id", "185037512345641")]
    assert found("dossier 185037512345642 complet") == []


def test_language_detection_picks_one_pipeline_when_clear() -> None:
    assert detect_languages("My name is John and I live in the city") == ("en",)
    assert detect_languages("Je m'appelle Marie et j'habite à Paris avec mon chat") == ("fr",)
    assert detect_languages("Hauptstraße 5") == ("en", "fr")  # unclear: both read it
    assert detect_languages("the cat and the dog", ("fr",)) == ("fr",)


def test_naming_cues() -> None:
    assert named_alone("Hi, my name is ", 15) and named_alone("Bonjour Mme ", 12)
    assert not named_alone("Summarise the plot of ", 22)


# ---- configuration and fallback ----------------------------------------------------------------


def missing_models(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(privacy_ner, "MODELS", {"en": ("no_such_model_xyz",), "fr": ()})


def test_ner_off_is_the_patterns_alone() -> None:
    scanner = PrivacyScanner(ner="off")
    assert not scanner.deep and "NER off" in scanner.status().describe()
    text = "My name is John Whitaker, mail john@corp-mail.org, 42 Baker Street"
    assert kinds(scanner.scan(text)) == ("email",)
    scanner.warm()  # nothing to load


def test_ner_on_without_the_models_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    missing_models(monkeypatch)
    with pytest.raises(ConfigError, match="no_such_model_xyz.*hybridllm\\[privacy\\]"):
        PrivacyScanner(ner="on")
    with pytest.raises(ConfigError, match="ner must be one of"):
        PrivacyScanner(ner="maybe")  # type: ignore[arg-type]


def test_auto_without_the_models_scans_patterns_and_warns_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    missing_models(monkeypatch)
    monkeypatch.setattr(privacy_ner, "_warned", privacy_ner.threading.Event())
    scanner = PrivacyScanner()  # auto
    assert not scanner.deep and not scanner.status().available
    assert "patterns only" in scanner.status().describe()
    with pytest.warns(PrivacyNerUnavailableWarning, match="patterns only.*not detected"):
        assert kinds(scanner.scan("I am John Whitaker, card 4111 1111 1111 1111")) == ("card",)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        scanner.scan("again")  # once per process
        scanner.scan("no deep scan", deep=False)


def test_the_default_scanner_reads_its_mode_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(privacy_ner, "_default", None)
    monkeypatch.setenv(privacy_ner.ENV, "off")
    first = default_scanner()
    assert first.ner == "off" and default_scanner() is first
    monkeypatch.setattr(privacy_ner, "_default", None)
    monkeypatch.setenv(privacy_ner.ENV, "sometimes")
    with pytest.raises(ConfigError, match="HYBRIDLLM_PRIVACY_NER"):
        default_scanner()


@needs(HAS_NER, "the privacy extra is not installed")
def test_a_missing_spacy_model_is_never_downloaded(monkeypatch: pytest.MonkeyPatch) -> None:
    import spacy.cli

    def no_download(*args: object, **kwargs: object) -> None:
        raise AssertionError("spacy.cli.download was called")

    monkeypatch.setattr(spacy.cli, "download", no_download)
    with pytest.raises(ConfigError, match="no_such_model_xyz is not installed"):
        privacy_ner.build_analyzer({"en": "no_such_model_xyz"})


def test_findings_across_two_messages_are_placed_in_the_conversation() -> None:
    items = [("messages[0].content", "My name is"), ("messages[1].content", "Jean Dupont")]
    # "Jean Dupont" in the joined text "My name is Jean Dupont": inside the second message
    inside = privacy_ner._located(items, [("person", 11, 22)])
    assert [(f.location, f.span) for f in inside] == [("messages[1].content", (0, 11))]
    across = privacy_ner._located(items, [("address", 3, 15)])
    assert across[0].location == "conversation" and across[0].origin == "ner"


# ---- only requests that could reach the cloud pay for the NER layer ----------------------------


class Recorder:
    def __init__(self) -> None:
        self.deep: list[bool] = []

    def __call__(
        self, messages: Sequence[Mapping[str, str]], *, deep: bool = True, extra: object = ()
    ) -> Collection[str]:
        self.deep.append(deep)
        return ()


def test_routing_scans_deeply_only_what_could_reach_the_cloud() -> None:
    scan = Recorder()
    routing = Gatherer(privacy=scan)
    request = GenerationRequest(messages=[{"role": "user", "content": "hi"}])
    both = {"local": ScriptedEngine("local"), "cloud": ScriptedEngine("cloud")}
    keep = Policy(name="p", privacy={"mode": "keep-local", "ner": True})
    routing.facts(request, keep, None, both)
    routing.facts(request, keep, "local", both)  # forced local
    routing.facts(request, keep, None, {"local": both["local"]})  # no cloud engine
    routing.facts(request, keep.with_(routing={"allow_cloud": False}), None, both)
    routing.facts(
        request, Policy(name="b", privacy={"mode": "block", "ner": True}), "local", both
    )  # block: refuses
    routing.facts(request, Policy(name="n"), None, both)  # the default: NER where installed
    routing.facts(request, Policy(name="f", privacy={"ner": False}), None, both)  # way out
    local_first = keep.with_(routing={"prefer": "local"})  # NER at the cloud seam only
    routing.facts(request, local_first, None, both)
    routing.facts(request, Policy(name="o", privacy={"mode": "off"}), None, both)  # no scan
    installed = default_scanner().deep
    assert scan.deep == [True, False, False, False, True, installed, False, False]


async def test_a_local_request_never_runs_the_ner_layer_scripted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Orchestration with ScriptedEngine doubles; the NER layer's entry point is counted."""
    calls: list[str] = []

    def counting(self: NerLayer, text: str) -> list[tuple[str, int, int]]:
        calls.append(text)
        return [("person", 0, 4)] if "Whitaker" in text else []

    monkeypatch.setattr(NerLayer, "find", counting)
    monkeypatch.setattr(NerLayer, "available", property(lambda self: True))
    monkeypatch.setattr(NerLayer, "load", lambda self: None)
    monkeypatch.setattr(NerLayer, "loaded", property(lambda self: True))  # not still loading
    monkeypatch.setattr(privacy_ner, "_default", PrivacyScanner(ner="auto"))
    local = ScriptedEngine("local", tokens=["local"])
    cloud = ScriptedEngine("cloud", tokens=["cloud"])
    cloud_first = Policy(name="cf", routing={"prefer": "cloud"}, privacy={"ner": True})
    async with HybridClient(
        local=local, cloud=cloud, policy=cloud_first, privacy="keep-local"
    ) as client:
        assert (await client.complete("Hi, John Whitaker here", engine="local")).text == "local"
        assert calls == []  # forced local: the patterns only
        done = await client.complete("Hi, John Whitaker here")
        # the NER layer (its finder says "person" only) kept it local
        assert done.text == "local" and "privacy_local" in done.trace.reason_codes
        assert (await client.complete("What is 2+2?")).text == "cloud"
    assert "Whitaker" not in str(cloud.requests)
    # routing and the guard read the same cloud-bound prompt: the guard's scan of the benign one
    assert calls.count("Hi, John Whitaker here") == 1 and "What is 2+2?" in calls


@pytest.mark.parametrize(
    "text",
    [
        "",
        "short",
        ("word7 " * 400).strip(),
        "x" * 2_500,  # no whitespace (a CJK prompt reads so)
        "\n".join(["alpha bravo charlie"] * 300),
    ],
)
def test_pieces_tile_the_text_and_bound_each_read(text: str) -> None:
    cut = privacy_ner.pieces(text, size=500, margin=60)
    assert [p.own_from for p in cut[1:]] == [p.own_to for p in cut[:-1]]
    if text:
        assert cut[0].own_from == 0 and cut[-1].own_to == len(text)
    for p in cut:
        assert p.read_from <= p.own_from < p.own_to <= p.read_to <= len(text)
        assert p.read_to - p.read_from <= 500 + 4 * 60
        assert p.own_from - p.read_from >= min(p.own_from, 60) - 60  # context kept when there


def test_a_piece_is_cut_at_whitespace_and_read_with_its_margins() -> None:
    text = "Dear reader, " * 200
    for p in privacy_ner.pieces(text, size=300, margin=40):
        assert p.own_to == len(text) or text[p.own_to - 1].isspace()
        assert p.read_from == 0 or text[p.read_from - 1].isspace()
        assert p.own_from - p.read_from >= 40 or p.read_from == 0
        assert p.read_to - p.own_to >= 40 or p.read_to == len(text)


def test_scanners_over_the_same_pipelines_share_one_analyzer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A second scanner (another client, one made per call) reads the pipelines the first one
    loaded: they are built once per process and set of models."""
    built: list[dict[str, str]] = []
    monkeypatch.setattr(privacy_ner, "_analyzers", {})
    monkeypatch.setattr(
        privacy_ner, "build_analyzer", lambda models: built.append(dict(models)) or object()
    )
    monkeypatch.setattr(privacy_ner, "find_models", lambda languages: ({"en": "m_en"}, []))
    first, second = privacy_ner.NerLayer(("en",)), privacy_ner.NerLayer(("en",))
    first.load()
    second.load()
    assert built == [{"en": "m_en"}] and first.loaded and second.loaded
    monkeypatch.setattr(privacy_ner, "find_models", lambda languages: ({"fr": "m_fr"}, []))
    privacy_ner.NerLayer(("fr",)).load()  # other pipelines: built for themselves
    assert built == [{"en": "m_en"}, {"fr": "m_fr"}]


class _SlowStart(ScriptedEngine):
    """A scripted local engine whose start takes a moment (a model's load), noting its end."""

    def __init__(self, order: list[str]) -> None:
        super().__init__("local", tokens=["l"])
        self.order = order

    async def start(self) -> None:
        await super().start()
        await anyio.sleep(0.02)
        self.order.append("local started")


async def test_the_ner_pipelines_load_once_the_engines_have_started_at_the_lowest_priority(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The pipelines' load holds the GIL for seconds: started beside the local engine's start,
    it slowed that start about 3x (benchmarks/bench_open.py), so the client starts it after,
    on a thread at the lowest CPU priority (Linux), so that the answers it overlaps keep
    their pace."""
    order: list[str] = []
    nice: list[int] = []

    def warm(self: PrivacyScanner) -> None:
        order.append("ner")
        if sys.platform.startswith("linux"):
            nice.append(os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))

    monkeypatch.setattr(PrivacyScanner, "warm", warm)
    cloud = ScriptedEngine("cloud", tokens=["c"])  # its guard opens at once
    async with HybridClient(local=_SlowStart(order), cloud=cloud, router=None) as client:
        for thread in threading.enumerate():
            if thread.name == "hybridllm-ner":
                thread.join(5)
        assert order == ["local started", "ner"]
        guard = client.cloud
        assert isinstance(guard, GuardedEngine) and guard.preload_at_start is False
    guard = GuardedEngine(ScriptedEngine("cloud", tokens=["c"]), privacy="keep-local")
    await guard.start()  # alone, a guard still loads them as it starts
    for thread in threading.enumerate():
        if thread.name == "hybridllm-ner":
            thread.join(5)
    assert order == ["local started", "ner", "ner"]
    if sys.platform.startswith("linux"):
        assert nice == [19, 19]  # the loading thread's own priority...
        assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) < 19  # ...not ours
