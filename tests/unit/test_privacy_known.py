"""Whether the local model knows a name (hybridllm.guard.privacy_known), and what the judge and
admission do with it, with a scripted engine that scores texts standing in for the model (the
real model: tests/integration/test_privacy_known_integration.py): the bar is the best invented
name's score plus the margin; a name above it is known; one word never is; scores are kept;
the judge clears a name alone only when every name is known, and only in time; admission drops
`person` from the facts of a cloud-bound "keep-local" request whose names are all known, and
the decision says so; German nouns are not read as names."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import pytest

from hybridllm import HybridClient, Policy
from hybridllm.engines.base import GenerationRequest
from hybridllm.engines.capabilities import ScoresText
from hybridllm.guard.privacy_judge import PrivacyJudge, person_names
from hybridllm.guard.privacy_known import FRAME, MARGIN, NameRecogniser, invented_names, name_words
from hybridllm.guard.privacy_ner_rules import german, name_words as capitalised_name_words
from hybridllm.guard.privacy_public import names_public_figure
from hybridllm.routing.decision import RequestFacts
from hybridllm.runtime.public_names import clear_public_names
from hybridllm.testing import ScriptedEngine
from tests.parts import HAS_NER, needs

pytestmark = pytest.mark.anyio
needs_ner = needs(HAS_NER, "names need the NER layer (privacy extra)")
PRIVATE_SCORE = -10.0  # every text the double does not know
KNOWN = {" Quintavius": -1.0, " Vexmoor": -0.5}  # the rest of two made-up famous names


class ScoringEngine(ScriptedEngine):
    """A scripted local engine that also scores texts: `scores` maps the text scored (the rest
    of a name) to its summed log-probability, split over two tokens; anything else scores
    `PRIVATE_SCORE`. `calls` counts the scorings; `delay_s` makes each take that long."""

    def __init__(self, scores: Mapping[str, float], delay_s: float = 0.0) -> None:
        super().__init__("local", tokens=["local answer"])
        self.scores = dict(scores)
        self.calls: list[tuple[str, str]] = []
        self.delay_s = delay_s

    async def text_logprobs(self, prefix: str, text: str) -> tuple[float, ...]:
        import anyio

        self.calls.append((prefix, text))
        await anyio.sleep(self.delay_s)
        value = self.scores.get(text, PRIVATE_SCORE)
        return (value / 2, value / 2)


@pytest.mark.parametrize(
    ("span", "words"),
    [
        ("Katherine Johnson's", ["Katherine", "Johnson"]),
        ("Dr. Ada Byron", ["Ada", "Byron"]),
        ("Hedy Lamarr", ["Hedy", "Lamarr"]),
        ("about Nina Simone", ["Nina", "Simone"]),
        ("Why is Katherine Johnson", ["Katherine", "Johnson"]),
        ("Simone de Beauvoir", ["Simone", "de", "Beauvoir"]),
        ("Mme", []),
    ],
)
def test_the_words_of_a_name(span: str, words: list[str]) -> None:
    assert name_words(span) == words


async def test_the_bar_is_the_best_invented_name_plus_the_margin() -> None:
    best = invented_names()[3]
    engine = ScoringEngine({" " + best.split(" ", 1)[1]: -3.0, **KNOWN})
    names = NameRecogniser(engine)
    assert isinstance(engine, ScoresText)
    assert await names.bar() == -3.0 + MARGIN
    assert len(engine.calls) == len(invented_names())
    assert all(prefix.startswith(FRAME) for prefix, _ in engine.calls)
    assert await names.known("Zorblax Quintavius")  # -1.0 > -2.5
    assert not await names.known("Hannah Lindqvist")  # -10 < -2.5
    assert not await names.known("Quintavius")  # one word: never scored, never known
    calls = len(engine.calls)
    assert await names.known("Zorblax Quintavius's")  # the same name: its score is kept
    assert len(engine.calls) == calls
    assert await names.bar() == -2.5  # measured once
    assert len(engine.calls) == calls


async def test_the_judge_clears_a_name_alone_only_when_every_name_is_known() -> None:
    judge = PrivacyJudge(ScoringEngine(KNOWN), budget_s=5)
    assert judge.clears_names and judge.names is not None
    texts = ["Compare Zorblax Quintavius and Mira Vexmoor."]
    cleared = await judge.verdict(texts, names=["Zorblax Quintavius", "Mira Vexmoor"])
    assert not cleared.private and not cleared.missed_deadline
    kept = await judge.verdict(texts, names=["Zorblax Quintavius", "Hannah Lindqvist"])
    assert kept.private and kept.span == "Hannah Lindqvist" and not kept.missed_deadline
    slow = PrivacyJudge(ScoringEngine(KNOWN, delay_s=0.05), budget_s=0.2)
    late = await slow.verdict(texts, names=["Zorblax Quintavius"])
    assert late.private and late.missed_deadline  # the bar alone takes 60 x 50 ms


def test_an_engine_that_cannot_score_clears_no_name_unless_told() -> None:
    judge = PrivacyJudge(ScriptedEngine("local"))
    assert judge.names is None and not judge.clears_names
    assert PrivacyJudge(ScriptedEngine("local"), clears_names=True).clears_names


def test_person_names_reads_each_person_finding() -> None:
    from hybridllm.guard.privacy import Finding

    sent = [("messages[0].content", "Who was Hedy Lamarr?")]
    found = [
        Finding("person", "messages[0].content", 8, 19, "person"),
        Finding("person", "conversation", 0, 4, "person"),  # not among the texts: ""
        Finding("email", "messages[0].content", 0, 3, "email"),
    ]
    assert person_names(found, sent) == ["Hedy Lamarr", ""]


CLOUD_FIRST = Policy(
    name="cloud-first-private",
    routing={"prefer": "cloud"},
    privacy={"mode": "keep-local", "ner": True},
    sampling={"max_tokens": 4},
)


def _request(text: str) -> GenerationRequest:
    return GenerationRequest(messages=[{"role": "user", "content": text}], max_tokens=4)


@needs_ner
async def test_admission_drops_person_when_every_name_is_known() -> None:
    judge = PrivacyJudge(ScoringEngine(KNOWN), budget_s=5)
    facts = RequestFacts(prompt_tokens=10, max_tokens=4, privacy_kinds=frozenset({"person"}))
    public = _request("What did Zorblax Quintavius discover about comets?")
    cleared = await clear_public_names(judge, public, CLOUD_FIRST, None, facts)
    assert cleared.privacy_kinds == frozenset() and cleared.public_names == 1
    private = _request("Write a birthday note to Hannah Lindqvist from the team.")
    assert await clear_public_names(judge, private, CLOUD_FIRST, None, facts) == facts
    # not asked where it cannot change the outcome
    assert await clear_public_names(judge, public, CLOUD_FIRST, "local", facts) == facts
    other = dataclasses.replace(facts, privacy_kinds=frozenset({"person", "phone"}))
    assert await clear_public_names(judge, public, CLOUD_FIRST, None, other) == other
    off = CLOUD_FIRST.with_(privacy={"mode": "off"})
    assert await clear_public_names(judge, public, off, None, facts) == facts
    assert await clear_public_names(None, public, CLOUD_FIRST, None, facts) == facts


@needs_ner
async def test_the_client_sends_a_known_name_where_the_policy_says() -> None:
    local = ScoringEngine(KNOWN)
    cloud = ScriptedEngine("cloud", tokens=["cloud answer"])
    async with HybridClient(
        local=local, cloud=cloud, policy=CLOUD_FIRST, privacy="keep-local", privacy_judge=5
    ) as client:
        public = await client.complete("What did Zorblax Quintavius discover about comets?")
        private = await client.complete("Write a birthday note to Hannah Lindqvist.")
    assert public.trace.engine == "cloud"
    assert "privacy_public_names" in public.trace.reason_codes
    assert private.trace.engine == "local"
    assert len(cloud.requests) == 1  # the private name never left


def test_german_nouns_are_not_name_words() -> None:
    text = "Welche Rolle spielte Otto von Bismarck bei der Einigung Deutschlands?"
    assert german(text) and not german("What role did Otto von Bismarck play?")
    assert capitalised_name_words("Welche Rolle", True) == 1
    assert capitalised_name_words("Einigung Deutschlands", True) == 0
    assert capitalised_name_words("Klaus Wagner", True) == 2
    assert capitalised_name_words("Welche Rolle", False) == 2
    de = "Was hat Albert Einstein im Jahr 1905 veröffentlicht?"
    start, end = de.index("Albert"), de.index(" 1905")
    assert names_public_figure(de, start, end, nouns=True)
    assert not names_public_figure(de, start, end)  # "Jahr": a capitalised word, not German


@pytest.mark.parametrize(
    ("text", "name"),
    [
        ("My colleague Deepa Raghunathan keeps taking credit for my work.", "Deepa Raghunathan"),
        ("Mein Nachbar Wolfgang Eichhorn beschwert sich.", "Wolfgang Eichhorn"),
        ("Dile a mi jefa, Carmen Ortiz, que llego tarde.", "Carmen Ortiz"),
        ("Scrivi a mia sorella Giulia per il compleanno.", "Giulia"),
        ("Écris à ma voisine Maëlle Jourdain.", "Maëlle Jourdain"),
    ],
)
def test_a_name_after_a_relation_is_a_private_persons(text: str, name: str) -> None:
    from hybridllm.guard.privacy_ner_rules import find, named_alone

    found = [(kind, text[a:b]) for kind, a, b in find(text)]
    assert ("person", name) in found
    assert named_alone(text, text.index(name))


@pytest.mark.parametrize(
    "text",
    ["my boss wants the report by Friday", "My friend and I went to the cinema.", "mi jefe dice"],
)
def test_a_relation_without_a_capitalised_name_finds_nobody(text: str) -> None:
    from hybridllm.guard.privacy_ner_rules import find

    assert not [k for k, _, _ in find(text) if k == "person"]


def test_a_short_german_question_is_read_as_german() -> None:
    # two function words are enough ("Warum", "als", "der"): "Begründer" is then a noun
    text = "Warum gilt Immanuel Kant als Begründer der kritischen Philosophie?"
    assert german(text)
    start = text.index("Immanuel")
    assert names_public_figure(text, start, text.index(" der"), nouns=True)


async def test_closing_the_client_stops_the_bar_being_measured() -> None:
    import anyio

    local = ScoringEngine(KNOWN, delay_s=0.5)  # the bar would take 60 x 0.5 s
    cloud = ScriptedEngine("cloud", tokens=["ok"])
    with anyio.fail_after(5):
        async with HybridClient(local=local, cloud=cloud, privacy_judge=5):
            await anyio.sleep(0.1)
    assert 1 <= len(local.calls) < len(invented_names())
