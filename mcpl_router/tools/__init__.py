"""The tools a model may call through its host.

- :mod:`~mcpl_router.tools.seam`: :class:`ToolProvider`, :class:`ToolCall`, :func:`tool_result`,
  :func:`agent_may_call`;
- :mod:`~mcpl_router.tools.table`: :class:`ToolTable`, the one name table every listing and
  dispatch reads (a clash is refused when it is built);
- the providers, each given its collaborators at construction (none sees the daemon):
  :class:`ChannelTools` (``channel_*``), :class:`SpeechTools` (``drafts``, ``sleep``, …),
  :class:`TuneOuts` (``tune_out`` and the subconscious tools), :class:`ConnectorTools` (the
  servers' own tools).

The providers are loaded when first named here: they use the turn machinery, which imports
this package's seam, so importing them eagerly would make a cycle.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from mcpl_router.tools.seam import ServerTool, ToolCall, ToolName, ToolProvider, ToolSpec, agent_may_call, tool_result
from mcpl_router.tools.table import NameClash, ToolEntry, ToolTable

if TYPE_CHECKING:
    from mcpl_router.tools.channel_tools import ChannelTools
    from mcpl_router.tools.connector_tools import ConnectorTools
    from mcpl_router.tools.speech_tools import SpeechTools
    from mcpl_router.tools.tune_out import TuneOuts

__all__ = [
    "ChannelTools",
    "ConnectorTools",
    "NameClash",
    "ServerTool",
    "SpeechTools",
    "ToolCall",
    "ToolEntry",
    "ToolName",
    "ToolProvider",
    "ToolSpec",
    "ToolTable",
    "TuneOuts",
    "agent_may_call",
    "tool_result",
]

_PROVIDERS = {
    "ChannelTools": "channel_tools",
    "ConnectorTools": "connector_tools",
    "SpeechTools": "speech_tools",
    "TuneOuts": "tune_out",
}


def __getattr__(name: str) -> Any:
    module = _PROVIDERS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
