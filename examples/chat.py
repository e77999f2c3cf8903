"""A minimal chat loop: the local model, plus a cloud when OPENAI_BASE_URL is set.

python examples/chat.py                          # interactive: type, Enter; Ctrl-D quits
python examples/chat.py --once "What is a GGUF file?"
OPENAI_BASE_URL=http://127.0.0.1:8000/v1 python examples/chat.py --engine cloud
"""

from __future__ import annotations

import argparse
import os
import sys

import anyio
import anyio.to_thread

from hybridllm import HybridClient, LlamaCppEngine, OpenAIEngine


async def read_line(prompt: str) -> str | None:
    """One line from stdin without blocking the event loop; None at end of input."""
    print(prompt, end="", flush=True)
    line = await anyio.to_thread.run_sync(sys.stdin.readline, abandon_on_cancel=True)
    return line.strip() if line else None


async def main(args: argparse.Namespace) -> None:
    local = LlamaCppEngine(args.model, pull=True)
    cloud = OpenAIEngine() if os.environ.get("OPENAI_BASE_URL") else None
    history = [{"role": "system", "content": "You are a helpful assistant. Answer briefly."}]
    async with HybridClient(local=local, cloud=cloud, policy="chat") as client:
        while True:
            question = args.once if args.once is not None else await read_line("> ")
            if question is None:
                break
            if not question:
                continue
            history.append({"role": "user", "content": question})
            answer: list[str] = []
            async with client.stream(history, engine=args.engine, max_tokens=args.max_tokens) as s:
                async for token in s:
                    print(token, end="", flush=True)
                    answer.append(token)
            history.append({"role": "assistant", "content": "".join(answer)})
            t = s.trace
            ttft = f"{t.ttft_ms:.0f} ms" if t.ttft_ms is not None else "-"
            print(f"\n[{t.engine}: TTFT {ttft}, {t.n_tokens} tokens]")
            if args.once is not None:
                break


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--once", metavar="QUESTION", help="ask one question and exit")
    parser.add_argument("--model", default="qwen2.5-coder-0.5b-instruct", help="local model")
    parser.add_argument("--engine", choices=["local", "cloud"], help="force an engine")
    parser.add_argument("--max-tokens", type=int, default=256)
    try:
        anyio.run(main, parser.parse_args())
    except KeyboardInterrupt:
        print()
