"""One long-lived thread for every llama.cpp computation in the process.

llama-cpp-python's CPU build uses OpenMP, which keeps a thread pool per OS thread that calls into
llama.cpp. As soon as two threads have driven it, libgomp stops spin-waiting at its barriers and
every decode step gets about 45% slower (measured: 42 -> 62 ms/token for Qwen 0.5B on 2 cores).
So model loading, warm-up, prefill and decode all run on this single thread, never on anyio's
shared worker pool. Tokenizing (no ggml compute) may run anywhere.

Results come back to the event loop without making the llama thread wait for the loop: the
thread posts a wake-up with the backend's thread-safe "call soon" and carries on.
"""

from __future__ import annotations

import concurrent.futures
import queue
import threading
from collections.abc import Callable
from functools import partial
from typing import Any, TypeVar

import anyio
import sniffio

T = TypeVar("T")
Job = tuple[Callable[[], Any], "concurrent.futures.Future[Any]"]


class LlamaThread:
    _lock = threading.Lock()
    _shared: LlamaThread | None = None

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[Job] = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._run, name="hybridllm-llama", daemon=True)
        self.thread.start()

    @classmethod
    def shared(cls) -> LlamaThread:
        with cls._lock:
            if cls._shared is None:
                cls._shared = cls()
            return cls._shared

    def submit(self, fn: Callable[[], T]) -> concurrent.futures.Future[T]:
        fut: concurrent.futures.Future[T] = concurrent.futures.Future()
        self._jobs.put((fn, fut))
        return fut

    def _run(self) -> None:
        while True:
            fn, fut = self._jobs.get()
            if not fut.set_running_or_notify_cancel():
                continue
            try:
                fut.set_result(fn())
            except BaseException as exc:  # delivered to the awaiting task
                fut.set_exception(exc)


def loop_caller() -> Callable[[Callable[[], object]], None]:
    """A function that any thread can use to run a callback on the current event loop soon,
    without waiting for it."""
    if sniffio.current_async_library() == "trio":  # pragma: no cover - asyncio is the default
        import trio

        token = trio.lowlevel.current_trio_token()

        def trio_post(cb: Callable[[], object]) -> None:
            token.run_sync_soon(cb)

        return trio_post
    import asyncio

    loop = asyncio.get_running_loop()

    def asyncio_post(cb: Callable[[], object]) -> None:
        loop.call_soon_threadsafe(cb)

    return asyncio_post


async def run_on_llama_thread(fn: Callable[[], T], *, on_cancel: Callable[[], None]) -> T:
    """Run `fn` on the llama thread and await its result.

    If the caller is cancelled: a job that has not started is dropped; a running one gets
    `on_cancel()` (which must make it return soon, e.g. llama.cpp's abort) and is waited for, so
    nothing keeps computing after the caller is gone.
    """
    fut = LlamaThread.shared().submit(fn)
    done = anyio.Event()
    post = loop_caller()
    fut.add_done_callback(lambda _f: post(done.set))
    try:
        await done.wait()
    except anyio.get_cancelled_exc_class():
        if not fut.cancel():
            on_cancel()
            with anyio.CancelScope(shield=True):
                await done.wait()
        raise
    return fut.result()


class Handoff:
    """Tokens from the llama thread to the event loop, without the loop waiting for a core.

    Decoding keeps both cores busy (the llama thread and its OpenMP team), so a token posted to
    the loop waited for the scheduler to give the loop's thread a core: 0.2 ms at the median but
    4-8 ms in the tail on 2 cores, which is jitter the app hears. So the llama thread, having
    posted a token (`send`), waits until the loop has taken it and run `turns` more of its
    turns (enough for the orchestrator to hand it to the app: `taken`), at most `wait_s`, before
    it starts the next decode step. The wait costs the decode about the loop's own work per
    token; a loop busy elsewhere costs at most `wait_s` per token."""

    def __init__(
        self, post: Callable[[Callable[[], object]], None], wait_s: float = 0.004, turns: int = 2
    ) -> None:
        self.post, self.wait_s, self.turns = post, wait_s, turns

    def send(self, deliver: Callable[[threading.Event], None]) -> None:
        """On the llama thread: post `deliver(ack)` to the loop and wait for its `ack`."""
        ack = threading.Event()
        self.post(partial(deliver, ack))
        if self.wait_s > 0:
            ack.wait(self.wait_s)

    def taken(self, ack: threading.Event) -> None:
        """On the loop: the token was taken; release the llama thread `turns` turns later."""
        self._later(ack, self.turns)

    def _later(self, ack: threading.Event, turns: int) -> None:
        if turns <= 0:
            ack.set()
        else:
            self.post(partial(self._later, ack, turns - 1))
