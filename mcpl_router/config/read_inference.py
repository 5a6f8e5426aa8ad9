"""Reading ``mcplServers.<id>.inference``: whether a server may ask for inference, and its limits.

Server-initiated inference is denied by default: a server without this table is never granted
``inferenceRequest``, ``inferenceRequest.streaming`` or ``modelInfo``, so naming one of those in
its ``enabledCapabilities`` is a mistake reported here (it would grant nothing).
"""

from __future__ import annotations

from mcpl_router.config.errors import show_value
from mcpl_router.config.model import INFERENCE_KEYS, InferencePolicy
from mcpl_router.config.section_reader import Section

__all__ = ["SERVER_INFERENCE_LEAVES", "parse_inference"]

#: The capability leaves only a server with ``inference`` configured may be granted.
SERVER_INFERENCE_LEAVES: tuple[str, ...] = ("inferenceRequest", "inferenceRequest.streaming", "modelInfo")

_EXAMPLE = 'inference = { agent = "kai" }'


def parse_inference(s: Section, enabled_capabilities: tuple[str, ...] | None) -> InferencePolicy | None:
    """The server's ``inference`` table, or None when absent (or invalid: the problem is recorded)."""
    if not s.has("inference"):
        for index, pattern in enumerate(enabled_capabilities or ()):
            if pattern in SERVER_INFERENCE_LEAVES:
                s.problems.error(
                    f"{s.key_of('enabledCapabilities')}[{index}]",
                    f"{show_value(pattern)} is granted only to a server with an \"inference\" table: "
                    "without one this server may not ask for inference.",
                    f"Add {_EXAMPLE} (the agent whose model answers it), or remove {show_value(pattern)}.",
                )
        return None
    if s.unresolved("inference"):
        return None
    if not isinstance(s.raw("inference"), dict):
        s.error("inference", f"expected a table, got {show_value(s.raw('inference'))}.", f"Write {_EXAMPLE}.")
        return None
    table = s.table("inference", INFERENCE_KEYS, "server's inference")
    agent = table.string("agent", fix=f"Name the agent whose model answers this server: {_EXAMPLE}.")
    if agent is None:
        if not table.has("agent"):
            table.error(
                "agent",
                "is missing: inference needs the agent whose model answers this server.",
                f"Add it: {_EXAMPLE}.",
            )
        return None
    if any(char.isspace() for char in agent):
        table.error("agent", f"{show_value(agent)} is not an agent name (no whitespace).", "Use the agent's name.")
        return None
    defaults = InferencePolicy(agent)
    return InferencePolicy(
        agent=agent,
        max_concurrent=table.integer("maxConcurrent", defaults.max_concurrent, at_least=1, at_most=1024),
        max_request_bytes=table.integer("maxRequestBytes", defaults.max_request_bytes, at_least=1, at_most=2**31 - 1),
        per_minute=table.integer("perMinute", defaults.per_minute, at_least=1, at_most=1_000_000),
        timeout=table.number("timeout", defaults.timeout, above=0, at_most=86_400),
    )
