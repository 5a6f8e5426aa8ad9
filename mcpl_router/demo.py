"""``mcpl-router demo``: the daemon with two bundled MCPL servers that share a channel id.

Servers ``a`` (a strict 0.5 server) and ``b`` (a Discord-like 0.4 server, handled in legacy
mode) are the fixture program spawned over stdio; both register ``general``. The demo prints
each server's state, grant and channels, and how the name ``general`` resolves, so a newcomer
sees the shared-id situation with no external service. Ctrl-C (or SIGTERM) stops it cleanly.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import Any, TextIO

import trio

from mcpl_router.config import RouterConfig, parse_config
from mcpl_router.daemon import Daemon, run_until_signalled
from mcpl_router.testing.control import fixture_command

READY_TIMEOUT = 30.0


def demo_config(workdir: Path) -> RouterConfig:
    servers: dict[str, Any] = {}
    for server_id, personality in (("a", "strict"), ("b", "discord")):
        argv = fixture_command(
            "stdio",
            personality,
            ["general=general", f"{server_id}-only"],
            workdir / f"{server_id}.control.json",
            server_name=server_id,
        )
        servers[server_id] = {"command": argv[0], "args": argv[1:], "inheritEnv": True}
    data = {
        "mcplServers": servers,
        "host": {"unixSocket": str(workdir / "run" / "host.sock"), "websocket": {"enabled": False}},
        "journal": {"path": str(workdir / "journal.sqlite3")},
    }
    return parse_config(data, source="<embedded demo config>", base_dir=workdir)


def _grant_line(grant: dict[str, Any]) -> str:
    granted = grant.get("granted") or []
    return f"{len(granted)} capabilities: {', '.join(granted)}"


def print_overview(daemon: Daemon, out: TextIO) -> None:
    print("", file=out)
    for status in daemon.servers_list():
        legacy = "legacy mode (manifest " + str(status["manifestVersion"]) + ")" if status["legacy"] else "MCPL " + str(status["manifestVersion"])
        print(f"server {status['serverId']}: {status['state']} over {status['transport']}, {legacy}", file=out)
        print(f"  grant: {_grant_line(status['grant'])}", file=out)
        channels = [row for row in daemon.channels_list() if row["serverId"] == status["serverId"]]
        names = ", ".join(f"{row['channelId']} (shown as {row['shown']})" for row in channels) or "none"
        print(f"  channels: {names}", file=out)
    print("", file=out)
    for name in ("general", "a:general", "b:general"):
        explanation = daemon.explain(name)
        resolved = explanation.get("resolved")
        if resolved:
            print(f'the name "{name}" picks server {resolved["serverId"]}\'s channel {resolved["channelId"]}', file=out)
        else:
            print(f'the name "{name}" is refused:', file=out)
            for line in explanation["refusal"]["text"].splitlines():
                print(f"    {line}", file=out)
    print("", file=out)


async def run_demo(*, once: bool = False, out: TextIO = sys.stdout) -> int:
    with tempfile.TemporaryDirectory(prefix="mcpl-router-demo-") as tmp:
        workdir = Path(tmp)
        (workdir / "run").mkdir(mode=0o700)
        config = demo_config(workdir)

        def show(event: str, fields: dict[str, Any]) -> None:
            if event == "server/state":
                print(f"[{fields['serverId']}] {fields['old']} -> {fields['state']}", file=out, flush=True)
            elif event == "channels/changed":
                for ref in fields["added"]:
                    print(f"[{ref['serverId']}] registered channel {ref['channelId']!r}", file=out, flush=True)
                for ref in fields["removed"]:
                    print(f"[{ref['serverId']}] channel {ref['channelId']!r} gone", file=out, flush=True)

        daemon = Daemon(config, observers=[show])
        print("mcpl-router demo: servers a and b both register a channel called general.", file=out, flush=True)
        async with trio.open_nursery() as nursery:
            await nursery.start(run_until_signalled, daemon)
            with trio.move_on_after(READY_TIMEOUT) as waited:
                await _wait_for_general_on_both(daemon)
            if waited.cancelled_caught:
                print("demo: servers did not become ready in time; see the log lines above", file=out, flush=True)
                daemon.request_shutdown()
                return 1
            print_overview(daemon, out)
            if once:
                daemon.request_shutdown()
            else:
                print("Running. Press Ctrl-C to stop.", file=out, flush=True)
        print("demo stopped; every server process has exited.", file=out, flush=True)
    return 0


async def _wait_for_general_on_both(daemon: Daemon) -> None:
    while True:
        ready = {s["serverId"] for s in daemon.servers_list() if s["state"] == "ready"}
        with_general = {row["serverId"] for row in daemon.channels_list() if row["channelId"] == "general"}
        if {"a", "b"} <= ready and {"a", "b"} <= with_general:
            return
        await trio.sleep(0.05)
