"""A LangChain chain with structured output, on hybridllm: `prompt | model.with_structured_output(
Capital)`, where the model is `HybridChatModel` (the local model, and a cloud when given).

python examples/langchain_chain.py [--model qwen2.5-coder-0.5b-instruct]
                                   [--cloud-url http://127.0.0.1:8000/v1 --cloud-model NAME]

The answer is JSON of the schema: the local engine generates it under a grammar of the schema,
and the runtime checks it, so LangChain's parser always gets a `Capital`. Each line says which
engine answered, why, and its time to first token, read from the message's `response_metadata`
(`include_raw=True` keeps the message beside the parsed answer). Needs
`pip install 'hybridllm[langchain]'`.
"""

from __future__ import annotations

import argparse
from typing import Any

import anyio
from langchain_core.prompts import ChatPromptTemplate
from pydantic import BaseModel, Field

from hybridllm import HybridClient, LlamaCppEngine, OpenAIEngine
from hybridllm.integrations.langchain import HybridChatModel


class Capital(BaseModel):
    """A country's capital city."""

    country: str = Field(description="the country asked about")
    capital: str = Field(description="its capital city")


PROMPT = ChatPromptTemplate.from_messages(
    [
        ("system", "You answer geography questions as JSON."),
        ("user", "What is the capital of {country}?"),
    ]
)


async def main(args: argparse.Namespace) -> None:
    local = LlamaCppEngine(args.model, pull=True, n_threads=args.threads, warm_up=False)
    cloud = None
    if args.cloud_url:
        cloud = OpenAIEngine(base_url=args.cloud_url, model=args.cloud_model, api_key="none")
    async with HybridClient(local=local, cloud=cloud, router=None) as client:
        model = HybridChatModel(client=client, policy="chat")
        structured = model.with_structured_output(Capital, include_raw=True)
        chain = PROMPT | structured.with_config(run_name="capital")
        for country in args.countries:
            out: dict[str, Any] = await chain.ainvoke({"country": country})
            meta = out["raw"].response_metadata
            print(f"{out['parsed']!r}")
            route = f"engine={meta['engine']} ttft_ms={meta['ttft_ms']:.0f}"
            print(f"  {route} reason={meta['reason']}")


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="qwen2.5-coder-0.5b-instruct")
    p.add_argument("--cloud-url")
    p.add_argument("--cloud-model", default="gpt-4o-mini")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("countries", nargs="*", default=["France", "Japan"])
    return p.parse_args()


if __name__ == "__main__":
    anyio.run(main, parse())
