"""Dialect (b), vLLM's ``prompt_logprobs`` on ``/v1/completions``: three ways to read it.

``choices[0].prompt_logprobs`` is a list with None first, then per prompt position a dict
token_id -> {logprob, rank, decoded_token} holding the top ``prompt_logprobs`` tokens and the
prompt's own token (rank 1: the model's top choice). vLLM computes prompt log-probabilities
from a full prefill (no prefix cache for such requests): every round pays the whole context
again, which the plan's cost counts. What a real vLLM returns are raw log-probabilities (its
default ``--logprobs-mode raw_logprobs``: before temperature and top_p), at most
``--max-logprobs`` (20 by default) per position; hybridllm serve-model does the same.

- Token-level, greedy (`PromptLogprobsVerifier`, temperature 0, the local and cloud tokenizers
  the same): the prompt goes as token ids; a drafted token is accepted when its rank is 1;
  at the first other one the cloud's top-1 is committed, else its generated token.
- Token-level, sampled (temperature > 0): speculative sampling (`sampling`). The cloud's
  p at each drafted position is the top 20 raw log-probabilities tempered and cut to the top_p
  nucleus by the client, exact only when the nucleus is inside them (checked per position);
  20 is vLLM's default cap; where the server allows more (vLLM's ``--max-logprobs``, hybridllm
  serve's option of that name) the probe finds it and rounds ask for 64, which covers wider
  nuclei (each round's answer then carries 64 entries for every prompt position: more bytes).
  The bonus token is the cloud's own draw after the draft (the generated token, sampled with
  the request's temperature, top_p and a seed from the round's random source). A position
  whose p is not determined ends the round there: what was decided before it is committed
  (`Verdict.switch`), and the plan's next round drafts nothing, so that the cloud's own draw
  fills that position. The probe checks that
  the server's log-probabilities are raw (the same at two temperatures); a server that
  processes them is used for greedy rounds only.
- Text-level (`TextLogprobsVerifier`, the tokenizers differ): the prompt goes as text
  (rendered with the local chat template), the server's own tokenization of the drafted text
  decides. Its tokens' texts (``decoded_token`` of each prompt token, read with
  ``return_token_ids``) are laid over the text; the accepted text is the longest prefix of the
  draft whose server tokens are each the server's top-1, then the server's own next token's
  text (its top-1 where it disagrees, else its generated greedy token). Where the top-1 adds
  no text (it ends at the draft's start, or is a special token or a piece of a character),
  the accepted text is committed and the next round drafts nothing, so that the generated
  token decides (`Verdict.switch`). Where the token texts do not spell the draft (a character
  split over tokens), or the top-1 would rewrite committed text, the round is
  `Unverifiable`. Greedy only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from hybridllm import errors
from hybridllm.engines.capabilities import VerificationPost
from hybridllm.runtime.plans.speculative.sampling import accept, nucleus_of_top
from hybridllm.runtime.plans.speculative.verifier import (
    Dialect,
    Probed,
    Round,
    Unverifiable,
    Verdict,
    billed_usage,
    first_choice,
    greedy_and_gap,
    text_verdict,
)

TOP = 20  # log-probabilities asked per position for sampled rounds (vLLM's default maximum)
WIDE = 64  # asked for instead where the server allows it (vLLM's --max-logprobs)


@dataclass
class PromptLogprobsVerifier:
    """vLLM's `/v1/completions` with `prompt_logprobs` on a token-id prompt. `raw`: the
    server's log-probabilities are raw (needed for sampled rounds)."""

    raw: bool = True
    top: int = TOP  # log-probabilities asked per position in sampled rounds
    dialect: Dialect = "prompt-logprobs"
    token_level: bool = True

    @property
    def samples(self) -> bool:
        return self.raw

    async def verify(self, round_: Round, post: VerificationPost) -> Verdict:
        s = round_.sampling
        body: dict[str, Any] = {
            "prompt": [*round_.context_ids, *round_.draft_ids],
            "max_tokens": 1,
            "temperature": 0.0,
            "prompt_logprobs": 2,
            "logprobs": 2,
            "return_tokens_as_token_ids": True,
        }
        if s is not None:  # the cloud draws the bonus token itself (seeded from ours)
            body.update(
                temperature=s.temperature,
                top_p=s.top_p,
                prompt_logprobs=self.top,
                logprobs=1,
                seed=s.rng.randrange(2**31),
            )
            return read_sampled(await post("completions", body), round_, self.top)
        return read_prompt_logprobs(await post("completions", body), round_)


