"""The local model's own confidence on a prompt, read from its logits (router stage 2).

One code path serves the labeller (`scripts/label_router_data.py --signals`) and the SDK
(`LlamaCppEngine.signals()`, `HybridClient.router_score()`, the cascade plan), so the figures a
stage-2 model was trained on are the figures it sees at run time.

- After the prompt's prefill, the next-token distribution over the whole vocabulary: top-1
  probability, entropy (nats, full vocabulary, not a top-k approximation), margin top-1 - top-2.
- Over the first `N_ANSWER` greedy answer tokens (fewer when the answer ends): their
  log-probabilities, summarised as mean, minimum and the quantiles 0.1/0.25/0.5 of Gupta et al.
  2024 ("Language model cascades: token-level uncertainty and beyond", the per-token quantile
  form they found best for deferral).
- For a multiple-choice prompt (lines "A. ...", "B. ..."), the probability of the most likely
  option letter, normalised over the prompt's letters, and that distribution's entropy.

Everything here is synchronous and touches the `llama_cpp.Llama` object: call it on the llama
thread. The pure summaries (`TokenTracker`, `summarise`) take numpy arrays, no model.
"""

from __future__ import annotations

import math
import string
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from hybridllm import errors
from hybridllm.engines.llama import option_rotations as perm
from hybridllm.engines.llama.kvstore import common_prefix

N_ANSWER = 8  # answer tokens whose log-probabilities are kept
ROTATIONS = 4  # rotations of a multiple-choice prompt's options (a whole cycle up to 5 options)
QUANTILES = (0.1, 0.25, 0.5)
# The names, in this order, of the figures `summarise` returns (a stage-2 model's inputs).
SIGNAL_NAMES = (
    "first_p",
    "first_entropy",
    "first_margin",
    "lp_mean",
    "lp_min",
    "lp_q10",
    "lp_q25",
    "lp_q50",
    "answer_tokens",
    "option_p",
    "option_entropy",
    "is_choice",
    *perm.PERM_NAMES,
)

Logits = npt.NDArray[np.float32]


def option_letters(prompt: str) -> list[str]:
    """The option letters of a multiple-choice prompt ("\\nA. ..."), [] for any other prompt."""
    letters = [x for x in string.ascii_uppercase[:8] if f"\n{x}. " in prompt]
    return letters if len(letters) >= 2 and letters[0] == "A" else []


@dataclass(frozen=True, slots=True)
class Distribution:
    """One next-token distribution, summarised."""

    top_p: float
    entropy: float
    margin: float
    logprob: float  # of the token that was chosen


def distribution(logits: Logits, chosen: int) -> Distribution:
    """Summarise raw logits (one row, the whole vocabulary) and the chosen token."""
    x = logits.astype(np.float64, copy=False)
    m = float(x.max())
    z = x - m
    e = np.exp(z)
    s = float(e.sum())
    logp = z - math.log(s)
    p = e / s
    top2 = np.partition(p, -2)[-2:]
    return Distribution(
        top_p=float(top2[1]),
        entropy=float(-(p * logp).sum()),
        margin=float(top2[1] - top2[0]),
        logprob=float(logp[chosen]),
    )


def logprob(logits: Logits, token: int) -> float:
    """The log-probability of `token` under raw logits (one row): `distribution`'s `logprob`
    alone, a fifth of its work (no float64 copy of the row, no entropy or top-2)."""
    m = float(logits.max())
    total = float(np.exp(logits - m).sum(dtype=np.float64))
    return float(logits[token]) - m - math.log(total)


@dataclass
class TokenTracker:
    """Collects the first `limit` answer tokens' distributions while a generation runs."""

    limit: int = N_ANSWER
    dists: list[Distribution] = field(default_factory=list)
    options: list[float] | None = None  # normalised option-letter probabilities, if any

    @property
    def full(self) -> bool:
        return len(self.dists) >= self.limit

    def add(self, logits: Logits, chosen: int) -> None:
        if not self.full:
            self.dists.append(distribution(logits, chosen))

    def add_options(self, logits: Logits, letter_ids: Sequence[int]) -> None:
        if letter_ids:
            self.options = perm.option_distribution(logits, letter_ids)

    def signals(self) -> dict[str, float]:
        return summarise(self.dists, self.options)


