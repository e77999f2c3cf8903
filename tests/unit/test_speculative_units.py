"""The speculative plan's pieces without a model: the verifier dialects read against the
response shapes their documentation gives (replayed by an httpx MockTransport, named as such:
no vLLM or OpenAI server runs here), the probe's choice of dialect, the expected-gain
arithmetic that picks k and says when speculation stops paying, the routing rule, and the
guard's path for verification calls (privacy scan, reservation, settlement).

Shapes replayed:
- vLLM `/v1/completions` with `prompt_logprobs`: `choices[0].prompt_logprobs` is a list with
  None first, then per prompt position a dict token_id -> {logprob, rank, decoded_token} (the
  top `prompt_logprobs` tokens and the prompt's own token); `return_tokens_as_token_ids` makes
  `logprobs.tokens` read "token_id:<id>".
- OpenAI chat completions with `prediction`: `usage.completion_tokens_details` carries
  `accepted_prediction_tokens` and `rejected_prediction_tokens`; rejected ones are billed as
  output (they are counted in `completion_tokens`).
- llama-cpp-python's echo answer: the shape recorded from the real server (SmolLM2, a ChatML
  prompt led by BOS, so rows are not shifted).
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import httpx2
import pytest

from hybridllm import GuardedEngine, Ledger, ModelPrice, Policy, Prices, PrivacyBlockedError
from hybridllm.engines.scripted import ScriptedEngine
from hybridllm.engines.verify import (
    EchoVerifier,
    PredictionVerifier,
    Round,
    Unverifiable,
    echo_shift,
    read_echo,
)
from hybridllm.engines.verify_probe import probe
from hybridllm.engines.verify_vllm import (
    PromptLogprobsVerifier,
    TextLogprobsVerifier,
    read_prompt_logprobs,
)
from hybridllm.errors import ServerError
from hybridllm.guard.budget import TokenUsage
from hybridllm.routing.decide import LiveState, RequestFacts, decide
from hybridllm.runtime.speculation import Outlook, expected_tokens

pytestmark = pytest.mark.anyio


def entry(
    own: int, own_lp: float, own_rank: int, text: str, *others: tuple[int, float, str]
) -> dict[str, Any]:
    """One vLLM prompt_logprobs position: the prompt's own token and the top others."""
    e = {str(own): {"logprob": own_lp, "rank": own_rank, "decoded_token": text}}
    for rank, (tok, lp, t) in enumerate(others, start=1):
        e[str(tok)] = {"logprob": lp, "rank": rank, "decoded_token": t}
    return e


def vllm_answer(n_ctx: int, draft: list[int], reject_at: int | None) -> dict[str, Any]:
    plp: list[Any] = [None] + [entry(1, -0.5, 1, "x") for _ in range(n_ctx - 1)]
    for j, tok in enumerate(draft):
        if j == reject_at:
            plp.append(entry(tok, -2.0, 3, f"d{j}", (77, -0.3, " own"), (78, -0.9, " two")))
        else:
            plp.append(entry(tok, -0.1, 1, f"d{j}", (tok, -0.1, f"d{j}"), (55, -3.0, "z")))
    return {
        "choices": [{"text": " gen", "index": 0, "finish_reason": "length",
                     "prompt_logprobs": plp,
                     "logprobs": {"tokens": ["token_id:99"], "text_offset": [0],
                                  "token_logprobs": [-0.2],
                                  "top_logprobs": [{"token_id:99": -0.2, "token_id:98": -2.5}]}}],
        "usage": {"prompt_tokens": n_ctx + len(draft), "completion_tokens": 1,
                  "total_tokens": n_ctx + len(draft) + 1},
    }  # fmt: skip


ROUND = Round("P", "", [1, 2, 3], [10, 11, 12], ["d0", "d1", "d2"])


