"""A check the speculative plan's integration tests share: drafts and retractions add up."""

from __future__ import annotations

from collections.abc import Sequence

from hybridllm.events import Draft, Retract, Token


def drafts_add_up(events: Sequence[object]) -> None:
    """At each committed piece, the provisional text that is left (drafts less retractions) is
    where the committed piece starts."""
    pending = ""
    for e in events:
        if isinstance(e, Draft):
            pending += e.text
        elif isinstance(e, Retract):
            assert pending.endswith(e.text)
            pending = pending[: len(pending) - len(e.text)]
        elif isinstance(e, Token):
            assert e.text.startswith(pending), (e.text, pending)
            pending = ""