def summarise(dists: Sequence[Distribution], options: Sequence[float] | None) -> dict[str, float]:
    """The figures of `SIGNAL_NAMES` (NaN where a figure does not apply, e.g. no options)."""
    nan = math.nan
    out = dict.fromkeys(SIGNAL_NAMES, nan)
    if dists:
        first = dists[0]
        lps = np.array([d.logprob for d in dists])
        out.update(
            first_p=first.top_p,
            first_entropy=first.entropy,
            first_margin=first.margin,
            lp_mean=float(lps.mean()),
            lp_min=float(lps.min()),
            answer_tokens=float(len(dists)),
        )
        for q, name in zip(QUANTILES, ("lp_q10", "lp_q25", "lp_q50"), strict=True):
            out[name] = float(np.quantile(lps, q))
    out["is_choice"] = 1.0 if options else 0.0
    if options:
        p = np.array(options)
        out["option_p"] = float(p.max())
        out["option_entropy"] = float(-(p * np.log(np.clip(p, 1e-12, None))).sum())
    return out


def last_logits(llm: Any) -> Logits:
    """The logits of the last evaluated position (a copy: the next decode overwrites them)."""
    ptr = llm._ctx.get_logits_ith(-1)
    return np.ctypeslib.as_array(ptr, shape=(llm.n_vocab(),)).copy()


def letter_ids(llm: Any, letters: Sequence[str]) -> list[int]:
    """One token id per option letter (its single-token spelling)."""
    ids = []
    for x in letters:
        toks = llm.tokenize(x.encode(), add_bos=False, special=False)
        if len(toks) != 1:
            return []
        ids.append(int(toks[0]))
    return ids


def measure(
    llm: Any,
    tokens: Sequence[int],
    *,
    reuse: int = 0,
    letters: Sequence[str] = (),
    n_answer: int = N_ANSWER,
    is_eog: Any = None,
    rotated: Sequence[Sequence[float]] = (),
    detail: dict[str, Any] | None = None,
) -> tuple[dict[str, float], list[int], list[float]]:
    """Prefill `tokens` (the first `reuse` already in the KV cache) and decode up to `n_answer`
    greedy tokens: (signals, answer token ids, their log-probabilities). `rotated`: the option
    probabilities of the rotated prompts (`option_rotations`), compared with this order's; `detail`,
    when given, gets this order's option probabilities ("options").
    Leaves the prompt and the answer tokens but the last in the KV cache."""
    llm.n_tokens = reuse
    llm.eval(list(tokens[reuse:]))
    tracker = TokenTracker(limit=n_answer)
    logits = last_logits(llm)
    tracker.add_options(logits, letter_ids(llm, letters))
    out: list[int] = []
    while True:
        tok = int(np.argmax(logits))
        tracker.add(logits, tok)
        out.append(tok)
        if tracker.full or (is_eog is not None and is_eog(tok)) or tok == llm.token_eos():
            break
        llm.eval([tok])
        logits = last_logits(llm)
    signals = tracker.signals()
    signals.update(perm.summarise(tracker.options or [], rotated))
    if detail is not None:
        detail["options"] = tracker.options
    return signals, out, [d.logprob for d in tracker.dists]


def session_signals(
    session: Any, messages: Sequence[Any], n_answer: int = N_ANSWER
) -> tuple[dict[str, float], int, list[int]]:
    """`measure` on a `LlamaSession` for chat `messages`, formatted exactly as a request is:
    (signals, prompt tokens, greedy answer tokens). The prompt stays in the KV cache, so a
    local request for the same messages that follows reuses the prefill."""
    signals, prompt_tokens, answer, _ = session_measure(session, messages, n_answer)
    return signals, prompt_tokens, answer