def test_vllm_prompt_logprobs_accepts_rank_one_tokens_and_takes_the_clouds_own() -> None:
    v = read_prompt_logprobs(vllm_answer(3, [10, 11, 12], reject_at=1), ROUND)
    assert (v.accepted, v.accepted_text, v.next_id, v.text) == (1, "d0", 77, "d0 own")
    assert v.gap == pytest.approx(0.6) and not v.finished
    assert (v.prompt_tokens, v.completion_tokens) == (6, 1)
    # the texts come from the local tokenizer when it is at hand (a server may name tokens
    # "token_id:N" everywhere with return_tokens_as_token_ids, as hybridllm serve does)
    local = replace(ROUND, text_of=lambda ids: "|".join(f"t{i}" for i in ids))
    v = read_prompt_logprobs(vllm_answer(3, [10, 11, 12], reject_at=1), local)
    assert (v.accepted_text, v.text) == ("d0", "t10|t77")
    whole = read_prompt_logprobs(vllm_answer(3, [10, 11, 12], reject_at=None), ROUND)
    assert (whole.accepted, whole.next_id, whole.text) == (3, 99, "d0d1d2 gen")
    assert whole.gap == pytest.approx(2.3)


def test_predicted_outputs_commit_the_clouds_own_text_and_count_accepted_tokens() -> None:
    answer = {
        "choices": [{"index": 0, "finish_reason": "length",
                     "message": {"role": "assistant", "content": "d0d1 other"}}],
        "usage": {"prompt_tokens": 40, "completion_tokens": 5,
                  "completion_tokens_details": {"accepted_prediction_tokens": 2,
                                                "rejected_prediction_tokens": 1}},
    }  # fmt: skip
    pv = PredictionVerifier(None)  # type: ignore[arg-type]  # read() only
    v = pv.read(answer, ROUND)
    assert (v.accepted, v.accepted_text, v.text, v.finished) == (2, "d0d1", "d0d1 other", False)
    assert (v.prompt_tokens, v.completion_tokens) == (40, 5)  # rejected ones are in the 5
    assert pv.counts == {"accepted": 2, "rejected": 1}


# the real llama_cpp.server's echo answer for a BOS-led ChatML prompt (SmolLM2), cut short
ECHO = {
    "choices": [{"text": "...", "index": 0, "finish_reason": "length", "logprobs": {
        "tokens": ["user", "\n", "What", " is", " ", "2", "+", "2", "?", "", "\n", "ass",
                   "istant", "\n", "The", " answer", " is", ":"],
        "text_offset": [0, 4, 5, 9, 12, 13, 14, 15, 16, 17, 17, 18, 21, 27, 28, 31, 38, 41],
        "token_logprobs": [None] + [-1.0] * 17,
        "top_logprobs": [None, {"\n": -3.3, " the": -3.4}, {"\n": -2.4, "What": -3.8},
                         {" is": -0.8, " are": -2.2}, {" the": -0.6, " ": -4.5},
                         {"1": -1.0, "2": -2.1}, {"0": -1.0, "+": -3.7}, {"2": -0.3, "1": -2.0},
                         {"+": -1.35, "?": -1.36}, {"": -0.2, "\n": -2.2},
                         {"\n": -0.0001, "\n\n": -10.1}, {"ass": -0.008, "user": -4.9},
                         {"istant": -0.00001, "istent": -12.8}, {"\n": -0.0004, "": -8.7},
                         {"The": -1.55, "To": -2.08}, {" answer": -0.63, " expression": -3.4},
                         {" is": -0.49, " to": -1.21}, {":": -1.03, " ": -1.31}]}}],
    "usage": {"prompt_tokens": 19, "completion_tokens": 1, "total_tokens": 20},
}  # fmt: skip


def test_echo_rows_are_read_as_the_answer_shows_and_the_first_disagreement_ends_the_round() -> None:
    assert echo_shift(ECHO) == 0
    prompt = "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n"
    agree = Round(prompt, "The", [], [1, 2], [" answer", " is"])
    v = read_echo(ECHO, agree, 0)
    assert (v.accepted, v.accepted_text, v.text) == (2, " answer is", " answer is:")
    assert v.gap == pytest.approx(0.28)
    # a draft the cloud disagrees with: " answer" is greedy, " is" is, but the draft said " to"
    ECHO2 = json.loads(json.dumps(ECHO))
    ECHO2["choices"][0]["logprobs"]["top_logprobs"][16] = {" was": -0.2, " is": -1.5}
    v2 = read_echo(ECHO2, agree, 0)
    assert (v2.accepted, v2.text) == (1, " answer was")
    # a greedy "" (an end, or a split character) cannot be judged from strings
    ECHO2["choices"][0]["logprobs"]["top_logprobs"][16] = {"": -0.2, " is": -1.5}
    with pytest.raises(Unverifiable):
        read_echo(ECHO2, agree, 0)


