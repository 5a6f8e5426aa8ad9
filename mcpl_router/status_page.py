"""The status page (``GET /`` and ``/status`` on the health listener): the status model as one
server-rendered HTML page, for a person with a browser.

No build step and nothing fetched from elsewhere (it works offline): inline CSS, no script; it
reloads itself every few seconds, and reads on a phone (tables scroll sideways). Every value is
HTML-escaped where it is written, so a channel named ``<script>`` is shown as text. It shows what
the model holds and nothing more: no secret, and no message text beyond ``[health]
statusPreview`` characters (none by default).
"""

from __future__ import annotations

import html
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Final
from urllib.parse import urlencode

__all__ = ["REFRESH_SECONDS", "render_status_page"]

#: How often the page reloads itself.
REFRESH_SECONDS: Final = 5

_STYLE: Final = """
body{font:14px/1.4 system-ui,sans-serif;margin:0 auto;padding:0 12px 24px;max-width:1200px;color:#222}
h1{font-size:20px;margin:16px 0 4px}h2{font-size:16px;margin:22px 0 6px}
.scroll{overflow-x:auto}table{border-collapse:collapse;width:100%;margin:4px 0}
th,td{border-bottom:1px solid #ddd;padding:4px 6px;text-align:left;vertical-align:top;white-space:nowrap}
th{background:#f3f3f3;font-weight:600}tr.shared td{background:#fff8e1}
.ok{color:#1b7f2a;font-weight:600}.bad{color:#b3261e;font-weight:600}.dim{color:#777}
code{font:12px ui-monospace,monospace}form{margin:6px 0}
input[type=search]{font:inherit;padding:3px 6px;width:16em}
"""


def e(value: object) -> str:
    """``value`` as HTML text: escaped, whatever it holds (None shows as a dash)."""
    if value is None:
        return "–"
    return html.escape(str(value), quote=True)


def _table(headers: Sequence[str], rows: Iterable[Sequence[str]], *, row_classes: Sequence[str] = ()) -> str:
    """A table of already-escaped cells (every caller escapes with :func:`e`)."""
    head = "".join(f"<th>{e(h)}</th>" for h in headers)
    body = []
    for index, cells in enumerate(rows):
        css = row_classes[index] if index < len(row_classes) and row_classes[index] else ""
        body.append(f'<tr class="{css}">' + "".join(f"<td>{cell}</td>" for cell in cells) + "</tr>")
    if not body:
        body.append(f'<tr><td colspan="{len(headers)}" class="dim">none</td></tr>')
    return f'<div class="scroll"><table><tr>{head}</tr>{"".join(body)}</table></div>'


def _ago(stamp: object, now: float) -> str:
    if not isinstance(stamp, (int, float)):
        return "–"
    seconds = max(0, int(now - stamp))
    return f"{seconds // 3600}h {seconds % 3600 // 60}m ago" if seconds >= 3600 else f"{seconds // 60}m {seconds % 60}s ago"


def _map(value: object) -> Mapping[str, object]:
    """``value`` when it is a JSON object, else an empty one: the page shows what is there."""
    return value if isinstance(value, Mapping) else {}


def _rows(value: object) -> list[Mapping[str, object]]:
    """The objects of a JSON array (none when ``value`` is not one)."""
    return [row for row in value if isinstance(row, Mapping)] if isinstance(value, (list, tuple)) else []


def _strings(value: object) -> list[str]:
    """A JSON array's items as text (none when ``value`` is not one)."""
    return [str(item) for item in value] if isinstance(value, (list, tuple)) else []


def _int(value: object, default: int) -> int:
    return value if isinstance(value, int) and value else default


def _ref(row: Mapping[str, object]) -> str:
    if not row:
        return "–"
    return f"{e(row.get('serverId'))}:<code>{e(row.get('channelId'))}</code>"


def _servers(model: Mapping[str, object], now: float) -> str:
    rows = []
    for server in _rows(model.get("servers")):
        liveness = _map(server.get("liveness"))
        state = server.get("state")
        css = "ok" if server.get("serving") else "bad"
        grant = _map(server.get("grant"))
        rows.append([
            e(server.get("serverId")) + (' <span class="dim">(required)</span>' if server.get("required") else ""),
            f'<span class="{css}">{e(state)}</span>',
            e(server.get("epoch")),
            e(server.get("channelCount")),
            e(f"{len(_strings(grant.get('granted')))} granted, {grant.get('deniedCount', 0)} denied"),
            e(liveness.get("state")) + (f" ({e(liveness.get('lastRoundTripMs'))} ms)" if liveness.get("lastRoundTripMs") is not None else ""),
            e(server.get("problem") or server.get("lastError")),
            e(_ago(server.get("since"), now)),
        ])
    return _table(["server", "state", "epoch", "channels", "grant", "ping", "problem / last error", "since"], rows)


