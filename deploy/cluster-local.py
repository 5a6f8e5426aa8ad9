#!/usr/bin/env python3
"""A two-node mcpl-router cluster on loopback, and a takeover to watch (docs/deploy.md).

    sudo python3 deploy/cluster-local.py          # bring it up, show a takeover, stop everything
    sudo python3 deploy/cluster-local.py --keep   # ... then leave it running until Ctrl-C

It starts, each on 127.0.0.1 and in one temporary directory:

- a PostgreSQL primary with a synchronous standby (Debian's postgresql-15, run as the
  ``postgres`` user: PostgreSQL refuses root; hence this script runs as root);
- one MCPL server (the repository's fixture server, over TCP, channel ``general``);
- nodes ``a`` and ``b``: ``mcpl-router run`` twice with ONE config file, each told its name, its
  health port and its state directory by its environment (``${MCPL_ROUTER_NODE}``...).

Then it waits until a node holds the links, shows who holds what (each node's ``/readyz`` and
``/status.json``), kills the holder with SIGKILL and times how long until the other node holds
the links and is ready. A killed node is started again and comes back as a standby. At the end
(or on Ctrl-C, or SIGTERM) it stops every process it started, by pid, and removes the directory.
Exit status: 0 when the takeover happened, 1 when a step failed (its node logs are printed), 2
when this machine cannot run it.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from datetime import datetime
from pathlib import Path
from typing import Any, NoReturn

ROOT = Path(__file__).resolve().parent.parent
if (ROOT / "mcpl_router" / "__init__.py").exists():
    # Run from a checkout: this checkout's package, for this script and the processes it starts.
    sys.path.insert(0, str(ROOT))

from mcpl_router.testing import postgres  # noqa: E402
from mcpl_router.testing.control import fixture_command  # noqa: E402

NODES = ("a", "b")
#: How long a node may take to start and hold the links (a loaded two-core machine).
START_DEADLINE = 60.0
#: How long after the kill the other node may take, beyond the lease, before the takeover failed.
TAKEOVER_SLACK = 30.0
POLL = 0.05
STARTED = time.monotonic()


class Failed(Exception):
    """A step did not happen: said on one line, then the node logs' tails."""


def say(text: str) -> None:
    print(f"[{time.monotonic() - STARTED:6.2f}s] {text}", flush=True)


def _stop_with_us() -> None:
    # In the child: if this script is killed outright its processes go too (nothing left behind).
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def child_env(**extra: str) -> dict[str, str]:
    env = {**os.environ, **extra}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    return env


