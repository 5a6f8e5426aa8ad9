"""How a running daemon meets whatever supervises it: signals, and systemd's notify socket.

SIGINT and SIGTERM start a graceful shutdown (a second one too), SIGHUP reloads the config.
Under systemd (``Type=notify``, ``deploy/mcpl-router.service``) the daemon says ``READY=1``
once its listeners are bound and its links started (whether each server is ready is
``/readyz``'s question, not start-up's), ``STOPPING=1`` when it starts draining, and
``WATCHDOG=1`` at half of ``WATCHDOG_USEC`` when the unit sets a watchdog: from a trio task, so a wedged event loop stops the pings and systemd
restarts it. The protocol is one datagram per state on ``$NOTIFY_SOCKET``; a few lines here
rather than a dependency. Without ``$NOTIFY_SOCKET`` every call is a no-op.
"""

from __future__ import annotations

import os
import signal
import socket
from collections.abc import Mapping
from typing import TYPE_CHECKING

import attrs
import trio

from mcpl_router.logs import get_logger

if TYPE_CHECKING:
    from mcpl_router.cluster import ClusterNode
    from mcpl_router.daemon import Daemon

__all__ = ["SystemdNotifier", "run_until_signalled"]


@attrs.define
class SystemdNotifier:
    """Sends sd_notify(3) states to ``address`` (none: every call does nothing)."""

    address: str | None
    #: Seconds between ``WATCHDOG=1`` pings, or None when the unit sets no watchdog.
    watchdog_interval: float | None = None
    #: Datagrams that could not be sent (logged each time; systemd may have gone away).
    failures: int = 0

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> SystemdNotifier:
        """The notifier ``$NOTIFY_SOCKET`` and ``$WATCHDOG_USEC`` describe."""
        env = os.environ if environ is None else environ
        address = env.get("NOTIFY_SOCKET") or None
        interval = None
        usec = env.get("WATCHDOG_USEC", "")
        # WATCHDOG_PID names the process the watchdog is for; a child that inherited the
        # variables (a stdio server the daemon started) must not ping on the daemon's behalf.
        watchdog_pid = env.get("WATCHDOG_PID", "")
        if usec.isdigit() and int(usec) > 0 and (not watchdog_pid or watchdog_pid == str(os.getpid())):
            # Half the deadline, as sd_watchdog_enabled(3) advises: one late ping is not a restart.
            interval = int(usec) / 2_000_000
        return cls(address, interval)

    def notify(self, *states: str) -> None:
        """Send ``states`` (``"READY=1"``, ``"STATUS=…"``) as one datagram."""
        if self.address is None:
            return
        # An address starting with "@" is in the abstract namespace: a leading NUL on the wire.
        target = "\0" + self.address[1:] if self.address.startswith("@") else self.address
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
                sock.setblocking(False)
                sock.sendto("\n".join(states).encode(), target)
        except OSError as exc:
            self.failures += 1
            get_logger().warning("systemd.notify_failed", socket=self.address, states=list(states), error=f"{type(exc).__name__}: {exc}")

    async def keep_watchdog(self) -> None:
        """Ping ``WATCHDOG=1`` forever (returns at once when the unit sets no watchdog)."""
        if self.address is None or self.watchdog_interval is None:
            return
        while True:
            self.notify("WATCHDOG=1")
            await trio.sleep(self.watchdog_interval)


async def run_until_signalled(
    daemon: Daemon | ClusterNode,
    *,
    notifier: SystemdNotifier | None = None,
    task_status: trio.TaskStatus[Daemon | ClusterNode] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run ``daemon`` (or a cluster's node, which runs one while it holds the links) until it
    stops: SIGINT/SIGTERM drain it, SIGHUP reloads its config, and systemd (when it is
    watching) hears each step."""
    systemd = SystemdNotifier.from_environ() if notifier is None else notifier
    log = get_logger()
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM, signal.SIGHUP) as signals:
        async with trio.open_nursery() as nursery:

            async def watch_signals() -> None:
                async for signum in signals:
                    name = signal.Signals(signum).name
                    log.info("daemon.signal", signal=name)
                    if signum == signal.SIGHUP:
                        daemon.request_reload()
                    else:
                        daemon.request_shutdown(f"signal {name}")

            async def say_stopping() -> None:
                # However the shutdown was asked for: a signal, the socket, a test.
                await daemon.shutdown_requested.wait()
                systemd.notify("STOPPING=1", "STATUS=draining")

            async def run_daemon(task_status: trio.TaskStatus[Daemon | ClusterNode] = trio.TASK_STATUS_IGNORED) -> None:
                await daemon.run(task_status=task_status)
                nursery.cancel_scope.cancel()

            nursery.start_soon(watch_signals)
            nursery.start_soon(say_stopping)
            started = await nursery.start(run_daemon)
            systemd.notify("READY=1", "STATUS=serving")
            nursery.start_soon(systemd.keep_watchdog)
            task_status.started(started)
