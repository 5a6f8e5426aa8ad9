"""Test-side helpers for the fixture server: build its argv, spawn it, find it, drive it.

- :func:`fixture_command` — the argv to put in a daemon config (stdio servers the daemon spawns).
- :meth:`FixtureProcess.start` — spawn the fixture as a real subprocess and drive it; on exit the
  process is terminated (SIGTERM, then SIGKILL after 5 s), so a test never leaves one behind.
- :meth:`FixtureControl.connect` — drive a fixture someone else spawned, through its control file.
- :func:`wait_until` — wait for the condition a test is about, instead of sleeping.
"""

from __future__ import annotations

import inspect
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import msgspec
import trio

from mcpl_router.jsonrpc import MethodTable, NdjsonStream, Peer
from mcpl_router.testing.descriptors import channel_descriptor as channel_descriptor

FIXTURE_MODULE = "mcpl_router.testing.fixture_server"
# Oversized test frames travel through the control channel: allow far more than any host does.
_CONTROL_MAX_MESSAGE_BYTES = 256 * 1024 * 1024
# Longer than the fixture's own host deadline (10 s), so a host timeout surfaces as its error.
_CONTROL_REQUEST_TIMEOUT = 30.0
_TERMINATE_GRACE = 5.0
_POLL_INTERVAL = 0.02


class FixtureStartError(RuntimeError):
    """The fixture did not become ready (exited early, or no control file before the deadline)."""


def _channel_spec(channel: str | tuple[str, str]) -> str:
    if isinstance(channel, tuple):
        channel_id, label = channel
        return f"{channel_id}={label}"
    return channel


def fixture_command(
    transport: str,
    personality: str = "strict",
    channels: Iterable[str | tuple[str, str]] = (),
    control_file: str | Path = "",
    **extra: Any,
) -> list[str]:
    """The argv that runs the fixture server (``[sys.executable, "-m", ...]``).

    Args:
        transport: ``stdio``, ``tcp`` or ``ws``.
        personality: ``strict``, ``discord``, ``legacy`` or ``notify-publish``.
        channels: ``"ID"``, ``"ID=LABEL"`` or ``(id, label)`` per text channel.
        control_file: where the fixture writes its ready file (required by the program).
        extra: more flags, snake_case: ``True`` → bare flag, ``False``/``None`` → omitted, a list
            → the flag repeated, a mapping → ``--flag K=V`` per item (``dm={"u1": "Ann"}``).
    """
    argv = [
        sys.executable,
        "-m",
        FIXTURE_MODULE,
        "--transport",
        transport,
        "--personality",
        personality,
        "--control-file",
        str(control_file),
    ]
    for channel in channels:
        argv += ["--channel", _channel_spec(channel)]
    for key, value in extra.items():
        flag = "--" + key.replace("_", "-")
        if value is None or value is False:
            continue
        if value is True:
            argv.append(flag)
        elif isinstance(value, Mapping):
            for item_key, item_value in value.items():
                argv += [flag, f"{item_key}={item_value}"]
        elif isinstance(value, (list, tuple)):
            for item in value:
                argv += [flag, str(item)]
        else:
            argv += [flag, str(value)]
    return argv


async def wait_until(
    predicate: Callable[[], Awaitable[Any] | Any], *, timeout: float = 10, interval: float = _POLL_INTERVAL
) -> Any:
    """Poll ``predicate`` until it returns something truthy; return that value.

    Raises:
        trio.TooSlowError: not true within ``timeout`` seconds.
    """
    with trio.move_on_after(timeout):
        while True:
            value = predicate()
            if inspect.isawaitable(value):
                value = await value
            if value:
                return value
            await trio.sleep(interval)
    name = getattr(predicate, "__name__", repr(predicate))
    raise trio.TooSlowError(f"condition {name} not met within {timeout:g}s")


async def _read_control_file(
    path: Path, *, stale_pid: int | None = None, process: trio.Process | None = None
) -> dict[str, Any]:
    # The fixture writes the file with a rename, so a file that exists is whole.
    while True:
        if process is not None and process.poll() is not None:
            raise FixtureStartError(f"fixture exited with code {process.returncode} before writing {path}")
        try:
            info = msgspec.json.decode(path.read_bytes())
        except (FileNotFoundError, msgspec.DecodeError):
            info = None
        if isinstance(info, dict) and info.get("pid") != stale_pid:
            return info
        await trio.sleep(_POLL_INTERVAL)


