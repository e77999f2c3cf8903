"""`python -m hybridllm.server MODEL --port N`: the same as `hybridllm serve-model`."""

from __future__ import annotations

import argparse
import sys

from hybridllm.errors import HybridError
from hybridllm.server.command import add_arguments, run


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m hybridllm.server")
    add_arguments(parser)
    args = parser.parse_args()
    try:
        return run(args)
    except HybridError as exc:  # a bad argument: one line, as `hybridllm serve-model` says it
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