def replay(routes: dict[str, Any]) -> httpx2.AsyncClient:
    """A MockTransport replaying documented answers by path (status 404 elsewhere)."""

    def handler(request: httpx2.Request) -> httpx2.Response:
        body = json.loads(request.content)
        for path, answer in sorted(routes.items(), key=lambda kv: -len(kv[0])):
            if request.url.path.endswith(path):
                data = answer(body) if callable(answer) else answer
                if isinstance(data, int):
                    return httpx2.Response(data, json={"error": {"message": "no"}})
                return httpx2.Response(200, json=data)
        return httpx2.Response(404, json={"detail": "Not Found"})

    return httpx2.AsyncClient(transport=httpx2.MockTransport(handler), base_url="http://x/v1/")


def vllm_probe(body: dict[str, Any]) -> dict[str, Any]:
    ids = body["prompt"] if isinstance(body["prompt"], list) else [1, 2, 3]
    plp = [None] + [{str(t): {"logprob": -0.1, "rank": 1, "decoded_token": f"<{t}>"}}
                    for t in ids[1:]]  # fmt: skip
    return {"choices": [{"text": "x", "index": 0, "finish_reason": "length",
                         "prompt_logprobs": plp}],
            "usage": {"prompt_tokens": len(ids), "completion_tokens": 1}}  # fmt: skip


async def test_probe_finds_each_dialect_or_says_why_none() -> None:
    async with replay({"/completions": vllm_probe}) as c:
        found = await probe(c, "m", [5, 6, 7], ["<5>", "<6>", "<7>"])
        assert isinstance(found.verifier, PromptLogprobsVerifier), found.reason
        assert found.verifier.raw and "raw log-probabilities" in found.reason
        other = await probe(c, "m", [5, 6, 7], ["a", "b", "c"])  # another tokenizer
        assert isinstance(other.verifier, TextLogprobsVerifier), other.reason
        assert "text-level" in other.reason
    openai_like = {
        "/chat/completions": {
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": "OK"}}],
            "usage": {"prompt_tokens": 12, "completion_tokens": 1,
                      "completion_tokens_details": {"accepted_prediction_tokens": 1,
                                                    "rejected_prediction_tokens": 0}}},
        "/completions": 404,
    }  # fmt: skip
    async with replay(openai_like) as c:
        found = await probe(c, "m")
        assert isinstance(found.verifier, PredictionVerifier), found.reason
    async with replay({"/completions": 500, "/chat/completions": {
            "choices": [{"index": 0, "finish_reason": "stop", "message": {"content": "OK"}}],
            "usage": {"prompt_tokens": 12, "completion_tokens": 1}}}) as c:  # fmt: skip
        none = await probe(c, "m")
    assert none.verifier is None
    assert "completions: HTTP 500: verification refused" in none.reason
    assert "no prediction token counts" in none.reason
    async with replay({"/completions": ECHO}) as c:
        echo = await probe(c, "m")
    assert isinstance(echo.verifier, EchoVerifier)


def test_k_follows_acceptance_and_speculation_steps_aside_when_it_stops_paying() -> None:
    assert expected_tokens(0.0, 8) == pytest.approx(1.0)
    assert expected_tokens(1.0, 8) == 9.0
    assert expected_tokens(0.8, 8) == pytest.approx((1 - 0.8**9) / 0.2)
    good, bad = Outlook(), Outlook()
    for _ in range(6):
        good.observe(8, 8, 8 * 0.02, 0.05)  # all accepted, 20 ms per draft token, 50 ms RTT
        bad.observe(8, 1, 8 * 0.02, 0.60)  # little accepted, long round trip
    assert good.best_k() > bad.best_k()
    assert good.pays(0.04)[0]  # beats a 25 tok/s plain stream
    pays, why = bad.pays(0.04)
    assert not pays and "vs plain cloud 25.0 tok/s" in why
    assert Outlook().pays(0.04)[0]  # too few rounds to judge: try
    # a round of one draft moves the acceptance less than a round of eight
    one, eight = Outlook(), Outlook()
    one.observe(1, 0, 0.02, 0.1)
    eight.observe(8, 0, 0.16, 0.1)
    assert eight.acceptance < one.acceptance < 0.7
    # rounds without drafts (round 0, a cloud step) teach nothing; unmeasured drafting: try
    blank = Outlook()
    for _ in range(5):
        blank.observe(0, 0, 0.0, 1.5)
    assert blank.rounds == 0 and blank.verify_s is None
    assert blank.pays(0.02) == (True, "acceptance 0.70 (too few rounds to judge the pay)")
    # a request that would not pay streams plainly, except once in EXPLORE_EVERY
    from hybridllm.runtime.speculation import EXPLORE_EVERY

    explored = [bad.explore() for _ in range(3 * EXPLORE_EVERY)]
    assert explored.count(True) == 3 and explored[EXPLORE_EVERY - 1]