async def _open_control_stream(info: dict[str, Any], path: Path, *, stale_pid: int | None) -> tuple[dict[str, Any], trio.SocketStream]:
    # A control file can outlive a killed fixture; retry until a live one answers.
    while True:
        try:
            stream = await trio.open_tcp_stream(info["control"]["host"], info["control"]["port"])
            return info, stream
        except OSError:
            await trio.sleep(_POLL_INTERVAL)
            info = await _read_control_file(path, stale_pid=stale_pid)


class FixtureControl:
    """A connection to one fixture's control channel; every control method as a coroutine.

    Host-facing methods raise :class:`~mcpl_router.jsonrpc.RpcError` -32000 when no host is
    connected, and re-raise the host's own error answer (e.g. -32002) when it refused.
    """

    def __init__(self, peer: Peer, info: dict[str, Any], control_file: Path) -> None:
        self._peer = peer
        self.info = info
        self.control_file = control_file

    @classmethod
    @asynccontextmanager
    async def connect(
        cls, control_file: str | Path, timeout: float = 10, *, stale_pid: int | None = None
    ) -> AsyncIterator[FixtureControl]:
        """Wait for ``control_file`` (ignoring one written by ``stale_pid``), then connect.

        Raises:
            FixtureStartError: no live fixture within ``timeout`` seconds.
        """
        path = Path(control_file)
        try:
            with trio.fail_after(timeout):
                info = await _read_control_file(path, stale_pid=stale_pid)
                info, stream = await _open_control_stream(info, path, stale_pid=stale_pid)
        except trio.TooSlowError:
            raise FixtureStartError(f"no live fixture behind {path} within {timeout:g}s") from None
        async with _control_peer(stream, info) as peer:
            yield cls(peer, info, path)

    # -- identity ------------------------------------------------------------------------------

    @property
    def pid(self) -> int:
        return int(self.info["pid"])

    @property
    def listen_url(self) -> str | None:
        listen = self.info.get("listen")
        return listen["url"] if listen else None

    @property
    def listen_port(self) -> int | None:
        listen = self.info.get("listen")
        return listen["port"] if listen else None

    # -- control methods -----------------------------------------------------------------------

    async def call(self, method: str, /, **params: Any) -> Any:
        """Call any control method with keyword params; returns its result."""
        return await self._peer.request(method, params)

    async def call_for_object(self, method: str, /, **params: Any) -> dict[str, Any]:
        """:meth:`call` for a method that answers a JSON object."""
        answer = await self.call(method, **params)
        assert isinstance(answer, dict), f"{method} answered {answer!r}, not an object"
        return answer

    async def register(
        self, channels: Sequence[str | Mapping[str, Any]], *, form: str | None = None
    ) -> Any:
        """Send ``channels/register``; a ``str`` becomes a default text-channel descriptor."""
        descriptors = [channel_descriptor(c) if isinstance(c, str) else dict(c) for c in channels]
        return await self.call("register", channels=descriptors, **_given(form=form))

    async def change(
        self,
        *,
        added: Sequence[Mapping[str, Any]] | None = None,
        removed: Sequence[str] | None = None,
        updated: Sequence[Mapping[str, Any]] | None = None,
        form: str | None = None,
    ) -> Any:
        """Send ``channels/changed`` with the members given."""
        return await self.call("change", **_given(added=added, removed=removed, updated=updated, form=form))

    async def withdraw(self, ids: Sequence[str], *, form: str | None = None) -> Any:
        """Send ``channels/changed {removed: ids}``."""
        return await self.call("withdraw", ids=list(ids), **_given(form=form))

    async def incoming(self, messages: Sequence[Mapping[str, Any]], *, form: str | None = None) -> Any:
        """Send ``channels/incoming``; the fixture fills messageId, author, timestamp (and
        ``content`` from a ``text`` shorthand)."""
        return await self.call("incoming", messages=[dict(m) for m in messages], **_given(form=form))

    async def flood(self, count: int, *, outstanding: int = 128, per_request: int = 1, prefix: str = "flood", **fields: Any) -> dict[str, Any]:
        """Have the fixture send ``count`` ``channels/incoming`` requests, ``outstanding`` at once
        (a pipelining server): ``{accepted, refused, failed, seconds}``."""
        params = {"count": count, "outstanding": outstanding, "perRequest": per_request, "prefix": prefix, **fields}
        answer = await self._peer.request("flood", params, timeout=600)
        assert isinstance(answer, dict), answer
        return answer

    async def push(self, event_id: str | None = None, **fields: Any) -> Any:
        """Send ``push/event`` (``origin``, ``payload``, ``tags``, ``featureSet``, ``form``)."""
        return await self.call("push", **_given(eventId=event_id), **fields)

    async def host_call(self, method: str, params: Any = None, *, form: str = "request") -> dict[str, Any]:
        """Make an arbitrary call to the host: ``{"result": …}`` or ``{"error": {code, message, data}}``."""
        return await self.call_for_object("call", method=method, params=params, form=form)

    async def send_raw(self, data: str, *, repeat: int = 1, suffix: str = "") -> dict[str, Any]:
        """Write ``data * repeat + suffix`` verbatim to the host transport (no newline added)."""
        return await self.call_for_object("sendRaw", data=data, repeat=repeat, suffix=suffix)

    async def send_bytes(self, data: bytes) -> dict[str, Any]:
        """Write ``data`` verbatim to the host transport: bytes a string can't carry (bad UTF-8)."""
        return await self.call_for_object("sendRaw", hex=data.hex())

    async def manifest_changed(self, manifest: Mapping[str, Any]) -> dict[str, Any]:
        """Replace the manifest and announce it with ``mcpl/manifestChanged`` (if a host is up)."""
        return await self.call_for_object("manifestChanged", manifest=dict(manifest))

    async def configure(
        self,
        *,
        publish: Mapping[str, Any] | None = None,
        before_inference: Mapping[str, Any] | None = None,
        tools: Sequence[Mapping[str, Any]] | None = None,
        receipt: Mapping[str, Any] | None = None,
        tool_call: Mapping[str, Any] | None = None,
        policy_delay_ms: int | None = None,
        open: Mapping[str, Any] | None = None,
    ) -> None:
        """Set how the fixture answers publishes, hooks, tool listings and calls, and the policy
        (``policy_delay_ms``: how long each ``featureSets/update`` Request waits for its answer);
        ``open={"error": {"code", "message"}}`` refuses every ``channels/open``."""
        await self.call(
            "configure",
            **_given(
                publish=publish, beforeInference=before_inference, tools=tools, receipt=receipt, toolCall=tool_call,
                policyDelayMs=policy_delay_ms, open=open,
            ),
        )

    async def recorded(self, method: str | None = None, *, epoch: int | None = None) -> list[dict[str, Any]]:
        """Host messages received so far, in order (optionally one method / one epoch)."""
        answer = await self.call("recorded", **_given(method=method, epoch=epoch))
        assert isinstance(answer, list), answer
        return answer

    async def state(self) -> dict[str, Any]:
        """Epoch, connection, grant, registered channels, eager/auto answers, personality."""
        return await self.call_for_object("state")

    async def disconnect(self) -> dict[str, Any]:
        """Drop the host connection (tcp/ws: the host must reconnect; stdio: the process exits)."""
        return await self.call_for_object("disconnect")

    async def exit(self, code: int = 0) -> dict[str, Any]:
        """Make the fixture process exit with ``code``."""
        return await self.call_for_object("exit", code=code)


