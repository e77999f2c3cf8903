"""Verifier dialects: how a cloud endpoint scores a local draft in one request.

```
Verifier (one `verify(round) -> Verdict` per dialect)
├── EchoVerifier             (a) /v1/completions with echo + logprobs (llama-cpp-python's server,
│                                started with --logits_all true); text-level
├── PromptLogprobsVerifier   (b) /v1/completions with vLLM's `prompt_logprobs`; token-level
│                                (token ids of a shared tokenizer; greedy or sampled)
├── TextLogprobsVerifier     (b) the same on a text prompt; text-level (`verify_vllm`)
└── PredictionVerifier       (c) OpenAI Predicted Outputs: chat completions with `prediction`;
                                 text-level, the cloud's own text comes back
```

(d) none: `verify_probe.probe()` returns no verifier and the reason; the plan then streams
plainly.

Dialect (a). llama-cpp-python 0.3.36 builds echo log-probabilities by pairing the entries
(prompt tokens, then the generated one) with its score rows, one row per evaluated prompt token,
row i being the distribution AFTER prompt token i. A prompt that starts with the BOS token
(SmolLM2: BOS is `<|im_start|>`, so every ChatML prompt does) loses that token's entry, so entry
i carries the row that predicts token i itself (`shift` 0) and the generated token keeps its
entry. Any other prompt (Qwen has no BOS token) keeps every entry, so entry i's row predicts
token i+1 (`shift` 1) and the pairing runs out of rows before the generated token: it has no
entry, and the last entry's row is the one that chose it. Later BOS entries are left out, with
their rows. Which reading holds is read from each answer: the right one predicts most echoed
tokens, and the row it says chose the generated (greedy) token names it. Token
strings are detokenized with special tokens as "" and broken UTF-8 dropped, so the verdict is
text-level: the server's own tokenization of the drafted text decides, and the cloud's greedy
string is committed. Where those strings cannot say what was meant (a greedy token of "",
which is the end of the answer or a piece of a character split over tokens; echoed text that
does not end with the draft) the round raises `Unverifiable`, and the plan streams the rest
plainly from the committed text.

Dialect (b), vLLM's `prompt_logprobs`: `engines.verify_vllm` (token-level greedy, token-level
speculative sampling above temperature 0, and text-level when the tokenizers differ).

Dialect (c), OpenAI Predicted Outputs: the draft is the prediction; the cloud generates its own
text (at most k + 1 tokens) and `usage.completion_tokens_details` says how many prediction
tokens it accepted and rejected; rejected ones are billed as output (they are in
`completion_tokens`). Closed APIs cannot score given tokens, so this is the only dialect they
offer, and the round's committed text is simply the cloud's text.

A verifier holds no connection: each call gets the `post` that sends its one request, the
cloud guard's `verification_post` (privacy scan, reservation and settlement; the plan declares
the round's text and bounds in an `Outgoing`), which sends it through the cloud engine's own
client (`OpenAIEngine.verification_post`: its key, its timeouts, a refused key noticed there).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from hybridllm import errors
from hybridllm.engines.base import CONTINUE_INSTRUCTION, Message
from hybridllm.engines.capabilities import Post
from hybridllm.engines.spec_sampling import Dist

Dialect = Literal["echo-logprobs", "prompt-logprobs", "predicted-outputs"]


class Unverifiable(Exception):  # noqa: N818 - a verdict, not a failure of the endpoint
    """The answer cannot judge this round (see the module); the plan streams the rest."""


@dataclass(frozen=True)
class Sampling:
    """A sampled round (temperature > 0): the request's temperature and top_p, the random
    source (seeded from the request's seed), q at each drafted position, the vocabulary size."""

    temperature: float
    top_p: float
    rng: random.Random
    q: Sequence[Dist]
    vocab: int


@dataclass(frozen=True)
class Round:
    """What one verification round sends: the rendered prompt, the committed answer, the
    context as token ids (prompt + committed, local tokenizer), and the draft. `text_of`:
    the text of token ids following the context (local tokenizer); `sampling`: the draft was
    sampled (speculative sampling decides), else greedy."""

    prompt_text: str
    committed_text: str
    context_ids: Sequence[int]
    draft_ids: Sequence[int]
    draft_pieces: Sequence[str]
    messages: Sequence[Message] = ()
    text_of: Callable[[Sequence[int]], str] | None = None
    sampling: Sampling | None = None

    @property
    def draft_text(self) -> str:
        return "".join(self.draft_pieces)


@dataclass(frozen=True)
class Verdict:
    """The cloud's answer to one round. `accepted`: drafted tokens it agreed with; `text`: the
    text to commit (the accepted draft text, then the cloud's own next token or tokens);
    `next_id`: the cloud's own token id (token-level dialects); `finished`: the answer ended;
    `gap`: the cloud's top-2 log-probability gap where its own token was chosen (a near-tie
    when small); billed usage as the server reported it; `switch`: the round could decide
    only its first `accepted` tokens (why): commit `text`, then stream plainly."""

    accepted: int
    text: str
    accepted_text: str
    next_id: int | None
    finished: bool
    prompt_tokens: int
    completion_tokens: int
    gap: float | None = None
    usage_reported: bool = True
    switch: str | None = None


class Verifier(Protocol):
    dialect: Dialect
    token_level: bool

    @property
    def samples(self) -> bool:
        """Whether it can judge sampled drafts (speculative sampling)."""
        ...

    async def verify(self, round_: Round, post: Post) -> Verdict:
        """Judge `round_` with one request sent by `post` (the cloud guard's, for this round)."""
        ...


def _usage(data: Mapping[str, Any]) -> tuple[int, int, bool]:
    u = data.get("usage") or {}
    p, c = u.get("prompt_tokens"), u.get("completion_tokens")
    if isinstance(p, int) and isinstance(c, int):
        return p, c, True
    return 0, 0, False


def _choice(data: Mapping[str, Any]) -> dict[str, Any]:
    try:
        choice = data["choices"][0]
    except (KeyError, IndexError, TypeError) as exc:
        raise errors.CloudProtocolError("verification: no choices in the answer") from exc
    if not isinstance(choice, dict):
        raise errors.CloudProtocolError("verification: a choice is not an object")
    return choice


def _best(dist: Mapping[str, float]) -> tuple[str, float | None]:
    """The greedy key of a top-logprobs dict and its gap to the second."""
    ranked = sorted(dist.items(), key=lambda kv: kv[1], reverse=True)
    gap = ranked[0][1] - ranked[1][1] if len(ranked) > 1 else None
    return ranked[0][0], gap


# ---- (a) echo + logprobs -------------------------------------------------------------------


@dataclass
class EchoVerifier:
    """llama-cpp-python's `/v1/completions` with `echo`, `logprobs` and `max_tokens: 1`."""

    shift: int = 1  # the reading when an answer does not tell (see `echo_shift`)
    dialect: Dialect = "echo-logprobs"
    token_level: bool = False
    samples: bool = False

    async def verify(self, round_: Round, post: Post) -> Verdict:
        body = {
            "prompt": round_.prompt_text + round_.committed_text + round_.draft_text,
            "echo": True, "logprobs": 2, "max_tokens": 1, "temperature": 0.0,
        }  # fmt: skip
        data = await post("completions", body)
        return read_echo(data, round_, echo_shift(data, self.shift))


def read_echo(data: Mapping[str, Any], round_: Round, shift: int | None) -> Verdict:
    """The verdict from an echo answer (see the module for the shift)."""
    choice = _choice(data)
    lp = choice.get("logprobs") or {}
    tokens: list[str] = list(lp.get("tokens") or [])
    top: list[Mapping[str, float] | None] = list(lp.get("top_logprobs") or [])
    if not tokens or len(top) != len(tokens) or shift is None:
        raise errors.CloudProtocolError("verification: echo answer without log-probabilities")
    p_tok, c_tok, reported = _usage(data)
    n_prompt = _prompt_entries(choice, len(tokens), c_tok, shift)
    draft = round_.draft_text
    # where the draft starts in the echoed prompt (entries' texts, concatenated)
    starts, pos = [], 0
    for t in tokens[:n_prompt]:
        starts.append(pos)
        pos += len(t)
    boundary = pos - len(draft)
    if not "".join(tokens[:n_prompt]).endswith(draft):
        raise Unverifiable("the echoed text does not end with the draft (split characters)")
    accepted_text, i = "", 0
    while i < n_prompt and starts[i] + len(tokens[i]) <= boundary:
        i += 1
    gap: float | None = None
    for j in range(i, n_prompt):
        dist = top[j - shift] if j - shift >= 0 else None
        if not dist:
            raise errors.CloudProtocolError("verification: no distribution for a draft token")
        want, gap = _best(dist)
        if want != tokens[j]:
            if want == "":
                raise Unverifiable(
                    "the greedy token reads as nothing (an end or a split character)"
                )
            return _verdict(round_, accepted_text, want, False, p_tok, c_tok, gap, reported)
        accepted_text += tokens[j][max(0, boundary - starts[j]) :]
    if not _generated(choice, c_tok):  # the answer ended right after the draft
        return _verdict(round_, accepted_text, "", True, p_tok, c_tok, None, reported)
    # every drafted token agreed: the cloud's own token is the generated one, named by its
    # entry, or (it has none: shift 1) by the row that chose it
    dist = top[n_prompt - shift] if n_prompt - shift >= 0 else None
    gap = _best(dist)[1] if dist else None
    own = tokens[n_prompt] if n_prompt < len(tokens) else (_best(dist)[0] if dist else "")
    if own == "":
        raise Unverifiable("the generated token reads as nothing (a split character)")
    return _verdict(round_, accepted_text, own, False, p_tok, c_tok, gap, reported)


def _generated(choice: Mapping[str, Any], completion_tokens: int) -> bool:
    """Whether the answer generated a token (an end of the answer generates none)."""
    return completion_tokens >= 1 or choice.get("finish_reason") == "length"


def _prompt_entries(
    choice: Mapping[str, Any], n_entries: int, completion_tokens: int, shift: int
) -> int:
    """How many entries are the echoed prompt's: all but the generated token's, which has an
    entry only when the rows are not shifted (see the module)."""
    return n_entries - (1 if shift == 0 and _generated(choice, completion_tokens) else 0)


def _verdict(
    round_: Round, accepted_text: str, own: str, finished: bool,
    p: int, c: int, gap: float | None, reported: bool,
) -> Verdict:  # fmt: skip
    n, acc = 0, 0
    for piece in round_.draft_pieces:  # drafted tokens wholly inside the accepted text
        if acc + len(piece) > len(accepted_text):
            break
        acc += len(piece)
        n += 1
    return Verdict(n, accepted_text + own, accepted_text, None, finished, p, c, gap, reported)


def echo_shift(data: Mapping[str, Any], default: int | None = None) -> int | None:
    """Which rows predict which tokens in an echo answer: 0 (entry i's row predicts token i, and
    the generated token has an entry) or 1 (it predicts token i+1, and the generated token has
    none). Each reading scores the echoed prompt tokens its rows predict, plus a bonus when the
    row it says chose the generated (greedy) token names it. None (or `default`): neither
    reading predicts the text (e.g. a server without --logits_all)."""
    choice = _choice(data)
    lp = choice.get("logprobs") or {}
    tokens, top = list(lp.get("tokens") or []), list(lp.get("top_logprobs") or [])
    if len(tokens) < 4 or len(top) != len(tokens):
        return default
    c_tok = _usage(data)[1]
    text = str(choice.get("text") or "")
    scores = {}
    for shift in (0, 1):
        last = _prompt_entries(choice, len(tokens), c_tok, shift)
        pairs = [(top[i - shift], tokens[i]) for i in range(2, last)]
        hits = sum(1 for d, t in pairs if d and _best(d)[0] == t)
        chose = top[last - shift] if _generated(choice, c_tok) and last - shift >= 0 else None
        named = _best(chose)[0] if chose else ""
        gen = tokens[last] == named if last < len(tokens) else text.endswith(named)
        bonus = 0.5 if named and gen else 0.0
        scores[shift] = hits / max(1, len(pairs)) + bonus
    shift = max(scores, key=lambda s: scores[s])
    if scores[shift] >= 0.5 and scores[shift] > scores[1 - shift]:
        return shift
    return default


# ---- (c) OpenAI Predicted Outputs ----------------------------------------------------------


@dataclass
class PredictionVerifier:
    """Chat completions with `prediction={"type": "content", "content": draft}`."""

    dialect: Dialect = "predicted-outputs"
    token_level: bool = False
    samples: bool = False
    counts: dict[str, int] = field(default_factory=lambda: {"accepted": 0, "rejected": 0})

    async def verify(self, round_: Round, post: Post) -> Verdict:
        messages = [dict(m) for m in round_.messages]
        if round_.committed_text:
            messages += [{"role": "assistant", "content": round_.committed_text},
                         {"role": "user", "content": CONTINUE_INSTRUCTION}]  # fmt: skip
        body = {
            "messages": messages, "temperature": 0.0,
            "max_tokens": len(round_.draft_ids) + 1,
            "prediction": {"type": "content", "content": round_.draft_text},
        }  # fmt: skip
        return self.read(await post("chat/completions", body), round_)

    def read(self, data: Mapping[str, Any], round_: Round) -> Verdict:
        choice = _choice(data)
        text = str((choice.get("message") or {}).get("content") or "")
        p_tok, c_tok, reported = _usage(data)
        details = (data.get("usage") or {}).get("completion_tokens_details") or {}
        self.counts["accepted"] += int(details.get("accepted_prediction_tokens") or 0)
        self.counts["rejected"] += int(details.get("rejected_prediction_tokens") or 0)
        n, acc = 0, 0
        for piece in round_.draft_pieces:
            if not text.startswith(piece, acc):
                break
            acc += len(piece)
            n += 1
        finished = choice.get("finish_reason") == "stop"
        return Verdict(n, text, text[:acc], None, finished, p_tok, c_tok, None, reported)


# ---- probing -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Probed:
    """What probing an endpoint found: a verifier, or None and why."""

    verifier: Verifier | None
    reason: str
