"""The query commands (status, channels, explain, reload, health): find the running daemon,
ask it, and print its answer for a person (or ``--json``).

Where to ask comes from the command line (``--socket``, ``--url``) or the config file
(``--config``: only ``host``, ``journal`` and ``health`` are read, so no secret is needed). The
exit codes are cli.py's, the same for every command.
"""

from __future__ import annotations

import argparse
import json
import os
import stat
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio

from mcpl_router.exit_codes import EXIT_CONFIG, EXIT_OK, EXIT_REFUSED, EXIT_UNREACHABLE, UsageError, fail

if TYPE_CHECKING:
    from mcpl_router.config import DaemonLocation


class _Unreachable(Exception):
    """The daemon could not be reached; the message says where we looked and what to try."""


def _target(args: argparse.Namespace) -> tuple[str, str, str | None, DaemonLocation | None]:
    """Where to ask: ``("unix", path, None)``, ``("http", url, None)`` or ``("ws", url, token)``,
    and the daemon's location when its config was read.

    Raises:
        ConfigError: the config's host/health sections are invalid.
        _Unreachable: a ws:// URL whose token can't be read.
    """
    from mcpl_router.config import default_unix_socket_path, locate_daemon

    # The config is read when it locates the daemon, or holds the token a ws:// URL needs.
    wanted = not (args.socket or args.url) or (args.url or "").startswith("ws://")
    location = locate_daemon(args.config) if args.config and wanted else None
    if args.url:
        if args.url.startswith(("http://", "https://")):
            return "http", args.url, None, location
        if args.url.startswith("ws://"):
            return "ws", args.url, _read_token(args, location), location
        raise UsageError(f"--url {args.url!r}: give http://HOST:PORT (the [health] listener) or ws://HOST:PORT/PATH (the host WebSocket).")
    if args.socket:
        return "unix", args.socket, None, location
    if location is not None:
        if args.command == "health" and location.health_url is not None:
            return "http", location.health_url, None, location
        if location.unix_socket is None:
            raise UsageError(
                f"{location.source}: host.unixSocket is false, so there is no socket to ask. "
                "Give --url ws://HOST:PORT/ with --token-file, or enable host.unixSocket."
            )
        return "unix", str(location.unix_socket), None, location
    return "unix", str(default_unix_socket_path(os.environ)), None, None


