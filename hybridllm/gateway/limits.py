"""What one gateway lets a request be and do: its limits and who may call it."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from hybridllm import errors

__all__ = ["GatewayLimits", "is_loopback"]


@dataclass(frozen=True, slots=True)
class GatewayLimits:
    """The gateway's bounds, each checked (>= 1) when made. `max_body_bytes`: a larger request
    body is a 413; `max_messages`: more messages is a 400 (param "messages"); `max_tokens`: a
    larger `max_tokens` / `max_completion_tokens` is a 400 naming it; `max_concurrency`: chat
    requests served at once, the next one is a 429 with Retry-After; `cors_origins`: the
    origins a browser may call from (none: no CORS headers at all)."""

    max_body_bytes: int = 1_000_000
    max_messages: int = 256
    max_tokens: int = 4096
    max_concurrency: int = 8
    cors_origins: tuple[str, ...] = ()
    retry_after_s: int = 1

    def __post_init__(self) -> None:
        for name in ("max_body_bytes", "max_messages", "max_tokens", "max_concurrency"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise errors.InvalidArgumentError(name, value, "an integer >= 1")
        for origin in self.cors_origins:
            if origin != "*" and not origin.startswith(("http://", "https://")):
                raise errors.InvalidArgumentError(
                    "cors_origins", origin, "an origin such as https://app.example.com, or *"
                )


def is_loopback(host: str) -> bool:
    """Does `host` (an address or a name) bind only this machine's loopback?"""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
