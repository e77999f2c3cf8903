"""A LiveKit agent with one function tool, on hybridllm, driven by LiveKit's text-only harness.

python examples/livekit_agent.py [--question "What's the weather in Lisbon?"]
    [--cloud-url http://127.0.0.1:8000/v1 --cloud-model NAME]

No LiveKit server and no audio: `AgentSession.run(user_input=...)` (LiveKit's own test harness)
runs one user turn through the agent, whose LLM is `HybridLLM`. The agent calls `get_weather`,
LiveKit runs the tool, and the agent answers from its result. Then, for each LLM request of the
turn, the time to first token as LiveKit's `LLMMetrics` measured it beside hybridllm's trace.
"""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

from livekit.agents import Agent, AgentSession, RunContext, function_tool, metrics

from hybridllm import HybridClient, LlamaCppEngine, OpenAIEngine, Policy
from hybridllm.integrations.livekit import HybridLLM
from hybridllm.runtime.trace import Trace


class WeatherAgent(Agent):
    def __init__(self) -> None:
        super().__init__(
            instructions="You are a weather assistant. Call get_weather once for a weather "
            "question, then answer from its result in one short sentence."
        )

    @function_tool
    async def get_weather(self, context: RunContext, city: str) -> str:
        """The weather now in a city.

        Args:
            city: the city's name
        """
        return f"It is sunny and 21 degrees Celsius in {city}."  # a stand-in for a service


async def run_turn(llm: HybridLLM, question: str) -> list[Any]:
    """One user turn through LiveKit's `AgentSession` with no room, no audio: its events."""
    # max_tool_steps=1: at most one round of calls before LiveKit asks for the answer with
    # tool_choice="none" (a 0.5B model tends to call the same tool again and again)
    async with AgentSession(llm=llm, max_tool_steps=1) as session:
        await session.start(WeatherAgent())
        result = await session.run(user_input=question)
    return list(result.events)


def show(events: list[Any]) -> None:
    for event in events:
        item = event.item
        if event.type == "function_call":
            print(f"tool call: {item.name}({item.arguments})")
        elif event.type == "function_call_output":
            print(f"tool output: {item.output}")
        elif event.type == "message":
            route = item.extra.get("hybridllm", {})
            print(
                f"reply ({route.get('engine')}, {route.get('route_reason')}): {item.text_content}"
            )


def figures(collected: list[metrics.LLMMetrics], traces: list[Trace]) -> None:
    """LiveKit's TTFT and the trace's, request by request (matched by the request id)."""
    by_id = {t.request_id: t for t in traces}
    for m in collected:
        trace = by_id[m.request_id]
        livekit = f"{m.ttft * 1000:.1f}" if m.ttft >= 0 else "none"
        hybrid = f"{trace.ttft_ms:.1f}" if trace.ttft_ms is not None else "none"
        print(
            f"request {m.request_id[:8]}: {trace.engine}, LiveKit ttft {livekit} ms, "
            f"trace ttft {hybrid} ms, {m.completion_tokens} tokens"
        )


async def main(args: argparse.Namespace) -> None:
    local = LlamaCppEngine(args.model, pull=True, n_ctx=2048)
    cloud = None
    if args.cloud_url:
        cloud = OpenAIEngine(base_url=args.cloud_url, model=args.cloud_model, api_key="none")
    policy = Policy.preset("voice-assistant").with_(sampling={"temperature": 0.0})
    async with HybridClient(local=local, cloud=cloud, policy=policy) as client:
        llm = HybridLLM(client=client, max_tokens=args.max_tokens)
        collected: list[metrics.LLMMetrics] = []
        traces: list[Trace] = []
        llm.on("metrics_collected", collected.append)
        llm.on("hybridllm_trace", traces.append)
        show(await run_turn(llm, args.question))
        figures(collected, traces)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen2.5-coder-1.5b-instruct", help="local model")
    parser.add_argument("--cloud-url", help="an OpenAI-compatible endpoint")
    parser.add_argument("--cloud-model", default="cloud", help="its model name")
    parser.add_argument("--question", default="What's the weather in Lisbon?")
    parser.add_argument("--max-tokens", type=int, default=80)
    asyncio.run(main(parser.parse_args()))
