"""The policy in tables: the old flat form is refused with each field's new place, and
`hybridllm policy migrate` rewrites an old file (tested on every old preset)."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from hybridllm import Policy
from hybridllm.cli.main import main
from hybridllm.cli.policy_migrate import migrate_file, migrate_text
from hybridllm.errors import PolicyError
from hybridllm.policy import MOVED, TABLES, known_policies, resolve_policy

OLD_PRESETS = sorted((Path(__file__).parent.parent / "data" / "flat_policies").glob("*.toml"))


def test_every_old_preset_is_kept() -> None:
    assert {p.stem for p in OLD_PRESETS} == set(known_policies())


@pytest.mark.parametrize("old", OLD_PRESETS, ids=lambda p: p.stem)
def test_migrate_turns_every_old_preset_into_the_shipped_one(old: Path) -> None:
    new = migrate_text(old.read_text())
    data = tomllib.loads(new)
    assert not set(data) & set(MOVED) - {"privacy"}, "no flat field is left at the top"
    migrated = Policy.model_validate({"name": old.stem, **data})
    assert migrated == resolve_policy(old.stem)
    comments = [line.strip() for line in old.read_text().splitlines() if "#" in line]
    for comment in comments:  # every comment is kept (a moved field's comment moves with it)
        words = comment.split("#", 1)[1].strip()
        assert words in new


@pytest.mark.parametrize("old", OLD_PRESETS, ids=lambda p: p.stem)
def test_an_old_file_names_each_fields_new_place(tmp_path: Path, old: Path) -> None:
    path = tmp_path / "mine.toml"
    path.write_text(old.read_text())
    flat = [k for k in tomllib.loads(old.read_text()) if k in MOVED]
    with pytest.raises(PolicyError) as info:
        resolve_policy(path)
    assert info.value.path == path and info.value.field in flat
    table, name = MOVED[info.value.field or ""]
    assert f"[{table}]" in str(info.value) and name in str(info.value)
    assert "hybridllm policy migrate" in str(info.value)


@pytest.mark.parametrize("flat", sorted(MOVED))
def test_flat_keyword_arguments_name_their_new_place(flat: str) -> None:
    with pytest.raises(PolicyError) as info:
        Policy(**{flat: None})
    table, name = MOVED[flat]
    assert info.value.field == flat
    assert f"[{table}]" in str(info.value) and f"Policy({table}={{'{name}'" in str(info.value)


def test_one_name_per_knob() -> None:
    names = [(t, n) for t, model in TABLES.items() for n in model.model_fields]
    assert len(names) == len(set(names))
    assert set(MOVED.values()) <= set(names), "every old field has a place"
    assert "max_verify_overhead" not in TABLES["speculative"].model_fields
    assert Policy(speculative={"max_prompt_overhead": 2.0}).speculative.max_prompt_overhead == 2.0


def test_preset_with_changes_merges_a_table_key_by_key() -> None:
    chat = Policy.preset("chat")
    mine = chat.with_(name="mine", routing={"ttft_deadline_ms": 300}, hedge={"after_ms": 50})
    assert mine.name == "mine" and mine.routing.ttft_deadline_ms == 300
    assert mine.routing.target_cloud_share == chat.routing.target_cloud_share  # kept
    assert mine.hedge.after_ms == 50 and chat.hedge.after_ms == "auto"  # the preset is unchanged
    with pytest.raises(PolicyError) as info:
        chat.with_(routing={"ttft_deadline_ms": -1})
    assert info.value.field == "routing.ttft_deadline_ms"
    with pytest.raises(PolicyError, match="old flat form"):
        chat.with_(ttft_deadline_ms=300)


@pytest.mark.parametrize(
    ("client", "policy", "effective"),
    [
        ("off", "keep-local", "keep-local"),
        ("keep-local", "off", "keep-local"),
        ("keep-local", "block", "block"),
        ("block", "keep-local", "block"),
        ("off", "off", "off"),
    ],
)
def test_the_client_privacy_mode_is_a_floor(client: str, policy: str, effective: str) -> None:
    pol = Policy(privacy={"mode": policy})
    assert pol.under_client(client).privacy.mode == effective  # type: ignore[arg-type]


def test_the_migrate_command_rewrites_in_place_and_to_stdout(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "mine.toml"
    path.write_text('prefer = "cloud"  # the cloud first\nhedge_after_ms = 200\n')
    assert main(["policy", "migrate", str(path), "-o", "-"]) == 0
    out = capsys.readouterr().out
    assert '[routing]\nprefer = "cloud"  # the cloud first' in out and "after_ms = 200" in out
    assert "hedge_after_ms" in path.read_text()  # -o -: the file is untouched
    assert main(["policy", "migrate", str(path)]) == 0
    assert resolve_policy(path).hedge.after_ms == 200.0


def test_migrate_refuses_what_would_not_load(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text('prefer = "9-gpu"\n')
    with pytest.raises(PolicyError) as info:
        migrate_file(path, path)
    assert "9-gpu" in str(info.value)
    assert path.read_text() == 'prefer = "9-gpu"\n'  # nothing written
    assert main(["policy", "migrate", str(tmp_path / "absent.toml")]) == 2


def test_max_tokens_has_one_ceiling_in_a_policy_and_per_call() -> None:
    from hybridllm.engines import validate
    from hybridllm.policy import MAX_TOKENS

    assert validate.MAX_TOKENS == MAX_TOKENS == 2**20
    assert Policy(sampling={"max_tokens": MAX_TOKENS}).sampling.max_tokens == MAX_TOKENS
    with pytest.raises(PolicyError) as info:
        Policy(sampling={"max_tokens": 10**9})
    assert info.value.field == "sampling.max_tokens"
