"""The tools a model may call through its host.

- :mod:`~mcpl_router.tools.seam`: :class:`ToolProvider`, :class:`ToolCall`, :func:`tool_result`,
  :func:`agent_may_call` (``routing/agents.py``'s);
- :mod:`~mcpl_router.tools.table`: :class:`ToolTable`, the one name table every listing and
  dispatch reads (a clash is refused when it is built);
- :mod:`~mcpl_router.tools.dispatch`: ``turn/tool``, a call sent to the tool its name means;
- the providers, each given its collaborators at construction (none sees the daemon):
  :class:`ChannelTools` (``channel_*``), :class:`SpeechTools` (``drafts``, ``sleep``, …),
  :class:`TuneOuts` (``tune_out`` and the subconscious tools), :class:`ConnectorTools` (the
  servers' own tools).

The providers are imported from their own modules (``mcpl_router.tools.channel_tools``, …).
Tools sit above the turns (a call carries its ``TurnRun``) and below the host API.
"""

from __future__ import annotations

from mcpl_router.routing.agents import agent_may_call
from mcpl_router.tools.seam import ServerTool, ToolCall, ToolName, ToolProvider, ToolSpec, record_explicit_send, tool_result
from mcpl_router.tools.table import NameClash, ToolEntry, ToolTable

__all__ = [
    "NameClash",
    "ServerTool",
    "ToolCall",
    "ToolEntry",
    "ToolName",
    "ToolProvider",
    "ToolSpec",
    "ToolTable",
    "agent_may_call",
    "record_explicit_send",
    "tool_result",
]
