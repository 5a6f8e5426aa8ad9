"""A scriptable MCPL server: ``python -m mcpl_router.testing.fixture_server --control-file PATH``.

It plays the servers the daemon meets in the field (PROTOCOL.md §8) so integration tests and the
demo talk to a real process over a real transport (stdio, TCP or WebSocket). Its *personality*
picks the wire habits it imitates:

- ``strict`` (slack-like, 0.5): nothing privileged before the ``featureSets/update`` Request;
  -32002 ``{capability}`` for a host call the current grant does not cover; registers its
  channels once the policy is answered (and ``channels.register`` granted).
- ``discord`` (0.4, array ``featureSets``, ``channels: true``): a log line on stdout after
  ``initialize`` (stdio), registers after the policy answer or after ``--grace`` seconds.
- ``legacy`` (heartbeat-like, 0.4): ``featureSets/update`` answers -32601; registers (and pushes,
  with ``--push-on-start``) right after ``notifications/initialized``.
- ``notify-publish`` (a 0.5 server that registers early): registers right after
  ``notifications/initialized``; ``channels/publish`` only as a Notification (-32601 as a Request).
- ``editor`` (mcpl-editor): claims 0.5 but speaks 0.4 (``channels: {register, publish, observe}``,
  feature sets using ``channels.observe``, non-spec ``stateUpdate``/``branches``); sends
  ``channels/register`` right after ``notifications/initialized`` and reads nothing else until it
  is answered (refused, its handling of the connection ends: nothing more is answered);
  ``featureSets/update`` and ``channels/publish`` only as Notifications (-32601 as Requests,
  a publish lands in its chat store); no typing, acknowledge, streaming or hook handlers; its
  ``channels/incoming`` messages carry no ``metadata``.

The ``legacy`` personality is heartbeat-mcpl's wire behaviour, ``discord`` discord-mcpl's: it also
reads ``channels/acknowledge`` only as a Request ``{channelId, messageId, intent, value?}`` (👀
without ``value``; state ``reactions`` is what the platform got) and ``channels/open`` history as
``history.limit`` (state ``historyRequests``).

Tests drive it through a **control channel**: ndjson JSON-RPC on 127.0.0.1 (see
:class:`_ControlSession` for the methods; :mod:`mcpl_router.testing.control` is the client).
Every message the host sends is recorded in arrival order, stamped with its connection
*epoch*: each accepted host connection is a new epoch with a fresh grant and channel set.

When ready, the program atomically writes ``--control-file``:
``{"pid", "control": {"host", "port"}, "listen": {"host", "port", "url"} | null}``.
"""

from __future__ import annotations

import argparse
import hmac
import os
import signal
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any, Final
from urllib.parse import parse_qs, urlsplit

import attrs
import msgspec
import trio
import trio_websocket

from mcpl_router.jsonrpc import (
    METHOD_NOT_FOUND,
    Inbound,
    MessageStream,
    MethodTable,
    NdjsonStream,
    Peer,
    PeerClosed,
    RequestTimeout,
    RpcError,
    WebSocketMessageStream,
)
from mcpl_router.logs import configure_logging, get_logger
from mcpl_router.testing.descriptors import channel_descriptor

PERSONALITIES = ("strict", "discord", "legacy", "notify-publish", "editor")
TRANSPORTS = ("stdio", "tcp", "ws")
FORMS = ("request", "notification")
LOOPBACK = "127.0.0.1"
WS_PATH = "/mcpl"

NO_HOST = -32000
CAPABILITY_DENIED = -32002
UNKNOWN_CHANNEL = -32023

# The names these personalities' real counterparts use, for feature sets and serverInfo.
_DEFAULT_NAMES = {"strict": "slack", "discord": "discord", "legacy": "heartbeat", "notify-publish": "editor", "editor": "editor"}
# Host → server methods mcpl-editor has no handler for (src/mcpl.ts handleRequest/Notification):
# a Request gets -32601, a Notification is ignored.
_EDITOR_UNHANDLED = frozenset(
    {"channels/typing", "channels/acknowledge", "channels/outgoing/chunk", "channels/outgoing/complete",
     "inference/lifecycle", "context/beforeInference"}
)
# What discord-mcpl prints with console.log once initialized (src/server.ts:937): it begins with
# "[", the way a JSON-RPC batch would.
#: The personalities whose real servers have no ``ping`` handler (discord-mcpl, heartbeat-mcpl,
#: mcpl-editor answer it -32601 Method not found), so the fixture answers as they do.
_NO_PING: Final = frozenset({"discord", "legacy", "editor"})
_DEFAULT_DISCORD_LOG_LINE = "[discord-mcpl] Client initialized (MCPL mode)"
# Tests send oversized frames *through* the control channel: its limit must dwarf the host's.
_CONTROL_MAX_MESSAGE_BYTES = 256 * 1024 * 1024
_HOST_MAX_MESSAGE_BYTES = 16 * 1024 * 1024
_HOST_REQUEST_TIMEOUT = 10.0
# Eager calls run inside the in-order dispatch of `notifications/initialized` (so they surely
# precede the policy answer); a host that never answers must not stall the link for long.
_EAGER_TIMEOUT = 5.0
_PARENT_POLL_INTERVAL = 0.5

# Host → server methods a strict server gates, with the leaves any one of which admits them.
_GATED_METHODS: dict[str, tuple[str, tuple[str, ...]]] = {
    "channels/publish": ("channels.publish", ("channels.publish",)),
    "channels/typing": ("channels.typing", ("channels.typing",)),
    "channels/outgoing/chunk": ("channels.streaming", ("channels.streaming",)),
    "channels/outgoing/complete": ("channels.streaming", ("channels.streaming",)),
    "channels/acknowledge": ("channels.acknowledge", ("channels.acknowledge",)),
    "channels/open": ("channels.lifecycle", ("channels.lifecycle",)),
    "channels/close": ("channels.lifecycle", ("channels.lifecycle",)),
    "channels/list": ("channels.register", ("channels.register",)),
    "inference/lifecycle": ("inferenceLifecycle", ("inferenceLifecycle",)),
    "inference/chunk": ("inferenceRequest.streaming", ("inferenceRequest.streaming",)),
    "context/beforeInference": (
        "contextHooks.beforeInference",
        (
            "contextHooks.beforeInference.observe",
            "contextHooks.beforeInference.inject.system",
            "contextHooks.beforeInference.inject.beforeUser",
            "contextHooks.beforeInference.inject.afterUser",
        ),
    ),
}

_MESSAGING_USES = [
    "channels.register",
    "channels.incoming",
    "channels.publish",
    "channels.lifecycle",
    "channels.typing",
    "channels.streaming",
    "channels.acknowledge",
    "pushEvents",
]
_CONTEXT_USES = [
    "contextHooks.beforeInference.observe",
    "contextHooks.beforeInference.inject.system",
    "contextHooks.beforeInference.inject.beforeUser",
    "contextHooks.beforeInference.inject.afterUser",
    "inferenceLifecycle",
]


# -- small pure helpers --------------------------------------------------------------------------


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def grants_leaf(patterns: Sequence[str], leaf: str) -> bool:
    """True when one of ``patterns`` grants ``leaf`` (``*`` = exactly one segment, PROTOCOL §3)."""
    leaf_parts = leaf.split(".")
    for pattern in patterns:
        parts = pattern.split(".")
        if len(parts) == len(leaf_parts) and all(p in ("*", segment) for p, segment in zip(parts, leaf_parts)):
            return True
    return False


def _effective(grant: dict[str, Any] | None) -> list[str]:
    # Absent or malformed allowlist = a grant of nothing (§5.3): fail closed.
    if not grant:
        return []
    paths = grant.get("effectiveCapabilities")
    if not isinstance(paths, list):
        return []
    return [p for p in paths if isinstance(p, str)]


def channel_descriptor_from_spec(spec: str, channel_type: str = "text") -> dict[str, Any]:
    """A channel descriptor from a CLI spec ``ID[=LABEL]``."""
    channel_id, _, label = spec.partition("=")
    return channel_descriptor(channel_id, label or None, channel_type=channel_type)


