"""The benchmark's prompts: sized in tokens, each one unique.

Each prompt starts with its own request number, so no request reuses another's cached prefix
(llama.cpp keeps the last prompt's KV cache; a repeated prompt would prefill almost nothing and
its TTFT would say nothing about the input length). Sizes are counted with the local model's
chat template and tokenizer (`LlamaCppEngine.count_tokens`): the prefill the local engine does.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from hybridllm.errors import InvalidArgumentError

Counter = Callable[[str], int]

FILLER = (
    "The Lyon depot shipped 412 parcels on Monday, most of them to Paris and Grenoble.",
    "Two vans were late because of roadworks on the ring road near Villeurbanne.",
    "Customers in Annecy asked for evening delivery slots twice as often as last month.",
    "The new sorting belt cut the average handling time per parcel by eleven seconds.",
    "Fuel costs rose by four percent, while tyre wear stayed about the same as in spring.",
    "A driver reported that the loading bay door sticks when the temperature drops.",
    "Returns were mostly shoes and small electronics, packed in their original boxes.",
    "The Saint-Etienne route now starts at six so that the first drop is before eight.",
    "Weekend volumes were low, so one shift was moved to Tuesday, the busiest day.",
    "The team proposes a second charging point for the electric vans before winter.",
)
QUESTION = "Question: in one sentence, what do these notes say about deliveries?"


def sized_prompt(target: int, number: int, count: Counter) -> str:
    """A prompt of about `target` tokens (at least `target`, by `count`) for request `number`:
    notes of a delivery depot and a question about them."""
    if target < 1:
        raise InvalidArgumentError("target", target, "a token count >= 1")
    head = f"Request {number}. Read the notes below, then answer the question at the end.\n\n"
    body: list[str] = []
    sentences = itertools.cycle(FILLER)
    text = head + QUESTION
    while count(text) < target:
        body.append(next(sentences))
        text = head + " ".join(body) + "\n\n" + QUESTION
    return text


@dataclass(frozen=True, slots=True)
class MixedRequest:
    """One request of the mixed workload: its kind, prompt size and output tokens."""

    kind: str
    input_tokens: int
    max_tokens: int


# a chat-like mix: mostly short questions, some longer contexts, some longer answers
MIX = (
    MixedRequest("short question", 50, 16),
    MixedRequest("chat turn", 150, 32),
    MixedRequest("short question", 60, 24),
    MixedRequest("document question", 700, 16),
    MixedRequest("chat turn", 200, 48),
)


def mixed(n: int, scale_tokens: float = 1.0) -> Iterator[MixedRequest]:
    """The first `n` requests of the mix (output tokens scaled by `scale_tokens`)."""
    for request in itertools.islice(itertools.cycle(MIX), n):
        tokens = max(4, round(request.max_tokens * scale_tokens))
        yield MixedRequest(request.kind, request.input_tokens, tokens)
