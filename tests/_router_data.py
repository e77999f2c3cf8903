"""A small synthetic labels file for router tests (same format as scripts/label_router_data.py).

Three kinds of prompt with a learnable pattern: arithmetic (local mostly wrong, cloud mostly
right), yes/no questions (both mostly right) and trivia (both mostly wrong), with 10% noise.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

WORDS = ["river", "planet", "castle", "violin", "engine", "garden", "harbor", "desert"]


def row(source: str, i: int, prompt: str, local: bool, cloud: bool) -> dict[str, object]:
    def side(ok: bool) -> dict[str, object]:
        return {"correct": ok, "response": "x", "prompt_tokens": len(prompt) // 4,
                "completion_tokens": 1, "ttft_ms": 1.0, "tpot_ms": 0.0}  # fmt: skip

    return {"source": source, "id": str(i), "kind": "short", "prompt": prompt, "answer": "x",
            "local": side(local), "cloud": side(cloud)}  # fmt: skip


def write_fixture(path: Path, n: int = 240, seed: int = 0) -> Path:
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        kind = i % 3
        noise = rng.random() < 0.1
        w = rng.choice(WORDS)
        if kind == 0:
            a, b = rng.randint(100, 999), rng.randint(10, 99)
            prompt = f"Calculate {a} * {b}? Answer with the number only."
            local, cloud = noise, not noise
            rows.append(row("arith", i, prompt, local, cloud))
        elif kind == 1:
            prompt = f"Is a {w} bigger than a {rng.choice(WORDS)}? Answer yes or no."
            rows.append(row("yesno", i, prompt, not noise, True))
        else:
            prompt = f"Who wrote the famous {w} song of {rng.randint(1900, 2000)}?"
            rows.append(row("trivia", i, prompt, False, noise))
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path