def stop_process(process: subprocess.Popen[bytes], grace: float) -> str:
    """SIGTERM, then SIGKILL after ``grace`` seconds; how it ended."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        process.send_signal(signal.SIGCONT)  # one a person paused (kill -STOP) hears it too
        try:
            process.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            return "did not stop on SIGTERM: killed"
    code = process.returncode
    return f"exit {code}" if code >= 0 else f"ended by {signal.Signals(-code).name}"


class Node:
    """One ``mcpl-router run`` of the shared config: its pid, health port, host socket, log."""

    def __init__(self, name: str, workdir: Path, config: Path) -> None:
        self.name = name
        self.config = config
        self.port = postgres.free_port()
        self.socket = workdir / "run" / f"{name}.sock"
        self.log = workdir / f"node-{name}.log"
        self.state_dir = workdir / "state" / name
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def start(self) -> None:
        assert not self.alive(), f"node {self.name} is running"
        env = child_env(MCPL_ROUTER_NODE=self.name, MCPL_ROUTER_HEALTH_PORT=str(self.port), MCPL_ROUTER_STATE_DIR=str(self.state_dir))
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "mcpl_router", "run", "--config", str(self.config)],
                stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env,
                # Its own session: a Ctrl-C in the terminal reaches this script only, which stops
                # the nodes in order (SIGTERM: drain, release the lease) before PostgreSQL.
                start_new_session=True, preexec_fn=_stop_with_us,
            )

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def get(self, path: str) -> tuple[int, str] | None:
        """The health listener's answer (status, body), or None when nothing answers."""
        try:
            with urllib.request.urlopen(self.url + path, timeout=2) as answer:
                return int(answer.status), answer.read().decode(errors="replace")
        except urllib.error.HTTPError as refused:
            return int(refused.code), refused.read().decode(errors="replace")
        except (OSError, ValueError):
            return None

    def ready(self) -> bool:
        answer = self.get("/readyz")
        return answer is not None and answer[0] == 200

    def cluster(self) -> dict[str, Any]:
        """``/status.json``'s ``cluster`` section (empty when the node does not answer)."""
        answer = self.get("/status.json")
        if answer is None or answer[0] != 200:
            return {}
        section = json.loads(answer[1]).get("cluster")
        return section if isinstance(section, dict) else {}

    def describe(self) -> str:
        """One line: what the node says of itself, from its health listener."""
        readyz = self.get("/readyz")
        if readyz is None:
            return f"node {self.name}: not answering on {self.url}"
        cluster = self.cluster()
        reason = " ".join(line.lstrip("- ") for line in readyz[1].splitlines() if line.startswith("- "))
        lease = cluster.get("lease") or {}
        if cluster.get("state") == "holding":
            since = time.strftime("%H:%M:%S", time.localtime(float(lease.get("since", 0))))
            held = f"holds the links (epoch {lease.get('epoch')}, since {since})"
        else:
            held = f"is {cluster.get('state', 'starting')}"
        return f"node {self.name} (pid {self.pid}) {held}; /readyz {readyz[0]} {'ready' if readyz[0] == 200 else reason}"

    def stop(self) -> None:
        if self.process is not None:
            say(f"stopped node {self.name} (pid {self.pid}): {stop_process(self.process, 20)}")


class Fixture:
    """The MCPL server the nodes link to: the fixture server over TCP, channel ``general``."""

    def __init__(self, workdir: Path) -> None:
        control = workdir / "fixture.control.json"
        argv = fixture_command("tcp", "strict", ["general"], control, exit_with_parent=True, server_name="chat")
        with (workdir / "fixture.log").open("ab") as log:
            self.process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=child_env(), start_new_session=True)
        deadline = time.monotonic() + 20
        while not control.exists():
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise Failed(f"the fixture server did not start (see {workdir / 'fixture.log'})")
            time.sleep(POLL)
        self.url = str(json.loads(control.read_text())["listen"]["url"])

    def stop(self) -> None:
        say(f"stopped the MCPL server (pid {self.process.pid}): {stop_process(self.process, 5)}")


CONFIG = """\
# One file for every node: each node's name, health port and state directory come from its
# environment (MCPL_ROUTER_NODE, MCPL_ROUTER_HEALTH_PORT, MCPL_ROUTER_STATE_DIR).
[cluster]
node = "${{MCPL_ROUTER_NODE}}"
leaseTtl = {lease}

[journal]
backend = "postgres"
# Both PostgreSQL servers: whichever takes writes (after a promotion, the former standby).
dsn = "{dsn}"

[host]
unixSocket = "{run}/${{MCPL_ROUTER_NODE}}.sock"
websocket = false

[health]
bind = "127.0.0.1"
port = "${{MCPL_ROUTER_HEALTH_PORT}}"

[logging]
format = "json"

[mcplServers.chat]
url = "{server}"
required = true
"""


def write_config(workdir: Path, dsn: str, server_url: str, lease: float) -> Path:
    (workdir / "run").mkdir(mode=0o700)
    path = workdir / "cluster.toml"
    path.write_text(CONFIG.format(lease=lease, dsn=dsn, run=workdir / "run", server=server_url))
    return path


def wait_for(what: str, check: Any, timeout: float, nodes: dict[str, Node]) -> Any:
    """Until ``check()`` is true; failed when a node exits meanwhile or the time is up."""
    deadline = time.monotonic() + timeout
    while True:
        for node in nodes.values():
            if not node.alive():
                raise Failed(f"{what}: node {node.name} exited ({node.process.returncode if node.process else '?'})")
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise Failed(f"{what}: not within {timeout:g} s")
        time.sleep(POLL)


