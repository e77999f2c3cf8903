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