def session_measure(
    session: Any,
    messages: Sequence[Any],
    n_answer: int = N_ANSWER,
    rotations: int | None = None,
    detail: dict[str, Any] | None = None,
    rotations_by: float | None = None,
    rotations_max_s: float | None = None,
    pace_s: float | None = None,
) -> tuple[dict[str, float], int, list[int], list[float]]:
    """`session_signals`, and the answer tokens' log-probabilities. A multiple-choice prompt is
    also read with its options rotated (up to `rotations` times, default `ROTATIONS`,
    `option_rotations`) first, so that the prompt as asked is what stays in the KV cache (and
    the figures are computed as the labeller computed them for stage 2's training). The
    rotations' cost a local answer does not reuse (all their prefill but the question's, which
    the prompt as asked then finds cached) is priced before the first one at the last measured
    `pace_s` (seconds a prompt token takes: the engine's measured prefill speed); past
    `rotations_max_s` they are not read (with no pace known, they are). `detail`,
    when given, gets the option probabilities: "options" (as asked) and "rotated" (each
    rotation's, by original option), for the labeller, and "rotations_ms", the work they added
    that the answer does not reuse. `rotations_by` (a `time.perf_counter()` time): the
    rotations are not started when their whole price would end after it, and given up, all of
    them (the figures are NaN), when the next one would end after it at the pace of those
    before."""
    rotations = ROTATIONS if rotations is None else rotations
    session._abort.clear()
    text = str(messages[-1].get("content", "")) if messages else ""
    letters = option_letters(text)
    vocab, lc = session._vocab, session._lc
    seen: dict[str, Any] = {} if detail is None else detail
    try:
        tokens = session.tokenize(session.render(messages))
        cycle = rotation_cycle(session, messages, tokens, letters, rotations, pace_s)
        cheap = rotations_max_s is None or cycle.price_s is None or cycle.price_s <= rotations_max_s
        t0 = time.perf_counter()
        rotated = _rotated(session, cycle, rotations_by) if cheap else []
        seen["rotated"] = rotated
        spent_ms = (time.perf_counter() - t0) * 1e3 if cheap else 0.0
        seen["rotations_ms"] = _unshared_ms(cycle, spent_ms)
        signals, answer, logprobs = measure(
            session.llm,
            tokens,
            reuse=_reuse(session, tokens),
            letters=letters,
            n_answer=n_answer,
            is_eog=lambda t: bool(lc.llama_vocab_is_eog(vocab, t)),
            rotated=rotated,
            detail=seen,
        )
    except RuntimeError as exc:
        session._after_abort()
        if session._abort.is_set():
            raise Aborted from exc
        raise errors.LocalEngineError(f"signals failed: {exc}", engine="local") from exc
    return signals, len(tokens), answer, logprobs


def _reuse(session: Any, tokens: Sequence[int]) -> int:
    """Keep the cached prefix of `tokens` in the KV cache, drop the rest: how many are kept."""
    reuse = int(session.cached_prefix(tokens))
    llm = session.llm
    if reuse <= 0 or not llm._ctx.kv_cache_seq_rm(-1, reuse, -1):
        reuse = 0
        llm.reset()
    return reuse


def _option_probs(llm: Any, tokens: Sequence[int], reuse: int, ids: Sequence[int]) -> list[float]:
    """Prefill `tokens` (the first `reuse` kept in the KV cache): the option probabilities."""
    llm.n_tokens = reuse
    llm.eval(list(tokens[reuse:]))
    return perm.option_distribution(last_logits(llm), ids)


@dataclass(frozen=True)
class Cycle:
    """A multiple-choice prompt's option rotations, rendered: each one's tokens and option
    order, the option letters' token ids, the tokens they prefill (`fresh`), of which the
    prompt as asked then finds `shared` cached (the question), and what the rest, the work a
    local answer does not reuse, is priced at (`price_s`; None: no prefill pace known yet)."""

    prompts: list[tuple[list[int], list[int]]]
    ids: list[int]
    fresh: int = 0
    shared: int = 0
    pace_s: float | None = None  # seconds a prompt token takes (None: unknown)

    @property
    def price_s(self) -> float | None:
        return None if self.pace_s is None else (self.fresh - self.shared) * self.pace_s


def rotation_cycle(
    session: Any,
    messages: Sequence[Any],
    asked: Sequence[int],
    letters: Sequence[str],
    n: int,
    pace_s: float | None = None,
) -> Cycle:
    """The rotations of the last message's options (up to `n`), rendered, counted against what
    the KV cache holds now and priced at `pace_s`; `asked`: the prompt as asked."""
    text = str(messages[-1].get("content", "")) if messages else ""
    ids = letter_ids(session.llm, letters) if letters and n > 0 else []
    prompts = [
        (session.tokenize(session.render([*messages[:-1], {**messages[-1], "content": p}])), o)
        for p, o in (perm.rotations(text, letters, n) if ids else [])
    ]
    if not prompts:
        return Cycle(prompts, ids)
    held: Sequence[int] = session.llm._input_ids[: session.llm.n_tokens]
    fresh = 0
    for tokens, _ in prompts:
        fresh += len(tokens) - min(common_prefix(held, tokens), len(tokens) - 1)
        held = tokens
    before = common_prefix(session.llm._input_ids[: session.llm.n_tokens], asked)
    shared = max(common_prefix(held, asked) - before, 0)
    return Cycle(prompts, ids, fresh, shared, pace_s)


def _unshared_ms(cycle: Cycle, spent_ms: float) -> float:
    """Of the rotations' `spent_ms`, the part a local answer does not reuse: all but the
    question's share of the tokens they prefilled (`Cycle.shared`)."""
    if not cycle.fresh or spent_ms <= 0.0:
        return 0.0
    return spent_ms * (cycle.fresh - cycle.shared) / cycle.fresh


