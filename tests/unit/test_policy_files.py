"""Policy files: the extended schema, `extends`, the search path, and every kind of mistake."""

from __future__ import annotations

from pathlib import Path

import pytest

from hybridllm import Policy
from hybridllm.errors import PolicyError
from hybridllm.policy import ENV_PATH, known_policies, resolve_policy


def write(d: Path, name: str, body: str) -> Path:
    path = d / f"{name}.toml"
    path.write_text(body)
    return path


def test_presets_carry_their_latency_budgets() -> None:
    chat = resolve_policy("chat")
    assert chat.routing.ttft_deadline_ms == 500 and chat.routing.tpot_target_ms == 50
    assert resolve_policy("translation").routing.ttft_deadline_ms == 500
    voice = resolve_policy("voice-assistant").routing
    assert voice.tpot_target_ms is not None and voice.tpot_target_ms > 50
    batch = resolve_policy("batch")
    assert batch.routing.ttft_deadline_ms is None and batch.plans == ("single",)
    private = resolve_policy("private")
    assert not private.cloud_allowed and private.privacy.mode == "keep-local"
    assert private.order == ("local",)


def test_a_user_file_extends_a_preset_and_merges_tables(tmp_path: Path) -> None:
    body = '[routing]\nprefer = "cloud"\nretries = 3\n'
    body += "[budget]\nper_day_usd = 1.0\nper_month_usd = 9.0\n"
    write(tmp_path, "base", body)
    path = write(
        tmp_path,
        "mine",
        'extends = "base"\n[sampling]\nmax_tokens = 32\n[routing]\nretries = 1\n'
        "[budget]\nper_day_usd = 0.5\n",
    )
    pol = resolve_policy(path)
    assert pol.name == "mine" and pol.routing.prefer == "cloud" and pol.sampling.max_tokens == 32
    assert pol.budget.per_day_usd == 0.5 and pol.budget.per_month_usd == 9.0
    assert pol.routing.retries == 1