def _not_a_socket(path: str) -> str | None:
    """Why ``path`` can't be the daemon's socket, where something else is there (connecting to
    it would only say "connection refused", as if a daemon had stopped)."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return None  # nothing there: said as "cannot reach … Is it running?"
    if stat.S_ISSOCK(mode):
        return None
    what = "a directory" if stat.S_ISDIR(mode) else "a regular file" if stat.S_ISREG(mode) else "not a socket"
    return (
        f"{path} is {what}, not a socket: give the daemon's host socket (its host.unixSocket) with "
        "--socket PATH, or its config with --config FILE."
    )


def _os_error_text(exc: OSError) -> str:
    """An OSError as a person reads it: its strerror, or that of the attempts inside it (trio's
    "all attempts to connect … failed" carries them as its cause), else its message."""
    from mcpl_router.errors import leaf_exceptions

    if exc.strerror:
        return exc.strerror
    cause = exc.__cause__
    if cause is not None:
        reasons = dict.fromkeys(
            leaf.strerror for leaf in leaf_exceptions(cause) if isinstance(leaf, OSError) and leaf.strerror
        )
        if reasons:
            return "; ".join(reasons)
    return str(exc) or type(exc).__name__


def _read_token(args: argparse.Namespace, location: DaemonLocation | None) -> str:
    path = args.token_file or (location.token_file if location is not None else None)
    if path is None:
        raise UsageError("a ws:// --url needs the host token: give --token-file PATH (the daemon's host.tokenFile), or --config.")
    try:
        return Path(path).read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise _Unreachable(f"can't read the host token file {path}: {exc.strerror}. Give --token-file PATH.") from None


def query(args: argparse.Namespace) -> int:
    """Run a query command; its exit code."""
    from mcpl_router.config import ConfigError

    try:
        kind, where, token, location = _target(args)
    except ConfigError as exc:
        print(str(exc), file=sys.stderr)
        return EXIT_CONFIG
    except UsageError as exc:
        return fail(str(exc), EXIT_CONFIG)
    except _Unreachable as exc:
        return fail(str(exc), EXIT_UNREACHABLE)
    if kind == "unix":
        problem = _not_a_socket(where)
        if problem is not None:
            return fail(problem, EXIT_CONFIG)
    if kind == "http":
        if args.command != "health":
            return fail(
                f"{where} is the [health] listener, which answers only `health`. Ask the host socket: --socket PATH (or --config).",
                EXIT_CONFIG,
            )
        return _health_over_http(where, as_json=args.json)
    method, params = {
        "status": ("status", {}),
        "health": ("status", {}),
        "channels": ("channels/list", {}),
        "reload": ("daemon/reload", {}),
        "explain": ("explain", {"name": getattr(args, "name", ""), "serverId": getattr(args, "server", None)}),
    }[args.command]

    async def ask() -> Any:
        from mcpl_router.client import RouterClient

        async def call(client: RouterClient) -> Any:
            if method != "channels/list":
                return await client.call(method, params)
            # Paged (docs/host-api.md): follow the cursor to the end.
            page = await client.call(method, params)
            rows = list(page["channels"])
            while page.get("nextCursor"):
                page = await client.call(method, {"cursor": page["nextCursor"]})
                rows.extend(page["channels"])
            return {"channels": rows}

        with trio.fail_after(QUERY_TIMEOUT):
            if kind == "unix":
                async with RouterClient.connect_unix(where) as client:
                    return await call(client)
            async with RouterClient.connect_websocket(where, token) as client:
                return await call(client)

    try:
        answer = trio.run(ask)
    except trio.TooSlowError:
        return fail(f"the daemon at {where} did not answer within {QUERY_TIMEOUT:g}s.", EXIT_UNREACHABLE)
    except BaseException as exc:
        message = _unreachable_message(exc, where, kind)
        if message is None:
            raise
        if location is not None and location.cluster_node is not None:
            message += (f" Node {location.cluster_node} is a cluster's node: its socket answers while the node runs (a standby"
                        " forwards to the node holding the links, and refuses while none does); `mcpl-router health --config …`"
                        " or its /readyz names the holder (docs/cluster.md).")
        return fail(message, _exit_code_of(exc))
    return _print_answer(args, answer)


def _exit_code_of(exc: BaseException) -> int:
    """The documented exit code of a query that failed: the daemon said no (3), refused our
    token (2: the config or --token-file is wrong), or could not be reached (1)."""
    from mcpl_router.errors import first_leaf
    from mcpl_router.jsonrpc import RpcError

    if first_leaf(exc, lambda leaf: isinstance(leaf, RpcError)) is not None:
        return EXIT_REFUSED
    if first_leaf(exc, lambda leaf: getattr(leaf, "status_code", None) in (401, 403)) is not None:
        return EXIT_CONFIG
    return EXIT_UNREACHABLE


#: How long a query command waits for the daemon's answer (a reload may stop servers: 20 s).
QUERY_TIMEOUT = 30.0


def _unreachable_message(exc: BaseException, where: str, kind: str) -> str | None:
    from mcpl_router.errors import first_leaf
    from mcpl_router.jsonrpc import PeerClosed, RpcError

    leaf = first_leaf(exc, lambda leaf: isinstance(leaf, (OSError, PeerClosed, RpcError)) or type(leaf).__module__.startswith("trio_websocket"))
    if leaf is None:
        return None
    if isinstance(leaf, RpcError):
        return f"the daemon refused the request: {leaf}"
    status = getattr(leaf, "status_code", None)
    if status == 401:
        return f"the daemon at {where} refused the token (401). Give --token-file with the daemon's host.tokenFile."
    detail = _os_error_text(leaf) if isinstance(leaf, OSError) else str(leaf) or type(leaf).__name__
    hint = "(--socket PATH, or --config FILE)" if kind == "unix" else "(--url)"
    return f"cannot reach the daemon at {where}: {detail}. Is it running? {hint}"


def _health_over_http(url: str, *, as_json: bool) -> int:
    base = url.rstrip("/")
    target = base if base.endswith(("/readyz", "/healthz")) else base + "/readyz"
    import h11

    try:
        status, body = trio.run(http_get, target, 10.0)
    except (OSError, trio.TooSlowError, h11.ProtocolError) as exc:
        if isinstance(exc, OSError):
            detail = _os_error_text(exc)
        elif isinstance(exc, trio.TooSlowError):
            detail = "no answer in 10s"
        else:
            detail = f"not an HTTP answer ({exc})"
        return fail(f"cannot reach the daemon's health listener at {target}: {detail}. Is it running? ([health] port)", EXIT_UNREACHABLE)
    text = body.decode("utf-8", "replace").strip()
    if as_json:
        print(json.dumps({"url": target, "status": status, "ready": status == 200, "body": text}, indent=2))
    else:
        print(text if status == 200 else f"{text} ({target}: HTTP {status})")
    return EXIT_OK if status == 200 else EXIT_REFUSED


async def http_get(url: str, timeout: float) -> tuple[int, bytes]:
    """GET ``url`` (http only) with h11; the status and the whole body."""
    import h11
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    host = parts.hostname or "127.0.0.1"
    port = parts.port or 80
    with trio.fail_after(timeout):
        stream = await trio.open_tcp_stream(host, port)
        async with stream:
            connection = h11.Connection(h11.CLIENT)
            authority = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
            request = h11.Request(method="GET", target=parts.path or "/", headers=[("Host", authority), ("Connection", "close")])
            await stream.send_all(connection.send(request) + connection.send(h11.EndOfMessage()))
            status = 0
            body = b""
            while True:
                event = connection.next_event()
                if event is h11.NEED_DATA:
                    connection.receive_data(await stream.receive_some(65536))
                elif isinstance(event, h11.Response):
                    status = event.status_code
                elif isinstance(event, h11.Data):
                    body += event.data
                elif isinstance(event, (h11.EndOfMessage, h11.ConnectionClosed)):
                    return status, body


def _print_answer(args: argparse.Namespace, answer: Any) -> int:
    command = args.command
    if command == "health":
        readiness = answer.get("readiness") or {"ready": answer["ready"] > 0, "problems": []}
        total = len(answer["servers"])
        if args.json:
            print(json.dumps(readiness, indent=2))
        elif readiness["ready"]:
            print(f"ready: {answer['ready']}/{total} servers ready")
        else:
            print("not ready: " + "; ".join(readiness["problems"]))
        return EXIT_OK if readiness["ready"] else EXIT_REFUSED
    if args.json:
        print(json.dumps(answer, indent=2))
    elif command == "status":
        _print_status(answer)
    elif command == "channels":
        for row in answer["channels"]:
            print(f"  {row['shown']:<32} server={row['serverId']} id={row['channelId']} open={row.get('open')}")
    elif command == "explain":
        _print_explain(answer)
    elif command == "reload":
        print(_reload_summary(answer))
    if command == "explain" and answer.get("resolved") is None:
        return EXIT_REFUSED
    if command == "reload" and answer.get("outcome") != "applied":
        return EXIT_REFUSED
    return EXIT_OK


def _print_status(answer: Any) -> None:
    readiness = answer.get("readiness") or {}
    state = "ready" if readiness.get("ready", True) else "NOT READY"
    print(f"mcpl-router {answer['version']}: {state}, {answer['ready']}/{len(answer['servers'])} servers ready, {answer['channels']} channels")
    for problem in readiness.get("problems", []):
        print(f"  ! {problem}")
    for server in answer["servers"]:
        required = " (required)" if server.get("required") else ""
        # A connected server that stopped answering ping shows as such, not as "ready".
        unresponsive = (server.get("liveness") or {}).get("state") == "unresponsive" and server["state"] == "ready"
        shown_state = "unresponsive" if unresponsive else server["state"]
        print(f"  {server['serverId']:<16} {shown_state:<10} {server['transport']:<10} {server['endpoint']}{required}")
        if server.get("problem") and server["state"] == "ready":
            print(f"      {server['problem']}")
        elif server.get("lastError") and server["state"] != "ready":
            print(f"      last error: {server['lastError']}")
        if server.get("registrationsRefused"):
            reasons = "; ".join(f"{count}× {reason}" for reason, count in server.get("refusalReasons", {}).items())
            print(f"      {server['registrationsRefused']} channel registrations refused: {reasons}")
        if server.get("exitCode") is not None and server["state"] != "ready":
            print(f"      exit code {server['exitCode']}; its last stderr lines:")
            for line in server.get("stderr", [])[-5:]:
                print(f"        | {line}")
    _print_cluster(answer.get("cluster"))
    _print_channel_decisions(answer.get("channelDecisions") or {})
    for agent in answer.get("agents", []):
        owner = f"owned by {agent['host']}" if agent["host"] else "not claimed"
        print(f"  agent {agent['name']:<12} {agent['proseRouting']:<9} {owner}, {agent['unackedWakes']} unacked wakes")
    reload = answer.get("lastReload")
    if reload:
        when = time.strftime("%H:%M:%S", time.localtime(reload["at"]))
        print(f"  last reload at {when}: {_reload_summary(reload)}")


def _clock(at: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(at))


def _print_cluster(cluster: Any) -> None:
    """A cluster's node (docs/cluster.md): who holds the links, since when, and every node."""
    if not cluster:
        return
    lease = cluster.get("lease") or {}
    balanced = cluster.get("linkHoldings") is not None
    what = "the router's lease" if balanced else "the links"
    holding = f"holding {what}, epoch {lease['epoch']} since {_clock(lease['since'])}" if lease else cluster["state"]
    print(f"  cluster: node {cluster['node']} {holding}; lease {cluster['leaseTtl']:g}s, {cluster.get('terms', 0)} terms held,"
          f" {cluster.get('leasesLost', 0)} lost")
    if balanced:
        print(f"    links: {cluster.get('placement')}")
        for link in cluster.get("links", []):
            held = f"on node {link['node']}, epoch {link['epoch']} since {_clock(link['since'])}" if link["expiresIn"] > 0 \
                else f"free (last on node {link['node']}, epoch {link['epoch']})"
            print(f"    link {link['server']:<16} {held}")
    proxied = cluster.get("proxied") or {}
    if proxied.get("total") or proxied.get("refused"):
        refused = "; ".join(f"{count}× {reason}" for reason, count in sorted((proxied.get("refused") or {}).items()))
        print(f"    host connections forwarded to the holder while a standby: {proxied.get('open', 0)} now, {proxied.get('total', 0)} in all"
              + (f"; refused {refused}" if refused else ""))
    for node in cluster.get("nodes", []):
        info = node.get("info") or {}
        where = f"pid {info.get('pid')} on {info.get('hostname')}" + (f", {info['hostSocket']}" if info.get("hostSocket") else "")
        # A node not heard of for a lease holds nothing, whatever its last heartbeat said.
        state = node["state"] if node.get("live") else f"gone (last said {node['state']})"
        print(f"    node {node['node']:<12} {state:<9} seen {node['seenAgo']:.1f}s ago; {where}")