def holder_of(nodes: dict[str, Node]) -> Node | None:
    ready = [node for node in nodes.values() if node.alive() and node.ready()]
    return ready[0] if len(ready) == 1 else None


def standby_named(node: Node, holder: Node) -> bool:
    answer = node.get("/readyz")
    return answer is not None and f"standby: node {holder.name} holds the links" in answer[1]


def takeover(nodes: dict[str, Node], holder: Node, lease: float) -> Node:
    """Kill the holder with SIGKILL; time until the other node holds the lease, and is ready."""
    [other] = [node for node in nodes.values() if node is not holder]
    say(f"kill -9 node {holder.name} (pid {holder.pid}), the holder: node {other.name} takes the links once the lease ({lease:g} s) expires")
    killed_at, killed_wall = time.monotonic(), time.time()
    os.kill(holder.pid, signal.SIGKILL)
    assert holder.process is not None
    holder.process.wait()
    deadline = killed_at + lease + TAKEOVER_SLACK
    while not other.ready():
        if time.monotonic() > deadline or not other.alive():
            raise Failed(f"node {other.name} did not take over within {lease + TAKEOVER_SLACK:g} s of the kill")
        time.sleep(POLL)
    ready_at = time.monotonic()
    epoch = (other.cluster().get("lease") or {}).get("epoch")
    taken = lease_taken_at(other)
    held = "" if taken is None else f"took the lease {taken - killed_wall:.2f} s after the kill (its log), and "
    say(f"node {other.name} {held}is ready (epoch {epoch}, server linked) {ready_at - killed_at:.2f} s after the kill")
    say(f"takeover: {ready_at - killed_at:.2f} s from kill -9 to the other node ready (lease {lease:g} s)")
    return other


def lease_taken_at(node: Node) -> float | None:
    """When the node last logged ``cluster.lease.taken`` (wall clock), or None."""
    taken = None
    for line in node.log.read_text(errors="replace").splitlines():
        if '"cluster.lease.taken"' in line:
            with contextlib.suppress(ValueError, KeyError):
                taken = datetime.fromisoformat(json.loads(line)["timestamp"].replace("Z", "+00:00")).timestamp()
    return taken


def show(nodes: dict[str, Node]) -> None:
    for node in nodes.values():
        say(node.describe())


def print_commands(nodes: dict[str, Node], holder: Node) -> None:
    # From a checkout, its package (an installed mcpl-router may be another version, or none).
    cli = f"PYTHONPATH={ROOT} {sys.executable} -m mcpl_router" if str(ROOT) in sys.path else "mcpl-router"
    say("to try while it runs:")
    print(f"  {cli} status --socket {holder.socket}    # the holder's host socket (a standby's forwards there)")
    for node in nodes.values():
        print(f"  curl -s {node.url}/readyz; curl -s {node.url}/status.json | python3 -m json.tool    # node {node.name}")
    print(f"  kill -9 <pid of the holder>    # then watch the other take over (a killed node is started again)")
    print(f"  tail -f {nodes['a'].log} {nodes['b'].log}")
    print(f"  cat {nodes['a'].config}    # the one config both nodes run", flush=True)
    say("left running until Ctrl-C")


def keep_running(nodes: dict[str, Node]) -> NoReturn:
    """Until Ctrl-C: say when the holder changes, and start a node again that a person killed."""
    holder = holder_of(nodes)
    while True:
        time.sleep(0.5)
        for node in nodes.values():
            if not node.alive():
                assert node.process is not None
                say(f"node {node.name} (pid {node.pid}) exited ({stop_process(node.process, 0)}): starting it again")
                node.start()
        now = holder_of(nodes)
        if now is not None and now is not holder:
            say(f"node {now.name} now holds the links (epoch {(now.cluster().get('lease') or {}).get('epoch')}) and is ready")
            holder = now


def stop_nodes(nodes: dict[str, Node]) -> None:
    """The standbys first, then the holder: it drains and releases the lease with no standby
    left to take the links for a moment."""
    for node in sorted(nodes.values(), key=lambda node: node.alive() and node.ready()):
        node.stop()