def _ranked(entry: Mapping[str, Any]) -> list[tuple[int, int, float, str]]:
    """(rank, token id, logprob, decoded text) of one prompt position, best first."""
    out = []
    for key, v in entry.items():
        if isinstance(v, Mapping):
            out.append(
                (
                    int(v.get("rank", 10**9)),
                    int(key),
                    float(v["logprob"]),
                    str(v.get("decoded_token") or ""),
                )
            )
    return sorted(out)


def _text_of_ids(round_: Round, ids: Sequence[int], fallback: str) -> str:
    """The text of drafted and verifier token ids after the round's context (local tokenizer)."""
    return round_.text_of(ids) if round_.text_of is not None else fallback


def _prompt_logprobs(data: Mapping[str, Any], round_: Round) -> tuple[dict[str, Any], list[Any]]:
    """The answer's first choice and its `prompt_logprobs`, one entry per round token."""
    choice = first_choice(data)
    plp = choice.get("prompt_logprobs")
    if not isinstance(plp, list) or len(plp) != len(round_.context_ids) + len(round_.draft_ids):
        raise errors.CloudProtocolError("verification: prompt_logprobs missing or misaligned")
    return choice, plp


def _position(plp: list[Any], i: int) -> Mapping[str, Any]:
    """The `prompt_logprobs` entry of prompt position `i` (a protocol error when empty)."""
    entry = plp[i]
    if not isinstance(entry, Mapping) or not entry:
        raise errors.CloudProtocolError("verification: an empty prompt_logprobs entry")
    return entry


def read_prompt_logprobs(data: Mapping[str, Any], round_: Round) -> Verdict:
    """The verdict from a vLLM answer with `prompt_logprobs` (token-level, greedy)."""
    choice, plp = _prompt_logprobs(data, round_)
    n_ctx, draft = len(round_.context_ids), list(round_.draft_ids)
    p_tok, c_tok, reported = billed_usage(data)
    accepted_text = ""
    for j, tok in enumerate(draft):
        entry = _position(plp, n_ctx + j)
        ranked = _ranked(entry)
        mine = entry.get(str(tok))
        if not isinstance(mine, Mapping) or int(mine.get("rank", 0)) != 1:
            best = ranked[0]
            gap = best[2] - ranked[1][2] if len(ranked) > 1 else None
            text = _text_of_ids(round_, [*draft[:j], best[1]], accepted_text + best[3])
            return Verdict(j, text, accepted_text, best[1], False, p_tok, c_tok, gap, reported)
        accepted_text += round_.draft_pieces[j]
    text = choice.get("text") or ""
    finished = choice.get("finish_reason") == "stop" and not text
    lp = choice.get("logprobs") or {}
    own: int | None = None
    gap = None
    toks = lp.get("tokens") or []
    if toks and isinstance(toks[0], str) and toks[0].startswith("token_id:"):
        own = int(toks[0].removeprefix("token_id:"))
        text = _text_of_ids(round_, [*draft, own], accepted_text + text)
    tops = lp.get("top_logprobs") or []
    if tops and isinstance(tops[0], Mapping) and len(tops[0]) > 1:
        gap = greedy_and_gap(tops[0])[1]
    return Verdict(len(draft), text, accepted_text, own, finished, p_tok, c_tok, gap, reported)