def build_manifest(personality: str, name: str, *, has_channels: bool) -> dict[str, Any]:
    """The manifest a personality advertises (record or array ``featureSets``, per §8)."""
    if personality == "strict":
        return {
            "version": "0.5",
            "pushEvents": True,
            "tools": True,
            "inferenceLifecycle": True,
            "contextHooks": {"beforeInference": True},
            "channels": {
                "register": True,
                "lifecycle": True,
                "publish": True,
                "incoming": True,
                "streaming": True,
                "acknowledge": True,
                "typing": True,
            },
            "featureSets": {
                f"{name}.messaging": {"description": f"Read and post {name} messages.", "uses": list(_MESSAGING_USES)},
                f"{name}.context": {"description": f"Recent {name} context before each turn.", "uses": list(_CONTEXT_USES)},
            },
        }
    if personality == "discord":
        return {
            "version": "0.4",
            "pushEvents": True,
            "tools": True,
            "channels": True,
            "contextHooks": {"beforeInference": True},
            "featureSets": [
                {"name": f"{name}.messaging", "description": "Discord guild and DM messaging.", "uses": list(_MESSAGING_USES)},
                {"name": f"{name}.context", "description": "Recent channel history.", "uses": _CONTEXT_USES[1:4]},
            ],
        }
    if personality == "legacy":
        manifest: dict[str, Any] = {
            "version": "0.4",
            "pushEvents": True,
            "tools": True,
            "featureSets": [{"name": name, "description": "Periodic heartbeats and reminders.", "uses": ["pushEvents"]}],
        }
        if has_channels:
            manifest["channels"] = {"register": True, "publish": True, "incoming": True}
            manifest["featureSets"].append(
                {"name": f"{name}.messaging", "uses": ["channels.register", "channels.incoming", "channels.publish"]}
            )
        return manifest
    if personality == "editor":
        # mcpl-editor's own manifest (src/mcpl.ts:138-147, src/feature-sets.ts), names and all.
        return {
            "version": "0.5",
            "pushEvents": True,
            "stateUpdate": True,
            "channels": {"register": True, "publish": True, "observe": True},
            "branches": {"list": True, "create": True, "switch": True, "delete": True},
            "featureSets": {
                f"{name}.observe": {"name": f"{name}.observe", "description": "Receive notifications when the document changes",
                                    "uses": ["pushEvents", "stateUpdate"], "rollback": False, "hostState": False},
                f"{name}.read": {"name": f"{name}.read", "description": "Read document content and structure",
                                 "uses": ["tools"], "rollback": False, "hostState": False},
                f"{name}.write": {"name": f"{name}.write", "description": "Edit the document",
                                  "uses": ["tools"], "rollback": True, "hostState": False},
                f"{name}.chat": {"name": f"{name}.chat", "description": "Chat with the human editing the document",
                                 "uses": ["channels.publish", "channels.observe"], "rollback": False, "hostState": False},
                f"{name}.branches": {"name": f"{name}.branches", "description": "Manage host branches from the editor UI",
                                     "uses": ["branches"], "rollback": False, "hostState": False},
            },
        }
    # notify-publish: 0.5 with the non-spec leaves mcpl-editor advertises.
    return {
        "version": "0.5",
        "pushEvents": True,
        "tools": True,
        "channels": {"register": True, "publish": True, "incoming": True, "cursor": True},
        "workspace": {"files": True, "selection": True},
        "featureSets": {
            f"{name}.messaging": {
                "description": "Chat with the person at the editor.",
                "uses": ["channels.register", "channels.incoming", "channels.publish", "pushEvents"],
            }
        },
    }


def _default_tools() -> list[dict[str, Any]]:
    return [
        {
            "name": "send_message",
            "description": "Send a message to a channel.",
            "inputSchema": {
                "type": "object",
                "properties": {"channelId": {"type": "string"}, "text": {"type": "string"}},
                "required": ["channelId", "text"],
            },
        },
        {
            "name": "fetch_history",
            "description": "Fetch recent messages of a channel.",
            "inputSchema": {
                "type": "object",
                "properties": {"channelId": {"type": "string"}, "limit": {"type": "integer"}},
                "required": ["channelId"],
            },
        },
    ]


def _error_object(exc: BaseException) -> dict[str, Any]:
    if isinstance(exc, RpcError):
        error: dict[str, Any] = {"code": exc.code, "message": exc.message}
        if exc.data is not None:
            error["data"] = exc.data
        return error
    if isinstance(exc, RequestTimeout):
        return {"code": NO_HOST, "message": f"host did not answer {exc.method} within {exc.timeout:g}s"}
    return {"code": NO_HOST, "message": f"host connection closed: {exc}"}


class _MessageProbe(msgspec.Struct):
    """Just enough of a JSON-RPC message to record it or to see which request it answers."""

    id: int | str | None | msgspec.UnsetType = msgspec.UNSET
    method: str | msgspec.UnsetType = msgspec.UNSET
    params: msgspec.Raw | msgspec.UnsetType = msgspec.UNSET
    result: msgspec.Raw | msgspec.UnsetType = msgspec.UNSET
    error: msgspec.Raw | msgspec.UnsetType = msgspec.UNSET


_probe_decoder = msgspec.json.Decoder(_MessageProbe)


def _probe(data: bytes) -> _MessageProbe | None:
    if data.lstrip()[:1] != b"{":
        return None
    try:
        return _probe_decoder.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None


# -- the transport wrapper -----------------------------------------------------------------------


@attrs.define
class _AfterReply:
    raw: bytes = b""
    then: Callable[[], None] | None = None


class _HookedStream:
    """A :class:`MessageStream` that can also write raw bytes and act right after a given reply.

    Why: a real server's side effects follow its answer on the wire (discord prints its log line
    *after* the initialize result; strict registers *after* the policy receipt), and tests send
    malformed bytes between well-formed messages. One lock orders Peer writes and raw writes so
    they never interleave mid-message. ``on_receive`` sees every inbound message in arrival
    order, before the Peer dispatches it (recording there keeps the true order).
    """

    def __init__(
        self,
        inner: MessageStream,
        *,
        raw_write: Callable[[bytes], Awaitable[None]] | None = None,
        on_receive: Callable[[bytes], None] | None = None,
    ) -> None:
        self.line_oriented = inner.line_oriented
        self._inner = inner
        self._raw_write = raw_write
        self.on_receive = on_receive
        self._lock = trio.Lock()
        self._after: dict[int | str, _AfterReply] = {}

    def after_reply(self, request_id: int | str | None, *, raw: bytes = b"", then: Callable[[], None] | None = None) -> None:
        """Once our answer to ``request_id`` is written, write ``raw`` then call ``then``."""
        if request_id is None:
            return
        self._after[request_id] = _AfterReply(raw, then)

    async def send_message(self, data: bytes) -> None:
        hook: _AfterReply | None = None
        async with self._lock:
            await self._inner.send_message(data)
            if self._after:
                probe = _probe(data)
                if probe is not None and probe.method is msgspec.UNSET and isinstance(probe.id, (int, str)):
                    hook = self._after.pop(probe.id, None)
            if hook is not None and hook.raw:
                await self._write_raw_locked(hook.raw)
        if hook is not None and hook.then is not None:
            hook.then()

    async def send_messages(self, messages: list[bytes], *, progress: Callable[[], None] | None = None) -> None:
        # One at a time: each answer may have an after-reply hook to run right behind it.
        for data in messages:
            await self.send_message(data)
            if progress is not None:
                progress()

    async def send_raw(self, data: bytes) -> None:
        """Write ``data`` verbatim (no framing added)."""
        async with self._lock:
            await self._write_raw_locked(data)

    async def _write_raw_locked(self, data: bytes) -> None:
        if self._raw_write is None:
            raise trio.ClosedResourceError("this stream takes no raw writes")
        await self._raw_write(data)

    async def receive_message(self) -> bytes:
        data = await self._inner.receive_message()
        if self.on_receive is not None:
            self.on_receive(data)
        return data

    async def aclose(self) -> None:
        await self._inner.aclose()


