"""Whether the daemon at the other end still answers: the probe :class:`FailoverClient` runs
on each of its connections.

A node that stops without closing its connection (SIGSTOP, a paused VM, a partition that drops
packets silently) leaves the socket open: nothing ends, the host's calls time out one by one,
and a host that only waits for wakes waits forever, while in a cluster another node has taken
the links over and serves. So: when nothing at all has arrived on the connection for
``probe_after`` seconds, one ``servers/list`` goes out with a deadline of ``probe_timeout``.
``servers/list`` because it is the cheapest call of the host API (one row per server, no journal
read; ``status`` builds the whole status model, channel page included). Anything arriving by the
deadline — its answer (an error answer too), a wake, any notification — says the node is alive.
Nothing: the node is unresponsive, and the caller closes the connection.

No load while traffic flows: the probe only goes after ``probe_after`` seconds of silence, so a
connection on which wakes or answers keep arriving is never probed. A host that doesn't read its
wakes is not taken for a dead node: a wake waiting for room in the buffer waits in its lane, and
the read loop reads on (answers included) until the connection's inbound bound (4096 messages)
is full behind it, which the daemon's 1024 outstanding wakes per connection never fill.
"""

from __future__ import annotations

import attrs
import trio

from mcpl_router.client.connection import RouterClient
from mcpl_router.jsonrpc import PeerClosed, RequestTimeout, RpcError

__all__ = ["PROBE_METHOD", "ProbeCounts", "watch"]

#: The request a probe sends.
PROBE_METHOD = "servers/list"


@attrs.define
class ProbeCounts:
    """Probes sent, and those unanswered (each closed its connection), over every connection."""

    sent: int = 0
    unanswered: int = 0


async def watch(client: RouterClient, *, probe_after: float, probe_timeout: float, counts: ProbeCounts) -> float | None:
    """Probe ``client`` whenever it has been quiet ``probe_after`` seconds; return once a probe
    went unanswered: the seconds nothing had arrived by then. None: the connection ended first,
    or its stream doesn't say when anything arrived. Runs until cancelled otherwise."""
    while not client.is_closed:
        heard = client.last_received
        if heard is None:
            return None
        quiet = trio.current_time() - heard
        if quiet < probe_after:
            await trio.sleep(probe_after - quiet)
            continue
        counts.sent += 1
        try:
            await client.call(PROBE_METHOD, timeout=probe_timeout)
        except RequestTimeout:
            now, heard_since = trio.current_time(), client.last_received
            if heard_since is not None and heard_since > heard:
                continue  # something else arrived meanwhile: alive, its answer only slow
            counts.unanswered += 1
            return now - heard
        except RpcError:
            continue  # an error answer is an answer
        except PeerClosed:
            return None
    return None