def test_a_fixed_k_drafts_k_and_never_steps_aside_for_pay_but_adaptive_k_does() -> None:
    from hybridllm.runtime.plans.speculative import SpeculativeSetup, _should_switch
    from hybridllm.runtime.speculation import SpeculationState

    bad = Outlook()
    for _ in range(6):
        bad.observe(8, 1, 8 * 0.02, 0.60)
    eng = ScriptedEngine("cloud")
    adaptive = SpeculativeSetup(eng, eng, SpeculationState(), cloud_tpot_s=0.04)
    fixed = SpeculativeSetup(eng, eng, SpeculationState(), cloud_tpot_s=0.04, k=8)
    why = _should_switch(bad, adaptive, billed_prompt=100, n_out=20)
    assert why is not None and why.startswith("speculation stopped paying")
    assert _should_switch(bad, fixed, billed_prompt=100, n_out=20) is None
    capped = SpeculativeSetup(eng, eng, SpeculationState(), 0.04, k=8, max_prompt_overhead=2.0)
    assert "verification overhead" in (_should_switch(bad, capped, 100, 20) or "")
    assert Policy(speculative={"k": 8}).speculative.k == 8 and Policy().speculative.k is None


def test_decide_chooses_speculative_when_asked_or_when_it_pays_with_the_reason() -> None:
    pol = Policy(plans=("single", "speculative"))
    facts = RequestFacts(prompt_tokens=20, max_tokens=64)
    yes = decide(facts, pol, LiveState(speculation=(True, "expected 30 tok/s vs 20")))
    assert yes.plan == "speculative" and (yes.primary, yes.fallback) == ("cloud", "local")
    assert "speculative: expected to pay (expected 30 tok/s vs 20)" in yes.reason
    no = decide(facts, pol, LiveState(speculation=(False, "acceptance 0.20")))
    assert no.plan != "speculative" and "no speculative plan: acceptance 0.20" in no.reason
    off = decide(facts, Policy(), LiveState(speculation=(True, "x")))
    assert off.plan != "speculative"  # the policy does not allow it
    asked = decide(RequestFacts(20, 64, plan="speculative"), Policy(),
                   LiveState(speculation=(False, "acceptance 0.20")))  # fmt: skip
    assert asked.plan == "speculative" and "asked by the caller" in asked.reason
    local_only = decide(RequestFacts(20, 64, plan="speculative"),
                        Policy(routing={"allow_cloud": False}), LiveState())  # fmt: skip
    assert local_only.plan != "speculative" and "needs both engines" in local_only.reason


async def test_verification_calls_go_through_the_guard() -> None:
    prices = Prices(models={"scripted": ModelPrice(input_per_million=1.0, output_per_million=2.0)})
    ledger = Ledger()
    guard = GuardedEngine(ScriptedEngine("cloud"), privacy="keep-local", ledger=ledger,
                          prices=prices)  # fmt: skip
    settled: list[tuple[TokenUsage, float]] = []
    from hybridllm.guard.guarded import RequestContext

    ctx = RequestContext(on_settle=lambda u, usd: settled.append((u, usd)))

    async def call() -> tuple[str, TokenUsage | None]:
        return "verdict", TokenUsage(120, 3)

    got = await guard.guarded_call([("p", "a prompt")], 130, 9, call, ctx)
    assert got == "verdict" and settled[0][0] == TokenUsage(120, 3)
    assert settled[0][1] == pytest.approx((120 * 1.0 + 3 * 2.0) / 1e6)

    async def never() -> tuple[str, TokenUsage | None]:
        raise AssertionError("a flagged verification must not be sent")

    with pytest.raises(PrivacyBlockedError):
        await guard.guarded_call([("p", "mail bob.jones@corp-mail.org")], 10, 2, never, ctx)

    async def refused() -> tuple[str, TokenUsage | None]:
        raise ServerError("down", status_code=503)

    with pytest.raises(ServerError):
        await guard.guarded_call([("p", "x")], 10, 2, refused, ctx)
    assert len(settled) == 1  # an error status before content is released, not billed