class FixtureProcess(FixtureControl):
    """A fixture this test spawned as a subprocess; see :meth:`start`."""

    def __init__(
        self, peer: Peer, info: dict[str, Any], control_file: Path, process: trio.Process, transport: str
    ) -> None:
        super().__init__(peer, info, control_file)
        self.process = process
        self.transport = transport

    @classmethod
    @asynccontextmanager
    async def start(
        cls,
        nursery: trio.Nursery | None = None,
        *,
        transport: str = "tcp",
        personality: str = "strict",
        channels: Iterable[str | tuple[str, str]] = (),
        control_dir: str | Path,
        timeout: float = 10,
        extra_argv: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        **extra: Any,
    ) -> AsyncIterator[FixtureProcess]:
        """Spawn the fixture, wait until it is ready, connect its control channel.

        Args:
            nursery: where the control connection's reader runs (default: a private nursery).
            transport: ``stdio`` gives the test the process's pipes as the host link
                (:meth:`host_stream`); ``tcp``/``ws`` listen on 127.0.0.1 (:attr:`listen_url`).
            control_dir: the directory for the control file (a fresh name per fixture).
            timeout: seconds to wait for the control file.
            extra: more CLI flags, as for :func:`fixture_command` (``token=``, ``eager=True``…).

        On exit the process is terminated (SIGTERM, SIGKILL after 5 s) and reaped, even when
        the body failed or was cancelled.

        Raises:
            FixtureStartError: the process exited early or wasn't ready within ``timeout``.
        """
        control_file = Path(control_dir) / f"fixture-{personality}-{transport}-{uuid.uuid4().hex[:8]}.json"
        argv = fixture_command(transport, personality, channels, control_file, exit_with_parent=True, **extra)
        argv += list(extra_argv)
        stdio = transport == "stdio"
        process = await trio.lowlevel.open_process(
            argv,
            stdin=subprocess.PIPE if stdio else subprocess.DEVNULL,
            stdout=subprocess.PIPE if stdio else subprocess.DEVNULL,
            env=dict(env) if env is not None else None,
        )
        try:
            try:
                with trio.fail_after(timeout):
                    info = await _read_control_file(control_file, process=process)
                    stream = await trio.open_tcp_stream(info["control"]["host"], info["control"]["port"])
            except trio.TooSlowError:
                raise FixtureStartError(f"fixture not ready within {timeout:g}s: {' '.join(argv)}") from None
            async with _control_peer(stream, info, nursery) as peer:
                yield cls(peer, info, control_file, process, transport)
        finally:
            with trio.CancelScope(shield=True):
                await _terminate(process)

    @property
    def pid(self) -> int:
        return self.process.pid

    def host_stream(self) -> NdjsonStream:
        """stdio only: the host side of the link (write to the fixture's stdin, read its stdout)."""
        if self.process.stdin is None or self.process.stdout is None:
            raise RuntimeError(f"host_stream() is for stdio fixtures; this one listens at {self.listen_url}")
        return NdjsonStream(self.process.stdin, self.process.stdout)

    async def wait(self) -> int:
        """Wait for the process to exit; returns its exit code."""
        return await self.process.wait()


