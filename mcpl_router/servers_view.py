"""The servers as ``servers/list``, ``status`` and a host's hello answer show them: each link's
state, its channels, its liveness, and why it is not serving when it is not.

The one state of its own is what each server's registrations were refused in its current
connection, counted as the daemon's answers go out and forgotten when the server connects
again. Built before the sessions (a hello answer lists the servers), after the links. What it counts it hears as :class:`RegistrationsAnswered`.
"""

from __future__ import annotations

import collections
from collections.abc import Mapping
from typing import TYPE_CHECKING

from mcpl_router.events import EventBus, RegistrationsAnswered, ServerStateChanged
from mcpl_router.logs import get_logger
from mcpl_router.mcpl.link import LinkState

if TYPE_CHECKING:
    from mcpl_router.mcpl.link import ServerLink
    from mcpl_router.mcpl.liveness import Liveness
    from mcpl_router.routing.router import Router

__all__ = ["ServersView"]


class ServersView:
    """Each server's row, and whether it serves.

    Args:
        router: the registry (each server's channel count).
        links: the daemon's links by server id (its own dict: a reload changes it in place).
        liveness: whether each ready server still answers ping.
        events: where it hears a server connecting again (its refusals are forgotten).
    """

    def __init__(self, *, router: Router, links: Mapping[str, ServerLink], liveness: Liveness, events: EventBus) -> None:
        self._router = router
        self._links = links
        self._liveness = liveness
        #: Per server: channel registrations refused in its current connection, by reason text.
        self.registration_refusals: dict[str, collections.Counter[str]] = {}
        self._log = get_logger()
        events.subscribe(ServerStateChanged, self._state_changed)
        events.subscribe(RegistrationsAnswered, self._registrations_answered)

    def _state_changed(self, event: ServerStateChanged) -> None:
        if event.new == LinkState.CONNECTING.value:
            self.new_connection(event.server_id)

    def _registrations_answered(self, answered: RegistrationsAnswered) -> None:
        """A ``channels/register``/``changed`` answer: count (and log) its refusals."""
        refused = [result for result in answered.results if not result.accepted]
        if not refused:
            return
        counts = self.registration_refusals.setdefault(answered.server_id, collections.Counter())
        for result in refused:
            counts[result.reason or "refused"] += 1
        self._log.warning(
            "server.registrations.refused",
            server=answered.server_id,
            refused=len(refused),
            reasons=sorted({result.refusal.value if result.refusal is not None else "other" for result in refused}),
        )

    def new_connection(self, server_id: str) -> None:
        """A server connects again: it registers afresh, and last time's refusals no longer
        describe it (also when it is removed)."""
        self.registration_refusals.pop(server_id, None)

    def servers_list(self) -> list[dict[str, object]]:
        rows = []
        for link in self._links.values():
            row = link.status().to_wire()
            refusals = self.registration_refusals.get(link.server_id)
            row["required"] = link.config.required
            row["channelCount"] = self._router.registry.channel_count(link.server_id)
            row["registrationsRefused"] = sum(refusals.values()) if refusals else 0
            row["refusalReasons"] = dict(refusals) if refusals else {}
            problem = self.server_problem(link)
            row["serving"] = problem is None
            row["problem"] = problem
            row["liveness"] = self._liveness.of(link.server_id).to_wire()
            rows.append(row)
        return rows

    def server_problem(self, link: ServerLink) -> str | None:
        """Why ``link`` is not serving (a phrase after its id), or None when it is.

        Ready with every channel registration refused is not serving: nothing it offers is
        reachable; nor is one connected that stopped answering ping.
        """
        if link.state is not LinkState.READY:
            why = f": {link.last_error}" if link.last_error else ""
            verb = "has failed" if link.state is LinkState.FAILED else f"is {link.state.value}"
            return f"{verb}{why}"
        refusals = self.registration_refusals.get(link.server_id)
        if refusals and not self._router.registry.channel_count(link.server_id):
            reason, _ = refusals.most_common(1)[0]
            return f"is ready but every channel registration was refused ({sum(refusals.values())}: {reason})"
        return self._liveness.of(link.server_id).problem()