def print_tails(nodes: dict[str, Node]) -> None:
    for node in nodes.values():
        lines = node.log.read_text(errors="replace").splitlines()[-15:] if node.log.exists() else []
        print(f"--- the last lines of node {node.name}'s log ({node.log}):", *lines, sep="\n", flush=True)


def run(args: argparse.Namespace, stack: contextlib.ExitStack, nodes: dict[str, Node]) -> None:
    workdir = Path(tempfile.mkdtemp(prefix="mcpl-router-cluster-"))
    stack.callback(lambda: (shutil.rmtree(workdir, ignore_errors=True), say(f"removed {workdir}")))
    say(f"working directory {workdir} (config, logs, host sockets)")
    pair = stack.enter_context(postgres.postgres_pair())
    stack.callback(say, f"stopped PostgreSQL (pids {pair.primary.pid}, {pair.standby.pid}) and removed {pair.root}")
    say(f"PostgreSQL primary on 127.0.0.1:{pair.primary.port} (pid {pair.primary.pid}), synchronous standby on "
        f"127.0.0.1:{pair.standby.port} (pid {pair.standby.pid}), data in {pair.root}")
    fixture = Fixture(workdir)
    stack.callback(fixture.stop)
    say(f"MCPL server 'chat' (fixture, TCP) on {fixture.url} (pid {fixture.process.pid}), channel general")
    config = write_config(workdir, pair.multi_host_dsn, fixture.url, args.lease_ttl)
    say(f"config for both nodes: {config} (journal on both PostgreSQL servers, lease {args.lease_ttl:g} s)")
    nodes.update((name, Node(name, workdir, config)) for name in NODES)
    stack.callback(stop_nodes, nodes)
    for node in nodes.values():
        node.start()
        say(f"node {node.name} started (pid {node.pid}), health on {node.url}, host socket {node.socket}, log {node.log}")
    holder = wait_for("a node holding the links and ready", lambda: holder_of(nodes), START_DEADLINE, nodes)
    [other] = [node for node in nodes.values() if node is not holder]
    wait_for(f"node {other.name} a standby", lambda: standby_named(other, holder), START_DEADLINE, nodes)
    show(nodes)
    killed, holder = holder, takeover(nodes, holder, args.lease_ttl)
    killed.start()
    say(f"node {killed.name} started again (pid {killed.pid}): it finds the lease held and waits as a standby")
    wait_for(f"node {killed.name} a standby again", lambda: standby_named(killed, holder), START_DEADLINE, nodes)
    show(nodes)
    if args.keep:
        print_commands(nodes, holder)
        keep_running(nodes)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="A two-node mcpl-router cluster on loopback, and a takeover.")
    parser.add_argument("--keep", action="store_true", help="after the takeover, leave everything running until Ctrl-C")
    parser.add_argument("--lease-ttl", type=float, default=5.0, help="[cluster] leaseTtl in seconds (default 5)")
    args = parser.parse_args(argv)
    missing = postgres.missing_reason()
    if missing is not None:
        print(f"cannot run here: {missing} (Debian's postgresql-15, psycopg, run as root)", file=sys.stderr)
        return 2

    def stop_asked(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    # Both said explicitly: a shell without job control starts a background command with SIGINT
    # ignored, and Python then leaves it so.
    signal.signal(signal.SIGINT, stop_asked)
    signal.signal(signal.SIGTERM, stop_asked)
    stack = contextlib.ExitStack()
    nodes: dict[str, Node] = {}
    outcome = 0
    try:
        run(args, stack, nodes)
    except KeyboardInterrupt:
        say("asked to stop (Ctrl-C or SIGTERM): stopping everything")
        outcome = 0 if args.keep else 130
    except (Failed, RuntimeError) as exc:
        say(f"FAILED: {exc}")
        print_tails(nodes)
        outcome = 1
    finally:
        # A second Ctrl-C must not leave half of it running.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        stack.close()
    say("everything this script started is stopped" if outcome != 1 else "stopped what was started")
    return outcome


if __name__ == "__main__":
    sys.exit(main())