# -- program state -------------------------------------------------------------------------------


@attrs.define
class _Behaviour:
    """What tests configured through ``configure``; survives reconnects."""

    publish: dict[str, Any] = attrs.field(factory=dict)
    before_inference: dict[str, Any] = attrs.field(factory=dict)
    tools: list[dict[str, Any]] = attrs.field(factory=_default_tools)
    #: How ``tools/call`` answers: ``delayMs`` before answering (a connector-call deadline test).
    tool_call: dict[str, Any] = attrs.field(factory=dict)
    receipt: dict[str, Any] | None = None
    #: Milliseconds to hold each ``featureSets/update`` Request before answering it (a host that
    #: widened before the receipt, or narrowed only after it, shows in that window).
    policy_delay_ms: int = 0
    #: How ``channels/open`` answers: ``{"error": {code, message}}`` refuses every open.
    open: dict[str, Any] = attrs.field(factory=dict)


@attrs.define(eq=False)
class FixtureServer:
    """The program's whole state: options, manifest, recordings, the current host session."""

    options: argparse.Namespace
    name: str
    manifest: dict[str, Any]
    channels: list[dict[str, Any]]
    log: Any
    behaviour: _Behaviour = attrs.field(factory=_Behaviour)
    recordings: list[dict[str, Any]] = attrs.field(factory=list)
    eager_answers: list[dict[str, Any]] = attrs.field(factory=list)
    #: discord: what reached "the platform" for each channels/acknowledge it handled.
    reactions: list[dict[str, Any]] = attrs.field(factory=list)
    #: discord: the history limit each channels/open asked for, as the server read it.
    history_requests: list[dict[str, Any]] = attrs.field(factory=list)
    auto_answers: list[dict[str, Any]] = attrs.field(factory=list)
    epoch: int = 0
    session: _HostSession | None = None
    published: int = 0
    #: editor: the chat store, in order; an agent's message lands here from a publish Notification.
    chat_store: list[dict[str, Any]] = attrs.field(factory=list)
    incoming_count: int = 0
    #: When each (channel, message id) was first posted, so a re-send is the same message.
    posted_at: dict[tuple[str, str], str] = attrs.field(factory=dict)
    push_count: int = 0
    exit_code: int = 0
    exit_reason: str = ""
    _cancel_scope: trio.CancelScope | None = None

    @classmethod
    def from_options(cls, options: argparse.Namespace) -> FixtureServer:
        name = options.server_name or _DEFAULT_NAMES[options.personality]
        channels = [channel_descriptor_from_spec(spec) for spec in options.channel]
        channels += [channel_descriptor_from_spec(spec, "dm") for spec in options.dm]
        log = get_logger(
            server=options.server_name or os.getpid(),
            personality=options.personality,
            transport=options.transport,
        )
        manifest = build_manifest(options.personality, name, has_channels=bool(channels))
        if options.inference:
            # Server-initiated inference (§11, §12): ask with the control's `call`
            # (inference/request, model/info); the host's inference/chunk are recorded.
            manifest.update({"inferenceRequest": True, "modelInfo": True})
            inference_set = {"description": f"{name} asks the host's model.", "uses": ["inferenceRequest", "modelInfo"]}
            if isinstance(manifest.get("featureSets"), dict):
                manifest["featureSets"][f"{name}.inference"] = inference_set
            else:
                manifest.setdefault("featureSets", []).append({"name": f"{name}.inference", **inference_set})
        return cls(options=options, name=name, manifest=manifest, channels=channels, log=log)

    @property
    def messaging_feature_set(self) -> str:
        if self.options.personality == "editor":
            return f"{self.name}.chat"
        return self.name if self.options.personality == "legacy" else f"{self.name}.messaging"

    @property
    def context_feature_set(self) -> str:
        return f"{self.name}.context"

    # -- lifecycle ---------------------------------------------------------------------------

    async def run(self) -> int:
        """Serve until told to exit (control ``exit``, stdin EOF in stdio mode, a signal)."""
        with trio.CancelScope() as scope:
            self._cancel_scope = scope
            async with trio.open_nursery() as nursery:
                control = await nursery.start(partial(trio.serve_tcp, self._serve_control, 0, host=LOOPBACK))
                control_port = control[0].socket.getsockname()[1]
                listen = await self._start_listener(nursery)
                nursery.start_soon(self._watch_signals)
                if self.options.exit_with_parent:
                    nursery.start_soon(self._watch_parent)
                self._write_control_file(control_port, listen)
                self.log.info(
                    "fixture.ready",
                    control_port=control_port,
                    listen=listen,
                    channels=[c["id"] for c in self.channels],
                )
                if self.options.transport == "stdio":
                    nursery.start_soon(self._serve_stdio)
        self._remove_control_file()
        self.log.info("fixture.exit", code=self.exit_code, reason=self.exit_reason)
        return self.exit_code

    def request_exit(self, code: int, reason: str) -> None:
        """Stop the program with ``code`` (the first reason wins)."""
        if self._cancel_scope is None or self._cancel_scope.cancel_called:
            return
        self.exit_code = code
        self.exit_reason = reason
        self._cancel_scope.cancel()

    async def _start_listener(self, nursery: trio.Nursery) -> dict[str, Any] | None:
        transport = self.options.transport
        if transport == "tcp":
            listeners = await nursery.start(partial(trio.serve_tcp, self._serve_tcp_host, self.options.port, host=LOOPBACK))
            port = listeners[0].socket.getsockname()[1]
            return {"host": LOOPBACK, "port": port, "url": f"tcp://{LOOPBACK}:{port}"}
        if transport == "ws":
            server = await nursery.start(
                partial(
                    trio_websocket.serve_websocket,
                    self._serve_ws_host,
                    LOOPBACK,
                    self.options.port,
                    ssl_context=None,
                    max_message_size=_HOST_MAX_MESSAGE_BYTES,
                    disconnect_timeout=5,
                )
            )
            return {"host": LOOPBACK, "port": server.port, "url": f"ws://{LOOPBACK}:{server.port}{WS_PATH}"}
        return None

    def _write_control_file(self, control_port: int, listen: dict[str, Any] | None) -> None:
        # Write-then-rename so a reader never sees half a file.
        path: Path = self.options.control_file
        path.parent.mkdir(parents=True, exist_ok=True)
        info = {"pid": os.getpid(), "control": {"host": LOOPBACK, "port": control_port}, "listen": listen}
        temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        temporary.write_bytes(msgspec.json.encode(info))
        os.replace(temporary, path)

    def _remove_control_file(self) -> None:
        # Only our own: a restarted incarnation may already have written its file there.
        path: Path = self.options.control_file
        try:
            if msgspec.json.decode(path.read_bytes()).get("pid") == os.getpid():
                path.unlink()
        except (OSError, msgspec.DecodeError, AttributeError):
            pass

    async def _watch_signals(self) -> None:
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async for signum in signals:
                self.request_exit(0, f"signal {signal.Signals(signum).name}")

    async def _watch_parent(self) -> None:
        # A test runner killed with SIGKILL can't clean up: don't outlive it.
        parent = os.getppid()
        while True:
            await trio.sleep(_PARENT_POLL_INTERVAL)
            if os.getppid() != parent:
                self.request_exit(0, "parent exited")
                return

    # -- host connections --------------------------------------------------------------------

    async def _serve_stdio(self) -> None:
        # Duplicates, so trio's non-blocking mode and closing never touch sys.stdin/sys.stdout.
        stdin = trio.lowlevel.FdStream(os.dup(sys.stdin.fileno()))
        stdout = trio.lowlevel.FdStream(os.dup(sys.stdout.fileno()))
        transport = _HookedStream(
            NdjsonStream(stdout, stdin, max_message_bytes=_HOST_MAX_MESSAGE_BYTES), raw_write=stdout.send_all
        )
        await self._run_session(transport)
        # Servers exit on stdin EOF: the host is gone and will spawn a new one if it wants.
        self.request_exit(0, "stdin closed")

    async def _serve_tcp_host(self, stream: trio.SocketStream) -> None:
        transport = _HookedStream(
            NdjsonStream(stream, stream, max_message_bytes=_HOST_MAX_MESSAGE_BYTES), raw_write=stream.send_all
        )
        await self._run_session(transport)

    async def _serve_ws_host(self, request: trio_websocket.WebSocketRequest) -> None:
        if urlsplit(request.path).path != WS_PATH:
            self.log.warning("fixture.ws.rejected", reason="wrong path", path=request.path)
            await request.reject(404, body=b"not found: the MCPL endpoint is /mcpl")
            return
        if self.options.token is not None and self.options.token_in == "query":
            # As the servers written for connectome-host: the token rides in ?token=.
            offered = parse_qs(urlsplit(request.path).query).get("token", [""])[0]
            if not hmac.compare_digest(offered.encode(), self.options.token.encode()):
                self.log.warning("fixture.ws.rejected", reason="missing or wrong ?token=")
                await request.reject(401, body=b"unauthorized: send ?token=<token>")
                return
        elif self.options.token is not None and not self._bearer_ok(request.headers):
            # Never log what was offered: it may be a real credential.
            self.log.warning("fixture.ws.rejected", reason="missing or wrong bearer token")
            await request.reject(401, body=b"unauthorized: send Authorization: Bearer <token>")
            return
        connection = await request.accept()

        async def raw_write(data: bytes) -> None:
            try:
                await connection.send_message(data.decode("utf-8", "replace"))
            except trio_websocket.ConnectionClosed as exc:
                raise trio.ClosedResourceError("websocket closed") from exc

        await self._run_session(_HookedStream(WebSocketMessageStream(connection), raw_write=raw_write))

    def _bearer_ok(self, headers: list[tuple[bytes, bytes]]) -> bool:
        expected = f"Bearer {self.options.token}".encode()
        for name, value in headers:
            if name.lower() == b"authorization" and hmac.compare_digest(value.strip(), expected):
                return True
        return False

    async def _run_session(self, transport: _HookedStream) -> None:
        self.epoch += 1
        session = _HostSession(self, self.epoch, transport)
        previous, self.session = self.session, session
        if previous is not None and not self.options.keep_replaced_hosts:
            # One live host at a time: a new connection replaces the old one.
            await previous.peer.aclose("replaced by a newer host connection")
        self.log.info("fixture.host.connected", epoch=session.epoch)
        try:
            await session.run()
        finally:
            if self.session is session:
                self.session = None
            self.log.info("fixture.host.disconnected", epoch=session.epoch)

    def require_session(self) -> _HostSession:
        """The live host session, or the control error "no host connected"."""
        session = self.session
        if session is None or session.peer.closed:
            raise RpcError(NO_HOST, "no host connected")
        return session

    def record(self, entry: dict[str, Any]) -> None:
        entry["seq"] = len(self.recordings) + 1
        self.recordings.append(entry)

    # -- control ------------------------------------------------------------------------------

    async def _serve_control(self, stream: trio.SocketStream) -> None:
        transport = _HookedStream(NdjsonStream(stream, stream, max_message_bytes=_CONTROL_MAX_MESSAGE_BYTES))
        await _ControlSession(self, transport).peer.run()


