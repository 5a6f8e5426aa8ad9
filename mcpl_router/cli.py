"""The ``mcpl-router`` command: run | demo | check-config | status | channels | explain NAME."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

import trio

from mcpl_router import __version__


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mcpl-router", description=__doc__)
    parser.add_argument("--version", action="version", version=f"mcpl-router {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)

    run = commands.add_parser("run", help="run the daemon with a config file")
    run.add_argument("--config", required=True, help="TOML or JSON config (mcpl-servers.json shape works)")
    run.add_argument("--log-level", default=None, help="override logging.level")

    demo = commands.add_parser("demo", help="two bundled servers sharing a channel id; no external service")
    demo.add_argument("--once", action="store_true", help="print the overview and exit")
    demo.add_argument("--log-level", default="warning")

    check = commands.add_parser("check-config", help="validate a config file and say what it configures")
    check.add_argument("file")

    for name, help_text in (("status", "the daemon's servers and counts"), ("channels", "every registered channel")):
        sub = commands.add_parser(name, help=help_text)
        _socket_args(sub)

    health = commands.add_parser("health", help="exit 0 when the daemon answers on its host socket (container health check)")
    _socket_args(health)

    explain = commands.add_parser("explain", help="how a channel name resolves, and why")
    explain.add_argument("name")
    explain.add_argument("--server", default=None, help="a serverId given beside the name")
    _socket_args(explain)
    return parser


def _socket_args(sub: argparse.ArgumentParser) -> None:
    sub.add_argument("--config", default=None, help="read host.unixSocket from this config")
    sub.add_argument("--socket", default=None, help="the daemon's host socket path")
    sub.add_argument("--json", action="store_true", help="print the raw JSON answer")


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "check-config":
        from mcpl_router.config import check_config

        ok, text = check_config(args.file)
        print(text, file=sys.stdout if ok else sys.stderr)
        return 0 if ok else 2
    if args.command == "run":
        return _run(args)
    if args.command == "demo":
        from mcpl_router.demo import run_demo
        from mcpl_router.logs import configure_logging

        configure_logging(args.log_level, json=False)
        return trio.run(lambda: run_demo(once=args.once))
    return _query(args)


def _run(args: argparse.Namespace) -> int:
    from mcpl_router.config import ConfigError, load_config
    from mcpl_router.daemon import Daemon, run_until_signalled
    from mcpl_router.logs import configure_logging

    try:
        config = load_config(args.config)
    except ConfigError as exc:
        print(str(exc), file=sys.stderr)
        return 2
    fmt = config.logging.format
    configure_logging(args.log_level or config.logging.level, json=None if fmt == "auto" else fmt == "json")
    try:
        trio.run(run_until_signalled, Daemon(config))
    except BaseException as exc:
        refusal = _startup_refusal(exc)
        if refusal is None:
            raise
        print(f"mcpl-router: not started: {refusal}", file=sys.stderr)
        return 2
    return 0


def _startup_refusal(exc: BaseException) -> BaseException | None:
    """A refusal to start (unsafe socket directory, token problems), found even inside a group."""
    from mcpl_router.errors import first_leaf
    from mcpl_router.hosts.auth import HostAuthError
    from mcpl_router.hosts.listener import SocketSetupError
    from mcpl_router.store.journal import JournalLocked

    return first_leaf(exc, lambda leaf: isinstance(leaf, (SocketSetupError, HostAuthError, JournalLocked)))


def _socket_path(args: argparse.Namespace) -> str:
    if args.socket:
        return args.socket
    if args.config:
        from mcpl_router.config import load_config

        config = load_config(args.config)
        if config.host.unix_socket:
            return str(config.host.unix_socket)
    from mcpl_router.config import default_unix_socket_path

    return str(default_unix_socket_path(os.environ))


def _query(args: argparse.Namespace) -> int:
    from mcpl_router.client import RouterClient

    path = _socket_path(args)
    method, params = {
        "status": ("status", {}),
        "health": ("status", {}),
        "channels": ("channels/list", {}),
        "explain": ("explain", {"name": getattr(args, "name", ""), "serverId": getattr(args, "server", None)}),
    }[args.command]

    async def ask() -> Any:
        async with RouterClient.connect_unix(path) as client:
            return await client.call(method, params)

    try:
        answer = trio.run(ask)
    except OSError as exc:
        print(f"cannot reach the daemon at {path}: {exc.strerror or exc}. Is it running? (--socket PATH)", file=sys.stderr)
        return 1
    if args.command == "health":
        ready = answer["ready"]
        total = len(answer["servers"])
        print(f"ok: daemon answering, {ready}/{total} servers ready")
        return 0
    if args.json:
        print(json.dumps(answer, indent=2))
    else:
        _print_answer(args.command, answer)
    return 0


def _print_answer(command: str, answer: Any) -> None:
    if command == "status":
        print(f"mcpl-router {answer['version']}: {answer['ready']}/{len(answer['servers'])} servers ready, {answer['channels']} channels")
        for server in answer["servers"]:
            error = f"  last error: {server['lastError']}" if server.get("lastError") else ""
            print(f"  {server['serverId']:<16} {server['state']:<10} {server['transport']:<10} {server['endpoint']}{error}")
        for agent in answer.get("agents", []):
            owner = f"owned by {agent['host']}" if agent["host"] else "not claimed"
            print(f"  agent {agent['name']:<12} {agent['proseRouting']:<9} {owner}, {agent['unackedWakes']} unacked wakes")
    elif command == "channels":
        for row in answer["channels"]:
            print(f"  {row['shown']:<32} server={row['serverId']} id={row['channelId']} open={row.get('open')}")
    else:
        print(json.dumps(answer, indent=2))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
