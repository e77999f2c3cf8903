"""A conversation that outgrew the local context, trimmed to fit (`[sampling] overflow = "trim"`).

    request, dropped = trim_to_fit(request, n_ctx=4096, count=local.count_tokens)

The oldest turns go first, after the opening system messages, which stay. A turn is a user
message and everything after it up to the next user message: an assistant's tool calls and the
tool results that answer them are in the same turn, so a call is never kept without its result
or a result without its call. The last turn (the question being asked) always stays. The
conversation is cut to the fewest turns dropped that leave room for the answer
(`room_for_output`: `max_tokens`, at most a quarter of the context); where even the last turn
alone does not fit, every older turn is dropped and routing decides (the prompt may then go to
an engine with a larger context, or fail with `ContextOverflowError`).

Counting a long conversation costs milliseconds: the fit is found by bisection over the number
of turns dropped, counting O(log turns) times (`HybridClient` runs this on its worker thread
with the rest of admission's costly facts).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

from hybridllm.engines.base import GenerationRequest, Message

__all__ = ["room_for_output", "trim_to_fit", "turns"]

Count = Callable[[Sequence[Message]], int | None]


def room_for_output(n_ctx: int, max_tokens: int) -> int:
    """The tokens a trimmed prompt leaves for the answer: `max_tokens`, at most n_ctx // 4."""
    return max(1, min(max_tokens, n_ctx // 4))


def turns(messages: Sequence[Message]) -> tuple[int, list[int]]:
    """The index where the conversation starts after its opening system messages, and the
    start of each turn (a user message) from there."""
    head = 0
    while head < len(messages) and messages[head].get("role") in ("system", "developer"):
        head += 1
    starts = [i for i in range(head, len(messages)) if messages[i].get("role") == "user"]
    return head, starts


def trim_to_fit(
    request: GenerationRequest, *, n_ctx: int, count: Count
) -> tuple[GenerationRequest, int]:
    """`request` with its oldest turns dropped until its prompt leaves `room_for_output` in
    `n_ctx`, and how many messages were dropped (0: it fitted, or cannot be counted)."""
    messages = request.messages
    budget = n_ctx - room_for_output(n_ctx, request.max_tokens)
    head, starts = turns(messages)
    if len(starts) < 2 or _fits(messages, budget, count):
        return request, 0

    def cut(k: int) -> tuple[Message, ...]:  # the first k turns dropped (k < len(starts))
        return (*messages[:head], *messages[starts[k] :])

    lo, hi = 1, len(starts) - 1  # the smallest k whose cut fits, or the last turn alone
    while lo < hi:
        mid = (lo + hi) // 2
        if _fits(cut(mid), budget, count):
            hi = mid
        else:
            lo = mid + 1
    kept = cut(lo)
    return replace(request, messages=kept), len(messages) - len(kept)


def _fits(messages: Sequence[Message], budget: int, count: Count) -> bool:
    n = count(messages)
    return n is None or n <= budget