def _given(**values: Any) -> dict[str, Any]:
    return {key: value for key, value in values.items() if value is not None}


@asynccontextmanager
async def _control_peer(
    stream: trio.SocketStream, info: dict[str, Any], nursery: trio.Nursery | None = None
) -> AsyncIterator[Peer]:
    """Run a control :class:`Peer` on ``stream`` for the duration of the block."""
    peer = Peer(
        NdjsonStream(stream, stream, max_message_bytes=_CONTROL_MAX_MESSAGE_BYTES),
        MethodTable(),  # the fixture never calls us: anything it sends answers -32601
        request_timeout=_CONTROL_REQUEST_TIMEOUT,
        log_fields={"link": "fixture-control", "fixture_pid": info.get("pid")},
    )
    if nursery is not None:
        await nursery.start(peer.run)
        try:
            yield peer
        finally:
            await peer.aclose("fixture control closed")
        return
    # Re-raise the block's own exception outside our nursery, so callers see it as raised
    # rather than wrapped in an ExceptionGroup by the nursery.
    failure: Exception | None = None
    async with trio.open_nursery() as own:
        await own.start(peer.run)
        try:
            yield peer
        except Exception as exc:
            failure = exc
        finally:
            await peer.aclose("fixture control closed")
            own.cancel_scope.cancel()
    if failure is not None:
        raise failure


async def _terminate(process: trio.Process) -> None:
    """SIGTERM, wait up to 5 s, then SIGKILL; always reap, and close our pipe ends."""
    if process.poll() is None:
        process.terminate()
        with trio.move_on_after(_TERMINATE_GRACE):
            await process.wait()
        if process.poll() is None:
            process.kill()
            await process.wait()
    for pipe in (process.stdin, process.stdout):
        if pipe is not None:
            await pipe.aclose()
