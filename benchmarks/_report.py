"""What the benchmarks that print a table and keep their figures share."""

from __future__ import annotations

import json
import platform
from collections.abc import Callable
from pathlib import Path
from typing import Any


def cpu_model() -> str:
    """The CPU's model name (Linux /proc/cpuinfo), to print beside every figure."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def report(res: Any, render: Callable[[Any], str], json_path: str | None) -> None:
    """Print the rendered table; with a path, write every figure there as JSON too."""
    print(render(res))
    if json_path:
        with open(json_path, "w") as fh:
            json.dump(res, fh, indent=1, default=str)
