"""The seam where a continuation joins the delivered text, judged before any of it is delivered.

Every continuation (a handoff, a failover either way, a released rescue, the speculative plan's
fallbacks, the cascade's switch) streams through `RequestRun.relay` with the delivered text as
its `assistant_prefix`; `seamed` holds the continuing engine's first text until the seam can be
judged, usually its first token or two (a start that could not grow into a repeat):

```
clean     the continuation goes on from the delivered text: delivered as it comes
overlap   it repeats the delivered text's last words ("Lighthouses were" + "were painted"):
          the repeated words are cut
restart   it starts the answer again, all of the delivered text first ("1, 2," + "1, 2, 3"):
          that repeated start is cut
```

A continuation that starts the answer again but leaves it before the seam ("1, 2, 3, 4," +
"1, 2, 5"), or that ends at once (a "stop" with no text) where the delivered text stops
mid-sentence, did not continue (unless the engine goes on from its own text: a released rescue
that stops there has ended its own answer): `ContinuationError`, and the plan's rule for a
failed engine applies (the other engine goes on, or the error reaches the app). What was judged is a
`SeamRecord` in `Trace.seams`. The hold is the continuation's first word or two; a start that
could still be a repeat is held at most `HOLD_MAX_CHARS`.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable
from contextlib import aclosing

from hybridllm import clock
from hybridllm.errors import ContinuationError
from hybridllm.events import Called, Chunk, Delta, Finish, Mark
from hybridllm.runtime.records import SeamKind, SeamRecord

__all__ = ["decided", "judge", "seamed"]

HOLD_MAX_CHARS = 64  # a start that could still be a repeat is judged at this length at most
HOLD_MAX_PIECES = 8  # ... or at this many deltas
MAX_OVERLAP_WORDS = 8
# a delivered text ending so has ended a sentence (a stop there is no failed continuation)
SENTENCE_ENDS = (".", "!", "?", "…", ":", ";", '"', "'", ")", "]", "}", "»", "\n")


def judge(delivered: str, start: str) -> tuple[SeamKind, int] | None:
    """How `start` (the continuation's text so far) joins `delivered`: the kind and how many of
    its characters to cut; None: a restart that leaves the delivered text (not a continuation)."""
    head = start.lstrip()
    lead = len(start) - len(head)
    told = delivered.strip()
    if told and head.startswith(told):
        return "restart", lead + len(told)
    d_words, s_words = delivered.split(), head.split()
    same = 0
    while same < min(len(d_words), len(s_words)) and d_words[same] == s_words[same]:
        same += 1
    if same >= 2 and len(s_words) > same:  # began the answer again, then went elsewhere
        return None
    for k in range(min(MAX_OVERLAP_WORDS, len(d_words), len(s_words)), 0, -1):
        if d_words[-k:] == s_words[:k]:
            return "overlap", lead + _end_of_words(head, k)
    return "clean", 0


def decided(delivered: str, start: str, pieces: int = 1) -> bool:
    """Whether `start` (`pieces` deltas) is enough to judge the seam: it can no longer grow into
    a repeat of the delivered text's start or of its last words (or it is as long as a hold may
    be)."""
    head = start.lstrip()
    if not head:
        return False
    if pieces >= HOLD_MAX_PIECES or len(head) >= HOLD_MAX_CHARS:
        return True
    told = delivered.strip()
    if told and told.startswith(head):
        return False  # could still become the whole delivered text again
    d_words = delivered.split()
    tails = (" ".join(d_words[-k:]) for k in range(1, min(MAX_OVERLAP_WORDS, len(d_words)) + 1))
    return not any(tail.startswith(head) for tail in tails)


async def seamed(
    chunks: AsyncGenerator[Chunk, None],
    delivered: str,
    engine: str,
    on_seam: Callable[[SeamRecord], None],
    *,
    own: bool = False,
) -> AsyncGenerator[Chunk, None]:
    """`chunks` of a continuation of `delivered`, its first text held until the seam is judged
    and cut as `judge` says (the stream is always closed). `own`: the engine goes on from text
    it wrote itself (a parked rescue released), so a stop at once is its own end, not a failed
    continuation."""
    held: list[Delta] | None = []  # None: judged
    since: float | None = None
    async with aclosing(chunks) as inner:
        async for chunk in inner:
            if held is None:
                yield chunk
                continue
            if isinstance(chunk, Delta):
                since = chunk.t if since is None else since
                held.append(chunk)
                if not decided(delivered, "".join(d.text for d in held), len(held)):
                    yield Mark("seam_held", chunk.t)  # alive: a held token is no stall
                    continue
            elif isinstance(chunk, Finish) and not any(d.text.strip() for d in held):
                if not own:
                    _check_stop(delivered, chunk, engine)
            elif not isinstance(chunk, Finish | Called):
                yield chunk  # marks, usage: not text
                continue
            for piece in _judged(delivered, held, engine, since, on_seam):
                yield piece
            held = None
            if not isinstance(chunk, Delta):
                yield chunk


def _judged(
    delivered: str,
    held: list[Delta],
    engine: str,
    since: float | None,
    on_seam: Callable[[SeamRecord], None],
) -> list[Delta]:
    """The held deltas with the seam's cut taken off their front; the record said."""
    text = "".join(d.text for d in held)
    verdict = judge(delivered, text) if text.strip() else ("clean", 0)
    if verdict is None:
        raise ContinuationError(engine, "restart", text)
    kind, cut = verdict
    if cut and delivered[-1:].isspace():  # the delivered text's own space stands at the seam
        cut += len(text[cut:]) - len(text[cut:].lstrip())
    held_ms = 0.0 if since is None else (clock.now() - since) * 1e3
    on_seam(SeamRecord(engine, kind, text[:cut], held_ms))
    out: list[Delta] = []
    for d in held:
        take = min(cut, len(d.text))
        cut -= take
        if d.text[take:]:
            out.append(Delta(d.text[take:], d.t))
    return out


def _check_stop(delivered: str, finish: Finish, engine: str) -> None:
    """A continuation that ends with no text where the delivered text stops mid-sentence did
    not continue it (a "length" or a tool call's finish is not such a stop)."""
    if finish.reason == "stop" and delivered.strip() and not delivered.endswith(SENTENCE_ENDS):
        raise ContinuationError(engine, "stopped", "")


def _end_of_words(text: str, k: int) -> int:
    """The index just after the `k`-th whitespace-separated word of `text`."""
    i, n = 0, 0
    while n < k:
        while i < len(text) and text[i].isspace():
            i += 1
        while i < len(text) and not text[i].isspace():
            i += 1
        n += 1
    return i
