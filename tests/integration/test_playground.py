"""The gateway's playground page (`GET /`) in a real headless browser: Debian's chromium driven by
Playwright, against the gateway over the real local engine (Qwen2.5-Coder 0.5B through
llama-cpp-python) and the stand-in cloud (`hybridllm serve-model`, SmolLM2) on loopback.

The page's answer is checked against the SSE body the browser received (the same bytes, not a
second generation): each token a span coloured by the engine its chunk names, runs matching the
finish chunk's spans, the decision shown under it. Also: the conversation's turns are sent
again, user text stays text (no HTML), a wrong key shows the gateway's error, Stop aborts the
fetch and the local engine stops decoding. Without chromium or Playwright the tests skip, except
in CI (``HYBRIDLLM_CI``, set by .ci/run, which installs chromium), where they fail."""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import pytest

from hybridllm import HybridClient, LlamaCppEngine, OpenAIEngine
from hybridllm.gateway.limits import GatewayLimits
from hybridllm.testing import HybridServer
from tests.integration.gateway_fixture import InProcessGateway, local_engine, write_policies
from tests.integration.servers import ALIAS, API_KEY

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Page, Response

pytestmark = pytest.mark.integration

KEY = "sk-playground-test"
LONG = 300  # the Stop test's max_tokens: far more than it waits for
LONG_POLICY = (
    f'[sampling]\ntemperature = 0.0\nmax_tokens = {LONG}\n[routing]\nprefer = "local"\n'
    'allow_cloud = false\nfallback_order = ["local"]\n'
)
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
ANSWER_S = 180.0  # a bound on waiting for an answer on 2 shared cores, not a timed assertion
XSS = '<img src=x onerror="window.pwned = 1"><b>bold?</b> Say hello in five words.'


def missing(what: str) -> NoReturn:
    """Skip without `what`, except in CI where it must be there (.ci/run installs it)."""
    if os.environ.get("CI") or os.environ.get("HYBRIDLLM_CI"):
        pytest.fail(f"{what} is missing (.ci/run and ./dev install it)")
    pytest.skip(f"{what} is missing")


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        missing("playwright (pip install 'hybridllm[browser]')")
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        missing("chromium (apt-get install chromium)")
    with sync_playwright() as pw:
        found = pw.chromium.launch(executable_path=chromium, headless=True, args=CHROMIUM_ARGS)
        yield found
        found.close()


@pytest.fixture(scope="module")
def local() -> LlamaCppEngine:
    return local_engine()


@pytest.fixture(scope="module")
def gateway(
    tmp_path_factory: pytest.TempPathFactory, local: LlamaCppEngine, cloud_server: HybridServer
) -> Iterator[InProcessGateway]:
    url = f"http://127.0.0.1:{cloud_server.port}/v1"
    cloud = OpenAIEngine(base_url=url, api_key=API_KEY, model=ALIAS)
    policies = write_policies(tmp_path_factory.mktemp("playground-policies"))
    (policies / "pg-long.toml").write_text(LONG_POLICY)
    client = HybridClient(local=local, cloud=cloud, router=None, policy_dirs=[policies])
    with InProcessGateway(client, GatewayLimits(max_concurrency=2), api_key=KEY) as gw:
        yield gw


@pytest.fixture
def page(browser: Browser, gateway: InProcessGateway) -> Iterator[Page]:
    """The playground, opened and given the key (its policies loaded)."""
    context = browser.new_context(viewport={"width": 1100, "height": 900})
    opened = context.new_page()
    opened.goto(f"http://127.0.0.1:{gateway.port}/")
    use_key(opened, KEY)
    opened.wait_for_selector("#policy option[value='hybridllm/gw-local']", state="attached")
    yield opened
    context.close()


def use_key(page: Page, key: str) -> None:
    page.wait_for_selector("#key-form", state="visible")  # the gateway has a key: the page asks
    page.fill("#key", key)
    page.click("#use-key")


def ask(page: Page, policy: str, text: str) -> Response:
    """Pick `policy`, type `text`, send; the chat response (its body: once the answer ends)."""
    page.select_option("#policy", f"hybridllm/{policy}")
    page.fill("#message", text)
    with page.expect_response(lambda r: r.url.endswith("/v1/chat/completions")) as info:
        page.click("#send")
    return info.value


def wait_answered(page: Page) -> str:
    """Wait until the last answer leaves "streaming"; its state."""
    answer = page.locator(".turn.assistant .answer").last
    page.wait_for_function(
        "el => el.dataset.state !== 'streaming'",
        arg=answer.element_handle(),
        timeout=ANSWER_S * 1e3,
    )
    return answer.get_attribute("data-state") or ""


def sse_chunks(body: str) -> list[dict[str, Any]]:
    data = [ln[len("data: ") :] for ln in body.splitlines() if ln.startswith("data: ")]
    assert data[-1] == "[DONE]"
    return [json.loads(d) for d in data[:-1]]


