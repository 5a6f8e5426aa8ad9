"""Whether a ready server still answers: MCP ``ping`` at an interval, with a deadline.

A server stopped (SIGSTOP), wedged, or cut off without its socket closing stays "ready" to its
transport: nothing fails until something is asked of it. So each ready link is asked ``ping``
every ``mcplServers.<id>.ping.interval`` seconds (``PingPolicy``). Any answer counts as alive,
an error included: discord-mcpl, heartbeat-mcpl and mcpl-editor have no ``ping`` handler and
answer -32601, which shows they read and answer as well as a result would.

No answer within ``ping.timeout`` makes the link ``unresponsive`` (``status``, ``/readyz`` for a
required server, ``mcpl_router_server_responsive``), until an answer comes again. Two cases are
not called unresponsive, to raise no false alarm:

- a server that never answered a ping on this connection: one that leaves unknown requests
  unanswered would look dead forever. Its liveness is ``unknown`` (logged once per connection,
  with the fix: ``ping = false``) until it answers one;
- a server that sent the daemon anything while the ping waited: it is reading and writing.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Final

import attrs
import trio

from mcpl_router.jsonrpc import PeerClosed, RequestTimeout, RpcError
from mcpl_router.logs import Logger, get_logger
from mcpl_router.mcpl.link_state import LinkState, LinkUnavailable

if TYPE_CHECKING:
    from mcpl_router.mcpl.link import ServerLink

__all__ = ["ANSWERING", "NOT_CHECKED", "UNKNOWN", "UNRESPONSIVE", "LinkLiveness", "Liveness"]

#: A link's liveness, as ``status`` shows it.
ANSWERING: Final = "answering"
UNRESPONSIVE: Final = "unresponsive"
UNKNOWN: Final = "unknown"
NOT_CHECKED: Final = "not-checked"


@attrs.define
class LinkLiveness:
    """One link's pings on its current connection."""

    state: str = NOT_CHECKED
    epoch: int = 0
    #: Pings answered on this connection (any answer, an error included).
    answered: int = 0
    #: Pings that got nothing within their deadline, since start.
    missed: int = 0
    #: How long the latest answer took, in seconds.
    last_round_trip: float | None = None
    #: Wall-clock time the link became unresponsive (None while it is not).
    unresponsive_since: float | None = None
    #: The deadline the latest missed ping had, in seconds.
    missed_deadline: float | None = None

    def to_wire(self) -> dict[str, object]:
        return {
            "state": self.state,
            "answered": self.answered,
            "missed": self.missed,
            "lastRoundTripMs": None if self.last_round_trip is None else round(self.last_round_trip * 1000, 3),
            "unresponsiveSince": self.unresponsive_since,
        }

    def problem(self) -> str | None:
        """Why the link is not serving although ready, or None (a phrase after the server's id)."""
        if self.state != UNRESPONSIVE or self.unresponsive_since is None:
            return None
        for_how_long = max(0.0, time.time() - self.unresponsive_since)
        return (
            f"is connected but not answering: no answer to ping within {self.missed_deadline or 0:g} s"
            f" (unresponsive for {for_how_long:.0f} s)"
        )


class Liveness:
    """Every link's liveness; :meth:`watch` runs beside each link."""

    def __init__(self) -> None:
        self._links: dict[str, LinkLiveness] = {}
        self._log = get_logger()

    def of(self, server_id: str) -> LinkLiveness:
        """The server's liveness (not checked yet, for one never watched)."""
        return self._links.get(server_id) or LinkLiveness()

    def forget(self, server_id: str) -> None:
        self._links.pop(server_id, None)

    async def watch(self, link: ServerLink) -> None:
        """Ping ``link`` while it is ready, as its config says, until cancelled."""
        liveness = self._links.setdefault(link.server_id, LinkLiveness())
        log = self._log.bind(server=link.server_id)
        while True:
            await link.wait_ready()
            if liveness.epoch != link.epoch:
                # A new connection: what the last one did says nothing of this one.
                liveness.epoch, liveness.answered, liveness.unresponsive_since = link.epoch, 0, None
                liveness.state = NOT_CHECKED
            policy = link.config.ping
            if not policy.enabled:
                liveness.state = NOT_CHECKED
                await trio.sleep(policy.interval)
                continue
            await trio.sleep(policy.interval)
            if link.state is not LinkState.READY or link.epoch != liveness.epoch:
                continue
            await self._ping(link, liveness, policy.timeout, log)

    async def _ping(self, link: ServerLink, liveness: LinkLiveness, timeout: float, log: Logger) -> None:
        stats = link.peer_statistics()
        heard_before = stats.inbound_handled if stats is not None else 0
        started = trio.current_time()
        try:
            await link.call("ping", None, capability=None, timeout=timeout)
        except RpcError:
            pass  # an answer: it read the request and wrote one back
        except RequestTimeout:
            self._missed(link, liveness, timeout, heard_before, log)
            return
        except (PeerClosed, LinkUnavailable):
            return  # the connection ended: the link's own state says so
        liveness.last_round_trip = trio.current_time() - started
        liveness.answered += 1
        if liveness.state == UNRESPONSIVE:
            log.info("link.ping.answering_again", after_missed_for=round(time.time() - (liveness.unresponsive_since or time.time()), 3))
        elif liveness.state == UNKNOWN:
            log.info("link.ping.answered", round_trip_ms=round(liveness.last_round_trip * 1000, 3))
        liveness.state, liveness.unresponsive_since = ANSWERING, None

    def _missed(self, link: ServerLink, liveness: LinkLiveness, timeout: float, heard_before: int, log: Logger) -> None:
        liveness.missed += 1
        stats = link.peer_statistics()
        if stats is not None and stats.inbound_handled > heard_before:
            # It sent us something meanwhile: reading and writing, whatever it does with ping.
            log.info("link.ping.missed_but_heard", timeout=timeout)
            return
        if liveness.answered == 0:
            if liveness.state != UNKNOWN:
                log.warning(
                    "link.ping.never_answered", timeout=timeout,
                    hint="its liveness is unknown until it answers a ping; if it never answers unknown requests, set ping = false",
                )
            liveness.state = UNKNOWN
            return
        if liveness.state != UNRESPONSIVE:
            log.warning("link.ping.unresponsive", timeout=timeout, epoch=link.epoch)
            liveness.unresponsive_since = time.time()
        liveness.state, liveness.missed_deadline = UNRESPONSIVE, timeout
