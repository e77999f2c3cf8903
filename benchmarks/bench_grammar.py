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
Each grammar arm runs twice: "checked" (the engine's way, `grammar.CheckedGrammar`: the tokens
the sampler can keep are checked first, the whole vocabulary only when none passes) and "whole"
(llama.cpp's grammar sampler over the whole vocabulary at every step, as before issue 45); the
table says whether the two wrote the same tokens (greedy: they must).
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


GRAMMAR_ARMS = ("json_schema", "json_object", "tool call")
RUNS = [
    (arm, check)
    for arm in ARMS
    for check in (("checked", "whole") if arm in GRAMMAR_ARMS else ("checked",))
]


def label(arm: str, check: str) -> str:
    return f"{arm} ({check})" if arm in GRAMMAR_ARMS else arm


def decode(
    session: LlamaSession, arm: str, check: str, tokens: int
) -> tuple[int, float, list[int]]:
    """Decode one answer; return (timed steps, seconds they took, the tokens written)."""
    session.grammar_check = check
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
    written = list(gen.tokens_out)
    session.close(gen)
    return steps, spent, written


def run(model: str, rounds: int, tokens: int) -> dict[str, Any]:
    path = resolve_model(model)
    session = LlamaSession(path, n_ctx=2048, settings=DEFAULT_SETTINGS.resolved(), extra={})
    session.warm_up()
    names = [label(arm, check) for arm, check in RUNS]
    per: dict[str, list[float]] = {name: [] for name in names}
    counts: dict[str, list[int]] = {name: [] for name in names}
    texts: dict[str, list[int]] = {}
    for _ in range(rounds):
        for (arm, check), name in zip(RUNS, names, strict=True):  # interleaved: every arm a round
            steps, spent, written = decode(session, arm, check, tokens)
            per[name].append(1000 * spent / max(steps, 1))
            counts[name].append(steps)
            texts[name] = written
    session.unload()
    ms = {name: statistics.median(v) for name, v in per.items()}
    same = {
        label(arm, "checked"): texts[label(arm, "checked")] == texts[label(arm, "whole")]
        for arm in GRAMMAR_ARMS
    }
    return {
        "cpu": cpu_model(),
        "model": model,
        "rounds": rounds,
        "tokens": tokens,
        "ms_per_token": ms,
        "ratio_to_plain": {name: ms[name] / ms["plain"] for name in names},
        "same_as_whole": same,
        "steps": counts,
        "samples_ms": per,
    }


def render(res: dict[str, Any]) -> str:
    lines = [
        f"grammar cost per token: {res['model']}, {res['rounds']} rounds, <= {res['tokens']} "
        f"steps per answer, CPU {res['cpu']}",
        f"{'arm':<24} {'ms/token':>9} {'x plain':>8}  same tokens as whole  steps",
    ]
    for arm, ms in res["ms_per_token"].items():
        ratio = res["ratio_to_plain"][arm]
        same = {True: "yes", False: "NO"}.get(res.get("same_as_whole", {}).get(arm), "")
        lines.append(f"{arm:<24} {ms:>9.1f} {ratio:>8.2f}  {same:<20}  {res['steps'][arm]}")
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