def test_a_speculative_trace_does_not_teach_the_latency_model_the_clouds_speed() -> None:
    from hybridllm.runtime.latency import LatencyModel
    from hybridllm.runtime.trace import Speculation, Trace

    model = LatencyModel()
    trace = Trace(t_start=0.0, engine="cloud", started=["cloud"])
    for t in (3.0, 6.0, 9.0, 12.0):  # commits in bursts, one per slow verification round
        trace.token(t)
    trace.speculation = Speculation(verifier="echo-logprobs", rounds=4)
    before = model.engine("cloud").tpot()
    model.observe_trace(trace, 20)
    assert model.engine("cloud").tpot() == before and model.engine("cloud").samples == 0


class _FakeDrafter:
    """Tokenizes the probe text one character per token (enough for the probe's checks)."""

    def tokenize(self, text: str) -> list[int]:
        return [ord(c) for c in text]

    def piece(self, ids: list[int], prev: object = ()) -> bytes:
        return "".join(chr(i) for i in ids).encode()


async def test_the_probe_goes_through_the_guard_and_its_tokens_are_billed() -> None:
    from hybridllm.runtime.speculation import SpeculationState

    prices = Prices(models={"scripted": ModelPrice(input_per_million=1.0, output_per_million=2.0)})
    ledger = Ledger()
    guard = GuardedEngine(ScriptedEngine("cloud"), ledger=ledger, prices=prices)  # keep-local
    state = SpeculationState()
    key = ("http://x/v1", "m")
    async with replay({"/completions": vllm_probe}) as c:
        state.clients[key] = c
        found = await state.verifier(key, None, _FakeDrafter(), guard.guarded_call)  # type: ignore[arg-type]
        state.clients.clear()
    assert found.verifier is not None, found.reason
    usd = ledger.spend("day").settled_usd
    # two requests (the dialect; the local token ids, which read as another tokenizer here),
    # each billed as the server reported it: 3 + 37 prompt tokens, 1 + 1 completion tokens
    assert len(_FakeDrafter().tokenize("1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12")) == 37
    assert usd == pytest.approx((3 + 37) * 1e-6 + 2 * 2e-6), ledger.entries()
    assert [e["state"] for e in ledger.entries()] == ["settled", "settled"]
    assert ledger.spend("day").reserved_usd == 0


def test_routing_expects_speculative_sampling_only_where_it_can_run() -> None:
    from hybridllm.engines.base import GenerationRequest
    from hybridllm.engines.verify import Probed
    from hybridllm.runtime.gather import Routing

    routing = Routing()
    engines: Any = {"local": ScriptedEngine("local"), "cloud": ScriptedEngine("cloud")}
    msgs = [{"role": "user", "content": "hi"}]
    wide = GenerationRequest(msgs, temperature=0.8, top_p=1.0)  # type: ignore[arg-type]
    pays, why = routing.speculation_outlook(wide, Policy(), engines) or (None, "")
    assert pays is False and "top_p = 1" in why
    key = ("", "scripted")  # where ScriptedEngine("cloud") would be verified
    routing.speculation.verifiers[key] = Probed(EchoVerifier(None), "echo-logprobs")  # type: ignore[arg-type]
    sampled = GenerationRequest(msgs, temperature=0.8, top_p=0.9)  # type: ignore[arg-type]
    pays, why = routing.speculation_outlook(sampled, Policy(), engines) or (None, "")
    assert pays is False and "raw token-level" in why
    greedy = GenerationRequest(msgs, temperature=0.0)  # type: ignore[arg-type]
    assert (routing.speculation_outlook(greedy, Policy(), engines) or (None,))[0] is True
    routing.speculation.verifiers[key] = Probed(PromptLogprobsVerifier(None), "prompt-logprobs")  # type: ignore[arg-type]
    assert (routing.speculation_outlook(sampled, Policy(), engines) or (None,))[0] is True
