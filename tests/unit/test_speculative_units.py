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

import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import httpx2
import openai
import pytest

from hybridllm import GuardedEngine, ModelPrice, OpenAIEngine, Policy, Prices, SQLiteLedger
from hybridllm.errors import PrivacyBlockedError, ServerError
from hybridllm.guard.budget import TokenUsage
from hybridllm.routing.decide import LiveState, RequestFacts, decide
from hybridllm.runtime.plans.speculative.dialect_llama import EchoVerifier, echo_shift, read_echo
from hybridllm.runtime.plans.speculative.dialect_openai import PredictionVerifier
from hybridllm.runtime.plans.speculative.dialect_vllm import (
    PromptLogprobsVerifier,
    TextLogprobsVerifier,
    read_prompt_logprobs,
)
from hybridllm.runtime.plans.speculative.outlook import Outlook, expected_tokens
from hybridllm.runtime.plans.speculative.probe import probe
from hybridllm.runtime.plans.speculative.verifier import Round, Unverifiable
from hybridllm.testing import ScriptedEngine

pytestmark = [pytest.mark.anyio, pytest.mark.virtual_clock]  # tests/unit/conftest.py


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
    # "token_id:N" everywhere with return_tokens_as_token_ids, as hybridllm serve-model does)
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
    pv = PredictionVerifier()
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


# the real llama_cpp.server's echo answer with Qwen2.5-Coder 0.5B (no BOS token: the rows are
# shifted, and the generated token " colors" has no entry of its own)
QWEN_ECHO = {
    "choices": [
        {
            "index": 0,
            "finish_reason": "length",
            "text": (
                "<|im_start|>user\nList three colors.<|im_end|>\n<|im_start|>assistant\n"
                "Here are three colors"
            ),
            "logprobs": {
                "tokens": [
                    "",
                    "user",
                    "\n",
                    "List",
                    " three",
                    " colors",
                    ".",
                    "",
                    "\n",
                    "",
                    "assistant",
                    "\n",
                    "Here",
                    " are",
                    " three",
                ],
                "top_logprobs": [
                    None,
                    {" 在": -2.6, " I": -2.81, "user": -11.6},
                    {"import": -1.87, "#": -2.25, "\n": -5.04},
                    {" of": -1.34, " all": -1.39, "List": -13.93},
                    {" different": -2.76, " things": -2.86, " three": -9.46},
                    {" that": -0.83, " in": -2.5, " colors": -12.62},
                    {"#": -1.98, "import": -2.59, ".": -8.04},
                    {"\n": -0.0, "": -8.93},
                    {"#": -1.54, "import": -2.24, "\n": -4.91},
                    {"\n": -0.0, "\n\n": -7.67, "": -10.68},
                    {" Three": -1.02, "Certainly": -1.88, "assistant": -17.24},
                    {"3": -1.6, "Three": -2.04, "\n": -10.4},
                    {" are": -0.02, " is": -4.58, "Here": -21.69},
                    {" three": -0.0, " the": -6.61, " are": -13.22},
                    {" colors": -0.12, " color": -3.59, " three": -8.34},
                ],
            },
        }
    ],
    "usage": {"prompt_tokens": 15, "completion_tokens": 1, "total_tokens": 16},
}


def test_echo_rows_without_bos_name_the_generated_token_by_the_row_that_chose_it() -> None:
    assert echo_shift(QWEN_ECHO) == 1
    prompt = "<|im_start|>user\nList three colors.<|im_end|>\n<|im_start|>assistant\n"
    whole = Round(prompt, "Here", [], [1, 2], [" are", " three"])
    v = read_echo(QWEN_ECHO, whole, 1)
    assert (v.accepted, v.accepted_text, v.text) == (2, " are three", " are three colors")
    assert v.gap == pytest.approx(3.47)
    # the first disagreement ends the round with the cloud's own choice there
    other = json.loads(json.dumps(QWEN_ECHO))
    other["choices"][0]["logprobs"]["top_logprobs"][13] = {" four": -0.1, " three": -2.5}
    v = read_echo(other, whole, 1)
    assert (v.accepted, v.accepted_text, v.text) == (1, " are", " are four")


@contextlib.asynccontextmanager
async def replay(routes: dict[str, Any], model: str = "m") -> AsyncIterator[OpenAIEngine]:
    """An `OpenAIEngine` whose own client replays documented answers by path (a MockTransport;
    status 404 elsewhere): verification goes through the engine's client as in production."""

    def handler(request: httpx2.Request) -> httpx2.Response:
        body = json.loads(request.content)
        for path, answer in sorted(routes.items(), key=lambda kv: -len(kv[0])):
            if request.url.path.endswith(path):
                data = answer(body) if callable(answer) else answer
                if isinstance(data, int):
                    return httpx2.Response(data, json={"error": {"message": "no"}})
                return httpx2.Response(200, json=data)
        return httpx2.Response(404, json={"detail": "Not Found"})

    engine = OpenAIEngine(base_url="http://x/v1", api_key="k", model=model)
    transport = httpx2.AsyncClient(transport=httpx2.MockTransport(handler))
    engine._client = openai.AsyncOpenAI(
        base_url="http://x/v1", api_key="k", max_retries=0, http_client=transport
    )
    try:
        yield engine
    finally:
        await engine.aclose()


