"""Small things a user hits at the door (issue 42, item 6): a policy field typo names the
closest known field (typed, `PolicyError.suggestion`), and a bound is printed as the integer it
is (`max_tokens ... from 1 to 1048576`, not 1.04858e+06)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hybridllm import Policy
from hybridllm.engines import validate
from hybridllm.errors import InvalidArgumentError, PolicyError
from hybridllm.policy import load_policy_file


@pytest.mark.parametrize(
    ("kwargs", "field", "suggestion"),
    [
        ({"routing": {"ttft_deadline": 400}}, "routing.ttft_deadline", "ttft_deadline_ms"),
        ({"routng": {"prefer": "cloud"}}, "routng", "routing"),
        ({"sampling": {"max_token": 8}}, "sampling.max_token", "max_tokens"),
        ({"routing": {"zzz": 1}}, "routing.zzz", None),
    ],
)
def test_an_unknown_policy_field_names_the_closest_known_one(
    kwargs: dict[str, object], field: str, suggestion: str | None
) -> None:
    with pytest.raises(PolicyError) as caught:
        Policy(name="typo", **kwargs)  # type: ignore[arg-type]
    assert caught.value.field == field and caught.value.suggestion == suggestion


def test_a_policy_file_with_a_typo_names_the_closest_field_too(tmp_path: Path) -> None:
    path = tmp_path / "voice.toml"
    path.write_text('name = "voice"\n[routing]\nttft_deadline = 400\n')
    with pytest.raises(PolicyError) as caught:
        load_policy_file(path)
    assert caught.value.suggestion == "ttft_deadline_ms" and caught.value.path == path


@pytest.mark.parametrize(("maximum", "printed"), [(2**20, "1048576"), (2**32 - 1, "4294967295")])
def test_an_integer_bound_is_printed_whole(maximum: int, printed: str) -> None:
    with pytest.raises(InvalidArgumentError) as caught:
        validate.integer("max_tokens", 0, minimum=1, maximum=maximum)
    assert caught.value.rule == f"an int from 1 to {printed}"  # the wording is the subject
