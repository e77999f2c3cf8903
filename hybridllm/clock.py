"""`now()`: the one clock that every time stamp in hybridllm reads.

It is the running event loop's clock (`anyio.current_time()`), so a stamp, a deadline computed
from stamps, and a sleep or timeout on the loop all count the same seconds. Under a test's
virtual clock (trio's `MockClock`, see `hybridllm.testing`) the figures of a trace therefore
follow virtual time exactly. Off the loop (a worker thread, or no loop at all) it reads
`time.monotonic()`, the clock asyncio's loop runs on; trio's own clock has another origin, so
take the stamps that are compared with others on the loop.
"""

from __future__ import annotations

import time

import anyio


def now() -> float:
    """Seconds on the event loop's clock (off the loop: `time.monotonic()`)."""
    try:
        return anyio.current_time()
    except RuntimeError:  # no event loop in this thread (sniffio's and anyio's errors are these)
        return time.monotonic()