def vllm_probe(body: dict[str, Any]) -> dict[str, Any]:
    ids = body["prompt"] if isinstance(body["prompt"], list) else [1, 2, 3]
    plp = [None] + [{str(t): {"logprob": -0.1, "rank": 1, "decoded_token": f"<{t}>"}}
                    for t in ids[1:]]  # fmt: skip
    return {"choices": [{"text": "x", "index": 0, "finish_reason": "length",
                         "prompt_logprobs": plp}],
            "usage": {"prompt_tokens": len(ids), "completion_tokens": 1}}  # fmt: skip


async def test_probe_finds_each_dialect_or_says_why_none() -> None:
    async with replay({"/completions": vllm_probe}) as c:
        found = await probe(c.verification_post, [5, 6, 7], ["<5>", "<6>", "<7>"])
        assert isinstance(found.verifier, PromptLogprobsVerifier), found.reason
        assert found.verifier.raw and "raw log-probabilities" in found.reason
        other = await probe(c.verification_post, [5, 6, 7], ["a", "b", "c"])  # another one
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
        found = await probe(c.verification_post)
        assert isinstance(found.verifier, PredictionVerifier), found.reason
    async with replay({"/completions": 500, "/chat/completions": {
            "choices": [{"index": 0, "finish_reason": "stop", "message": {"content": "OK"}}],
            "usage": {"prompt_tokens": 12, "completion_tokens": 1}}}) as c:  # fmt: skip
        none = await probe(c.verification_post)
    assert none.verifier is None
    assert "completions: HTTP 500: no" in none.reason
    assert "no prediction token counts" in none.reason
    async with replay({"/completions": ECHO}) as c:
        echo = await probe(c.verification_post)
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
    from hybridllm.runtime.plans.speculative.outlook import EXPLORE_EVERY

    explored = [bad.explore() for _ in range(3 * EXPLORE_EVERY)]
    assert explored.count(True) == 3 and explored[EXPLORE_EVERY - 1]


def test_a_fixed_k_drafts_k_and_never_steps_aside_for_pay_but_adaptive_k_does() -> None:
    from hybridllm.runtime.plans.speculative.outlook import SpeculationState
    from hybridllm.runtime.plans.speculative.plan import SpeculativeSetup
    from hybridllm.runtime.plans.speculative.rounds import switch_reason

    bad = Outlook()
    for _ in range(6):
        bad.observe(8, 1, 8 * 0.02, 0.60)
    eng = ScriptedEngine("cloud")
    adaptive = SpeculativeSetup(eng, eng, SpeculationState(), cloud_tpot_s=0.04)
    fixed = SpeculativeSetup(eng, eng, SpeculationState(), cloud_tpot_s=0.04, k=8)
    why = switch_reason(bad, adaptive, billed_prompt=100, n_out=20)
    assert why is not None and why.startswith("speculation stopped paying")
    assert switch_reason(bad, fixed, billed_prompt=100, n_out=20) is None
    capped = SpeculativeSetup(eng, eng, SpeculationState(), 0.04, k=8, max_prompt_overhead=2.0)
    assert "verification overhead" in (switch_reason(bad, capped, 100, 20) or "")
    assert Policy(speculative={"k": 8}).speculative.k == 8 and Policy().speculative.k is None


def test_decide_chooses_speculative_when_asked_or_when_it_pays_with_the_reason() -> None:
    pol = Policy(plans=("single", "speculative"))
    facts = RequestFacts(prompt_tokens=20, max_tokens=64)
    yes = decide(facts, pol, LiveState(speculation=(True, "expected 30 tok/s vs 20")))
    assert yes.plan == "speculative" and (yes.primary, yes.fallback) == ("cloud", "local")
    assert "speculative" in yes.codes
    no = decide(facts, pol, LiveState(speculation=(False, "acceptance 0.20")))
    assert no.plan != "speculative" and "no_speculative" in no.codes
    off = decide(facts, Policy(), LiveState(speculation=(True, "x")))
    assert off.plan != "speculative"  # the policy does not allow it
    asked = decide(RequestFacts(20, 64, plan="speculative"), Policy(),
                   LiveState(speculation=(False, "acceptance 0.20")))  # fmt: skip
    assert asked.plan == "speculative" and "speculative_asked" in asked.codes
    local_only = decide(RequestFacts(20, 64, plan="speculative"),
                        Policy(routing={"allow_cloud": False}), LiveState())  # fmt: skip
    assert local_only.plan != "speculative" and "speculative_needs_both" in local_only.codes