# -- one host connection -------------------------------------------------------------------------


class _HostSession:
    """One host connection (an epoch): its grant, its registered channels, its Peer."""

    def __init__(self, server: FixtureServer, epoch: int, transport: _HookedStream) -> None:
        self.server = server
        self.epoch = epoch
        self.transport = transport
        self.options = server.options
        self.log = server.log.bind(epoch=epoch)
        self.grant: dict[str, Any] | None = None
        self.receipt: dict[str, Any] | None = None
        self.initialized = False
        self.announced = False
        self.channels: dict[str, dict[str, Any]] = {}
        #: ``--host-owns-subscriptions``: the channels this host connection opened (as
        #: discord-mcpl keeps them: in memory, the host's to restore after any restart).
        self.subscribed: set[str] = set()
        # Admission is decided when a request arrives (against the grant current then) and
        # applied when it is handled.
        self._request_denials: dict[int | str, str] = {}
        self._nursery: trio.Nursery | None = None
        transport.on_receive = self._on_receive
        self.table = self._method_table()
        self.peer = Peer(
            transport,
            self._handle,
            request_timeout=_HOST_REQUEST_TIMEOUT,
            # A slow hook must not hold up publishes queued behind it (it has its own timeout).
            concurrent_methods=("context/beforeInference",),
            log_fields={"server": server.options.server_name or os.getpid(), "epoch": epoch, "link": "host"},
        )

    async def run(self) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            try:
                await self.peer.run()
            finally:
                # Grace timers and registrations die with the connection.
                nursery.cancel_scope.cancel()

    def spawn(self, fn: Callable[[], Awaitable[None]]) -> None:
        assert self._nursery is not None
        self._nursery.start_soon(fn)

    # -- admission and recording -------------------------------------------------------------

    def denied_capability(self, method: str) -> str | None:
        """The capability a strict server refuses ``method`` for under the current grant."""
        if self.options.personality != "strict":
            return None
        gate = _GATED_METHODS.get(method)
        if gate is None:
            return None
        label, leaves = gate
        granted = _effective(self.grant)
        if any(grants_leaf(granted, leaf) for leaf in leaves):
            return None
        return label

    def _on_receive(self, data: bytes) -> None:
        probe = _probe(data)
        if probe is None:
            return
        if probe.method is msgspec.UNSET:
            if isinstance(probe.id, str) or probe.id is None:
                # The answer to a request a test wrote raw (string ids; ours are numbers), or
                # an error with no id: recorded, so a test can read what the host answered.
                answer: dict[str, Any] = {"epoch": self.epoch, "kind": "answer", "method": None, "id": probe.id, "at": _now()}
                if probe.result is not msgspec.UNSET:
                    answer["result"] = msgspec.json.decode(probe.result)
                if probe.error is not msgspec.UNSET:
                    answer["error"] = msgspec.json.decode(probe.error)
                self.server.record(answer)
            return
        is_request = probe.id is not msgspec.UNSET
        entry: dict[str, Any] = {
            "epoch": self.epoch,
            "kind": "request" if is_request else "notification",
            "method": probe.method,
            "params": None if probe.params is msgspec.UNSET else msgspec.json.decode(probe.params),
            "at": _now(),
        }
        if is_request:
            entry["id"] = probe.id
        denied = self.denied_capability(probe.method)
        if denied is not None:
            entry["denied"] = denied
            if is_request and isinstance(probe.id, (int, str)):
                self._request_denials[probe.id] = denied
            self.log.warning("fixture.host.denied", method=probe.method, kind=entry["kind"], capability=denied)
        self.server.record(entry)

    async def _handle(self, inbound: Inbound) -> Any:
        if inbound.method in self.options.never_answer and not inbound.is_notification:
            # A server that hangs on this method: the host's deadline is what ends the wait.
            self.log.info("fixture.never_answering", method=inbound.method)
            await trio.sleep_forever()
        if inbound.method in self.options.unknown_method or (inbound.method == "ping" and self.options.personality in _NO_PING):
            # As the real servers answer methods they have no handler for (ping among them).
            raise RpcError(-32601, f"Method not found: {inbound.method}")
        if inbound.is_notification:
            denied = self.denied_capability(inbound.method)
        else:
            denied = self._request_denials.pop(inbound.id, None) if inbound.id is not None else None
        if denied is not None:
            raise RpcError(CAPABILITY_DENIED, f"Capability denied: {denied}", {"capability": denied})
        if self.options.personality == "editor" and inbound.method in _EDITOR_UNHANDLED:
            if inbound.is_notification:
                return None  # its notification switch has no case for it: silently nothing
            raise RpcError(METHOD_NOT_FOUND, f"Method not found: {inbound.method}")
        return await self.table(inbound)

    # -- host → server methods ---------------------------------------------------------------

    def _method_table(self) -> MethodTable:
        table = MethodTable()
        table.add("initialize", self._initialize, dict[str, Any])
        table.add("notifications/initialized", self._initialized)
        table.add("featureSets/update", self._feature_sets_update, dict[str, Any])
        table.add("channels/publish", self._publish, dict[str, Any])
        for method in (
            "channels/typing",
            "channels/outgoing/chunk",
            "channels/outgoing/complete",
            "inference/lifecycle",
            "inference/chunk",
            "ping",
        ):
            table.add(method, self._noted)
        table.add("channels/close", self._close_channel, dict[str, Any])
        table.add("channels/acknowledge", self._acknowledge, dict[str, Any])
        table.add("channels/open", self._open, dict[str, Any])
        table.add("channels/list", self._channels_list)
        table.add("context/beforeInference", self._before_inference, dict[str, Any])
        table.add("tools/list", self._tools_list)
        table.add("tools/call", self._tools_call, dict[str, Any])
        table.add("mcpl/manifest", self._manifest)
        return table

    async def _initialize(self, params: dict[str, Any], inbound: Inbound) -> dict[str, Any]:
        self.log.info("fixture.host.initialize", protocol_version=params.get("protocolVersion"))
        if self.options.personality == "discord" and self.options.transport == "stdio":
            line = self.options.log_line if self.options.log_line is not None else _DEFAULT_DISCORD_LOG_LINE
            self.transport.after_reply(inbound.id, raw=line.encode() + b"\n")
        elif self.options.log_line is not None and self.options.transport == "stdio":
            self.transport.after_reply(inbound.id, raw=self.options.log_line.encode() + b"\n")
        return {
            "protocolVersion": params.get("protocolVersion") or "2024-11-05",
            "capabilities": {"tools": {}, "experimental": {"mcpl": self.server.manifest}},
            "serverInfo": {"name": f"mcpl-fixture-{self.server.name}", "version": "0.1.0"},
        }

    async def _initialized(self, _params: Any, _inbound: Inbound) -> None:
        self.initialized = True
        if self.options.eager:
            # Inline, not spawned: in-order dispatch then guarantees these precede the policy.
            await self._send_eager()
        personality = self.options.personality
        if personality == "editor":
            # mcpl-editor awaits its channels/register before entering its read loop
            # (src/mcpl.ts:67 vs :70): everything the host sent meanwhile waits in line behind
            # this handler (dispatch is in order), and a refusal ends its handling for good.
            await self._announce("initialized")
            refused = [a for a in self.server.auto_answers if a["epoch"] == self.epoch and "error" in a]
            if refused:
                self.log.warning("fixture.editor.stalled", reason="channels/register refused", error=refused[0]["error"])
                await trio.sleep_forever()
            return
        if personality in ("legacy", "notify-publish"):
            # Inline, like --eager: these servers register *before* the policy, and a spawned
            # task could lose that race to the host's featureSets/update under load. Answers
            # are resolved by the read loop, so awaiting the host's answer here is safe.
            await self._announce("initialized")
        elif personality == "discord":
            self.spawn(self._grace_then_announce)

    async def _feature_sets_update(self, params: dict[str, Any], inbound: Inbound) -> dict[str, Any] | None:
        if self.options.personality == "legacy":
            raise RpcError(METHOD_NOT_FOUND, "Method not found: featureSets/update")
        if self.options.personality == "editor":
            if not inbound.is_notification:
                raise RpcError(METHOD_NOT_FOUND, "Method not found: featureSets/update")
            # Its Notification form toggles feature sets (src/mcpl.ts:219); no receipt.
            self.grant = params
            self.log.info("fixture.policy.notified", enabled=params.get("enabled"), disabled=params.get("disabled"))
            return None
        delay_ms = self.server.behaviour.policy_delay_ms
        if delay_ms:
            await trio.sleep(delay_ms / 1000)
        self.grant = params
        receipt = self.server.behaviour.receipt or self._receipt(params)
        self.receipt = receipt
        self.log.info(
            "fixture.policy.received",
            capabilities=_effective(params),
            accepted=receipt.get("accepted"),
            mode=receipt.get("mode", "full"),
        )
        if self.options.personality in ("strict", "discord") and not self.announced:
            # After the receipt is on the wire: the host widens only once it has it.
            self.transport.after_reply(inbound.id, then=lambda: self.spawn(partial(self._announce, "policy")))
        return receipt

    def _receipt(self, grant: dict[str, Any]) -> dict[str, Any]:
        granted = _effective(grant)
        enabled = grant.get("enabled")
        disabled_given = grant.get("disabled")
        disabled = disabled_given if isinstance(disabled_given, list) else []
        unavailable = []
        for name, uses in self._declared_feature_sets():
            if (isinstance(enabled, list) and name not in enabled) or name in disabled:
                continue
            missing = [leaf for leaf in uses if not grants_leaf(granted, leaf)]
            if missing:
                unavailable.append(
                    {
                        "featureSet": name,
                        "missingCapabilities": missing,
                        "effect": "disabled" if len(missing) == len(uses) else "degraded",
                    }
                )
        if not unavailable:
            return {"accepted": True}
        return {"accepted": True, "mode": "degraded", "unavailableFeatures": unavailable}

    def _declared_feature_sets(self) -> list[tuple[str, list[str]]]:
        declared = self.server.manifest.get("featureSets")
        pairs: list[tuple[str, list[str]]] = []
        if isinstance(declared, dict):
            items = [(name, spec) for name, spec in declared.items() if isinstance(spec, dict)]
        elif isinstance(declared, list):
            items = [(spec.get("name"), spec) for spec in declared if isinstance(spec, dict)]
        else:
            items = []
        for name, spec in items:
            uses = spec.get("uses")
            if isinstance(name, str) and isinstance(uses, list):
                pairs.append((name, [u for u in uses if isinstance(u, str)]))
        return pairs

    async def _publish(self, params: dict[str, Any], inbound: Inbound) -> dict[str, Any] | None:
        if not inbound.is_notification and self.options.personality in ("notify-publish", "editor"):
            raise RpcError(
                METHOD_NOT_FOUND, "Method not found: channels/publish as a request (send it as a notification)"
            )
        channel_id = params.get("channelId")
        if channel_id not in self.channels:
            # A publish for a channel this server never registered is a routing bug upstream.
            self.log.warning("fixture.publish.unknown_channel", channel=channel_id, kind="notification" if inbound.is_notification else "request")
            raise RpcError(UNKNOWN_CHANNEL, f"Unknown channel: {channel_id}", {"channelId": channel_id})
        setting = self.server.behaviour.publish
        delay_ms = setting.get("delayMs") or 0
        if delay_ms:
            await trio.sleep(delay_ms / 1000)
        error = setting.get("error")
        if error:
            raise RpcError(int(error.get("code", -32603)), str(error.get("message", "publish failed")), error.get("data"))
        self.server.published += 1
        message_id = f"m-{self.server.published}"
        self.log.info("fixture.publish.received", channel=channel_id, message_id=message_id)
        if self.options.personality == "editor":
            content_given = params.get("content")
            content = content_given if isinstance(content_given, list) else []
            text = "\n".join(b.get("text", "") for b in content if isinstance(b, dict) and b.get("type") == "text")
            self.server.chat_store.append({"author": "Agent", "source": "agent", "text": text, "at": _now()})
        if inbound.is_notification:
            return None
        if setting.get("delivered", True) is False:
            return {"delivered": False, "reason": "configured to fail delivery"}
        return {"delivered": True, "messageId": message_id}

    async def _acknowledge(self, params: dict[str, Any], inbound: Inbound) -> dict[str, Any] | None:
        if self.options.personality != "discord":
            return {} if not inbound.is_notification else None
        # discord-mcpl: a Request only (an unknown notification is dropped, server.ts:1158), read
        # as {channelId, messageId, intent, value?}; no value means its own 👀 (server.ts:2432).
        if inbound.is_notification:
            self.log.info("fixture.acknowledge.ignored", reason="notification")
            return None
        value = params.get("value")
        representation = value.strip() if isinstance(value, str) and value.strip() else "👀"
        self.server.reactions.append(
            {"epoch": self.epoch, "channelId": params.get("channelId"), "messageId": params.get("messageId"),
             "intent": params.get("intent"), "representation": representation}
        )
        return {"acknowledged": True, "representation": representation}

    async def _close_channel(self, params: dict[str, Any], _inbound: Inbound) -> dict[str, Any]:
        channel_id = params.get("channelId")
        if isinstance(channel_id, str):
            self.subscribed.discard(channel_id)
        return {}

    async def _open(self, params: dict[str, Any], inbound: Inbound) -> dict[str, Any]:
        refusal = self.server.behaviour.open.get("error")
        if isinstance(refusal, dict):
            raise RpcError(int(refusal.get("code", -32000)), str(refusal.get("message", "refused")))
        channel_id = params.get("channelId")
        descriptor = self.channels.get(channel_id) if isinstance(channel_id, str) else None
        if isinstance(channel_id, str):
            self.subscribed.add(channel_id)
        if self.options.personality != "discord":
            return {"channel": descriptor} if descriptor is not None else {}
        # discord-mcpl reads backscroll as history.limit (server.ts:68-71, :2379), nothing else.
        history = params.get("history")
        limit = history.get("limit") if isinstance(history, dict) else None
        requested = limit if isinstance(limit, int) and not isinstance(limit, bool) else 0
        self.server.history_requests.append({"epoch": self.epoch, "channelId": channel_id, "limit": requested})
        answer: dict[str, Any] = {"channel": descriptor or {"id": channel_id}}
        if requested > 0:
            answer["history"] = [
                {"channelId": channel_id, "messageId": f"h-{index}", "author": {"id": "user-1", "name": "Demo User"},
                 "timestamp": _now(), "content": [{"type": "text", "text": f"older message {index}"}],
                 "metadata": {"backscroll": True}}
                for index in range(1, min(requested, 50) + 1)
            ]
            answer["historyTruncated"] = False
        return answer

    async def _noted(self, _params: Any, _inbound: Inbound) -> dict[str, Any]:
        # Recorded on arrival; the fixture has nothing else to do with these.
        return {}

    async def _channels_list(self, _params: Any, _inbound: Inbound) -> dict[str, Any]:
        return {"channels": list(self.channels.values())}

    async def _before_inference(self, _params: dict[str, Any], _inbound: Inbound) -> dict[str, Any]:
        setting = self.server.behaviour.before_inference
        delay_ms = setting.get("delayMs") or 0
        if delay_ms:
            await trio.sleep(delay_ms / 1000)
        error = setting.get("error")
        if error:
            raise RpcError(int(error.get("code", -32603)), str(error.get("message", "hook failed")), error.get("data"))
        return {"featureSet": self.server.context_feature_set, "contextInjections": list(setting.get("injections", []))}

    async def _tools_list(self, _params: Any, _inbound: Inbound) -> dict[str, Any]:
        return {"tools": self.server.behaviour.tools}

    async def _tools_call(self, params: dict[str, Any], _inbound: Inbound) -> dict[str, Any]:
        name = params.get("name")
        arguments = params.get("arguments") or {}
        if name not in {tool.get("name") for tool in self.server.behaviour.tools}:
            raise RpcError(-32602, f"Unknown tool: {name}", {"name": name})
        delay_ms = self.server.behaviour.tool_call.get("delayMs") or 0
        if delay_ms:
            await trio.sleep(delay_ms / 1000)
        if name == "send_message":
            self.server.published += 1
            message_id = f"m-{self.server.published}"
            self.server.record(
                {
                    "epoch": self.epoch,
                    "kind": "tool",
                    "method": "channels/publish",
                    "params": {
                        "channelId": arguments.get("channelId"),
                        "content": [{"type": "text", "text": arguments.get("text", "")}],
                    },
                    "via": "tools/call",
                    "at": _now(),
                }
            )
            return {"content": [{"type": "text", "text": "sent"}], "structuredContent": {"messageId": message_id}}
        if name == "fetch_history":
            return {"content": [{"type": "text", "text": "[]"}], "structuredContent": {"messages": []}}
        return {"content": [{"type": "text", "text": "ok"}]}

    async def _manifest(self, _params: Any, _inbound: Inbound) -> dict[str, Any]:
        return {"manifest": self.server.manifest}

    # -- server → host ----------------------------------------------------------------------

    async def send(self, method: str, params: Any, form: str | None, *, timeout: float | None = None) -> Any:
        """Send a request (→ the host's result) or a notification (→ None).

        Raises:
            RpcError: the host's error answer, or -32000 when the connection or deadline failed.
        """
        try:
            if form == "notification":
                await self.peer.notify(method, params)
                return None
            return await self.peer.request(method, params, timeout=timeout)
        except (PeerClosed, RequestTimeout) as exc:
            error = _error_object(exc)
            raise RpcError(error["code"], error["message"]) from exc

    async def send_outcome(self, method: str, params: Any, form: str | None, *, timeout: float | None = None) -> dict[str, Any]:
        """Like :meth:`send`, but the outcome as ``{"result": …}`` or ``{"error": {…}}``."""
        try:
            return {"result": await self.send(method, params, form, timeout=timeout)}
        except RpcError as exc:
            return {"error": _error_object(exc)}

    def register_locally(self, added: Sequence[Any] = (), removed: Sequence[Any] = (), updated: Sequence[Any] = ()) -> None:
        # Before sending: the host may publish to a channel the moment it accepts it.
        for descriptor in [*added, *updated]:
            if isinstance(descriptor, dict) and isinstance(descriptor.get("id"), str):
                self.channels[descriptor["id"]] = descriptor
        for channel_id in removed:
            self.channels.pop(channel_id, None)

    def event_params(self, fields: dict[str, Any]) -> dict[str, Any]:
        """A ``push/event`` params object with defaults filled in."""
        self.server.push_count += 1
        event_id = fields.get("eventId") or f"ev-{self.server.push_count}"
        params: dict[str, Any] = {
            "featureSet": fields.get("featureSet") or self.server.messaging_feature_set,
            "eventId": event_id,
            "timestamp": fields.get("timestamp") or _now(),
            "origin": fields.get("origin") or {"source": self.server.name},
            "payload": fields.get("payload") or {"content": [{"type": "text", "text": f"event {event_id}"}]},
        }
        if fields.get("tags") is not None:
            params["tags"] = fields["tags"]
        return params

    async def _send_eager(self) -> None:
        probe_channels = self.server.channels or [channel_descriptor("eager-probe")]
        calls = [
            ("channels/register", {"channels": probe_channels}),
            ("push/event", self.event_params({"eventId": f"eager-{self.epoch}"})),
        ]
        for method, params in calls:
            outcome = await self.send_outcome(method, params, "request", timeout=_EAGER_TIMEOUT)
            self.server.eager_answers.append({"epoch": self.epoch, "method": method, **outcome})
            self.log.info("fixture.eager.answered", method=method, code=outcome.get("error", {}).get("code"))

    async def _grace_then_announce(self) -> None:
        await trio.sleep(self.options.grace)
        await self._announce("grace")

    async def _announce(self, reason: str) -> None:
        """Register the configured channels (and push, with ``--push-on-start``), once per epoch."""
        if self.announced:
            return
        strict = self.options.personality == "strict"
        granted = _effective(self.grant)
        if strict and self.server.channels and not grants_leaf(granted, "channels.register"):
            # Not announced: a later, wider policy registers them.
            self.log.info("fixture.register.skipped", reason="channels.register not granted")
            return
        self.announced = True
        if self.server.channels:
            self.register_locally(added=self.server.channels)
            outcome = await self.send_outcome(
                "channels/register", {"channels": self.server.channels}, self.options.register_form
            )
            self.server.auto_answers.append({"epoch": self.epoch, "method": "channels/register", **outcome})
            self.log.info(
                "fixture.channels.registered",
                trigger=reason,
                channels=list(self.channels),
                form=self.options.register_form,
                refused=outcome.get("error", {}).get("code"),
            )
        if self.options.push_on_start:
            if strict and not grants_leaf(granted, "pushEvents"):
                self.log.info("fixture.push.skipped", reason="pushEvents not granted")
                return
            fields: dict[str, Any] = {"eventId": f"start-{self.epoch}"}
            if self.options.personality == "legacy":
                fields["origin"] = {"source": "heartbeat"}
                # heartbeat-mcpl's ids are unique across restarts (`${kind}_${Date.now()}_…`,
                # src/index.ts:271), so a respawned one's first push is a new event, not a retry.
                fields["eventId"] = f"heartbeat_{os.getpid()}_{self.epoch}"
            outcome = await self.send_outcome("push/event", self.event_params(fields), "request")
            self.server.auto_answers.append({"epoch": self.epoch, "method": "push/event", **outcome})


