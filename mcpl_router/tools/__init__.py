"""The tools a model may call through its host.

- :mod:`~mcpl_router.tools.seam`: :class:`ToolProvider`, :class:`ToolCall`, :func:`tool_result`,
  :func:`agent_may_call`;
- :mod:`~mcpl_router.tools.table`: :class:`ToolTable`, the one name table every listing and
  dispatch reads (a clash is refused when it is built);
- the providers, each given its collaborators at construction (none sees the daemon):
  :class:`ChannelTools` (``channel_*``), :class:`SpeechTools` (``drafts``, ``sleep``, …),
  :class:`TuneOuts` (``tune_out`` and the subconscious tools), :class:`ConnectorTools` (the
  servers' own tools).

The providers are imported from their own modules (``mcpl_router.tools.channel_tools``, …):
they use the turn machinery, which uses this package's seam and table.
"""

from __future__ import annotations

from mcpl_router.tools.seam import ServerTool, ToolCall, ToolName, ToolProvider, ToolSpec, agent_may_call, record_explicit_send, tool_result
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