async def test_verification_calls_go_through_the_guard() -> None:
    prices = Prices(models={"scripted": ModelPrice(input_per_million=1.0, output_per_million=2.0)})
    ledger = SQLiteLedger()
    guard = GuardedEngine(ScriptedEngine("cloud"), privacy="keep-local", ledger=ledger,
                          prices=prices)  # fmt: skip
    settled: list[tuple[TokenUsage, float]] = []
    from hybridllm.guard.guarded import RequestContext

    ctx = RequestContext(on_settle=lambda u, usd, _overrun: settled.append((u, usd)))

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
    from hybridllm.runtime.recorder import Recorder
    from hybridllm.runtime.trace import Speculation, Trace

    model = LatencyModel()
    rec = Recorder(Trace(t_start=0.0, engine="cloud", started=("cloud",)))
    for t in (3.0, 6.0, 9.0, 12.0):  # commits in bursts, one per slow verification round
        rec.token(t)
    rec.plan_record(Speculation(verifier="echo-logprobs", rounds=4))
    trace = rec.freeze()
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
    from hybridllm.runtime.plans.speculative.outlook import SpeculationState

    prices = Prices(models={"m": ModelPrice(input_per_million=1.0, output_per_million=2.0)})
    ledger = SQLiteLedger()
    state = SpeculationState()
    async with replay({"/completions": vllm_probe}) as c:
        guard = GuardedEngine(c, ledger=ledger, prices=prices)  # keep-local
        key = guard.verification_endpoint()
        assert key == ("http://x/v1", "m")
        found = await state.verifier(key, guard.verification_post, _FakeDrafter())  # type: ignore[arg-type]
    assert found.verifier is not None, found.reason
    usd = ledger.spend("day").settled_usd
    # two requests (the dialect; the local token ids, which read as another tokenizer here),
    # each billed as the server reported it: 3 + 37 prompt tokens, 1 + 1 completion tokens
    assert len(_FakeDrafter().tokenize("1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12")) == 37
    assert usd == pytest.approx((3 + 37) * 1e-6 + 2 * 2e-6), ledger.entries()
    assert [e["state"] for e in ledger.entries()] == ["settled", "settled"]
    assert ledger.spend("day").reserved_usd == 0


class _DraftingScripted(ScriptedEngine):
    """A scripted local engine that declares the drafting capability (never asked to draft)."""

    def drafter(self) -> Any:
        raise AssertionError("routing only reads the capability")


def test_routing_expects_speculative_sampling_only_where_it_can_run() -> None:
    from hybridllm.engines.base import GenerationRequest
    from hybridllm.runtime.gather import Gatherer
    from hybridllm.runtime.plans.speculative.verifier import Probed

    routing = Gatherer()
    cloud = OpenAIEngine(base_url="http://x/v1", api_key="k", model="m")
    engines: Any = {"local": _DraftingScripted("local"), "cloud": cloud}
    msgs = [{"role": "user", "content": "hi"}]
    wide = GenerationRequest(msgs, temperature=0.8, top_p=1.0)  # type: ignore[arg-type]
    pays, why = routing.speculation_outlook(wide, Policy(), engines) or (None, "")
    assert pays is False and "top_p = 1" in why
    key = ("http://x/v1", "m")  # where the cloud engine verifies
    routing.speculation.verifiers[key] = Probed(EchoVerifier(), "echo-logprobs")
    sampled = GenerationRequest(msgs, temperature=0.8, top_p=0.9)  # type: ignore[arg-type]
    pays, why = routing.speculation_outlook(sampled, Policy(), engines) or (None, "")
    assert pays is False and "raw token-level" in why
    greedy = GenerationRequest(msgs, temperature=0.0)  # type: ignore[arg-type]
    assert (routing.speculation_outlook(greedy, Policy(), engines) or (None,))[0] is True
    routing.speculation.verifiers[key] = Probed(PromptLogprobsVerifier(), "prompt-logprobs")
    assert (routing.speculation_outlook(sampled, Policy(), engines) or (None,))[0] is True


def test_routing_expects_speculation_only_from_engines_that_draft_and_verify() -> None:
    from hybridllm.engines.base import GenerationRequest
    from hybridllm.runtime.gather import Gatherer

    greedy = GenerationRequest([{"role": "user", "content": "hi"}], temperature=0.0)
    cloud = OpenAIEngine(base_url="http://x/v1", api_key="k", model="m")
    guarded = GuardedEngine(ScriptedEngine("cloud"), privacy="off")
    cases = {
        "the cloud engine cannot verify drafts": (_DraftingScripted("local"), guarded),
        "the local engine cannot draft": (ScriptedEngine("local"), cloud),
    }
    for why, (local, remote) in cases.items():
        engines: Any = {"local": local, "cloud": remote}
        assert Gatherer().speculation_outlook(greedy, Policy(), engines) == (False, why)
    engines = {"local": _DraftingScripted("local"), "cloud": GuardedEngine(cloud, privacy="off")}
    pays, why = Gatherer().speculation_outlook(greedy, Policy(), engines) or (None, "")
    assert pays is True and "probed on this request" in why
