"""``mcpl-router demo``: the daemon with two bundled MCPL servers that share a channel id.

Servers ``a`` (a strict 0.5 server) and ``b`` (a Discord-like 0.4 server, handled in legacy
mode) are the fixture program spawned over stdio; both register ``general``. The demo prints
each server's state, grant and channels, and how the name ``general`` resolves, so a newcomer
sees the shared-id situation with no external service.

Then a scripted host connects to the daemon's socket: a message arrives on ``b``'s ``general``,
the host opens a turn and replies, and the demo shows — from what each *server* recorded —
that the typing and the reply landed on ``b`` alone. Ctrl-C (or SIGTERM) stops it cleanly.
"""

from __future__ import annotations

import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import TextIO

import trio

from mcpl_router.config import RouterConfig, parse_config
from mcpl_router.supervision import run_until_signalled
from mcpl_router.client import RouterClient, RpcError
from mcpl_router.daemon import Daemon
from mcpl_router.testing.control import FixtureControl, fixture_command

READY_TIMEOUT = 30.0


def demo_config(workdir: Path) -> RouterConfig:
    servers: dict[str, dict[str, object]] = {}
    for server_id, personality in (("a", "strict"), ("b", "discord")):
        argv = fixture_command(
            "stdio",
            personality,
            ["general=general", f"{server_id}-only"],
            workdir / f"{server_id}.control.json",
            server_name=server_id,
        )
        servers[server_id] = {"command": argv[0], "args": argv[1:], "inheritEnv": True}
    # b is a 0.4 server on purpose; the overview says so, so the link needn't warn about it.
    servers["b"]["legacy"] = "allow"
    data = {
        "mcplServers": servers,
        "host": {"unixSocket": str(workdir / "run" / "host.sock"), "websocket": {"enabled": False}},
        "journal": {"path": str(workdir / "journal.sqlite3")},
        # /healthz, /readyz and /metrics on a port the OS picks (printed when running).
        "health": {"enabled": True, "port": 0},
    }
    return parse_config(data, source="<embedded demo config>", base_dir=workdir)


def _grant_line(grant: object) -> str:
    granted = grant.get("granted") if isinstance(grant, Mapping) else None
    names = [str(name) for name in granted] if isinstance(granted, (list, tuple)) else []
    return f"{len(names)} capabilities: {', '.join(names)}"


def _refs(value: object) -> list[Mapping[str, object]]:
    """The refs in a notice's list (``added``, ``removed``)."""
    return [ref for ref in value if isinstance(ref, Mapping)] if isinstance(value, (list, tuple)) else []


def print_overview(daemon: Daemon, out: TextIO) -> None:
    print("", file=out)
    for status in daemon.servers_list():
        legacy = "legacy mode (manifest " + str(status["manifestVersion"]) + ")" if status["legacy"] else "MCPL " + str(status["manifestVersion"])
        print(f"server {status['serverId']}: {status['state']} over {status['transport']}, {legacy}", file=out)
        print(f"  grant: {_grant_line(status['grant'])}", file=out)
        channels = [row for row in daemon.router.names.channel_list() if row.server_id == status["serverId"]]
        names = ", ".join(f"{row.channel_id} (shown as {row.shown})" for row in channels) or "none"
        print(f"  channels: {names}", file=out)
    print("", file=out)
    for name in ("general", "a:general", "b:general"):
        explanation = daemon.router.names.explain(name)
        resolved = explanation.resolved
        if resolved is not None:
            print(f'the name "{name}" picks server {resolved.server_id}\'s channel {resolved.channel_id}', file=out)
        elif explanation.refusal is not None:
            print(f'the name "{name}" is refused:', file=out)
            for line in explanation.refusal.text.splitlines():
                print(f"    {line}", file=out)
    print("", file=out)


async def run_demo(*, once: bool = False, out: TextIO = sys.stdout) -> int:
    with tempfile.TemporaryDirectory(prefix="mcpl-router-demo-") as tmp:
        workdir = Path(tmp)
        (workdir / "run").mkdir(mode=0o700)
        config = demo_config(workdir)

        def show(event: str, fields: Mapping[str, object]) -> None:
            if event == "server/state":
                print(f"[{fields['serverId']}] {fields['old']} -> {fields['state']}", file=out, flush=True)
            elif event == "channels/changed":
                for ref in _refs(fields["added"]):
                    print(f"[{ref['serverId']}] registered channel {ref['channelId']!r}", file=out, flush=True)
                for ref in _refs(fields["removed"]):
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
            try:
                with trio.fail_after(READY_TIMEOUT):
                    await run_scripted_host(daemon, workdir, out)
            except (trio.TooSlowError, RpcError, OSError) as exc:
                print(f"demo: the scripted host did not finish: {exc}", file=out, flush=True)
                daemon.request_shutdown()
                return 1
            if once:
                daemon.request_shutdown()
            else:
                print_next_steps(daemon, workdir, out)
                print("Running. Press Ctrl-C to stop.", file=out, flush=True)
        print("demo stopped; every server process has exited.", file=out, flush=True)
    return 0