def runs(tokens: list[list[str]]) -> list[dict[str, Any]]:
    """The page's token spans as runs of one engine over characters (the finish chunk's shape)."""
    out: list[dict[str, Any]] = []
    at = 0
    for engine, text in tokens:
        if out and out[-1]["engine"] == engine:
            out[-1]["end"] += len(text)
        else:
            out.append({"engine": engine, "start": at, "end": at + len(text)})
        at += len(text)
    return out


def check_answer(page: Page, response: Response, engine: str, policy: str) -> str:
    """The last answer in the page is the SSE the browser received, coloured and explained;
    its text."""
    assert wait_answered(page) == "done"
    chunks = sse_chunks(response.text())
    content = [c for c in chunks if c["choices"] and c["choices"][0]["delta"].get("content")]
    delivered = [[c["hybridllm"]["engine"], c["choices"][0]["delta"]["content"]] for c in content]
    (finish,) = [c for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
    found = finish["hybridllm"]
    turn = page.locator(".turn.assistant").last
    shown = turn.locator(".answer .tok").evaluate_all(
        "els => els.map(e => [e.dataset.engine, e.className, e.textContent])"
    )
    assert delivered and [[e, t] for e, _, t in shown] == delivered  # token by token
    assert all(cls == f"tok {e}" for e, cls, _ in shown)  # the class that colours it
    assert runs([[e, t] for e, _, t in shown]) == found["spans"]
    assert {e for e, _ in delivered} == {engine} and found["engine"] == engine
    text = "".join(t for _, t in delivered)
    assert turn.locator(".answer").text_content() == text
    field = {
        f: turn.locator(f".decision dd[data-field='{f}']").text_content()
        for f in ("ttft_ms", "engine", "plan", "policy", "reason", "cost_usd")
    }
    assert float((field["ttft_ms"] or "").removesuffix(" ms")) == found["ttft_ms"] > 0
    assert field["engine"] == engine and field["policy"] == policy == found["policy"]
    assert field["plan"] == found["plan"] and field["reason"] == found["reason"] and found["reason"]
    assert field["cost_usd"] == "nothing settled" and found["cost_usd"] is None  # no prices set
    return text


def test_a_conversation_streams_coloured_tokens_and_the_decision(
    page: Page, tmp_path: Path
) -> None:
    first = ask(page, "gw-local", XSS)
    local_text = check_answer(page, first, "local", "gw-local")
    user = page.locator(".turn.user .text").first
    assert user.text_content() == XSS  # shown as text
    assert page.locator("#log img, #log b").count() == 0
    assert page.evaluate("window.pwned") is None
    second = ask(page, "gw-cloud", "And now in French?")
    check_answer(page, second, "cloud", "gw-cloud")
    sent = second.request.post_data_json
    assert sent is not None
    assert sent["model"] == "hybridllm/gw-cloud" and sent["stream"] is True
    assert sent["messages"] == [
        {"role": "user", "content": XSS},
        {"role": "assistant", "content": local_text},
        {"role": "user", "content": "And now in French?"},
    ]
    assert page.locator(".legend .local").is_visible() and page.locator(".legend .cloud").count()
    shot = tmp_path / "playground.png"
    page.screenshot(path=str(shot), full_page=True)
    assert shot.stat().st_size > 10_000  # a picture of the page, not an empty canvas


def test_a_wrong_key_shows_the_gateways_error(page: Page) -> None:
    use_key(page, "sk-wrong")  # the policies stay listed from the right key
    page.wait_for_function("() => document.getElementById('status').textContent.startsWith('401')")
    assert "invalid_api_key" in (page.text_content("#status") or "")
    ask(page, "gw-local", "Say hello.")
    assert wait_answered(page) == "error"
    error = page.locator(".turn.assistant .error").last.text_content() or ""
    assert error.startswith("401 invalid_api_key: ") and "API key" in error
    assert page.locator(".turn.user").last.get_attribute("class") == "turn user unsent"
    assert page.locator(".turn.assistant .tok").count() == 0


def test_stop_aborts_the_fetch_and_the_local_engine_stops(
    page: Page, local: LlamaCppEngine
) -> None:
    steps = local.steps_total
    ask(page, "pg-long", "Count from 1 to 300, separated by commas.")
    page.wait_for_selector(".turn.assistant .tok", timeout=ANSWER_S * 1e3)
    page.click("#stop")
    assert wait_answered(page) == "stopped"
    deadline = time.monotonic() + 30.0  # a bound on the wait, not a timed assertion
    while local.busy:
        assert time.monotonic() < deadline, "the local engine did not let go"
        time.sleep(0.01)
    assert local.steps_total - steps < LONG  # stopped, not decoded to max_tokens
    assert page.is_enabled("#send") and not page.is_enabled("#stop")
    assert re.fullmatch(r"stopped: .*", page.text_content(".turn.assistant .stopped") or "")
