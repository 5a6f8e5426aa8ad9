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

import enum
from collections.abc import Mapping
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
    "INFERENCE_STREAMING",
    "LIFECYCLE",
    "PUBLISH",
    "STREAMING",
    "TOOLS",
    "TYPING",
    "Queued",
    "TypingOp",
    "PublishOutcome",
    "ServerPort",
    "ServerSession",
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

_GONE_ERRORS: Final = (LinkUnavailable, CapabilityNotGranted, PeerClosed)


class ServerSession:
    """The typed requests and notifications to one server (``link.session``)."""

    def __init__(self, port: ServerPort) -> None:
        self._port = port
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

    def unusable(self, capability: str) -> texts.Reason | None:
        """Why nothing needing ``capability`` can go now (``server-unavailable``,
        ``not-permitted``), or None."""
        if not self.ready:
            return texts.Reason.NO_LINK
        if not self.allows(capability):
            return texts.Reason.NOT_PERMITTED
        return None

    # -- channels ------------------------------------------------------------------------------

    async def publish(self, params: PublishParams, *, timeout: float | None = None) -> PublishOutcome:
        """``channels/publish`` (a Request; a Notification to a server that takes only those)."""
        unusable = self.unusable(PUBLISH)
        if unusable is not None:
            return PublishOutcome("failed", texts.Reason.NO_LINK if unusable == texts.Reason.NO_LINK else unusable)
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
