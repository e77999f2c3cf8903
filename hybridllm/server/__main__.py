"""`python -m hybridllm.server MODEL --port N`: the same as `hybridllm serve`."""

from __future__ import annotations

import argparse
import sys

from hybridllm.server.command import add_arguments, run


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m hybridllm.server")
    add_arguments(parser)
    return run(parser.parse_args())


if __name__ == "__main__":
    sys.exit(main())