def _channels(model: Mapping[str, object], base: str) -> str:
    listing = _map(model.get("channelList"))
    rows, classes = [], []
    for row in _rows(listing.get("rows")):
        classes.append("shared" if row.get("sharedId") else "")
        rows.append([
            f"<code>{e(row.get('channelId'))}</code>",
            e(row.get("serverId")),
            f"<code>{e(row.get('name') or row.get('shown'))}</code>",
            e(row.get("label")),
            e(row.get("type")),
            e(row.get("direction")),
            '<span class="ok">open</span>' if row.get("open") else '<span class="dim">closed</span>',
        ])
    filter_text = str(listing.get("filter") or "")
    page, pages = _int(listing.get("page"), 0), _int(listing.get("pages"), 1)
    links = []
    if page > 0:
        links.append(f'<a href="{e(base + "?" + urlencode({"page": page - 1, "filter": filter_text}))}">previous</a>')
    if page + 1 < pages:
        links.append(f'<a href="{e(base + "?" + urlencode({"page": page + 1, "filter": filter_text}))}">next</a>')
    form = (
        f'<form method="get" action="{e(base)}"><input type="search" name="filter" value="{e(filter_text)}" '
        'placeholder="filter by id, name, label, server"> <button>filter</button></form>'
    )
    summary = f'<p class="dim">{e(listing.get("total", 0))} channels; page {page + 1} of {pages}. {" ".join(links)} Shared ids are highlighted: each row\'s name is the one that picks it alone.</p>'
    return form + summary + _table(["id", "server", "name that picks it", "label", "type", "direction", "open"], rows, row_classes=classes)


def _agents(model: Mapping[str, object]) -> str:
    rows = []
    for agent in _rows(model.get("agents")):
        wake = _map(agent.get("wake"))
        policy = []
        if wake.get("tags") is not None:
            policy.append("tags " + ", ".join(_strings(wake["tags"])))
        if wake.get("channels"):
            policy.append("channels " + ", ".join(_strings(wake["channels"])))
        if wake.get("servers"):
            policy.append("servers " + ", ".join(_strings(wake["servers"])))
        if wake.get("gated"):
            policy.append("gated")
        tuned = ", ".join(str(ref.get("shown")) for ref in _rows(agent.get("tunedOut")))
        rows.append([
            e(agent.get("name")),
            e(agent.get("proseRouting")),
            e(agent.get("host")) if agent.get("host") else '<span class="dim">not claimed</span>',
            e("; ".join(policy) or "default (addressed)"),
            e(agent.get("unackedWakes")),
            e(tuned or None),
        ])
    return _table(["agent", "prose routing", "owner host", "wake policy", "unacked wakes", "tuned out"], rows)


def _hosts(model: Mapping[str, object], now: float) -> str:
    rows = []
    for connection in _rows(model.get("hostConnections")):
        rows.append([
            e(connection.get("connection")),
            e(connection.get("transport")),
            e(connection.get("host")),
            e(", ".join(_strings(connection.get("agents"))) or None),
            e(_ago(connection.get("since"), now)),
            e(connection.get("outboxMessages")),
            '<span class="bad">stalled</span>' if connection.get("stalled") else "no",
        ])
    return _table(["connection", "transport", "host", "agents", "since", "outbox", "stalled"], rows)


def _decisions(model: Mapping[str, object], now: float) -> str:
    decisions = _map(model.get("decisions"))
    rows, classes = [], []
    for decision in _rows(decisions.get("latest")):
        kind = decision.get("kind")
        css = "ok" if kind == "delivered" else "bad" if kind in ("failed", "refused", "bounced") else ""
        candidates = ", ".join(f"{c.get('serverId')}:{c.get('channelId')}" for c in _rows(decision.get("candidates")))
        where = _ref(_map(decision.get("channel"))) if decision.get("channel") else f"<code>{e(decision.get('name'))}</code>"
        rows.append([
            e(_ago(decision.get("at"), now)),
            f'<span class="{css}">{e(kind)}</span>',
            e(decision.get("via")),
            e(decision.get("agent")),
            where,
            e(decision.get("reason")),
            e(candidates or None),
            e(decision.get("preview")),
        ])
        classes.append("")
    note = f'<p class="dim">the newest {e(decisions.get("keep"))} of {e(decisions.get("recorded", 0))} since start</p>'
    return note + _table(["when", "decision", "via", "agent", "channel / name", "reason", "candidates", "words"], rows, row_classes=classes)


