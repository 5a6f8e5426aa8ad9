"""The rows of the daemon's status model that read more than one part: what ``status`` (the
host socket, ``mcpl-router status``), ``/status.json`` and the status page show alike.

Read only, at the moment asked; no message text (the decisions' ``preview`` is ``[health]
statusPreview`` characters, none by default) and no secret.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from mcpl_router.hosts.connection import HostConnection
    from mcpl_router.hosts.sessions import SessionManager
    from mcpl_router.routing.names import ChannelNames
    from mcpl_router.store.journal import Journal
    from mcpl_router.tools.tune_out import TuneOuts

__all__ = ["CHANNELS_PER_PAGE", "agent_rows", "channel_page", "connection_rows", "journal_row"]

#: Channel rows per page of ``channelList`` (a daemon may hold 100k channels).
CHANNELS_PER_PAGE: Final = 200


def agent_rows(sessions: SessionManager, tune_outs: TuneOuts, names: ChannelNames) -> list[dict[str, object]]:
    """Each agent: who owns it, its wake policy in short, its unacked wakes and tune-outs."""
    rows = []
    specs = {spec.name: spec for spec in sessions.agents()}
    for row in sessions.statistics():
        spec = specs.get(row["name"])
        wake: dict[str, object] = {}
        if spec is not None:
            wake = {
                "tags": list(spec.wake_tags) if spec.wake_tags is not None else None,
                "channels": list(spec.wake_channels),
                "servers": list(spec.wake_servers),
                "gated": bool(spec.wake_gate.rules),
            }
        tuned = sorted(tune_outs.tuned_out(row["name"]), key=lambda ref: (ref.server_id, ref.channel_id))
        rows.append({
            **row,
            "wake": wake,
            "tunedOut": [{**ref.to_wire(), "shown": names.name_shown(ref)} for ref in tuned],
        })
    return rows


def connection_rows(connections: Collection[HostConnection]) -> list[dict[str, object]]:
    """Each host connection: its transport, since when, who said hello on it, and whether it
    stopped reading (its outbox backed up)."""
    rows = []
    for connection in sorted(connections, key=lambda c: c.id):
        stats = connection.peer.statistics() if connection.peer is not None else None
        session = connection.session
        rows.append({
            "connection": connection.id,
            "transport": connection.transport,
            "since": connection.opened_at,
            "host": session.host if session is not None else None,
            "agents": sorted(session.agents) if session is not None else [],
            "outboxMessages": stats.outbox_messages if stats is not None else 0,
            "outboxWaits": stats.outbox_waits if stats is not None else 0,
            "stalled": bool(stats.stalled) if stats is not None else False,
        })
    return rows


def channel_page(names: ChannelNames, page: int = 0, filter_text: str = "") -> dict[str, object]:
    """A page of the channel listing (``filter_text``: a case-insensitive part of a row's id,
    name, label or server), each shared id's rows next to each other with the name that picks
    each alone."""
    rows = [row.to_dict() for row in names.channel_list()]
    needle = filter_text.strip().lower()
    if needle:
        rows = [
            row for row in rows
            if any(needle in str(row.get(key) or "").lower() for key in ("channelId", "name", "label", "serverId", "shown"))
        ]
    # A shared id's rows together: sorted by id, then by registration order (stable sort).
    rows.sort(key=lambda row: str(row["channelId"]))
    counts: dict[str, int] = {}
    for row in rows:
        counts[str(row["channelId"])] = counts.get(str(row["channelId"]), 0) + 1
    for row in rows:
        row["sharedId"] = counts[str(row["channelId"])] > 1
    total = len(rows)
    page = max(0, page)
    start = page * CHANNELS_PER_PAGE
    return {
        "total": total,
        "page": page,
        "pages": max(1, -(-total // CHANNELS_PER_PAGE)),
        "perPage": CHANNELS_PER_PAGE,
        "filter": filter_text,
        "rows": rows[start : start + CHANNELS_PER_PAGE],
    }


def journal_row(journal: Journal) -> dict[str, object]:
    """The journal's statistics, with its backend, where it is and (a file's) size."""
    return {**journal.statistics().to_wire(), "backend": journal.backend, "path": journal.where, "sizeBytes": journal.size_bytes()}
