"""Everything the turns, the tools and the inference broker say to an MCPL server: one typed
method each, the params msgspec structs, the outcome a value (never an exception).

A :class:`ServerSession` speaks over a :class:`ServerPort`: what it needs of a server's current
connection (its id, epoch, state and grant, a request, a notification, a queued notification).
:class:`~mcpl_router.mcpl.link.ServerLink` is the port, and supervises the connection behind it
(connect, handshake, grant, reconnect); the tests' stand-in servers are ports too, so the
requests they see are built here, by the same code, and nothing outside ``mcpl/`` builds an
MCPL message or reads a link's state and grant to decide whether to send one.

The server's own rule for a method it takes only as a Notification (mcpl-editor's
``channels/publish``: -32601 to the Request) is kept here, per connection epoch: the first
refusal switches that method to Notifications for the rest of the epoch.
"""

from __future__ import annotations

import collections
import enum
from collections.abc import Iterator, Mapping
from typing import Any, Final, Literal, Protocol

import attrs
import msgspec

from mcpl_router.jsonrpc import METHOD_NOT_FOUND, PeerClosed, RequestTimeout, RpcError
from mcpl_router.logs import get_logger
from mcpl_router.mcpl.grants import Grant
from mcpl_router.mcpl.link_state import NOTIFIED, CapabilityNotGranted, LinkState, LinkUnavailable
from mcpl_router.routing import texts

__all__ = [
    "ACKNOWLEDGE",
    "HOOKS",
    "INFERENCE_LIFECYCLE",
    "INFERENCE_STREAMING",
    "LIFECYCLE",
    "OBSERVE",
    "PUBLISH",
    "STREAMING",
    "TOOLS",
    "TYPING",
    "BeforeInferenceParams",
    "ChannelContext",
    "HookAnswered",
    "HookFailed",
    "HookOutcome",
    "HookTimedOut",
    "IncomingContext",
    "LifecycleParams",
    "LinkSessions",
    "OutgoingContext",
    "Queued",
    "TypingOp",
    "PublishOutcome",
    "ServerPort",
    "ServerSession",
    "Unsent",
    "ToolAnswered",
    "ToolNotSent",
    "ToolRefused",
    "ToolUnconfirmed",
]

PUBLISH: Final = "channels.publish"
ACKNOWLEDGE: Final = "channels.acknowledge"
LIFECYCLE: Final = "channels.lifecycle"
TYPING: Final = "channels.typing"
STREAMING: Final = "channels.streaming"
TOOLS: Final = "tools"
INFERENCE_STREAMING: Final = "inferenceRequest.streaming"
INFERENCE_LIFECYCLE: Final = "inferenceLifecycle"
#: ``context/beforeInference`` goes to a server granted any leaf under this.
HOOKS: Final = "contextHooks.beforeInference"
#: A server granted this is shown the user message in ``context/beforeInference``.
OBSERVE: Final = "contextHooks.beforeInference.observe"


class ServerPort(Protocol):
    """What a session needs of one server's connection (``ServerLink`` implements it)."""

    server_id: str
    state: LinkState
    grant: Grant
    epoch: int

    @property
    def request_timeout(self) -> float: ...

    async def call(self, method: str, params: object = None, *, capability: str | None, timeout: float | None = None,
                   result_type: type | None = None) -> Any: ...

    async def send_notification(self, method: str, params: object = None, *, capability: str | None) -> None: ...

    def send_notification_nowait(self, method: str, params: object = None, *, capability: str | None) -> bool: ...


# -- params ------------------------------------------------------------------------------------


class _Params(msgspec.Struct, rename="camel", omit_defaults=True):
    """Params as the wire names them; a field left at its default is not sent."""


class TextContent(_Params):
    type: Literal["text"]
    text: str


class PublishParams(_Params):
    conversation_id: str
    channel_id: str
    content: tuple[TextContent, ...]
    thread_id: str | None = None


class AcknowledgeParams(_Params):
    channel_id: str
    message_id: str
    intent: str
    value: str | None = None