def print_next_steps(daemon: Daemon, workdir: Path, out: TextIO) -> None:
    """Where the running demo listens, and the commands to try against it."""
    socket = daemon.host_socket_path
    print(f"The daemon's host socket is {socket}", file=out)
    if daemon.health_url:
        print(f"Its health and metrics: {daemon.health_url}/readyz and {daemon.health_url}/metrics", file=out)
    print("Try, in another terminal, while this runs:", file=out)
    for command in ("status", "channels", "explain general", "explain b:general", "health"):
        print(f"  mcpl-router {command} --socket {socket}", file=out)
    # Nothing arrives by itself: a host started beside the demo waits until a server speaks.
    print("A host of your own (examples/fixed_reply_host.py) answers what a server sends:", file=out)
    print(f"  python3 examples/fixed_reply_host.py --socket {socket} --agent kai", file=out)
    print(f'  python3 -m mcpl_router.testing.drive {workdir / "b.control.json"} message general "hello kai"', file=out)
    print("(Logs are off in the demo; `mcpl-router demo --log-level info` shows them.)", file=out, flush=True)


DEMO_AGENT = "demo-agent"
REPLY = "Hello from the demo agent: this reply goes back where the message came from."


async def run_scripted_host(daemon: Daemon, workdir: Path, out: TextIO) -> None:
    """A host's whole turn over the socket, then what each server says it received."""
    assert daemon.host_socket_path is not None
    async with RouterClient.connect_unix(daemon.host_socket_path) as host, FixtureControl.connect(
        workdir / "b.control.json"
    ) as server_b, FixtureControl.connect(workdir / "a.control.json") as server_a:
        await host.hello("demo-host", [{"name": DEMO_AGENT}])
        print(f"host: connected as demo-host, agent {DEMO_AGENT}", file=out, flush=True)
        marks = {"a": len(await server_a.recorded()), "b": len(await server_b.recorded())}
        await server_b.incoming(
            [{"channelId": "general", "messageId": "demo-1", "author": {"id": "u1", "name": "Robin"},
              "content": [{"type": "text", "text": f"@{DEMO_AGENT} are you there?"}], "tags": ["chat:mention"]}]
        )
        print("server b: a message from Robin arrives on its channel general", file=out, flush=True)
        wake = await host.next_wake()
        where = f"{wake.channel.shown} (server {wake.channel.server_id})" if wake.channel else "no channel"
        print(f"host: woken (seq {wake.seq}) by a message on {where}", file=out, flush=True)
        # The block closes the turn "completed" as it ends (an exception would abort it).
        async with host.turn(DEMO_AGENT, wakes=[wake.seq]) as turn:
            await turn.context(model="demo-model")
            await turn.text(REPLY)
        await host.ack([wake.seq])
        print(f"host: turn closed: {turn.receipt.text if turn.receipt else None}", file=out, flush=True)
        for server_id, control in (("b", server_b), ("a", server_a)):
            received = (await control.recorded())[marks[server_id]:]
            print(f"server {server_id} received: {_describe(received)}", file=out, flush=True)
        print("", file=out, flush=True)


def _describe(recorded: list[dict[str, object]]) -> str:
    parts = []
    for entry in recorded:
        method, given = entry["method"], entry.get("params")
        params: Mapping[str, object] = given if isinstance(given, Mapping) else {}
        if method == "channels/typing":
            parts.append(f"typing {params.get('op', 'start')} in {params.get('channelId')}")
        elif method == "channels/publish":
            content = params.get("content")
            blocks = [block for block in content if isinstance(block, Mapping)] if isinstance(content, (list, tuple)) else []
            text = " ".join(str(block.get("text", "")) for block in blocks)
            parts.append(f"the reply in {params.get('channelId')}: {text!r}")
    return "; ".join(parts) or "no typing and no reply"


async def _wait_for_general_on_both(daemon: Daemon) -> None:
    while True:
        ready = {s["serverId"] for s in daemon.servers_list() if s["state"] == "ready"}
        with_general = {row.server_id for row in daemon.router.names.channel_list() if row.channel_id == "general"}
        if {"a", "b"} <= ready and {"a", "b"} <= with_general:
            return
        await trio.sleep(0.05)