def read_sampled(data: Mapping[str, Any], round_: Round, n_top: int = TOP) -> Verdict:
    """The verdict of speculative sampling over a `prompt_logprobs` answer (see the module)."""
    s = round_.sampling
    assert s is not None
    choice, plp = _prompt_logprobs(data, round_)
    n_ctx, draft = len(round_.context_ids), list(round_.draft_ids)
    p_tok, c_tok, reported = billed_usage(data)
    if len(s.q) < len(draft):
        raise ValueError("a sampled round needs q at every drafted position")

    def verdict(n: int, own: int | None, switch: str | None = None) -> Verdict:
        ids = [*draft[:n], *([own] if own is not None else [])]
        accepted = "".join(round_.draft_pieces[:n])
        return Verdict(
            n,
            _text_of_ids(round_, ids, accepted),
            accepted,
            own,
            False,
            p_tok,
            c_tok,
            None,
            reported,
            switch=switch,
        )

    for j, x in enumerate(draft):
        top = [(t, lp) for rank, t, lp, _ in _ranked(_position(plp, n_ctx + j)) if rank <= n_top]
        p = nucleus_of_top(top, s.temperature, s.top_p, s.vocab)
        if isinstance(p, str):
            return verdict(j, None, f"drafted position {j}: {p}")
        y = accept(p, s.q[j], x, s.rng)
        if y is not None:
            return verdict(j, y)
    toks = (choice.get("logprobs") or {}).get("tokens") or []
    if toks and isinstance(toks[0], str) and toks[0].startswith("token_id:"):
        return verdict(len(draft), int(toks[0].removeprefix("token_id:")))
    if choice.get("finish_reason") == "stop" and not choice.get("text"):
        v = verdict(len(draft), None)  # the cloud's own draw ends the answer
        return replace(v, finished=True)
    raise errors.CloudProtocolError("verification: no generated token id in the answer")


# ---- text-level ----------------------------------------------------------------------------


@dataclass
class TextLogprobsVerifier:
    """vLLM's `prompt_logprobs` on a text prompt: the server's tokenization decides."""

    dialect: Dialect = "prompt-logprobs"
    token_level: bool = False
    samples: bool = False

    async def verify(self, round_: Round, post: VerificationPost) -> Verdict:
        body = {
            "prompt": round_.prompt_text + round_.committed_text + round_.draft_text,
            "max_tokens": 1,
            "temperature": 0.0,
            "prompt_logprobs": 2,
            "logprobs": 2,
            "return_token_ids": True,
        }
        return read_text_logprobs(await post("completions", body), round_)


def read_text_logprobs(data: Mapping[str, Any], round_: Round) -> Verdict:
    """The verdict from a `prompt_logprobs` answer to a text prompt (see the module)."""
    choice = first_choice(data)
    names, ranks, tops = _server_tokens(choice)
    usage = billed_usage(data)
    draft, joined = round_.draft_text, "".join(names)
    if not joined.endswith(draft):
        raise Unverifiable("the server's token texts do not spell the draft (split characters)")
    boundary = len(joined) - len(draft)
    starts, pos = [], 0
    for n in names:
        starts.append(pos)
        pos += len(n)
    accepted = ""
    for j, name in enumerate(names):
        if starts[j] + len(name) <= boundary:
            continue  # before the draft
        if ranks[j] == 1:
            accepted += name[max(0, boundary - starts[j]) :]
            continue
        best = tops[j][0]
        gap = best[2] - tops[j][1][2] if len(tops[j]) > 1 else None
        own = best[3]
        if starts[j] < boundary:
            in_committed = joined[starts[j] : boundary]  # the server's token starts there
            if not own.startswith(in_committed):
                raise Unverifiable("the server's choice would rewrite committed text")
            own = own[len(in_committed) :]
        v = text_verdict(round_, accepted, own, False, usage, gap)
        if not own:  # its choice ends where the draft starts, or reads as nothing (a special
            # token, a piece of a character): a round without draft lets its generated token
            # decide the next text
            why = "the server's choice at the draft's start ends there or reads as nothing"
            return replace(v, switch=why)
        return v
    text = str(choice.get("text") or "")
    if not text and choice.get("finish_reason") == "length":
        raise Unverifiable("the server's next token reads as nothing (a split character)")
    return text_verdict(round_, accepted, text, not text, usage, _generated_gap(choice))