class HistoryParams(_Params):
    limit: int | None = None
    before_message_id: str | None = None


class OpenParams(_Params):
    channel_id: str
    history: HistoryParams | None = None
    thread_id: str | None = None


class CloseParams(_Params):
    channel_id: str


TypingOp = Literal["start", "stop"]


class TypingParams(_Params):
    channel_id: str
    op: TypingOp


class ChunkParams(_Params):
    inference_id: str
    conversation_id: str
    channel_id: str
    index: int
    delta: str


class CompleteParams(_Params):
    inference_id: str
    conversation_id: str
    channel_id: str
    content: str


class ToolCallParams(_Params):
    name: str
    arguments: Mapping[str, object]


class ToolsListParams(_Params):
    cursor: str | None = None


class LifecycleParams(_Params):
    """``inference/lifecycle``: ids and the phase, never content; ``usage`` (the host's, as
    it sent it) only on a terminal phase that has one."""

    inference_id: str
    conversation_id: str
    turn_index: int
    phase: str
    usage: object = None


class _AllSent(msgspec.Struct, rename="camel"):
    """Params whose every field is sent, ``null`` included."""


class IncomingContext(_AllSent):
    channel_id: str
    message_id: str | None
    thread_id: str | None


class OutgoingContext(_Params):
    channel_id: str


class ChannelContext(_Params, kw_only=True):
    """The ``channels`` a server is told in ``context/beforeInference``: its own, no other's;
    ``incoming`` and ``defaultOutgoing`` only when that channel is this server's."""

    incoming: IncomingContext | None = None
    default_outgoing: OutgoingContext | None = None
    candidates: list[str]


class BeforeInferenceParams(_AllSent):
    inference_id: str
    conversation_id: str
    turn_index: int
    #: None unless the server is granted :data:`OBSERVE`.
    user_message: object
    model: str | None
    channels: ChannelContext


# -- outcomes ----------------------------------------------------------------------------------


class Queued(enum.Enum):
    """A notification offered without waiting: queued, no room now (await the waiting form),
    or never able to leave (the connection is gone, or the grant doesn't allow it)."""

    QUEUED = "queued"
    FULL = "full"
    GONE = "gone"


@attrs.frozen
class PublishOutcome:
    """``delivered`` only on the server's ``{delivered: true}``; ``failed`` when nothing left or
    the server said no; ``unknown`` when it left and no receipt says where it landed."""

    outcome: Literal["delivered", "failed", "unknown"]
    reason: texts.Reason | None = None
    message_id: str | None = None


@attrs.frozen
class ToolAnswered:
    result: dict[str, object]


@attrs.frozen
class ToolNotSent:
    """Nothing reached the server (gone, not granted, or the request never left)."""


@attrs.frozen
class ToolUnconfirmed:
    """Sent and never answered: the tool may have run."""

    why: Literal["timeout", "connection lost"]


@attrs.frozen
class ToolRefused:
    code: int
    message: str


ToolOutcome = ToolAnswered | ToolNotSent | ToolUnconfirmed | ToolRefused


@attrs.frozen
class HookAnswered:
    """``context/beforeInference`` answered: the answer as sent (read leniently by the caller,
    one injection at a time)."""

    answer: object


@attrs.frozen
class HookTimedOut:
    """No answer within the deadline."""


@attrs.frozen
class HookFailed:
    """Refused, or never able to leave; ``error`` as the link or the server said it."""

    error: str


HookOutcome = HookAnswered | HookTimedOut | HookFailed


@attrs.frozen
class Unsent:
    """A notification that never left (the connection is gone, or the grant doesn't allow
    it); ``error`` as the link said it."""

    error: str

_GONE_ERRORS: Final = (LinkUnavailable, CapabilityNotGranted, PeerClosed)


