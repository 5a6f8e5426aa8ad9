"""The channel descriptor shape the fixture registers, shared by the fixture and the tests."""

from __future__ import annotations

from typing import Any


def channel_descriptor(channel_id: str, label: str | None = None, *, channel_type: str = "text") -> dict[str, Any]:
    """The descriptor the fixture registers for a channel (tests build the same shape)."""
    return {
        "id": channel_id,
        "type": channel_type,
        "label": label or channel_id,
        "direction": "bidirectional",
        "address": {"native": channel_id},
        "metadata": {},
    }
