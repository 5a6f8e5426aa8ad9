"""What a config reload does: which servers connect, disconnect, reconnect, take a new grant
or only new filters, and which sections need a restart. Pure: it compares two configs.

The daemon carries the plan out (:meth:`mcpl_router.daemon.Daemon.reload`).
"""

from __future__ import annotations

from collections.abc import Collection

import attrs

from mcpl_router.config import RouterConfig, ServerConfig

__all__ = ["ReloadPlan", "plan_reload"]

#: Server keys a live link can take without reconnecting: its tool filters, readiness and ping.
_LIVE_KEYS = frozenset({"enabled_tools", "disabled_tools", "required", "ping"})
#: Server keys applied to the live connection by sending it a new grant.
#: (``inference`` grants or withdraws the inference leaves; its limits are read per request.)
_GRANT_KEYS = frozenset(
    {"enabled_capabilities", "disabled_capabilities", "enabled_feature_sets", "disabled_feature_sets", "inference"}
)


@attrs.frozen
class ReloadPlan:
    """What a reload does, server by server (ids in the new config's order)."""

    added: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()
    reconnected: tuple[str, ...] = ()
    regranted: tuple[str, ...] = ()
    updated: tuple[str, ...] = ()
    restart_needed: tuple[str, ...] = ()

    def to_start(self, config: RouterConfig) -> list[ServerConfig]:
        return [config.servers[server_id] for server_id in (*self.reconnected, *self.added)]


def plan_reload(old: RouterConfig, new: RouterConfig, *, revive: Collection[str] = ()) -> ReloadPlan:
    """Compare two configs: which servers to connect, disconnect, reconnect or re-grant.

    ``revive``: servers whose link has failed or closed. Each one still configured is
    reconnected, changed or not: a failed link never retries by itself, and a grant sent to
    no connection would change nothing (a reload, SIGHUP, is the operator's "try again").
    """
    before = {server.id: server for server in old.enabled_servers()}
    after = {server.id: server for server in new.enabled_servers()}
    reconnected, regranted, updated = [], [], []
    for server_id, server in after.items():
        previous = before.get(server_id)
        if previous is not None and server_id in revive:
            reconnected.append(server_id)
            continue
        if previous is None or previous == server:
            continue
        changed = {field.name for field in attrs.fields(ServerConfig) if getattr(previous, field.name) != getattr(server, field.name)}
        if changed <= _LIVE_KEYS:
            updated.append(server_id)
        elif changed <= _LIVE_KEYS | _GRANT_KEYS:
            regranted.append(server_id)
        else:
            reconnected.append(server_id)
    restart = [name for name in ("host", "journal", "health", "logging", "cluster") if getattr(old, name) != getattr(new, name)]
    return ReloadPlan(
        added=tuple(server_id for server_id in after if server_id not in before),
        removed=tuple(server_id for server_id in before if server_id not in after),
        reconnected=tuple(reconnected),
        regranted=tuple(regranted),
        updated=tuple(updated),
        restart_needed=tuple(restart),
    )
