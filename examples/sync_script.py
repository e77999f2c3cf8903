"""Plain blocking code, no asyncio: `with client:` and `stream_sync` / `complete_sync`.

python examples/sync_script.py
"""

from __future__ import annotations

import argparse

from hybridllm import HybridClient, LlamaCppEngine


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen2.5-coder-0.5b-instruct", help="local model")
    args = parser.parse_args()

    with HybridClient(local=LlamaCppEngine(args.model, pull=True)) as client:
        # tokens as they arrive
        prompt = "Write a Python one-liner that reverses a string s."
        for token in client.stream_sync(prompt, policy="code-completion", max_tokens=48):
            print(token, end="", flush=True)
        print()

        # the whole answer at once, with its timings
        result = client.complete_sync(
            "Translate into Spanish: 'Good morning, see you tomorrow.'",
            policy="translation",
            max_tokens=32,
        )
        print(result.text)
        print(result.trace.summary())


if __name__ == "__main__":
    main()