# -- one control connection ----------------------------------------------------------------------


class _ControlSession:
    """The control methods tests call (ndjson JSON-RPC on the control port).

    Methods that talk to the host answer -32000 "no host connected" when none is; a host's
    error answer to a request the fixture forwarded comes back as this call's error.
    """

    def __init__(self, server: FixtureServer, transport: _HookedStream) -> None:
        self.server = server
        self.transport = transport
        table = MethodTable()
        # Calls that wait on the host run concurrently, so `state`/`recorded` stay answerable.
        for method, handler in (
            ("register", self._register),
            ("change", self._change),
            ("withdraw", self._withdraw),
            ("incoming", self._incoming),
            ("push", self._push),
            ("call", self._call),
            ("manifestChanged", self._manifest_changed),
            ("flood", self._flood),
        ):
            table.add(method, handler, dict[str, Any], concurrent=True)
        table.add("sendRaw", self._send_raw, dict[str, Any])
        table.add("configure", self._configure, dict[str, Any])
        table.add("recorded", self._recorded, dict[str, Any])
        table.add("state", self._state)
        table.add("disconnect", self._disconnect)
        table.add("exit", self._exit, dict[str, Any])
        self.peer = Peer(
            transport,
            table,
            request_timeout=_HOST_REQUEST_TIMEOUT,
            concurrent_methods=table.concurrent_methods,
            log_fields={"server": server.options.server_name or os.getpid(), "link": "control"},
        )

    def _form(self, params: dict[str, Any]) -> str:
        form = params.get("form") or self.server.options.register_form
        if form not in FORMS:
            raise RpcError(-32602, f"form must be one of {', '.join(FORMS)}", {"form": form})
        return str(form)

    async def _register(self, params: dict[str, Any], _inbound: Inbound) -> Any:
        session = self.server.require_session()
        channels = params.get("channels")
        if not isinstance(channels, list):
            raise RpcError(-32602, "register needs channels: [descriptor]")
        session.register_locally(added=channels)
        return await session.send("channels/register", {"channels": channels}, self._form(params), timeout=params.get("timeout"))

    async def _change(self, params: dict[str, Any], _inbound: Inbound) -> Any:
        session = self.server.require_session()
        change = {key: params[key] for key in ("added", "removed", "updated") if key in params}
        session.register_locally(change.get("added", ()), change.get("removed", ()), change.get("updated", ()))
        return await session.send("channels/changed", change, self._form(params), timeout=params.get("timeout"))

    async def _withdraw(self, params: dict[str, Any], inbound: Inbound) -> Any:
        ids = params.get("ids")
        if not isinstance(ids, list):
            raise RpcError(-32602, "withdraw needs ids: [channelId]")
        return await self._change({"removed": ids, **{k: v for k, v in params.items() if k in ("form", "timeout")}}, inbound)

    async def _incoming(self, params: dict[str, Any], _inbound: Inbound) -> Any:
        session = self.server.require_session()
        messages = params.get("messages")
        if not isinstance(messages, list):
            raise RpcError(-32602, "incoming needs messages: [message]")
        filled = [self._complete_message(m) for m in messages]
        not_sent: list[str] = []
        if self.server.options.host_owns_subscriptions:
            # As discord-mcpl: a message in a channel the host has not opened on this
            # connection never goes out (the platform's event is dropped there).
            not_sent = [m.get("messageId", "") for m in filled if m.get("channelId") not in session.subscribed]
            filled = [m for m in filled if m.get("channelId") in session.subscribed]
            if not_sent:
                self.server.log.info("fixture.incoming.not_subscribed", message_ids=not_sent)
            if not filled:
                return {"results": [], "notSent": not_sent}
        answer = await session.send("channels/incoming", {"messages": filled}, self._form(params), timeout=params.get("timeout"))
        if not_sent and isinstance(answer, dict):
            answer = {**answer, "notSent": not_sent}
        return answer

    async def _flood(self, params: dict[str, Any], _inbound: Inbound) -> dict[str, Any]:
        """Send ``count`` ``channels/incoming`` requests with up to ``outstanding`` in flight.

        A pipelining server, for load tests and benchmarks: the control channel's cost is paid
        once, not per message. Answers how many messages were accepted and how long it took
        (with ``ids``, also ``acceptedIds``: each accepted message's id, for a test that checks
        every one of them arrived).
        """
        session = self.server.require_session()
        count = int(params.get("count", 1))
        outstanding = max(1, int(params.get("outstanding", 128)))
        per_request = max(1, int(params.get("perRequest", 1)))
        channel = params.get("channelId", "general")
        prefix = str(params.get("prefix", "flood"))
        tags = params.get("tags", ["chat:mention"])
        text = str(params.get("text", "x"))
        # Open loop: message i leaves at start + i / rate, whatever the answers do (latency
        # under an offered load). Each carries its send time (CLOCK_MONOTONIC, shared by the
        # processes of one machine) in metadata.sentAt.
        rate = params.get("rate")
        slots = trio.Semaphore(outstanding)
        totals = {"accepted": 0, "refused": 0, "failed": 0}
        accepted_ids: list[str] | None = [] if params.get("ids") else None

        async def one(index: int) -> None:
            try:
                messages = [
                    self._complete_message(
                        {"channelId": channel, "messageId": f"{prefix}-{index}-{n}", "text": text, "tags": tags,
                         "metadata": {"sentAt": time.monotonic()}}
                    )
                    for n in range(per_request)
                ]
                try:
                    answer = await session.peer.request("channels/incoming", {"messages": messages}, timeout=120)
                except (RpcError, PeerClosed, RequestTimeout):
                    totals["failed"] += per_request
                    return
                for position, result in enumerate(answer.get("results", []) if isinstance(answer, dict) else []):
                    accepted = isinstance(result, dict) and bool(result.get("accepted"))
                    totals["accepted" if accepted else "refused"] += 1
                    if accepted and accepted_ids is not None and position < len(messages):
                        accepted_ids.append(messages[position]["messageId"])
            finally:
                slots.release()

        started = trio.current_time()
        async with trio.open_nursery() as nursery:
            for index in range(count):
                if isinstance(rate, (int, float)) and rate > 0:
                    await trio.sleep_until(started + index / rate)
                await slots.acquire()
                nursery.start_soon(one, index)
        seconds = trio.current_time() - started
        return {**totals, "seconds": seconds} if accepted_ids is None else {**totals, "seconds": seconds, "acceptedIds": accepted_ids}

    def _complete_message(self, message: Any) -> Any:
        if not isinstance(message, dict):
            return message
        self.server.incoming_count += 1
        filled = dict(message)
        filled.setdefault("messageId", f"in-{self.server.incoming_count}")
        filled.setdefault("author", {"id": "user-1", "name": "Demo User"})
        # A message keeps the time it was posted: a test re-sending it is a server's retry.
        key = (str(filled.get("channelId")), str(filled["messageId"]))
        filled.setdefault("timestamp", self.server.posted_at.setdefault(key, _now()))
        if "content" not in filled:
            filled["content"] = [{"type": "text", "text": filled.pop("text", "")}]
        if self.server.options.personality != "editor":
            filled.setdefault("metadata", {})  # mcpl-editor's messages carry none (src/chat.ts:72)
        return filled

    async def _push(self, params: dict[str, Any], _inbound: Inbound) -> Any:
        session = self.server.require_session()
        form = params.get("form") or "request"
        return await session.send("push/event", session.event_params(params), form, timeout=params.get("timeout"))

    async def _call(self, params: dict[str, Any], _inbound: Inbound) -> dict[str, Any]:
        session = self.server.require_session()
        method = params.get("method")
        if not isinstance(method, str):
            raise RpcError(-32602, "call needs method: str")
        form = params.get("form") or "request"
        if form not in FORMS:
            raise RpcError(-32602, f"form must be one of {', '.join(FORMS)}")
        return await session.send_outcome(method, params.get("params"), form, timeout=params.get("timeout"))

    async def _send_raw(self, params: dict[str, Any], _inbound: Inbound) -> dict[str, Any]:
        session = self.server.require_session()
        data = params.get("data")
        raw_hex = params.get("hex")
        if isinstance(raw_hex, str):
            # Bytes no JSON string can carry (invalid UTF-8), given as hex.
            payload = bytes.fromhex(raw_hex)
        elif isinstance(data, str):
            payload = (data * int(params.get("repeat", 1)) + str(params.get("suffix", ""))).encode()
        else:
            raise RpcError(-32602, "sendRaw needs data: str (or hex: str)")
        try:
            await session.transport.send_raw(payload)
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            raise RpcError(NO_HOST, f"host connection closed: {exc}") from exc
        return {"bytes": len(payload)}

    async def _manifest_changed(self, params: dict[str, Any], _inbound: Inbound) -> dict[str, Any]:
        manifest = params.get("manifest")
        if not isinstance(manifest, dict):
            raise RpcError(-32602, "manifestChanged needs manifest: object")
        # The new manifest holds for this and later connections, announced or not.
        self.server.manifest = manifest
        session = self.server.session
        if session is None or session.peer.closed:
            return {"notified": False}
        announcement = {"revision": manifest["revision"]} if "revision" in manifest else {}
        await session.send("mcpl/manifestChanged", announcement, "notification")
        return {"notified": True}

    async def _configure(self, params: dict[str, Any], _inbound: Inbound) -> dict[str, Any]:
        behaviour = self.server.behaviour
        if isinstance(params.get("publish"), dict):
            behaviour.publish = {**behaviour.publish, **params["publish"]}
        if isinstance(params.get("beforeInference"), dict):
            behaviour.before_inference = {**behaviour.before_inference, **params["beforeInference"]}
        if isinstance(params.get("tools"), list):
            behaviour.tools = params["tools"]
        if isinstance(params.get("toolCall"), dict):
            behaviour.tool_call = {**behaviour.tool_call, **params["toolCall"]}
        if "receipt" in params:
            behaviour.receipt = params["receipt"]
        if isinstance(params.get("policyDelayMs"), int):
            behaviour.policy_delay_ms = params["policyDelayMs"]
        if isinstance(params.get("open"), dict):
            behaviour.open = params["open"]
        return {}

    async def _recorded(self, params: dict[str, Any], _inbound: Inbound) -> list[dict[str, Any]]:
        method = params.get("method")
        epoch = params.get("epoch")
        return [
            entry
            for entry in self.server.recordings
            if (method is None or entry["method"] == method) and (epoch is None or entry["epoch"] == epoch)
        ]

    async def _state(self, _params: Any, _inbound: Inbound) -> dict[str, Any]:
        server = self.server
        session = server.session if server.session is not None and not server.session.peer.closed else None
        return {
            "epoch": server.epoch,
            "connected": session is not None,
            "initialized": session.initialized if session else False,
            "grant": session.grant if session else None,
            "receipt": session.receipt if session else None,
            "channels": list(session.channels) if session else [],
            "eagerAnswers": server.eager_answers,
            "reactions": server.reactions,
            "chatStore": server.chat_store,
            "historyRequests": server.history_requests,
            "autoAnswers": server.auto_answers,
            "personality": server.options.personality,
            "transport": server.options.transport,
            "name": server.name,
            "published": server.published,
            "pid": os.getpid(),
        }

    async def _disconnect(self, _params: Any, inbound: Inbound) -> dict[str, Any]:
        if self.server.options.transport == "stdio":
            # A stdio server can't hang up and stay: it exits, as real ones do.
            self.transport.after_reply(inbound.id, then=partial(self.server.request_exit, 0, "disconnect requested"))
            return {"epoch": self.server.epoch, "exiting": True}
        session = self.server.require_session()
        await session.peer.aclose("disconnect requested by control")
        return {"epoch": session.epoch}

    async def _exit(self, params: dict[str, Any], inbound: Inbound) -> dict[str, Any]:
        code = int(params.get("code", 0))
        self.transport.after_reply(inbound.id, then=partial(self.server.request_exit, code, "exit requested"))
        return {"exiting": True, "code": code}


