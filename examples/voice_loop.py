"""A voice-style loop with barge-in: speak the answer as it streams, and stop the moment the
user talks over it.

The "TTS" prints each word with a short delay. The interruption is simulated by a timer
(`--interrupt-after`), or comes from pressing Enter when stdin is a terminal. On barge-in the
stream is closed at once: generation stops within one decode step and the engine is idle again.

    python examples/voice_loop.py
    python examples/voice_loop.py --interrupt-after 0     # no barge-in: speak the whole answer
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass

import anyio
import anyio.to_thread

from hybridllm import HybridClient, LlamaCppEngine

QUESTION = "Tell me a long story about a robot who learns to paint."


@dataclass
class BargeIn:
    at: float | None = None  # when the user interrupted (perf_counter)
    engine_busy: bool = False  # was the engine still generating at that moment?


async def speak(token: str, word_delay: float) -> None:
    """Simulated TTS: print the token; each new word takes `word_delay` seconds to say."""
    print(token, end="", flush=True)
    if token.startswith((" ", "\n")):
        await anyio.sleep(word_delay)


async def listen(
    speaking: anyio.CancelScope, after: float, engine: LlamaCppEngine, barge_in: BargeIn
) -> None:
    """Cancel `speaking` when the user 'talks': after `after` s, or on Enter at a terminal."""
    with anyio.move_on_after(after if after > 0 else None):
        if sys.stdin.isatty():
            await anyio.to_thread.run_sync(sys.stdin.readline, abandon_on_cancel=True)
        else:
            await anyio.sleep_forever()
    barge_in.at, barge_in.engine_busy = time.perf_counter(), engine.busy
    speaking.cancel()


async def main(args: argparse.Namespace) -> None:
    local = LlamaCppEngine(args.model, pull=True)
    barge_in = BargeIn()
    async with HybridClient(local=local) as client:
        if sys.stdin.isatty():
            print("(press Enter to interrupt)")
        print(f"user: {args.question}\nassistant: ", end="", flush=True)
        async with anyio.create_task_group() as tg:
            with anyio.CancelScope() as speaking:
                tg.start_soon(listen, speaking, args.interrupt_after, local, barge_in)
                async with client.stream(
                    args.question, policy="voice-assistant", max_tokens=args.max_tokens
                ) as s:
                    async for token in s:
                        await speak(token, args.word_delay)
                # leaving `async with` (at the end, or on barge-in) closes the stream
            tg.cancel_scope.cancel()  # stop listening

    t = s.trace
    print()
    if barge_in.at is not None:
        stopped_ms = ((local.stopped_at or barge_in.at) - barge_in.at) * 1000
        print(
            f"[barge-in: engine busy at the interruption: {barge_in.engine_busy}; "
            f"generation stopped {stopped_ms:.0f} ms later; busy now: {local.busy}]"
        )
    ttft = "-" if t.ttft_ms is None else f"{t.ttft_ms:.0f} ms"
    print(
        f"[{t.engine}: TTFT {ttft}, {t.n_tokens} tokens generated, "
        f"finish: {'interrupted' if t.finish_reason == 'cancelled' else t.finish_reason}]"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen2.5-coder-0.5b-instruct", help="local model")
    parser.add_argument("--question", default=QUESTION)
    parser.add_argument(
        "--interrupt-after",
        type=float,
        default=1.5,
        metavar="SECONDS",
        help="simulated barge-in after this many seconds (0: never)",
    )
    parser.add_argument("--word-delay", type=float, default=0.08, metavar="SECONDS")
    parser.add_argument("--max-tokens", type=int, default=400)
    try:
        anyio.run(main, parser.parse_args())
    except KeyboardInterrupt:
        print()
