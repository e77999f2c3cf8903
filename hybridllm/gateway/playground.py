"""The playground: one self-contained page (``playground.html``, package data) that the gateway
serves at ``GET /``: pick a policy, type a message, watch the tokens stream, each coloured by the
engine that wrote it, and the decision (TTFT, engine, plan, policy, route reason, cost) under the
answer. docs/gateway.md describes it.

The page is static and holds no secret, so the door lets ``GET /`` through without the key; the
page asks for the key (kept in its memory) when the gateway has one, and sends it on its own
requests, which are same-origin (no CORS needed). Its inline script and style are allowed by
their SHA-256 hashes in a Content-Security-Policy that allows nothing else: no other script, no
other origin to connect to, no frame around it.
"""

from __future__ import annotations

import base64
import hashlib
import re
from dataclasses import dataclass
from importlib import resources

__all__ = ["PAGE_PATH", "Page", "page"]

PAGE_PATH = "/"
_FILE = "playground.html"
_KEY_NONE = 'data-key="none"'  # the page's root element: "required" shows its key field
_KEY_REQUIRED = 'data-key="required"'


@dataclass(frozen=True, slots=True)
class Page:
    """The page as served: its bytes and its response headers."""

    body: bytes
    headers: dict[str, str]


def _hashes(html: str, tag: str) -> str:
    """The CSP sources of the page's inline `tag` elements: ``'sha256-...'`` of each one's text."""
    blocks = re.findall(rf"<{tag}>(.*?)</{tag}>", html, flags=re.DOTALL)
    if not blocks:
        raise RuntimeError(f"{_FILE} has no inline <{tag}>")
    digests = (base64.b64encode(hashlib.sha256(b.encode()).digest()).decode() for b in blocks)
    return " ".join(f"'sha256-{d}'" for d in digests)


def content_security_policy(html: str) -> str:
    """Only the page's own inline script and style, fetches to its own origin, no frames."""
    return "; ".join(
        (
            "default-src 'none'",
            f"script-src {_hashes(html, 'script')}",
            f"style-src {_hashes(html, 'style')}",
            "connect-src 'self'",
            "img-src data:",
            "base-uri 'none'",
            "form-action 'none'",
            "frame-ancestors 'none'",
        )
    )


def page(key_required: bool) -> Page:
    """The playground page for a gateway with (`key_required`) or without an API key."""
    html = resources.files("hybridllm.gateway").joinpath(_FILE).read_text(encoding="utf-8")
    if html.count(_KEY_NONE) != 1:
        raise RuntimeError(f"{_FILE} must carry {_KEY_NONE} once, on its root element")
    if key_required:
        html = html.replace(_KEY_NONE, _KEY_REQUIRED)
    headers = {
        "content-security-policy": content_security_policy(html),
        "x-content-type-options": "nosniff",
        "x-frame-options": "DENY",
        "referrer-policy": "no-referrer",
        "cache-control": "no-cache",
    }
    return Page(html.encode(), headers)
