"""The tag closure (PROTOCOL.md §6): implications, then ambient dropped when addressed."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mcpl_router.routing.tags import expand_tags, tag_matches


@pytest.mark.parametrize(
    ("tags", "expanded"),
    [
        ([], ()),
        (None, ()),
        (["chat:mention"], ("chat:mention", "chat:addressed")),
        (["chat:reply"], ("chat:reply", "chat:addressed")),
        (["chat:dm"], ("chat:dm", "chat:addressed", "chat:private")),
        (["chat:ambient"], ("chat:ambient",)),
        (["chat:ambient", "chat:mention"], ("chat:mention", "chat:addressed")),
        (["chat:addressed", "chat:ambient"], ("chat:addressed",)),
        (["chat:mention", "chat:reply", "chat:from-human"], ("chat:mention", "chat:addressed", "chat:reply", "chat:from-human")),
        # Off the wire: junk is dropped, not trusted, not fatal.
        ([3, None, "noColon", "x:y"], ("x:y",)),
    ],
)
def test_closure(tags: list[object] | None, expanded: tuple[str, ...]) -> None:
    assert expand_tags(tags) == expanded


tag_text = st.sampled_from(["chat:mention", "chat:reply", "chat:dm", "chat:ambient", "chat:addressed", "chat:private", "x:y"])


@given(st.lists(tag_text, max_size=8))
def test_closure_is_idempotent_and_consistent(tags: list[str]) -> None:
    once = expand_tags(tags)
    assert expand_tags(once) == once
    assert len(set(once)) == len(once)
    if "chat:addressed" in once:
        assert "chat:ambient" not in once
    if {"chat:mention", "chat:reply", "chat:dm"} & set(tags):
        assert "chat:addressed" in once


def test_tag_patterns() -> None:
    assert tag_matches("chat:*", "chat:mention")
    assert not tag_matches("chat:*", "chatx:mention")
    assert tag_matches("chat:dm", "chat:dm")
    assert not tag_matches("chat:dm", "chat:dmx")
