"""A tool loop: the model calls a tool, the app runs it, the model answers from its result.

python examples/tools.py [--cloud-url http://127.0.0.1:8000/v1 --cloud-model NAME]

With only the local model, every call is made on the device (under a grammar of the tool's
schema, so its arguments always parse). With a cloud, a local call that fails its check, that
the local model is unsure of (`[tools] min_call_confidence`), or to a tool the question does
not name (`min_tool_fit`: "get_weather" for a question about the weather fits), goes to the
cloud.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import anyio

from hybridllm import HybridClient, LlamaCppEngine, OpenAIEngine, Policy, Token, ToolCall

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather now in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}


def get_weather(city: str) -> dict[str, Any]:
    return {"city": city, "sky": "clear", "celsius": 21}  # a stand-in for a real service


async def main(args: argparse.Namespace) -> None:
    local = LlamaCppEngine(args.model, pull=True)
    cloud = None
    if args.cloud_url:
        cloud = OpenAIEngine(base_url=args.cloud_url, model=args.cloud_model, api_key="none")
    policy = Policy.preset("chat").with_(tools={"min_call_confidence": 0.8, "min_tool_fit": 0.5})
    messages: list[dict[str, Any]] = [{"role": "user", "content": args.question}]
    async with HybridClient(local=local, cloud=cloud, policy=policy) as client:
        for _ in range(3):  # a call, its result, the answer (a few rounds at most)
            calls: list[ToolCall] = []
            async with client.stream(messages, tools=[WEATHER], max_tokens=200) as s:
                async for event in s.events():
                    if isinstance(event, Token):
                        print(event.text, end="", flush=True)
                    elif isinstance(event, ToolCall):
                        print(f"[{event.engine} calls {event.name}({event.arguments})]")
                        calls.append(event)
            if not calls:
                print()
                return
            messages.append({"role": "assistant", "content": "", "tool_calls": [
                call.message() for call in calls]})  # fmt: skip
            for call in calls:
                result = get_weather(**call.parsed())
                messages.append(
                    {"role": "tool", "tool_call_id": call.id, "content": json.dumps(result)}
                )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen2.5-coder-0.5b-instruct", help="local model")
    parser.add_argument("--cloud-url", help="an OpenAI-compatible endpoint")
    parser.add_argument("--cloud-model", default="cloud", help="its model name")
    parser.add_argument("--question", default="What's the weather in Lisbon right now?")
    anyio.run(main, parser.parse_args())
