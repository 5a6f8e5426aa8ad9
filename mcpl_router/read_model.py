"""The daemon as it is asked about: ``status``, ``servers/list``, readiness, ``channels/list``,
``explain`` (the host API, the CLI, ``/readyz``, the status page, the demo).

It reads the parts the daemon built and changes none of them. The servers' rows are
``servers_view.py``'s (built before the sessions, whose hello answer lists them); the rows
that read several parts are ``status_model.py``'s.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from typing import TYPE_CHECKING, Final

from mcpl_router import __version__
from mcpl_router.health import Readiness, readiness
from mcpl_router.servers_view import ServersView
from mcpl_router.status_model import agent_rows, channel_page, connection_rows, journal_row

if TYPE_CHECKING:
    from mcpl_router.hosts.admission import HostAdmission
    from mcpl_router.hosts.connection import HostConnection
    from mcpl_router.hosts.sessions import SessionManager
    from mcpl_router.mcpl.link import ServerLink
    from mcpl_router.mcpl.liveness import Liveness
    from mcpl_router.routing.router import Router
    from mcpl_router.store.journal import Journal
    from mcpl_router.tools.channel_lifecycle import ChannelLifecycle
    from mcpl_router.tools.tune_out import TuneOuts
    from mcpl_router.turns import TurnManager

__all__ = ["INLINE_CHANNELS", "ReadModel"]

#: Up to this many channels, ``status`` lists them whole (its first page); past it, on request.
INLINE_CHANNELS: Final = 2000


class ReadModel:
    """What the daemon answers when asked about itself (built by the daemon with its parts)."""

    def __init__(
        self,
        *,
        router: Router,
        links: Mapping[str, ServerLink],
        servers: ServersView,
        sessions: SessionManager,
        tune_outs: TuneOuts,
        turns: TurnManager,
        journal: Journal,
        host_connections: Collection[HostConnection],
        admission: HostAdmission,
        liveness: Liveness,
        channel_decisions: ChannelLifecycle,
        draining: Callable[[], bool],
        last_reload: Callable[[], dict[str, object] | None],
    ) -> None:
        self._router = router
        self._links = links
        self._servers = servers
        self._sessions = sessions
        self._tune_outs = tune_outs
        self._turns = turns
        self._journal = journal
        self._host_connections = host_connections
        self._admission = admission
        self._liveness = liveness
        self._channel_decisions = channel_decisions
        self._draining = draining
        self._last_reload = last_reload

    # -- the queries ---------------------------------------------------------------------------

    def status(self, *, channels_page: int | None = None, channels_filter: str = "") -> dict[str, object]:
        """``status``, ``/status.json`` and the status page: one model.

        The channel listing costs a walk of every channel: it comes whole up to
        :data:`INLINE_CHANNELS` channels, and past that only when a page (or a filter) is
        asked for (the status page asks), so ``status`` stays cheap at 100k channels.
        """
        servers = self.servers_list()
        state = self.readiness()
        total = self._router.registry.channel_count()
        if channels_page is not None or channels_filter or total <= INLINE_CHANNELS:
            channel_list = channel_page(self._router.names, channels_page or 0, channels_filter)
        else:
            channel_list = {"total": total, "page": None, "pages": None, "rows": [], "filter": "",
                            "omitted": f"over {INLINE_CHANNELS} channels: ask for a page (status page, /status.json?page=0)"}
        return {
            "version": __version__,
            "servers": servers,
            "ready": sum(1 for s in servers if s["serving"]),
            "channels": total,
            "lastSeq": self._journal.last_seq(),
            "agents": agent_rows(self._sessions, self._tune_outs, self._router.names),
            "hosts": {**self._sessions.host_statistics(), "admission": self._admission.statistics()},
            "hostConnections": connection_rows(self._host_connections),
            "channelList": channel_list,
            "decisions": self._router.names.decisions.to_wire(),
            "journal": journal_row(self._journal),
            "openTurns": len(self._turns.table.all()),
            "channelDecisions": self._channel_decisions.status(),
            "readiness": {"ready": state.ready, "problems": list(state.problems)},
            "lastReload": self._last_reload(),
        }

    def servers_list(self) -> list[dict[str, object]]:
        return self._servers.servers_list()

    def readiness(self) -> Readiness:
        """What ``/readyz`` answers (see :func:`mcpl_router.health.readiness`)."""
        return readiness(
            draining=self._draining(),
            journal_failing=self._journal.statistics().failing,
            links=self._links.values(),
            server_problem=self._servers.server_problem,
        )

    def channels_list(self) -> list[dict[str, object]]:
        return [row.to_dict() for row in self._router.names.channel_list()]

    def explain(self, name: str, server_id: str | None = None) -> dict[str, object]:
        return self._router.names.explain(name, server_id).to_dict()
