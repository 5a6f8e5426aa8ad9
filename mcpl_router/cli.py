"""The ``mcpl-router`` command: run | demo | check-config | status | channels | explain NAME."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio

from mcpl_router import __version__

if TYPE_CHECKING:
    from mcpl_router.daemon import Daemon


#: Exit codes (docs/operations.md): the same for every command.
EXIT_OK = 0
#: The daemon could not be reached (no socket, nothing listening, refused connection).
EXIT_UNREACHABLE = 1
#: Bad usage or an invalid config: nothing was done (``run``: the daemon did not start).
EXIT_CONFIG = 2
#: The daemon answered no: not ready (``health``), a name that picks no channel
#: (``explain``), a reload it refused (``reload``).
EXIT_REFUSED = 3


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mcpl-router",
        description=__doc__,
        epilog="exit codes: 0 ok; 1 daemon unreachable; 2 bad config or usage; 3 the daemon answered no "
        "(not ready, name refused, reload refused)",
    )
    parser.add_argument("--version", action="version", version=f"mcpl-router {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)

    run = commands.add_parser("run", help="run the daemon with a config file")
    run.add_argument("--config", required=True, help="TOML or JSON config (mcpl-servers.json shape works)")
    run.add_argument("--log-level", default=None, help="override logging.level")

    demo = commands.add_parser("demo", help="two bundled servers sharing a channel id; no external service")
    demo.add_argument("--once", action="store_true", help="print the overview and exit")
    demo.add_argument("--log-level", default="error", help="show the daemon's log lines at this level and above (default: error)")

    check = commands.add_parser("check-config", help="validate a config file and say what it configures")
    check.add_argument("file")

    for name, help_text in (
        ("status", "the daemon's servers (and why one isn't ready), agents and the last reload"),
        ("channels", "every registered channel"),
        ("reload", "re-read the daemon's config file now (as SIGHUP does) and say what changed"),
    ):
        sub = commands.add_parser(name, help=help_text)
        _socket_args(sub)

    health = commands.add_parser(
        "health", help="exit 0 when the daemon is ready (its /readyz, else its socket); the container health check"
    )
    _socket_args(health)

    explain = commands.add_parser("explain", help="how a channel name resolves, and why (exit 3 when it picks none)")
    explain.add_argument("name")
    explain.add_argument("--server", default=None, help="a serverId given beside the name")
    _socket_args(explain)
    return parser


def _socket_args(sub: argparse.ArgumentParser) -> None:
    sub.add_argument(
        "--config", default=None, help="find the daemon from this config (reads only host.*, journal.*, health.*: no secrets needed)"
    )
    sub.add_argument("--socket", default=None, help="the daemon's host Unix socket path")
    sub.add_argument(
        "--url", default=None, help="http://HOST:PORT of its [health] listener (health only), or ws://… of its host WebSocket"
    )
    sub.add_argument("--token-file", default=None, help="with a ws:// --url: the file holding the host token (default host.tokenFile)")
    sub.add_argument("--json", action="store_true", help="print the raw JSON answer")


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "check-config":
            from mcpl_router.config import check_config

            ok, text = check_config(args.file)
            print(text, file=sys.stdout if ok else sys.stderr)
            return EXIT_OK if ok else EXIT_CONFIG
        if args.command == "run":
            return _run(args)
        if args.command == "demo":
            from mcpl_router.demo import run_demo
            from mcpl_router.logs import configure_logging

            configure_logging(args.log_level, json=False)
            return trio.run(lambda: run_demo(once=args.once))
        return _query(args)
    except KeyboardInterrupt:
        return 130


#: The cyclic collector's thresholds while the daemon serves (Python's default: 700, 10, 10).
GC_THRESHOLDS = (20_000, 20, 20)


def tune_gc() -> None:
    """Keep the cyclic collector off the message path.

    A message's objects (its task, events, wake, answer) live for a few commits; with the
    default thresholds they survive into the older generations, which are collected every few
    hundred messages (2 ms each) and, now and then, whole (60 ms with a server's worth of
    channels loaded): the latency's tail. Everything built before the daemon runs (modules,
    the parsed config) is frozen out of the collector's scans — what ``Daemon.run`` loads
    later (the journal's state, the registry) is not — and the young generation is collected
    less often, so what a message leaves behind dies young.
    """
    import gc

    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


def _fail(message: str, code: int) -> int:
    print(f"mcpl-router: {message}", file=sys.stderr)
    return code


def _run(args: argparse.Namespace) -> int:
    from mcpl_router.config import ConfigError, load_config
    from mcpl_router.daemon import Daemon
    from mcpl_router.logs import configure_logging

    try:
        config = load_config(args.config)
    except ConfigError as exc:
        print(str(exc), file=sys.stderr)
        return EXIT_CONFIG
    fmt = config.logging.format
    configure_logging(args.log_level or config.logging.level, json=None if fmt == "auto" else fmt == "json")
    from mcpl_router.config import preflight
    from mcpl_router.logs import get_logger

    # The checks check-config makes (config/preflight.py): a refusal before anything is made,
    # listens or dials; a problem said once, up front, with the key and the fix, but not fatal
    # (a program may be installed, a directory mounted, later; the link retries).
    checks = preflight(config)
    if checks.refusals:
        for refusal in checks.refusals:
            print(f"mcpl-router: not started: {refusal}", file=sys.stderr)
        return EXIT_CONFIG
    for problem in checks.problems:
        get_logger().warning("config.runtime_problem", key=problem.key, problem=problem.problem, fix=problem.fix)
    try:
        daemon = Daemon(config)
        tune_gc()
        trio.run(run_until_signalled, daemon)
    except BaseException as exc:
        refusal = _startup_refusal(exc)
        if refusal is None:
            raise
        print(f"mcpl-router: not started: {refusal}", file=sys.stderr)
        return EXIT_CONFIG
    return EXIT_OK


def _startup_refusal(exc: BaseException) -> BaseException | None:
    """A refusal to start (unsafe socket directory, token problems, a port in use), found even
    inside a group."""
    from mcpl_router.errors import StartupRefusal, first_leaf
    from mcpl_router.hosts.auth import HostAuthError
    from mcpl_router.hosts.listener import SocketSetupError
    from mcpl_router.store.journal import JournalLocked

    return first_leaf(exc, lambda leaf: isinstance(leaf, (SocketSetupError, HostAuthError, StartupRefusal, JournalLocked)))


class _Unreachable(Exception):
    """The daemon could not be reached; the message says where we looked and what to try."""


class _Usage(Exception):
    """The command line can't say where the daemon is; the message says what to give."""


def _target(args: argparse.Namespace) -> tuple[str, str, Any]:
    """Where to ask: ``("unix", path, None)``, ``("http", url, None)`` or ``("ws", url, token)``.

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
            return "http", args.url, None
        if args.url.startswith("ws://"):
            return "ws", args.url, _read_token(args, location)
        raise _Usage(f"--url {args.url!r}: give http://HOST:PORT (the [health] listener) or ws://HOST:PORT/PATH (the host WebSocket).")
    if args.socket:
        return "unix", args.socket, None
    if location is not None:
        if args.command == "health" and location.health_url is not None:
            return "http", location.health_url, None
        if location.unix_socket is None:
            raise _Usage(
                f"{location.source}: host.unixSocket is false, so there is no socket to ask. "
                "Give --url ws://HOST:PORT/ with --token-file, or enable host.unixSocket."
            )
        return "unix", str(location.unix_socket), None
    return "unix", str(default_unix_socket_path(os.environ)), None


def _read_token(args: argparse.Namespace, location: Any) -> str:
    path = args.token_file or (location.token_file if location is not None else None)
    if path is None:
        raise _Usage("a ws:// --url needs the host token: give --token-file PATH (the daemon's host.tokenFile), or --config.")
    try:
        return Path(path).read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise _Unreachable(f"can't read the host token file {path}: {exc.strerror}. Give --token-file PATH.") from None


def _query(args: argparse.Namespace) -> int:
    from mcpl_router.config import ConfigError

    try:
        kind, where, token = _target(args)
    except ConfigError as exc:
        print(str(exc), file=sys.stderr)
        return EXIT_CONFIG
    except _Usage as exc:
        return _fail(str(exc), EXIT_CONFIG)
    except _Unreachable as exc:
        return _fail(str(exc), EXIT_UNREACHABLE)
    if kind == "http":
        if args.command != "health":
            return _fail(
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
        return _fail(f"the daemon at {where} did not answer within {QUERY_TIMEOUT:g}s.", EXIT_UNREACHABLE)
    except BaseException as exc:
        message = _unreachable_message(exc, where, kind)
        if message is None:
            raise
        return _fail(message, _exit_code_of(exc))
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
    detail = getattr(leaf, "strerror", None) or str(leaf) or type(leaf).__name__
    hint = "(--socket PATH, or --config FILE)" if kind == "unix" else "(--url)"
    return f"cannot reach the daemon at {where}: {detail}. Is it running? {hint}"


def _health_over_http(url: str, *, as_json: bool) -> int:
    base = url.rstrip("/")
    target = base if base.endswith(("/readyz", "/healthz")) else base + "/readyz"
    import h11

    try:
        status, body = trio.run(_http_get, target, 10.0)
    except (OSError, trio.TooSlowError, h11.ProtocolError) as exc:
        detail = getattr(exc, "strerror", None) or ("no answer in 10s" if isinstance(exc, trio.TooSlowError) else f"not an HTTP answer ({exc})")
        return _fail(f"cannot reach the daemon's health listener at {target}: {detail}. Is it running? ([health] port)", EXIT_UNREACHABLE)
    text = body.decode("utf-8", "replace").strip()
    if as_json:
        print(json.dumps({"url": target, "status": status, "ready": status == 200, "body": text}, indent=2))
    else:
        print(text if status == 200 else f"{text} ({target}: HTTP {status})")
    return EXIT_OK if status == 200 else EXIT_REFUSED


async def _http_get(url: str, timeout: float) -> tuple[int, bytes]:
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
        print(f"  {server['serverId']:<16} {server['state']:<10} {server['transport']:<10} {server['endpoint']}{required}")
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
    for agent in answer.get("agents", []):
        owner = f"owned by {agent['host']}" if agent["host"] else "not claimed"
        print(f"  agent {agent['name']:<12} {agent['proseRouting']:<9} {owner}, {agent['unackedWakes']} unacked wakes")
    reload = answer.get("lastReload")
    if reload:
        when = time.strftime("%H:%M:%S", time.localtime(reload["at"]))
        print(f"  last reload at {when}: {_reload_summary(reload)}")


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


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())


async def run_until_signalled(daemon: Daemon, *, task_status: trio.TaskStatus[Daemon] = trio.TASK_STATUS_IGNORED) -> None:
    """Run ``daemon``; SIGINT or SIGTERM starts a graceful shutdown (a second one too);
    SIGHUP reloads the config file."""
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM, signal.SIGHUP) as signals:
        async with trio.open_nursery() as nursery:

            async def watch() -> None:
                async for signum in signals:
                    name = signal.Signals(signum).name
                    from mcpl_router.logs import get_logger

                    get_logger().info("daemon.signal", signal=name)
                    if signum == signal.SIGHUP:
                        daemon.request_reload()
                    else:
                        daemon.request_shutdown(f"signal {name}")

            nursery.start_soon(watch)
            await daemon.run(task_status=task_status)
            nursery.cancel_scope.cancel()
