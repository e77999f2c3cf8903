"""The privacy scan's NER layer with the real Presidio and spaCy pipelines, against the real
loopback server through a recording FaultProxy: names with home addresses, dates of birth and
passport numbers, in English and French, and a name and address split over two turns, never
reach the cloud under privacy="keep-local"; benign prompts and a question about a public figure
do. What reached the network is read
back from the proxy's log of request bodies."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from hybridllm import HybridClient, LlamaCppEngine, OpenAIEngine, Policy
from hybridllm.errors import PrivacyBlockedError
from hybridllm.guard import privacy_ner
from hybridllm.guard.privacy_ner import NerLayer, PrivacyScanner, default_scanner
from hybridllm.testing import FaultProxy
from tests.integration.servers import ALIAS, API_KEY
from tests.integration.test_guarded_integration import leaked, on_the_wire
from tests.parts import HAS_NER, needs

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.integration,
    needs(
        HAS_NER,
        "the privacy extra (hybridllm[privacy]) is not installed",
    ),
]

# (messages, a kind the scan must name, the values that must never leave the device)
PRIVATE: list[tuple[list[dict[str, str]], str, tuple[str, ...]]] = [
    (
        [{"role": "user", "content": "Write to my landlord. I am Sarah Connolly, 17 Elm Grove, "
                                     "Bristol BS6 5TR."}],
        "person", ("Sarah Connolly", "17 Elm Grove"),
    ),
    (
        [{"role": "user", "content": "Je m'appelle Marie Dupont et j'habite au 12 rue de la Paix, "
                                     "75002 Paris. Écrivez à mon propriétaire."}],
        "address", ("Marie Dupont", "12 rue de la Paix"),
    ),
    ([{"role": "user", "content": "I was born on 14 March 1987 in Leeds. Which star sign am I?"}],
     "date_of_birth", ("14 March 1987",)),
    ([{"role": "user", "content": "Je suis née le 14 juillet 1990 à Lyon. Quel est mon signe ?"}],
     "date_of_birth", ("14 juillet 1990",)),
    ([{"role": "user", "content": "My passport number is 533380006. Does it need renewing?"}],
     "passport", ("533380006",)),
    ([{"role": "user", "content": "Mon numéro de passeport est 12AB34567, est-il valide ?"}],
     "passport", ("12AB34567",)),
    # issue 31: a US address with no name beside it, its street type (Trail) from USPS Pub 28
    ([{"role": "user", "content": "Ship the replacement part to 4821 Copper Creek Trail, Boise, "
                                  "ID 83709."}],
     "address", ("4821 Copper Creek Trail",)),
    (
        [
            {"role": "user", "content": "I need a letter to my landlord."},
            {"role": "assistant", "content": "Sure, what is your name and address?"},
            {"role": "user", "content": "Oliver Pennington, 58"},
            {"role": "user", "content": "Wellington Road, Sheffield"},
        ],
        "address", ("Oliver Pennington", "58 Wellington Road"),
    ),
]  # fmt: skip
BENIGN = [
    "How do I format a street address in an HTML form?",
    "What is a passport number used for?",
    "Comment formater une adresse postale dans un formulaire web ?",
    "Summarise the plot of Hamlet in three sentences.",
    # issue 31: a public figure in a question about public life is not private data
    "Who was Abraham Lincoln and why was he important?",
]


def cloud(proxy: FaultProxy) -> OpenAIEngine:
    return OpenAIEngine(base_url=proxy.url + "/v1", api_key=API_KEY, model=ALIAS)


async def test_personal_data_in_words_stays_local_benign_prompts_go_out(
    proxy: FaultProxy, model_path: Path
) -> None:
    proxy.record = True
    assert default_scanner().deep  # the real NER layer, not the patterns alone
    # loaded first: while it loads, routing leaves names to the guard at the cloud seam (the
    # cloud started, refused there, nothing sent: tests/unit/test_keep_local_names.py); this
    # test is about routing's own reading
    await anyio.to_thread.run_sync(default_scanner().warm)
    local = LlamaCppEngine(model_path, n_ctx=1024, n_threads=1)
    cloud_first = Policy(
        name="cloud-first",
        routing={"prefer": "cloud"},
        sampling={"max_tokens": 2, "temperature": 0},
        privacy={"ner": True},  # the NER layer is asked for (the default: patterns only)
    )
    async with HybridClient(
        local=local, cloud=cloud(proxy), policy=cloud_first, privacy="keep-local"
    ) as c:
        private = [await c.complete(messages) for messages, _, _ in PRIVATE]
        benign = [await c.complete(prompt) for prompt in BENIGN]
        # a forced cloud request with personal data is refused with the documented type
        with pytest.raises(PrivacyBlockedError) as refused:
            await c.complete(PRIVATE[0][0], engine="cloud")
        assert "person" in refused.value.kinds and "Connolly" not in str(refused.value)
    wire = on_the_wire(proxy)
    for (_, kind, secrets), done in zip(PRIVATE, private, strict=True):
        tr = done.trace
        assert tr.engine == "local" and tr.started == ("local",), tr.route_reason
        assert "privacy:" in tr.route_reason and kind in tr.route_reason, tr.route_reason
        for secret in secrets:
            assert not leaked(secret, wire), secret
            assert secret not in repr(tr) + str(tr.summary())
    assert all(done.trace.engine == "cloud" for done in benign)
    assert all(prompt in wire for prompt in BENIGN)
    assert len(proxy.requests()) == len(BENIGN)


async def test_the_guard_alone_stops_a_split_that_reaches_the_seam(proxy: FaultProxy) -> None:
    """Even without routing's scan, the guard at the cloud seam reads the conversation with the
    NER layer: a name in one turn and the street in the next are refused there."""
    from hybridllm.engines.base import GenerationRequest
    from hybridllm.guard.guarded import GuardedEngine

    proxy.record = True
    guard = GuardedEngine(cloud(proxy), privacy="keep-local", scanner=PrivacyScanner(ner="on"))
    await guard.start()
    try:
        request = GenerationRequest(messages=PRIVATE[-1][0], max_tokens=2)
        with pytest.raises(PrivacyBlockedError) as refused:
            async for _ in guard.stream(request):
                pass
        assert {"person", "address"} <= set(refused.value.kinds)
        ok = GenerationRequest(messages=[{"role": "user", "content": BENIGN[0]}], max_tokens=2)
        assert [c async for c in guard.stream(ok)]
    finally:
        await guard.aclose()
    assert len(proxy.requests()) == 1 and not leaked("Pennington", on_the_wire(proxy))


def test_a_long_text_read_in_pieces_finds_what_one_read_finds() -> None:
    """The NER layer reads a long text in pieces (so no single call holds the GIL long): names,
    addresses and dates placed all along it, some across a piece's edge, are found at the same
    places as when the whole text is read at once."""
    filler = "The weather report for the week ahead mentions rain in the north. "
    facts = [
        "I am Sarah Connolly and I live at 17 Elm Grove, Bristol BS6 5TR.",
        "My colleague Oliver Pennington was born on 14 March 1987 in Leeds.",
        "Je m'appelle Marie Dupont et j'habite au 12 rue de la Paix, 75002 Paris.",
    ]
    text = " ".join(filler * (3 + 2 * i) + fact for i, fact in enumerate(facts * 4))
    whole = NerLayer(detect=False, piece=10**9).find(text)
    crossed = 0
    for size in range(300, 600, 50):
        edges = [p.own_to for p in privacy_ner.pieces(text, size)[:-1]]
        crossed += any(s < e < t for e in edges for _, s, t in whole)
        assert NerLayer(detect=False, piece=size).find(text) == whole
    assert crossed, "no finding spans a piece's edge"
    assert {kind for kind, _, _ in whole} >= {"person", "address", "date_of_birth"}
