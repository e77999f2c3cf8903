"""Email addresses given in pieces with words between them (hybridllm.guard.privacy_split, run by
every `privacy.scan`): the issue-31 leak ("starts with jane.doe", another turn, "and ends with
@example.org") is found at the domain's place with a redacted hint; a domain alone, decorators
and scoped packages, and dotted names in code are not."""

from __future__ import annotations

import pytest

from hybridllm.guard.privacy import kinds, scan
from hybridllm.guard.privacy_split import split_emails
from tests.privacy_corpus import SPLIT


def conversation(*texts: str) -> list[dict[str, str]]:
    roles = ("user", "assistant")
    return [{"role": roles[i % 2], "content": t} for i, t in enumerate(texts)]


@pytest.mark.parametrize(("messages", "kind", "secrets"), SPLIT)
def test_the_corpus_splits_are_found(
    messages: list[dict[str, str]], kind: str, secrets: tuple[str, ...]
) -> None:
    found = scan(messages)
    assert kind in kinds(found)
    assert not any(secret in str(f) for f in found for secret in secrets)


def test_the_domain_is_where_the_address_is_completed() -> None:
    texts = [
        ("messages[0].content", "starts with jane.doe"),
        ("messages[2].content", "then @ex.org"),
    ]
    assert split_emails(texts) == [("messages[2].content", 5, 12)]
    (finding,) = scan(conversation("starts with jane.doe", "ok", "then @ex.org"))
    assert finding.hint == "email ***@*** (split)" and finding.location == "messages[2].content"


@pytest.mark.parametrize(
    "messages",
    [
        conversation("my mailbox is pedro1984", "Which provider?", "the domain is @correo.es"),
        conversation("Mon identifiant commence par marie.lefevre et le domaine est @orange.fr"),
        conversation("Mi usuario es lucia_mora", "¿Y el dominio?", "@telefonica.net"),
    ],
)
def test_other_wordings_and_languages(messages: list[dict[str, str]]) -> None:
    assert kinds(scan(messages)) == ("email",)


@pytest.mark.parametrize(
    "messages",
    [
        conversation("Block all mail from @spam-domain.com in the filter."),
        conversation("What does @dataclass do?", "It writes methods.", "And npm i @types/node?"),
        conversation("use os.path.join here", "ok", "emails to @example.com are test only"),
        conversation("Tickets by jsmith42 are closed.", "Fine.", "Tag @release.team on it."),
    ],
)
def test_a_domain_without_a_user_name_for_it_is_left_alone(
    messages: list[dict[str, str]],
) -> None:
    assert scan(messages) == ()
