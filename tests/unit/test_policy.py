from __future__ import annotations

from pathlib import Path

import pytest

from hybridllm import Policy
from hybridllm.errors import PolicyError
from hybridllm.policy import known_policies, resolve_policy

PRESETS = {
    "code-completion",
    "voice-assistant",
    "translation",
    "npc-dialogue",
    "chat",
    "long-writing",
    "batch",
    "private",
}


def test_every_preset_loads() -> None:
    assert PRESETS <= set(known_policies())
    for name in PRESETS:
        policy = resolve_policy(name)
        assert policy.name == name and policy.description
    assert resolve_policy("private").routing.allow_cloud is False
    assert resolve_policy("code-completion").routing.ttft_deadline_ms == 300


def test_unknown_name_lists_the_known_ones() -> None:
    with pytest.raises(PolicyError) as info:
        resolve_policy("warp-drive")
    assert "warp-drive" in str(info.value) and "voice-assistant" in str(info.value)


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ('[routing]\nprefer = "9-gpu"', "routing.prefer"),
        ("[sampling]\nmax_tokens = 0", "sampling.max_tokens"),
        ('[sampling]\ntemperature = "hot"', "sampling.temperature"),
        ("[routing]\nttft_deadline_ms = -5", "routing.ttft_deadline_ms"),
        ("colour = 3", "colour"),
        ("[speculative]\nk = 0", "speculative.k"),
        ("[speculative]\nk = 17", "speculative.k"),
        ("[speculative]\nk = 2.5", "speculative.k"),
        ("[speculative]\nk = true", "speculative.k"),
    ],
)
def test_malformed_file_names_file_and_field(tmp_path: Path, body: str, field: str) -> None:
    path = tmp_path / "mine.toml"
    path.write_text(body + "\n")
    with pytest.raises(PolicyError) as info:
        resolve_policy(path)
    assert info.value.path == path and info.value.field == field
    assert "mine.toml" in str(info.value) and field in str(info.value)


def test_invalid_toml_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "broken.toml"
    path.write_text("[routing]\nprefer = \n")
    with pytest.raises(PolicyError, match="broken.toml"):
        resolve_policy(path)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(PolicyError, match="not found"):
        resolve_policy(tmp_path / "absent.toml")


def test_policy_objects_are_frozen() -> None:
    policy = Policy(routing={"prefer": "local"})
    with pytest.raises(ValueError):
        policy.routing.prefer = "cloud"  # type: ignore[misc]
