"""The playground page's serving, without a browser or a model (a `ScriptedEngine` double): served
at ``GET /`` only, without the key (the page holds no secret; every API route still needs it),
its key field marked when the gateway has a key, a Content-Security-Policy whose hashes are the
page's own inline script and style, and a page that is one self-contained file (no external
fetch, no HTML insertion). The page in a real browser: tests/integration/test_playground.py."""

from __future__ import annotations

import base64
import hashlib
import re
from collections.abc import AsyncIterator

import httpx
import pytest

from hybridllm import HybridClient
from hybridllm.gateway.app import create_app
from hybridllm.gateway.command import Settings, describe
from hybridllm.gateway.limits import GatewayLimits
from hybridllm.gateway.playground import page
from hybridllm.testing import ScriptedEngine

pytestmark = pytest.mark.anyio

KEY = "sk-page"


async def http(api_key: str | None) -> AsyncIterator[httpx.AsyncClient]:
    hybrid = HybridClient(local=ScriptedEngine("local", tokens=["x"]), router=None)
    app = create_app(hybrid, api_key=api_key)
    async with hybrid:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
            yield client


def sha256_source(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"


async def test_the_page_is_served_at_the_root_only_and_without_the_key() -> None:
    async for client in http(KEY):
        root = await client.get("/")
        head = await client.head("/")
        elsewhere = await client.get("/playground.html")
        models = await client.get("/v1/models")
        posted = await client.post("/", content=b"{}")
    assert root.status_code == 200 and root.headers["content-type"].startswith("text/html")
    assert head.status_code == 200 and head.content == b""
    assert 'data-key="required"' in root.text
    assert elsewhere.status_code == 401 and models.status_code == 401  # the door, as before
    assert posted.status_code == 401  # only GET and HEAD of / pass the door without the key
    async for client in http(None):
        open_root = await client.get("/")
        missing = await client.get("/playground.html")
    assert 'data-key="none"' in open_root.text and missing.status_code == 404


async def test_the_csp_allows_the_pages_own_script_and_style_and_nothing_else() -> None:
    async for client in http(None):
        r = await client.get("/")
    csp = dict(d.split(" ", 1) for d in r.headers["content-security-policy"].split("; "))
    (script,) = re.findall(r"<script>(.*?)</script>", r.text, flags=re.DOTALL)
    (style,) = re.findall(r"<style>(.*?)</style>", r.text, flags=re.DOTALL)
    assert csp["script-src"] == sha256_source(script)
    assert csp["style-src"] == sha256_source(style)
    assert csp["default-src"] == "'none'" and csp["connect-src"] == "'self'"
    assert csp["frame-ancestors"] == "'none'" and csp["form-action"] == "'none'"
    assert r.headers["x-content-type-options"] == "nosniff"
    assert r.headers["x-frame-options"] == "DENY"


def test_the_page_is_one_file_that_inserts_text_only() -> None:
    html = page(key_required=False).body.decode()
    assert "innerHTML" not in html and "outerHTML" not in html and "insertAdjacentHTML" not in html
    assert "document.write" not in html and "eval(" not in html
    assert not re.search(r"(src|href)=\"(https?:)?//", html)  # nothing loaded from elsewhere
    assert "http://" not in html and "https://" not in html
    assert "localStorage" not in html and "sessionStorage" not in html  # the key: memory only
    assert html.count("<script>") == 1 and "<script src" not in html
    assert 'fetch("/v1/chat/completions"' in html and 'fetch("/v1/models"' in html


def test_the_start_lines_name_the_playground() -> None:
    settings = Settings(
        "127.0.0.1",
        8080,
        "m",
        None,
        None,
        False,
        None,
        None,
        None,
        None,
        GatewayLimits(),
        None,
        "info",
    )
    hybrid = HybridClient(local=ScriptedEngine("local", tokens=["x"]), router=None)
    lines = describe(settings, hybrid).splitlines()
    assert lines[:2] == [
        "hybridllm gateway on http://127.0.0.1:8080/v1",
        "  playground: http://127.0.0.1:8080/ (open it in a browser)",
    ]
