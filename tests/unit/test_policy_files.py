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
    assert chat.ttft_deadline_ms == 500 and chat.tpot_target_ms == 50
    assert resolve_policy("translation").ttft_deadline_ms == 500
    voice = resolve_policy("voice-assistant")
    assert voice.tpot_target_ms is not None and voice.tpot_target_ms > chat.tpot_target_ms
    batch = resolve_policy("batch")
    assert batch.ttft_deadline_ms is None and batch.plans == ("single",)
    private = resolve_policy("private")
    assert not private.cloud_allowed and private.privacy == "keep-local"
    assert private.order == ("local",)


def test_a_user_file_extends_a_preset_and_merges_tables(tmp_path: Path) -> None:
    write(tmp_path, "base", 'prefer = "cloud"\n[budget]\nper_day_usd = 1.0\nper_month_usd = 9.0\n')
    path = write(
        tmp_path, "mine", 'extends = "base"\nmax_tokens = 32\n[budget]\nper_day_usd = 0.5\n'
    )
    pol = resolve_policy(path)
    assert pol.name == "mine" and pol.prefer == "cloud" and pol.max_tokens == 32
    assert pol.budget.per_day_usd == 0.5 and pol.budget.per_month_usd == 9.0


def test_policy_dirs_and_env_path_come_before_the_presets(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mine, env = tmp_path / "mine", tmp_path / "env"
    mine.mkdir()
    env.mkdir()
    # a user "chat" that extends the preset "chat" it shadows
    write(mine, "chat", 'extends = "chat"\nttft_deadline_ms = 250\n')
    write(env, "night", 'extends = "batch"\ndescription = "overnight"\n')
    monkeypatch.setenv(ENV_PATH, str(env))
    chat = resolve_policy("chat", dirs=[mine])
    assert chat.ttft_deadline_ms == 250 and chat.tpot_target_ms == 50
    assert resolve_policy("night").prefer == "cloud"
    assert {"chat", "night", "batch"} <= set(known_policies(dirs=[mine]))


MISTAKES = [
    # (body, field, words in the message)
    ('prefer = "gpu"', "prefer", ["local", "gpu"]),
    ("max_tokens = 0", "max_tokens", ["greater than or equal to 1"]),
    ('temperature = "hot"', "temperature", ["number", "hot"]),
    ("router_threshold = 1.5", "router_threshold", ["less than or equal to 1"]),
    ("colour = 3", "colour", ["unknown field", "ttft_deadline_ms"]),
    ("[budget]\nper_dya_usd = 1.0", "budget.per_dya_usd", ["unknown field", "per_day_usd"]),
    ("[budget]\nper_day_usd = -1", "budget.per_day_usd", ["greater than or equal to 0"]),
    ('[budget]\non_exceeded = "panic"', "budget.on_exceeded", ["local", "fail"]),
    ('privacy = "maybe"', "privacy", ["keep-local"]),
    ('plans = ["single", "teleport"]', "plans.1", ["hedge"]),
    ('plans = ["single", "cascade", "teleport"]', "plans.2", ["hedge", "cascade"]),
    ("cascade_hold_tokens = 0", "cascade_hold_tokens", ["greater than or equal to 1"]),
    ("cascade_hedge = 1", "cascade_hedge", ["bool"]),
    ('cascade_judge = "whole"', "cascade_judge", ["prefix", "answer"]),
    ('fallback_order = ["local", "mars"]', "fallback_order.1", ["cloud"]),
    ("hedge_after_ms = -50", "hedge_after_ms", [">= 0", "auto", "-50"]),
    ('hedge_after_ms = "soon"', "hedge_after_ms", ["delay in ms", "auto", "soon"]),
    ("hedge_after_ms = nan", "hedge_after_ms", ["finite"]),
    ("hedge_after_ms = true", "hedge_after_ms", ["delay in ms"]),
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
        ("router_threshold = 0.5\ntarget_cloud_share = 0.3", ["router_threshold", "target_cloud"]),
        ("target_cloud_share = 0.3\nquality_floor = 0.9", ["target_cloud_share", "quality_floor"]),
        ('hedge_after_ms = 100\nplans = ["single"]', ["hedge_after_ms", "plans"]),
        ('plans = ["hedge"]', ["'single' must be allowed"]),
        ('prefer = "local"\nfallback_order = ["cloud", "local"]', ["fallback_order", "prefer"]),
        ('prefer = "cloud"\nallow_cloud = false', ["allow_cloud"]),
        ('fallback_order = ["local", "local"]', ["distinct"]),
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
    path = write(tmp_path, "broken", 'prefer = "local"\nmax_tokens = \n')
    with pytest.raises(PolicyError) as info:
        resolve_policy(path)
    assert info.value.path == path and "not valid TOML" in str(info.value)
    assert "line 2" in str(info.value)


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
    parent = write(tmp_path, "parent", "max_tokens = -3\n")
    child = write(tmp_path, "child", 'extends = "parent"\ntemperature = 0.1\n')
    with pytest.raises(PolicyError) as info:
        resolve_policy(child, dirs=[tmp_path])
    assert info.value.path == parent and info.value.field == "max_tokens"


def test_a_child_can_repair_its_parent(tmp_path: Path) -> None:
    write(tmp_path, "parent", "router_threshold = 0.5\n")
    child = write(tmp_path, "child", 'extends = "parent"\nmax_tokens = 9\n')
    assert resolve_policy(child, dirs=[tmp_path]).router_threshold == 0.5
    clash = write(tmp_path, "clash", 'extends = "parent"\nquality_floor = 0.9\n')
    with pytest.raises(PolicyError, match="at most one"):
        resolve_policy(clash, dirs=[tmp_path])


def test_unknown_name_lists_known_ones_including_user_dirs(tmp_path: Path) -> None:
    write(tmp_path, "my-own", 'prefer = "local"\n')
    with pytest.raises(PolicyError) as info:
        resolve_policy("my-ownn", dirs=[tmp_path])
    assert "my-own," in str(info.value) and "voice-assistant" in str(info.value)


def test_old_policy_objects_still_validate() -> None:
    pol = Policy(name="p", prefer="local", allow_cloud=False, ttft_deadline_ms=50)
    assert not pol.cloud_allowed and pol.order == ("local", "cloud")
    assert pol.plans == ("single", "hedge") and pol.privacy == "off"


def test_the_cache_rereads_a_changed_file(tmp_path: Path) -> None:
    import os

    from hybridllm.policy import PolicyCache

    base = write(tmp_path, "base", "max_tokens = 10\n")
    write(tmp_path, "mine", 'extends = "base"\n')
    cache = PolicyCache([tmp_path])
    first = cache.get("mine")
    assert first.max_tokens == 10 and cache.get("mine") is first
    base.write_text("max_tokens = 20\n")
    os.utime(base, ns=(base.stat().st_atime_ns, base.stat().st_mtime_ns + 10**9))
    assert cache.get("mine").max_tokens == 20  # the parent changed: both files are watched
