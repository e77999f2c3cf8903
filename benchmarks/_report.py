"""What the benchmarks that print a table and keep their figures share."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any


def report(res: Any, render: Callable[[Any], str], json_path: str | None) -> None:
    """Print the rendered table; with a path, write every figure there as JSON too."""
    print(render(res))
    if json_path:
        with open(json_path, "w") as fh:
            json.dump(res, fh, indent=1, default=str)