def _journal(model: Mapping[str, object]) -> str:
    journal = _map(model.get("journal"))
    failing = journal.get("failing")
    state = f'<span class="bad">failing: {e(failing)}</span>' if failing else '<span class="ok">ok</span>'
    size = journal.get("sizeBytes")
    rows = [[
        e(journal.get("backend")),
        f"<code>{e(journal.get('path'))}</code>",
        e(f"{size / 1048576:.1f} MiB" if isinstance(size, int) else None),
        e(journal.get("lastSeq")),
        e(journal.get("lastCommitMs")),
        e(journal.get("queuedWrites")),
        state,
    ]]
    return _table(["backend", "file", "size", "last seq", "last commit (ms)", "queued writes", "state"], rows)


def _cluster(model: Mapping[str, object], now: float) -> str:
    """A cluster's node (docs/cluster.md): this node, every node, who holds which lease."""
    cluster = _map(model.get("cluster"))
    if not cluster:
        return ""
    lease = _map(cluster.get("lease"))
    holding = f"holding, epoch {e(lease.get('epoch'))} since {_ago(lease.get('since'), now)}" if lease else e(cluster.get("state"))
    nodes = [
        [e(node.get("node")), e(node.get("state")) if node.get("live") else f'<span class="bad">gone</span> (last said {e(node.get("state"))})',
         e(f"{float(str(node.get('seenAgo', 0))):.1f}s ago")]
        for node in _rows(cluster.get("nodes"))
    ]
    links = [
        [e(link.get("server")), e(link.get("node")) if float(str(link.get("expiresIn", 0))) > 0 else '<span class="bad">free</span>',
         e(link.get("epoch")), _ago(link.get("since"), now)]
        for link in _rows(cluster.get("links"))
    ]
    return (
        f"<h2>Cluster</h2><p>node <b>{e(cluster.get('node'))}</b>: {holding} · lease {e(cluster.get('leaseTtl'))} s"
        + (f" · links {e(cluster.get('placement'))}" if cluster.get("placement") else "") + "</p>"
        + _table(["node", "state", "heard of"], nodes)
        + (_table(["server", "link held by", "epoch", "since"], links) if links else "")
    )


def render_status_page(model: Mapping[str, object], *, base: str = "/status", now: float | None = None) -> str:
    """The page for ``model`` (the daemon's status, as ``/status.json`` gives it)."""
    now = time.time() if now is None else now
    readiness = _map(model.get("readiness"))
    ready = bool(readiness.get("ready"))
    problems = "".join(f"<li>{e(problem)}</li>" for problem in _strings(readiness.get("problems")))
    headline = (
        f'<span class="{"ok" if ready else "bad"}">{"ready" if ready else "not ready"}</span> · '
        f'{e(model.get("ready"))}/{e(len(_rows(model.get("servers"))))} servers serving · {e(model.get("channels"))} channels · '
        f'{e(model.get("openTurns"))} open turns · last seq {e(model.get("lastSeq"))}'
    )
    return (
        "<!doctype html><html lang=en><head><meta charset=utf-8>"
        '<meta name="viewport" content="width=device-width,initial-scale=1">'
        f'<meta http-equiv="refresh" content="{REFRESH_SECONDS}">'
        f"<title>mcpl-router {e(model.get('version'))}</title><style>{_STYLE}</style></head><body>"
        f"<h1>mcpl-router {e(model.get('version'))}</h1><p>{headline}</p>"
        + (f"<ul>{problems}</ul>" if problems else "")
        + _cluster(model, now)
        + f"<h2>Servers</h2>{_servers(model, now)}"
        + f"<h2>Channels</h2>{_channels(model, base)}"
        + f"<h2>Agents</h2>{_agents(model)}"
        + f"<h2>Hosts</h2>{_hosts(model, now)}"
        + f"<h2>Recent routing decisions</h2>{_decisions(model, now)}"
        + f"<h2>Journal</h2>{_journal(model)}"
        + f'<p class="dim">Reloads every {REFRESH_SECONDS} s. The same data: <a href="/status.json">/status.json</a>.</p>'
        + "</body></html>"
    )
