"""Policies: per-scenario settings as validated, frozen data.

A policy is a TOML file in `policies/` (the presets) or anywhere the user points to. This is the
foundation's subset (preference and sampling defaults, the first-token deadline as data); the
routing and budget issues extend the schema. Errors name the file and the field.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from hybridllm.errors import PolicyError


class Policy(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = "default"
    description: str = ""
    prefer: Literal["local", "cloud", "auto"] = "auto"
    allow_cloud: bool = True
    ttft_deadline_ms: float | None = Field(default=None, gt=0)
    # start the backup this long after the call even before the deadline; "auto": at the
    # primary's observed p95 TTFT (once a few requests have been seen)
    hedge_after_ms: float | Literal["auto"] | None = None
    # a serving engine silent for longer than this mid-answer counts as failed (failover)
    stall_ms: float | None = Field(default=None, gt=0)
    # retries of retryable failures before the first token (never past the deadline)
    retries: int = Field(default=2, ge=0, le=10)
    max_tokens: int = Field(default=256, ge=1)
    temperature: float = Field(default=0.7, ge=0.0, le=2.0)
    top_p: float = Field(default=0.95, gt=0.0, le=1.0)
    stop: tuple[str, ...] = ()


DEFAULT_POLICY = Policy()


def policies_dir() -> Path:
    here = Path(__file__).resolve().parent
    source = here.parent / "policies"
    return source if source.is_dir() else here / "_data" / "policies"


def known_policies(directory: Path | None = None) -> list[str]:
    d = directory or policies_dir()
    return sorted(p.stem for p in d.glob("*.toml")) if d.is_dir() else []


def load_policy_file(path: Path) -> Policy:
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise PolicyError("policy file not found", path=path) from None
    except tomllib.TOMLDecodeError as exc:
        raise PolicyError(f"not valid TOML: {exc}", path=path) from exc
    data.setdefault("name", path.stem)
    try:
        return Policy.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        field = ".".join(str(x) for x in err["loc"]) or None
        raise PolicyError(err["msg"], path=path, field=field) from exc


def resolve_policy(policy: str | Path | Policy | None) -> Policy:
    """A Policy object, a preset name, or a path to a TOML file."""
    if policy is None:
        return DEFAULT_POLICY
    if isinstance(policy, Policy):
        return policy
    path = Path(policy)
    if path.suffix == ".toml" or path.exists():
        return load_policy_file(path)
    preset = policies_dir() / f"{policy}.toml"
    if not preset.is_file():
        known = ", ".join(known_policies()) or "(none)"
        raise PolicyError(f"unknown policy {str(policy)!r}; known policies: {known}")
    return load_policy_file(preset)
