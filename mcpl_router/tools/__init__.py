"""The tools a model may call through its host: the seam, and the daemon's providers."""

from mcpl_router.tools.seam import ToolCall, ToolProvider, agent_may_call, tool_result

__all__ = ["ToolCall", "ToolProvider", "agent_may_call", "tool_result"]
