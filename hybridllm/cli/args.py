"""argparse types for the commands' options, built on the API's own checks
(`hybridllm.engines.validate`): a bad value is a usage error (exit code 2) that names the rule,
before any work."""

from __future__ import annotations

import argparse
from pathlib import Path

from hybridllm.engines import validate
from hybridllm.errors import InvalidArgumentError


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an int, not {text!r}") from None


def positive_int(text: str) -> int:
    """An int >= 1 (threads, context sizes, token counts)."""
    try:
        return validate.integer("value", _int(text), minimum=1)
    except InvalidArgumentError as exc:
        raise argparse.ArgumentTypeError(f"must be {exc.rule}, not {text}") from None


def non_negative_int(text: str) -> int:
    """An int >= 0 (seeds)."""
    try:
        return validate.integer("value", _int(text), minimum=0)
    except InvalidArgumentError as exc:
        raise argparse.ArgumentTypeError(f"must be {exc.rule}, not {text}") from None


def existing_dir(text: str) -> Path:
    """A directory that exists (a missing one is an error, not silently skipped)."""
    try:
        return validate.directory("value", text)
    except InvalidArgumentError as exc:
        raise argparse.ArgumentTypeError(f"must be {exc.rule}, not {text!r}") from None


def prompt(text: str) -> str:
    """Prompt text with something in it besides whitespace."""
    if not text.strip():
        raise argparse.ArgumentTypeError("must hold some non-blank text")
    return text


def engine_name(text: str) -> str:
    """An engine's name as a policy names it (a letter, then letters, digits, _ . -)."""
    try:
        return validate.engine_name("value", text)
    except InvalidArgumentError as exc:
        raise argparse.ArgumentTypeError(f"must be {exc.rule}, not {text!r}") from None
