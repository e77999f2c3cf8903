"""Prices per cloud model (USD per million input and output tokens), loadable from TOML."""

from __future__ import annotations

import math
import tomllib
from decimal import Decimal
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from hybridllm.errors import ConfigError

NANO = 1_000_000_000  # ledger units per USD


class ModelPrice(BaseModel):
    """USD per million tokens."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    input_per_million: float = Field(ge=0)
    output_per_million: float = Field(ge=0)

    def cost_nano(self, prompt_tokens: int, completion_tokens: int) -> int:
        """Exact cost in nano-dollars, rounded up."""
        per_in = Decimal(str(self.input_per_million)) * 1000  # nano-dollars per token
        per_out = Decimal(str(self.output_per_million)) * 1000
        return math.ceil(per_in * prompt_tokens + per_out * completion_tokens)

    def cost_usd(self, prompt_tokens: int, completion_tokens: int) -> float:
        return self.cost_nano(prompt_tokens, completion_tokens) / NANO


class Prices(BaseModel):
    """Prices per cloud model; `default` prices a model that is not listed (else an error).

    TOML form::

        [models."gpt-4o-mini"]
        input_per_million = 0.15
        output_per_million = 0.60
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    models: dict[str, ModelPrice] = Field(default_factory=dict)
    default: ModelPrice | None = None

    def price(self, model: str) -> ModelPrice:
        found = self.models.get(model, self.default)
        if found is None:
            known = ", ".join(sorted(self.models)) or "(none)"
            raise ConfigError(f"no price for model {model!r}; priced models: {known}")
        return found

    @classmethod
    def from_toml(cls, path: str | Path) -> Prices:
        p = Path(path)
        try:
            data = tomllib.loads(p.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ConfigError(f"{p}: prices file not found") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{p}: not valid TOML: {exc}") from exc
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            err = exc.errors()[0]
            field = ".".join(str(x) for x in err["loc"])
            raise ConfigError(f"{p}: {field}: {err['msg']}") from exc