def _rotated(session: Any, cycle: Cycle, by: float | None = None) -> list[list[float]]:
    """The option probabilities of each rotation of `cycle`, by original option; [] when the
    whole cycle would not end by `by` (a partial cycle is not what stage 2 learnt from: the
    letter bias cancels only over all of it): not started when its whole prefill, at the last
    measured pace, would end past it; given up when the next rotation would end past it at the
    pace of those before."""
    whole_s = None if cycle.pace_s is None else cycle.fresh * cycle.pace_s
    if by is not None and whole_s is not None and time.perf_counter() + whole_s > by:
        return []
    out: list[list[float]] = []
    t0 = time.perf_counter()
    for tokens, order in cycle.prompts:
        pace = (time.perf_counter() - t0) / len(out) if out else 0.0
        if by is not None and time.perf_counter() + pace > by:
            return []
        probs = _option_probs(session.llm, tokens, _reuse(session, tokens), cycle.ids)
        out.append(perm.back_to_original(probs, order))
    return out


def prefix_signals(values: dict[str, float], logprobs: Sequence[float], n: int) -> dict[str, float]:
    """`values` measured over a longer answer, as they read over its first `n` tokens only
    (the figures stage 2 was trained on): the answer-token figures recomputed from `logprobs`."""
    out = dict(values)
    lps = np.array(list(logprobs[:n]))
    if lps.size:
        out.update(
            lp_mean=float(lps.mean()), lp_min=float(lps.min()), answer_tokens=float(lps.size)
        )
        for q, name in zip(QUANTILES, ("lp_q10", "lp_q25", "lp_q50"), strict=True):
            out[name] = float(np.quantile(lps, q))
    return out


class Aborted(Exception):
    """Internal: the signals' decoding was aborted on request (the caller was cancelled)."""


@dataclass(frozen=True)
class LocalSignals:
    """What `LlamaCppEngine.signals()` measured: the figures (`SIGNAL_NAMES`), the prompt's
    tokens, the greedy answer's first tokens as text (`answer`, `ended`: the answer ended
    there), the local work it took (`cost_ms`: queue wait not counted; `rotations_ms` of it
    the option rotations', the only part a local answer that follows does not reuse) and the
    answer tokens' log-probabilities (`logprobs`, the end-of-generation token's last when it
    `ended`) and ids (`tokens`, likewise)."""

    values: dict[str, float]
    prompt_tokens: int
    answer: str
    ended: bool
    cost_ms: float
    logprobs: tuple[float, ...] = ()
    tokens: tuple[int, ...] = ()
    rotations_ms: float = 0.0


async def engine_signals(
    engine: Any,
    messages: Sequence[Any],
    n_answer: int,
    rotations_within_s: float | None = None,
    rotations_max_s: float | None = None,
) -> LocalSignals:
    """Run `session_measure` as one queued job of `engine` (a `LlamaCppEngine`);
    `rotations_within_s`: the option rotations must end this long after the job starts, or
    none is used (`session_measure`'s `rotations_by`); `rotations_max_s`: the most they may add
    that the answer does not reuse, priced before they start."""

    tps = engine.prefill_tps
    pace_s = 1.0 / tps if tps else None  # the engine's measured prefill speed

    def job(session: Any) -> LocalSignals:  # on the llama thread
        t0 = time.perf_counter()
        by = None if rotations_within_s is None else t0 + rotations_within_s
        seen: dict[str, Any] = {}
        values, prompt_tokens, answer, logprobs = session_measure(
            session,
            messages,
            n_answer,
            detail=seen,
            rotations_by=by,
            rotations_max_s=rotations_max_s,
            pace_s=pace_s,
        )
        cost_ms = (time.perf_counter() - t0) * 1e3
        ended = bool(answer) and bool(session._lc.llama_vocab_is_eog(session._vocab, answer[-1]))
        text_tokens = answer[:-1] if ended else answer
        text = session.llm.detokenize(text_tokens).decode("utf-8", errors="ignore")
        return LocalSignals(
            values,
            prompt_tokens,
            text,
            ended,
            cost_ms,
            tuple(logprobs),
            tuple(answer),
            seen.get("rotations_ms", 0.0),
        )

    estimate_s = engine.estimate_s(0, n_answer)
    signals: LocalSignals = await engine.queued_job(job, estimate_s=estimate_s, what="signals")
    return signals
