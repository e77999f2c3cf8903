"""What importing hybridllm costs: `import hybridllm`, the first public name, `hybridllm --help`.

    .venv/bin/python benchmarks/bench_import.py [--repo DIR] [--runs N]

Each figure is the best of N fresh interpreters (process wall time, so interpreter start is in
it; a bare `python -c pass` is printed as the floor), run from a neutral directory with
PYTHONPATH=DIR, so DIR can be another checkout (e.g. `git worktree add /tmp/before <rev>`) and
both are measured with this interpreter and its packages. Also prints which heavy packages each
step loads and `-X importtime`'s own cumulative figure for `import hybridllm`.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HEAVY = ("numpy", "openai", "llama_cpp", "sklearn", "pydantic", "anyio", "rich")
STEPS = {
    "python -c pass (floor)": "pass",
    "import hybridllm": "import hybridllm",
    "from hybridllm import HybridClient": "from hybridllm import HybridClient",
}


def _run(repo: Path, args: list[str], cwd: str) -> tuple[float, str]:
    env = {**os.environ, "PYTHONPATH": str(repo)}
    t0 = time.perf_counter()
    out = subprocess.run(args, env=env, cwd=cwd, capture_output=True, text=True, check=True)
    return time.perf_counter() - t0, out.stdout + out.stderr


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repo", type=Path, default=Path(__file__).resolve().parents[1])
    ap.add_argument("--runs", type=int, default=7)
    args = ap.parse_args()
    repo = args.repo.resolve()
    cli = "hybridllm.cli.main" if (repo / "hybridllm/cli/main.py").exists() else "hybridllm.cli"
    with tempfile.TemporaryDirectory() as cwd:
        print(f"{repo} ({sys.executable})")
        for name, code in STEPS.items():
            probe = f"{code}; import sys; print(sorted(m for m in {HEAVY!r} if m in sys.modules))"
            runs = [_run(repo, [sys.executable, "-c", probe], cwd) for _ in range(args.runs)]
            best, out = min(runs)
            print(f"  {name:<36} {best * 1e3:7.0f} ms   loads {out.strip()}")
        runs = [_run(repo, [sys.executable, "-m", cli, "--help"], cwd) for _ in range(args.runs)]
        print(f"  {'hybridllm --help':<36} {min(runs)[0] * 1e3:7.0f} ms")
        cumulative = []
        for _ in range(args.runs):
            argv = [sys.executable, "-X", "importtime", "-c", "import hybridllm"]
            _, text = _run(repo, argv, cwd)
            rows = [line for line in text.splitlines() if line.rstrip().endswith("| hybridllm")]
            cumulative.append(int(rows[-1].split("|")[1]) / 1e3)
        print(f"  {'-X importtime: hybridllm cumulative':<36} {min(cumulative):7.0f} ms")


if __name__ == "__main__":
    main()