# -- the program ---------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parse the command line (see the module docstring)."""
    parser = argparse.ArgumentParser(
        prog="python -m mcpl_router.testing.fixture_server",
        description="A scriptable MCPL server for tests and demos, driven through a control port.",
    )
    parser.add_argument("--transport", choices=TRANSPORTS, default="stdio")
    parser.add_argument("--port", type=int, default=0, help="tcp/ws listen port on 127.0.0.1 (0 = any free port)")
    parser.add_argument("--personality", choices=PERSONALITIES, default="strict")
    parser.add_argument("--channel", action="append", default=[], metavar="ID[=LABEL]", help="a text channel to register")
    parser.add_argument("--dm", action="append", default=[], metavar="ID=LABEL", help="a dm channel to register")
    parser.add_argument("--control-file", required=True, type=Path, help="where to write the ready file")
    parser.add_argument("--token", help="ws: require 'Authorization: Bearer TOKEN' on the handshake")
    parser.add_argument("--token-in", choices=("header", "query"), default="header",
                        help="ws: where --token must be: the Authorization header, or ?token= (connectome-host's way)")
    parser.add_argument("--eager", action="store_true", help="send channels/register and push/event before the policy")
    parser.add_argument("--register-form", choices=FORMS, default="request")
    parser.add_argument("--grace", type=float, default=20.0, help="discord: register after this many seconds without policy")
    parser.add_argument("--log-line", help="stdio: a non-JSON line printed on stdout after initialize")
    parser.add_argument("--server-name", help="names logs, feature sets and serverInfo (default: per personality)")
    parser.add_argument("--push-on-start", action="store_true", help="push one event when the channels are registered")
    parser.add_argument("--unknown-method", action="append", default=[], metavar="METHOD",
                        help="answer METHOD -32601 Method not found, as discord-mcpl, heartbeat-mcpl and mcpl-editor answer ping")
    parser.add_argument("--host-owns-subscriptions", action="store_true",
                        help="as discord-mcpl: keep no subscriptions across a restart or a new host connection; "
                             "a message in a channel the host has not opened (channels/open) on this connection is not sent")
    parser.add_argument("--keep-replaced-hosts", action="store_true",
                        help="a new host connection does not close the one before (a server serving several hosts):"
                             " the older stays open and what arrives on it is recorded under its epoch; the control"
                             " channel drives the newest")
    parser.add_argument("--exit-with-parent", action="store_true", help="exit when the parent process is gone")
    parser.add_argument("--never-answer", action="append", default=[], metavar="METHOD",
                        help="never answer this host request (initialize, featureSets/update, …): a hung server")
    parser.add_argument("--inference", action="store_true",
                        help="advertise inferenceRequest (streaming too) and modelInfo, in a feature set <name>.inference")
    parser.add_argument("--log-level", default="info")
    options = parser.parse_args(argv)
    for spec in options.dm:
        if "=" not in spec:
            parser.error(f"--dm {spec!r}: expected ID=LABEL")
    if any(not spec.partition("=")[0] for spec in [*options.channel, *options.dm]):
        parser.error("--channel/--dm: the channel id must not be empty")
    return options


def main(argv: Sequence[str] | None = None) -> int:
    """Run the fixture server; returns the process exit code."""
    options = parse_args(argv)
    configure_logging(options.log_level, json=True)
    return trio.run(FixtureServer.from_options(options).run)


if __name__ == "__main__":
    sys.exit(main())