def test_policy_dirs_and_env_path_come_before_the_presets(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mine, env = tmp_path / "mine", tmp_path / "env"
    mine.mkdir()
    env.mkdir()
    # a user "chat" that extends the preset "chat" it shadows
    write(mine, "chat", 'extends = "chat"\n[routing]\nttft_deadline_ms = 250\n')
    write(env, "night", 'extends = "batch"\ndescription = "overnight"\n')
    monkeypatch.setenv(ENV_PATH, str(env))
    chat = resolve_policy("chat", dirs=[mine])
    assert chat.routing.ttft_deadline_ms == 250 and chat.routing.tpot_target_ms == 50
    assert resolve_policy("night").routing.prefer == "cloud"
    assert {"chat", "night", "batch"} <= set(known_policies(dirs=[mine]))


MISTAKES = [
    # (body, field, words in the message)
    ('[routing]\nprefer = "9-gpu"', "routing.prefer", ["local", "9-gpu"]),
    ("[sampling]\nmax_tokens = 0", "sampling.max_tokens", ["greater than or equal to 1"]),
    ('[sampling]\ntemperature = "hot"', "sampling.temperature", ["number", "hot"]),
    ("[routing]\nrouter_threshold = 1.5", "routing.router_threshold", ["less than or equal to 1"]),
    ("colour = 3", "colour", ["unknown field", "routing"]),
    ("[routing]\ncolour = 3", "routing.colour", ["unknown field", "ttft_deadline_ms"]),
    ("[hedge]\nafter = 3", "hedge.after", ["unknown field", "after_ms"]),
    ("[budget]\nper_dya_usd = 1.0", "budget.per_dya_usd", ["unknown field", "per_day_usd"]),
    ("[budget]\nper_day_usd = -1", "budget.per_day_usd", ["greater than or equal to 0"]),
    ('[budget]\non_exceeded = "panic"', "budget.on_exceeded", ["local", "fail"]),
    ('[privacy]\nmode = "maybe"', "privacy.mode", ["keep-local"]),
    ('plans = ["single", "teleport"]', "plans.1", ["hedge"]),
    ('plans = ["single", "cascade", "teleport"]', "plans.2", ["hedge", "cascade"]),
    ("[cascade]\nhold_tokens = 0", "cascade.hold_tokens", ["greater than or equal to 1"]),
    ("[cascade]\nhedge = 1", "cascade.hedge", ["bool"]),
    ('[cascade]\njudge = "whole"', "cascade.judge", ["prefix", "answer"]),
    ('[routing]\nfallback_order = ["local", "mars rover"]', "routing.fallback_order.1", ["cloud"]),
    ("[hedge]\nafter_ms = -50", "hedge.after_ms", [">= 0", "auto", "-50"]),
    ('[hedge]\nafter_ms = "soon"', "hedge.after_ms", ["delay in ms", "auto", "soon"]),
    ("[hedge]\nafter_ms = nan", "hedge.after_ms", ["finite"]),
    ("[hedge]\nafter_ms = true", "hedge.after_ms", ["delay in ms"]),
]


@pytest.mark.parametrize(("body", "field", "words"), MISTAKES)
def test_a_mistake_names_file_field_and_problem(
    tmp_path: Path, body: str, field: str, words: list[str]
) -> None:
    path = write(tmp_path, "mine", body + "\n")
    with pytest.raises(PolicyError) as info:
        resolve_policy(path)
    assert info.value.path == path and info.value.field == field
    text = str(info.value)
    assert "mine.toml" in text and field in text
    for word in words:
        assert word in text


@pytest.mark.parametrize(
    ("body", "words"),
    [
        (
            "[routing]\nrouter_threshold = 0.5\ntarget_cloud_share = 0.3",
            ["router_threshold", "target_cloud"],
        ),
        (
            "[routing]\ntarget_cloud_share = 0.3\nquality_floor = 0.9",
            ["target_cloud_share", "quality_floor"],
        ),
        ('plans = ["single"]\n\n[hedge]\nafter_ms = 100', ["after_ms", "plans"]),
        ('plans = ["hedge"]', ["'single' must be allowed"]),
        (
            '[routing]\nprefer = "local"\nfallback_order = ["cloud", "local"]',
            ["fallback_order", "prefer"],
        ),
        ('[routing]\nprefer = "cloud"\nallow_cloud = false', ["allow_cloud"]),
        ('[routing]\nfallback_order = ["local", "local"]', ["distinct"]),
    ],
)
def test_conflicting_fields_are_named(tmp_path: Path, body: str, words: list[str]) -> None:
    path = write(tmp_path, "clash", body + "\n")
    with pytest.raises(PolicyError) as info:
        resolve_policy(path)
    assert info.value.path == path
    for word in words:
        assert word in str(info.value)


def test_bad_toml_names_the_file_and_the_line(tmp_path: Path) -> None:
    path = write(tmp_path, "broken", '[routing]\nprefer = "local"\n[sampling]\nmax_tokens = \n')
    with pytest.raises(PolicyError) as info:
        resolve_policy(path)
    assert info.value.path == path and "not valid TOML" in str(info.value)
    assert "line 4" in str(info.value)


def test_unknown_extends_lists_the_known_names(tmp_path: Path) -> None:
    path = write(tmp_path, "mine", 'extends = "chaat"\n')
    with pytest.raises(PolicyError) as info:
        resolve_policy(path)
    assert info.value.field == "extends" and info.value.path == path
    assert "chaat" in str(info.value) and "chat" in str(info.value).split("known policies")[1]


def test_extends_must_be_a_name(tmp_path: Path) -> None:
    path = write(tmp_path, "mine", "extends = 3\n")
    with pytest.raises(PolicyError) as info:
        resolve_policy(path)
    assert info.value.field == "extends"


def test_extends_cycles_are_detected(tmp_path: Path) -> None:
    write(tmp_path, "a", 'extends = "b"\n')
    write(tmp_path, "b", 'extends = "c"\n')
    write(tmp_path, "c", 'extends = "a"\n')
    with pytest.raises(PolicyError) as info:
        resolve_policy("a", dirs=[tmp_path])
    assert info.value.field == "extends"
    assert "cycle" in str(info.value) and "a.toml -> b.toml -> c.toml -> a.toml" in str(info.value)
    own = write(tmp_path, "self", 'extends = "self.toml"\n')
    with pytest.raises(PolicyError, match="cycle"):
        resolve_policy(own)


def test_a_mistake_in_the_parent_names_the_parent(tmp_path: Path) -> None:
    parent = write(tmp_path, "parent", "[sampling]\nmax_tokens = -3\n")
    child = write(tmp_path, "child", 'extends = "parent"\n[sampling]\ntemperature = 0.1\n')
    with pytest.raises(PolicyError) as info:
        resolve_policy(child, dirs=[tmp_path])
    assert info.value.path == parent and info.value.field == "sampling.max_tokens"


def test_a_child_can_repair_its_parent(tmp_path: Path) -> None:
    write(tmp_path, "parent", "[routing]\nrouter_threshold = 0.5\n")
    child = write(tmp_path, "child", 'extends = "parent"\n[sampling]\nmax_tokens = 9\n')
    assert resolve_policy(child, dirs=[tmp_path]).routing.router_threshold == 0.5
    clash = write(tmp_path, "clash", 'extends = "parent"\n[routing]\nquality_floor = 0.9\n')
    with pytest.raises(PolicyError, match="at most one"):
        resolve_policy(clash, dirs=[tmp_path])


def test_unknown_name_lists_known_ones_including_user_dirs(tmp_path: Path) -> None:
    write(tmp_path, "my-own", '[routing]\nprefer = "local"\n')
    with pytest.raises(PolicyError) as info:
        resolve_policy("my-ownn", dirs=[tmp_path])
    assert "my-own," in str(info.value) and "voice-assistant" in str(info.value)


def test_policy_objects_take_tables() -> None:
    pol = Policy(
        name="p", routing={"prefer": "local", "allow_cloud": False, "ttft_deadline_ms": 50}
    )
    assert not pol.cloud_allowed and pol.order == ("local", "cloud")
    assert (
        pol.plans == ("single", "hedge")
        and pol.privacy.mode == "keep-local"
        and not pol.privacy.ner
    )


def test_the_cache_rereads_a_changed_file(tmp_path: Path) -> None:
    import os

    from hybridllm.policy import PolicyCache

    base = write(tmp_path, "base", "[sampling]\nmax_tokens = 10\n")
    write(tmp_path, "mine", 'extends = "base"\n')
    cache = PolicyCache([tmp_path])
    first = cache.get("mine")
    assert first.sampling.max_tokens == 10 and cache.get("mine") is first
    base.write_text("[sampling]\nmax_tokens = 20\n")
    os.utime(base, ns=(base.stat().st_atime_ns, base.stat().st_mtime_ns + 10**9))
    assert cache.get("mine").sampling.max_tokens == 20  # the parent changed: both files are watched