def _server_tokens(
    choice: Mapping[str, Any],
) -> tuple[list[str], list[int], list[list[tuple[int, int, float, str]]]]:
    """The server's prompt tokens after the first: each one's text, its rank, and the ranked
    entries at its position."""
    plp = choice.get("prompt_logprobs")
    ids = choice.get("prompt_token_ids")
    if not isinstance(plp, list) or len(plp) < 2:
        raise errors.CloudProtocolError("verification: no prompt_logprobs in the answer")
    if not isinstance(ids, list) or len(ids) != len(plp):
        ids = [None] + [next(iter(e)) if isinstance(e, Mapping) and e else None for e in plp[1:]]
    names, ranks, tops = [], [], []
    for i in range(1, len(plp)):
        entry = _position(plp, i)
        mine = entry.get(str(ids[i]))
        if not isinstance(mine, Mapping):
            raise errors.CloudProtocolError("verification: a prompt token missing its entry")
        names.append(str(mine.get("decoded_token") or ""))
        ranks.append(int(mine.get("rank", 0)))
        tops.append(_ranked(entry))
    return names, ranks, tops


def _generated_gap(choice: Mapping[str, Any]) -> float | None:
    """The top-2 gap where the server generated its own token (None: not reported)."""
    top_lp = (choice.get("logprobs") or {}).get("top_logprobs") or []
    if top_lp and isinstance(top_lp[0], Mapping) and top_lp[0]:
        return greedy_and_gap(top_lp[0])[1]
    return None


# ---- probing -------------------------------------------------------------------------------


async def probe_vllm(
    post: VerificationPost, local_ids: Sequence[int] | None, local_pieces: Sequence[str]
) -> Probed:
    """Which reading of dialect (b) fits: token-level when the server's names for the local
    tokenizer's ids of the probe text are the local pieces, else text-level."""
    text_level = Probed(
        TextLogprobsVerifier(),
        "prompt-logprobs, text-level (the cloud's tokenizer differs from the local one)",
    )
    if not local_ids:
        return text_level
    base = {"prompt": list(local_ids), "max_tokens": 1, "prompt_logprobs": 1, "top_p": 1.0}
    try:
        data = await post("completions", {**base, "temperature": 1.0})
        plp = first_choice(data).get("prompt_logprobs") or []
    except errors.RefusedError:  # the guard said no: not an answer about the dialect
        raise
    except errors.HybridError:
        return text_level
    seen = []
    for tok, entry in zip(local_ids[1:], plp[1:], strict=False):
        mine = entry.get(str(tok)) if isinstance(entry, Mapping) else None
        seen.append(str(mine.get("decoded_token")) if isinstance(mine, Mapping) else None)
    if len(seen) != len(local_ids) - 1 or seen != list(local_pieces[1:]):
        return text_level
    raw, top = await _raw_and_top(post, base, plp)
    words = "raw log-probabilities" if raw else "processed log-probabilities: greedy rounds only"
    return Probed(
        PromptLogprobsVerifier(raw=raw, top=top),
        f"prompt-logprobs (shared tokenizer, {words}, top {top})",
    )


async def _raw_and_top(
    post: VerificationPost, base: dict[str, Any], at_one: list[Any]
) -> tuple[bool, int]:
    """Whether the server's prompt log-probabilities ignore the temperature (raw ones), and
    how many per position it gives (`WIDE` where it allows that many, else `TOP`)."""
    other: dict[str, Any] | None = None
    top = WIDE
    for asked in (WIDE, 1):
        try:
            other = first_choice(
                await post("completions", {**base, "temperature": 0.5, "prompt_logprobs": asked})
            )
            break
        except errors.RefusedError:  # the guard said no: not an answer about the dialect
            raise
        except errors.HybridError:
            top = TOP
    if other is None:
        return False, TOP
    plp = other.get("prompt_logprobs") or []
    if len(plp) != len(at_one) or len(plp) < 2:
        return False, top
    for a, b in zip(at_one[1:], plp[1:], strict=True):
        if not isinstance(a, Mapping) or not isinstance(b, Mapping):
            return False, top
        for key, v in a.items():
            w = b.get(key)
            if not isinstance(w, Mapping) or abs(float(v["logprob"]) - float(w["logprob"])) > 1e-3:
                return False, top
    return True, top