_RECONCILES = (("open-done", "reopened"), ("open-failed", "reopen refused"), ("close-done", "closed again"),
               ("close-failed", "close refused"))


def _print_channel_decisions(decisions: Any) -> None:
    """How the servers are held to the agents' channel decisions: said only once something
    was reconciled, or a channel's server state differs from what its agents decided."""
    counts = decisions.get("reconciled") or {}
    diverging = decisions.get("diverging") or []
    pending = decisions.get("pending") or 0
    if not counts and not diverging and not pending:
        return
    parts = [f"{counts[key]} {label}" for key, label in _RECONCILES if counts.get(key)]
    if pending:
        parts.append(f"{pending} waiting")
    print(f"  channel decisions: {', '.join(parts) or 'none reconciled yet'}")
    for row in diverging:
        last = row.get("last")
        tried = ""
        if last:
            tried = f"; last {last['action']} {'refused: ' + str(last['reason']) if last['outcome'] == 'failed' else 'done'}"
        print(f"  ! {row['serverId']}:{row['channelId']} desired {row['desired']}, registered {row['registered']}{tried}")


def _reload_summary(reload: Any) -> str:
    if reload.get("outcome") != "applied":
        return "refused, the old config keeps running: " + " / ".join(reload.get("errors", []))
    parts = [
        f"{label} {', '.join(reload[key])}"
        for key, label in (
            ("added", "added"),
            ("removed", "removed"),
            ("reconnected", "reconnected"),
            ("regranted", "re-granted"),
            ("updated", "updated"),
            ("agentsAdded", "agents added"),
            ("agentsChanged", "agents changed"),
        )
        if reload.get(key)
    ]
    if reload.get("restartNeeded"):
        parts.append(f"needs a restart to apply: {', '.join(reload['restartNeeded'])}")
    if reload.get("policyPending"):
        # Narrowed host-side already; these servers are still being told their new grant.
        parts.append(f"policy still being sent to: {', '.join(reload['policyPending'])}")
    return "applied: " + ("; ".join(parts) if parts else "nothing changed")


def _print_explain(answer: Any) -> None:
    name = json.dumps(answer["name"])
    resolved = answer.get("resolved")
    if resolved is not None:
        print(f"{name} picks channel {resolved['channelId']} on server {resolved['serverId']} ({answer['ruleText']})")
    else:
        refusal = answer.get("refusal") or {}
        print(f"{name} picks no single channel ({answer['rule']}): {refusal.get('text', answer['ruleText'])}")
    for candidate in answer.get("candidates", []):
        alone = f", picked alone by {json.dumps(candidate['picksAlone'])}" if candidate.get("picksAlone") else ""
        print(f"  candidate {candidate['shown']} (server {candidate['serverId']}, id {candidate['channelId']}; matched by {', '.join(candidate['matchedBy'])}{alone})")
