"""matplotlib for the commands that draw (`hybridllm bench --plots`, `hybridllm stats --plot`):
loaded only when a plot is asked for, on the Agg backend (no display needed), and a typed
error naming the extra (`hybridllm[bench]`) where it is not installed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hybridllm.errors import MissingExtraError

EXTRA = "bench"


def pyplot(feature: str) -> Any:
    """`matplotlib.pyplot` on the Agg backend; `MissingExtraError` without matplotlib."""
    try:
        import matplotlib
    except ImportError:
        raise MissingExtraError(feature, EXTRA, "matplotlib") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save(fig: Any, path: Path, caption: str) -> Path:
    """Write `fig` as a PNG at `path` with `caption` (the machine, models, build, date) along
    its foot, and close it."""
    fig.text(0.01, 0.005, caption, fontsize=7, color="#444444", ha="left", va="bottom", wrap=True)
    fig.tight_layout(rect=(0.0, 0.06, 1.0, 1.0))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100, format="png")
    pyplot("a plot").close(fig)
    return path
