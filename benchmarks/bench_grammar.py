"""The grammar's cost per token on the local engine (issue 26): decode a JSON answer with and
without a llama.cpp grammar, same model, same run, interleaved.

    python benchmarks/bench_grammar.py [--model NAME] [--rounds N] [--tokens N] [--json PATH]

Arms, each a greedy answer to the same prompt (which asks for JSON), decoded through
`LlamaSession` (the engine's synchronous side, so no event-loop time is counted):
- plain: no grammar (the model writes what it likes);
- json_schema: the answer under the grammar of a response format's schema;
- json_object: under the grammar of any JSON object;
- tool call: `tool_choice` naming a tool (the call's JSON under the call grammar);
- banned: `tool_choice="none"` (the `<tool_call>` token banned by a logits processor).
ms/token = the decode steps' total time / their count, the first step (which evaluates the
prompt's last token) left out; up to --tokens steps per answer. Medians over the rounds, and
each arm's ratio to plain. No timed assertions.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

from benchmarks._report import cpu_model, report
from hybridllm.engines.base import GenerationRequest
from hybridllm.engines.llama.session import LlamaSession
from hybridllm.local.resolve import resolve_model
from hybridllm.local.settings import DEFAULT_SETTINGS
from hybridllm.tools import tool_spec

PROMPT = (
    "Describe three employees of a small bakery as JSON: for each, the name, the age, the role "
    "and a short list of the skills they have."
)
SCHEMA = {
    "type": "object",
    "properties": {
        "employees": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "name": {"type": "string"},
                    "age": {"type": "integer"},
                    "role": {"type": "string", "enum": ["baker", "cashier", "manager"]},
                    "skills": {"type": "array", "items": {"type": "string"}},
                },
                "required": ["name", "age", "role", "skills"],
            },
        }
    },
    "required": ["employees"],
}
TOOL = {
    "type": "function",
    "function": {"name": "add_employees", "parameters": SCHEMA},
}
ARMS: dict[str, Any] = {
    "plain": None,
    "json_schema": tool_spec(
        None, None, {"type": "json_schema", "json_schema": {"name": "staff", "schema": SCHEMA}}
    ),
    "json_object": tool_spec(None, None, {"type": "json_object"}),
    "tool call": tool_spec(
        [TOOL], {"type": "function", "function": {"name": TOOL["function"]["name"]}}, None
    ),
    "banned": tool_spec([TOOL], "none", None),
}


def decode(session: LlamaSession, arm: str, tokens: int) -> tuple[int, float]:
    """Decode one answer; return (timed steps, seconds they took)."""
    request = GenerationRequest(
        messages=[{"role": "user", "content": PROMPT}],
        max_tokens=tokens + 1,
        temperature=0.0,
        tools=ARMS[arm],
    )
    gen = session.prefill(session.prepare(request))
    session.step(gen)  # the prompt's last token, then the first sample: not a decode step
    steps, spent = 0, 0.0
    while gen.finish_reason is None and steps < tokens:
        t0 = time.perf_counter()
        out = session.step(gen)
        spent += time.perf_counter() - t0
        steps += 1
        if out is None:
            break
    session.close(gen)
    return steps, spent


def run(model: str, rounds: int, tokens: int) -> dict[str, Any]:
    path = resolve_model(model)
    session = LlamaSession(path, n_ctx=2048, settings=DEFAULT_SETTINGS.resolved(), extra={})
    session.warm_up()
    per: dict[str, list[float]] = {arm: [] for arm in ARMS}
    counts: dict[str, list[int]] = {arm: [] for arm in ARMS}
    for _ in range(rounds):
        for arm in ARMS:  # interleaved: each round runs every arm once
            steps, spent = decode(session, arm, tokens)
            per[arm].append(1000 * spent / max(steps, 1))
            counts[arm].append(steps)
    session.unload()
    ms = {arm: statistics.median(v) for arm, v in per.items()}
    return {
        "cpu": cpu_model(),
        "model": model,
        "rounds": rounds,
        "tokens": tokens,
        "ms_per_token": ms,
        "ratio_to_plain": {arm: ms[arm] / ms["plain"] for arm in ARMS},
        "steps": counts,
        "samples_ms": per,
    }


def render(res: dict[str, Any]) -> str:
    lines = [
        f"grammar cost per token: {res['model']}, {res['rounds']} rounds, <= {res['tokens']} "
        f"steps per answer, CPU {res['cpu']}",
        f"{'arm':<12} {'ms/token':>9} {'x plain':>8}  steps",
    ]
    for arm, ms in res["ms_per_token"].items():
        ratio = res["ratio_to_plain"][arm]
        lines.append(f"{arm:<12} {ms:>9.1f} {ratio:>8.2f}  {res['steps'][arm]}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="qwen2.5-coder-0.5b-instruct")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    report(run(args.model, args.rounds, args.tokens), render, args.json)


if __name__ == "__main__":
    main()