class ServerSession:
    """The typed requests and notifications to one server (``link.session``)."""

    def __init__(self, port: ServerPort) -> None:
        self._port = port
        #: Every publish's outcome (and reason), counted here; ``/metrics`` reads it.
        self.publishes: collections.Counter[tuple[str, texts.Reason | None]] = collections.Counter()
        # Methods this epoch's server answered -32601 as Requests: sent as Notifications now.
        self._notification_only: set[str] = set()
        self._notification_epoch = -1
        self._log = get_logger(server=port.server_id)

    # -- what the port is now ------------------------------------------------------------------

    @property
    def server_id(self) -> str:
        return self._port.server_id

    @property
    def epoch(self) -> int:
        """The connection's epoch: a send recorded in one epoch means nothing to the next."""
        return self._port.epoch

    @property
    def ready(self) -> bool:
        return self._port.state is LinkState.READY

    @property
    def request_timeout(self) -> float:
        """The server's own ``requestTimeout`` (docs/config.md)."""
        return self._port.request_timeout

    def allows(self, capability: str) -> bool:
        """Whether the current grant allows ``capability`` (whatever the state)."""
        return self._port.grant.allows(capability)

    def allows_any_under(self, prefix: str) -> bool:
        """Whether the current grant allows any leaf under ``prefix``."""
        return self._port.grant.allows_any_under(prefix)

    def unusable(self, capability: str) -> texts.Reason | None:
        """Why nothing needing ``capability`` can go now (``server-unavailable``,
        ``not-permitted``), or None."""
        if not self.ready:
            return texts.Reason.NO_LINK
        if not self.allows(capability):
            return texts.Reason.NOT_PERMITTED
        return None

    # -- channels ------------------------------------------------------------------------------

    async def publish(self, params: PublishParams, *, timeout: float | None = None, registered: bool = True) -> PublishOutcome:
        """``channels/publish`` (a Request; a Notification to a server that takes only those).

        ``registered``: whether the channel is registered (nothing is sent to one that is not).
        Each outcome is counted in :attr:`publishes`.
        """
        outcome = await self._publish(params, timeout=timeout, registered=registered)
        self.publishes[(outcome.outcome, outcome.reason)] += 1
        return outcome

    async def _publish(self, params: PublishParams, *, timeout: float | None, registered: bool) -> PublishOutcome:
        unusable = self.unusable(PUBLISH)
        if unusable is not None:
            return PublishOutcome("failed", unusable)
        if not registered:
            return PublishOutcome("failed", texts.Reason.NOT_REGISTERED)
        deadline = self.request_timeout if timeout is None else timeout
        try:
            answer = await self._request_or_notify("channels/publish", params, capability=PUBLISH, timeout=deadline)
        except RpcError:
            return PublishOutcome("failed", texts.Reason.SERVER_REFUSED)
        except RequestTimeout as exc:
            return PublishOutcome("unknown" if exc.sent else "failed", texts.Reason.TIMEOUT)
        except (LinkUnavailable, CapabilityNotGranted):
            return PublishOutcome("failed", texts.Reason.NO_LINK)
        except PeerClosed:
            return PublishOutcome("unknown", texts.Reason.NO_RECEIPT)
        if answer is NOTIFIED:
            return PublishOutcome("unknown", texts.Reason.NO_RECEIPT)
        if isinstance(answer, dict) and answer.get("delivered") is True:
            message_id = answer.get("messageId")
            return PublishOutcome("delivered", message_id=message_id if isinstance(message_id, str) else None)
        if isinstance(answer, dict) and answer.get("delivered") is False:
            return PublishOutcome("failed", texts.Reason.NOT_DELIVERED)
        return PublishOutcome("unknown", texts.Reason.MALFORMED_RECEIPT)

    async def acknowledge(self, params: AcknowledgeParams, *, timeout: float) -> texts.Reason | None:
        """``channels/acknowledge``; None when done, else a stable reason.

        The shape is what discord-mcpl reads (``src/server.ts:78-83``): a **Request**
        ``{channelId, messageId, intent, value}``, where ``value`` is the reaction (without it
        the server falls back to its own 👀). discord-mcpl drops an acknowledge sent as a
        Notification, so the Request comes first. Reasons: ``timeout``, ``unconfirmed`` (sent,
        no answer), ``server-refused`` (an error, or ``acknowledged: false``), ``server-unavailable``.
        """
        try:
            answer = await self._request_or_notify("channels/acknowledge", params, capability=ACKNOWLEDGE, timeout=timeout)
        except RpcError:
            return texts.Reason.SERVER_REFUSED
        except RequestTimeout as exc:
            return texts.Reason.UNCONFIRMED if exc.sent else texts.Reason.TIMEOUT
        except (LinkUnavailable, CapabilityNotGranted):
            return texts.Reason.NO_LINK
        except PeerClosed:
            return texts.Reason.UNCONFIRMED
        if answer is NOTIFIED:
            return texts.Reason.UNCONFIRMED  # sent as a Notification: no answer says it landed
        if isinstance(answer, dict) and answer.get("acknowledged") is False:
            return texts.Reason.SERVER_REFUSED
        return None

    async def open_channel(self, params: OpenParams, *, timeout: float) -> texts.Reason | None:
        """``channels/open``; None when answered, else a stable reason."""
        return await self._lifecycle("channels/open", params, timeout)

    async def close_channel(self, params: CloseParams, *, timeout: float) -> texts.Reason | None:
        """``channels/close``; None when answered, else a stable reason."""
        return await self._lifecycle("channels/close", params, timeout)

    async def _lifecycle(self, method: str, params: OpenParams | CloseParams, timeout: float) -> texts.Reason | None:
        try:
            await self._port.call(method, params, capability=LIFECYCLE, timeout=timeout)
        except RequestTimeout as exc:
            return texts.Reason.UNCONFIRMED if exc.sent else texts.Reason.TIMEOUT
        except RpcError:
            return texts.Reason.SERVER_REFUSED
        except (LinkUnavailable, CapabilityNotGranted):
            return texts.Reason.NO_LINK
        except PeerClosed:
            return texts.Reason.UNCONFIRMED
        return None

    async def typing(self, params: TypingParams) -> bool:
        """``channels/typing``; False when it could not be sent (the connection is gone)."""
        return await self._notify("channels/typing", params, TYPING)

    def typing_nowait(self, params: TypingParams) -> Queued:
        return self._notify_nowait("channels/typing", params, TYPING)

    async def stream_chunk(self, params: ChunkParams) -> bool:
        """``channels/outgoing/chunk``; False when it could not be sent."""
        return await self._notify("channels/outgoing/chunk", params, STREAMING)

    async def stream_complete(self, params: CompleteParams) -> bool:
        """``channels/outgoing/complete``; False when it could not be sent."""
        return await self._notify("channels/outgoing/complete", params, STREAMING)

    def stream_complete_nowait(self, params: CompleteParams) -> Queued:
        return self._notify_nowait("channels/outgoing/complete", params, STREAMING)

    # -- the inference's hooks and lifecycle ----------------------------------------------------

    async def before_inference(self, params: BeforeInferenceParams, *, timeout: float) -> HookOutcome:
        """``context/beforeInference``: answered, timed out, or failed (refused, or never sent)."""
        try:
            answer = await self._port.call("context/beforeInference", params, capability=HOOKS + ".*", timeout=timeout)
        except RequestTimeout:
            return HookTimedOut()
        except (RpcError, *_GONE_ERRORS) as exc:
            return HookFailed(str(exc))
        return HookAnswered(answer)

    async def lifecycle(self, params: LifecycleParams) -> Unsent | None:
        """``inference/lifecycle``; None when sent."""
        try:
            await self._port.send_notification("inference/lifecycle", params, capability=INFERENCE_LIFECYCLE)
        except _GONE_ERRORS as exc:
            return Unsent(str(exc))
        return None

    def lifecycle_nowait(self, params: LifecycleParams) -> Queued | Unsent:
        """``inference/lifecycle`` queued if the outbox has room now (``QUEUED``), else ``FULL``
        (nothing queued: await :meth:`lifecycle`)."""
        try:
            queued = self._port.send_notification_nowait("inference/lifecycle", params, capability=INFERENCE_LIFECYCLE)
        except _GONE_ERRORS as exc:
            return Unsent(str(exc))
        return Queued.QUEUED if queued else Queued.FULL

    # -- tools and inference -------------------------------------------------------------------

    async def list_tools(self, params: ToolsListParams, *, timeout: float) -> Any:
        """One page of ``tools/list``: the answer as sent. Raises what the request raised."""
        return await self._port.call("tools/list", params, capability=TOOLS, timeout=timeout)

    async def call_tool(self, params: ToolCallParams, *, timeout: float) -> ToolOutcome:
        """``tools/call``: answered, refused, never sent, or sent and never answered."""
        try:
            answer = await self._port.call("tools/call", params, capability=TOOLS, timeout=timeout)
        except RequestTimeout as exc:
            return ToolUnconfirmed("timeout") if exc.sent else ToolNotSent()
        except PeerClosed:
            return ToolUnconfirmed("connection lost")
        except (LinkUnavailable, CapabilityNotGranted):
            return ToolNotSent()
        except RpcError as error:
            return ToolRefused(error.code, error.message)
        return ToolAnswered(dict(answer) if isinstance(answer, Mapping) else {"content": [], "isError": False})

    async def inference_chunk(self, chunk: Mapping[str, object]) -> str | None:
        """A host's ``inference/chunk``, forwarded as the server sent the request's id; None
        when sent, ``not-granted`` without streaming, ``gone`` when the connection is."""
        try:
            await self._port.send_notification("inference/chunk", chunk, capability=INFERENCE_STREAMING)
        except CapabilityNotGranted:
            return "not-granted"
        except (LinkUnavailable, PeerClosed):
            return "gone"
        return None

    # -- the sending -----------------------------------------------------------------------------

    async def _notify(self, method: str, params: _Params, capability: str) -> bool:
        try:
            await self._port.send_notification(method, params, capability=capability)
        except _GONE_ERRORS:
            return False
        return True

    def _notify_nowait(self, method: str, params: _Params, capability: str) -> Queued:
        try:
            queued = self._port.send_notification_nowait(method, params, capability=capability)
        except _GONE_ERRORS:
            return Queued.GONE
        return Queued.QUEUED if queued else Queued.FULL

    async def _request_or_notify(self, method: str, params: _Params, *, capability: str, timeout: float) -> Any:
        """Send ``method`` as a Request; the result, or :data:`NOTIFIED` when it went as a
        Notification (this epoch's server answered the Request -32601 once). Raises as the
        port's request does otherwise."""
        if self._notification_epoch != self._port.epoch:
            self._notification_only.clear()
            self._notification_epoch = self._port.epoch
        if method not in self._notification_only:
            try:
                return await self._port.call(method, params, capability=capability, timeout=timeout)
            except RpcError as error:
                if error.code != METHOD_NOT_FOUND:
                    raise
                self._notification_only.add(method)
                self._log.info("link.notification_only", method=method, epoch=self._port.epoch)
        await self._port.send_notification(method, params, capability=capability)
        return NOTIFIED


class HasSession(Protocol):
    """A server link as :class:`LinkSessions` sees it: its session."""

    @property
    def session(self) -> ServerSession: ...


class LinkSessions(Mapping[str, ServerSession]):
    """Each server's session by server id: a live view of the daemon's links (a reload adds
    and removes servers in place), so the turns and tools depend on sessions, not on links."""

    def __init__(self, links: Mapping[str, HasSession]) -> None:
        self._links = links

    def __getitem__(self, server_id: str) -> ServerSession:
        return self._links[server_id].session

    def __iter__(self) -> Iterator[str]:
        return iter(self._links)

    def __len__(self) -> int:
        return len(self._links)
