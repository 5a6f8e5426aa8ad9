"""Connector tools: the servers' own MCP tools, offered to agents through the daemon's links.

A server's tools (``send_message``, ``fetch_history``, …) are reachable only over the link the
daemon holds, so the daemon lists them (``tools/list``, capability ``tools``) and forwards calls
(``tools/call``) to the server that owns them.

- **Catalog.** Each server's list is fetched when its link becomes ready (every transport epoch,
  so after every reconnect) and again on ``notifications/tools/list_changed``. A fetch that
  overlaps another coalesces; an answer from an earlier epoch is dropped.
- **Names.** A tool is offered as ``<toolPrefix><tool>`` (default prefix ``mcpl--<serverId>--``),
  sanitized for model APIs that take only ``[A-Za-z0-9_-]{1,64}``: see :func:`exposed_name`.
  Each tool goes into the one name table (:mod:`mcpl_router.tools.table`) with its exact
  ``(serverId, tool)`` pair; the name is never parsed back, so no spelling can reach another
  server's tool. The table refuses a name a daemon tool has, or several server tools share.
- **Filters, at listing and at dispatch.** The server's ``enabledTools`` / ``disabledTools``
  globs (deny wins, matched against the server's own tool name) and the agent's allowed tools
  (matched against the offered name, by the turn seam). A disabled tool called by name without
  being listed is refused, with nothing sent.
- **Forwarding.** ``tools/call`` with a deadline (:attr:`ConnectorTools.call_timeout`). A
  deadline that passes after the request was written, or a connection lost mid-call, is an
  *unknown outcome* (reason ``unconfirmed``): the agent is told to check before calling again.
- **Sends.** A successful (or unconfirmed) send — ``send_message``, ``reply_message``,
  ``send_dm``, or a tool whose ``_meta`` carries ``"mcpl/send": true`` — counts as an explicit
  send: its channel argument (``_meta["mcpl/channelArgument"]``, default ``channelId``; for a
  result naming ``channelId`` in its ``structuredContent``, that) is read **on the tool's own
  server only**, through the one resolver
  (:meth:`~mcpl_router.routing.names.ChannelNames.channel_on_server`: the server's channel with
  that id, else the one of its channels the name picks; a name several of them answer to is
  refused with the candidates, and nothing is sent), as ``ChannelRef(serverId, channelId)``,
  engaged for the calling turn through
  :func:`~mcpl_router.tools.seam.record_explicit_send`, and opened in the registry
  if it was closed, with a notice in the result.
"""

from __future__ import annotations

import hashlib
import itertools
import re
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Final

import attrs
import msgspec
import trio

from mcpl_router.jsonrpc import PeerClosed, RequestTimeout, RpcError
from mcpl_router.events import EventBus, ServerStateChanged, ServerToolsChanged
from mcpl_router.logs import Logger, get_logger
from mcpl_router.mcpl.link import CapabilityNotGranted, LinkState, LinkUnavailable
from mcpl_router.mcpl.session import LIFECYCLE, TOOLS, ToolCallParams, ToolNotSent, ToolRefused, ToolsListParams, ToolUnconfirmed
from mcpl_router.routing import texts
from mcpl_router.routing.desired import OPEN
from mcpl_router.routing.names import Refusal, Resolved
from mcpl_router.routing.refs import ChannelRef
from mcpl_router.tools.seam import ServerTool, ToolCall, ToolName, ToolSpec, record_explicit_send, same_objects, tool_result

if TYPE_CHECKING:
    from mcpl_router.routing.agents import AgentSpec
    from mcpl_router.mcpl.link import ServerLink
    from mcpl_router.routing.router import Router
    from mcpl_router.tools.channel_lifecycle import ChannelLifecycle
    from mcpl_router.turns import TurnRun

__all__ = [
    "CALL_TIMEOUT",
    "SEND_TOOLS",
    "ConnectorTool",
    "ConnectorTools",
    "exposed_name",
    "is_send_tool",
]

#: How long a forwarded ``tools/call`` may take before its outcome is unknown.
CALL_TIMEOUT: Final = 30.0
#: How long one ``tools/list`` page may take.
LIST_TIMEOUT: Final = 10.0
#: The most ``tools/list`` pages read from one server (a cursor loop can't run forever).
MAX_LIST_PAGES: Final = 50
#: Tool names a connector uses for sends (MCPL connectors' common names).
SEND_TOOLS: Final = frozenset({"send_message", "reply_message", "send_dm"})
#: ``_meta`` key by which a server marks one of its tools as a send.
META_SEND: Final = "mcpl/send"
#: ``_meta`` key naming the argument that holds a send tool's channel id.
META_CHANNEL_ARGUMENT: Final = "mcpl/channelArgument"
#: What model APIs accept in a tool name.
NAME_MAX: Final = 64
_NAME_OK = re.compile(r"[A-Za-z0-9_-]+")
_NAME_BAD_CHAR = re.compile(r"[^A-Za-z0-9_-]")


def exposed_name(prefix: str, tool: str, server_id: str) -> str:
    """The name a server's tool is offered under: ``prefix + tool``, made model-safe.

    Where ``prefix + tool`` is already ``[A-Za-z0-9_-]{1,64}`` it is used as is
    (``mcpl--a--send_message``). Otherwise every other character becomes ``_``, the result is
    cut to 55 characters, and ``-`` plus 8 hex digits of a SHA-256 of the exact
    ``(serverId, tool)`` pair are appended (``mcpl--discord_main--foo_bar-1a2b3c4d``), so two
    tools that sanitize alike still get different names, and a name stays the same whatever
    else the servers list. The catalog, not this function, maps a name back to its tool.
    """
    raw = prefix + tool
    if len(raw) <= NAME_MAX and _NAME_OK.fullmatch(raw):
        return raw
    digest = hashlib.sha256(msgspec.json.encode([server_id, tool])).hexdigest()[:8]
    return f"{_NAME_BAD_CHAR.sub('_', raw)[: NAME_MAX - 9]}-{digest}"


def _meta(tool: Mapping[str, object]) -> Mapping[str, object]:
    meta = tool.get("_meta")
    return meta if isinstance(meta, Mapping) else {}


def is_send_tool(tool: Mapping[str, object]) -> bool:
    """Whether a listed tool posts a message: a known send name, or ``_meta["mcpl/send"]``."""
    return tool.get("name") in SEND_TOOLS or _meta(tool).get(META_SEND) is True


@attrs.frozen
class ConnectorTool:
    """One tool a server listed, with the name it is offered under."""

    server_id: str
    name: str
    exposed: str
    spec: Mapping[str, object]

    @property
    def is_send(self) -> bool:
        return is_send_tool(self.spec)

    @property
    def tool_name(self) -> ToolName:
        """Its entry in the name table: the offered name and the ``(serverId, tool)`` pair."""
        return ToolName(self.exposed, ServerTool(self.server_id, self.name))

    @property
    def channel_argument(self) -> str:
        argument = _meta(self.spec).get(META_CHANNEL_ARGUMENT)
        return argument if isinstance(argument, str) and argument else "channelId"

    def offered_spec(self) -> dict[str, object]:
        """The spec ``turn/open`` offers: the offered name, the server's schema and text."""
        schema = self.spec.get("inputSchema")
        description = self.spec.get("description")
        return {
            "name": self.exposed,
            "description": f"[server {self.server_id}] {description if isinstance(description, str) else self.name}",
            "inputSchema": schema if isinstance(schema, Mapping) else {"type": "object"},
        }


@attrs.define
class _ServerCatalog:
    """One server's tools as last listed, in the epoch they were listed in."""

    epoch: int
    tools: dict[str, ConnectorTool] = attrs.field(factory=dict)


@attrs.define
class _Refresh:
    running: bool = False
    dirty: bool = False


class ConnectorTools:
    """The connector-tool provider (:class:`~mcpl_router.tools.seam.ToolProvider`); ``daemon.connector_tools``.

    Run :meth:`run` in the daemon's nursery; :meth:`link_ready` and :meth:`list_changed` schedule
    fetches there. ``call_timeout`` is a constant by default; tests shorten it on the instance.

    Args:
        links: the daemon's links by server id, in config order (its own dict: a reload changes
            it in place).
        router: the registry (a send's channel, opened if closed) and the one resolver.
        events: where it says a server's list changed (the name table is rebuilt), and hears
            that a link became ready (its tools are listed again).
    """

    call_timeout: float = CALL_TIMEOUT
    list_timeout: float = LIST_TIMEOUT

    def __init__(self, links: Mapping[str, ServerLink], router: Router, events: EventBus, channels: ChannelLifecycle) -> None:
        self._links = links
        self._router = router
        self._events = events
        self._channels = channels
        events.subscribe(ServerStateChanged, self._state_changed)
        self._catalogs: dict[str, _ServerCatalog] = {}
        self._refreshes: dict[str, _Refresh] = {}
        self._nursery: trio.Nursery | None = None
        self._log = get_logger()
        #: Bumped after every catalog change (tests wait on it).
        self.generation = 0
        #: The last offered list and what it was made of (see :meth:`tools_for`).
        self._offered: tuple[tuple[object, ...], list[ToolSpec]] | None = None

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Host the list fetches until cancelled."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            for link in self._links.values():
                if link.state is LinkState.READY:
                    self.link_ready(link)
            try:
                await trio.sleep_forever()
            finally:
                self._nursery = None

    # ------------------------------------------------------------------ the catalog

    def tools_of(self, server_id: str) -> list[ConnectorTool]:
        """The tools ``server_id`` listed last (for status and tests), in its order."""
        catalog = self._catalogs.get(server_id)
        return list(catalog.tools.values()) if catalog else []

    def _tool_of(self, pair: ServerTool) -> ConnectorTool | None:
        """The tool ``pair`` names in its server's catalog as last listed."""
        catalog = self._catalogs.get(pair.server_id)
        return catalog.tools.get(pair.tool) if catalog is not None else None

    def servers_changed(self) -> None:
        """A reload changed the links: the catalogs of servers gone go, the names with them."""
        gone = [server_id for server_id in self._catalogs if server_id not in self._links]
        for server_id in gone:
            del self._catalogs[server_id]
            self._events.publish(ServerToolsChanged(server_id))
        if gone:
            self.generation += 1

    def _state_changed(self, event: ServerStateChanged) -> None:
        link = self._links.get(event.server_id)
        if event.new == LinkState.READY.value and link is not None:
            self.link_ready(link)

    def link_ready(self, link: ServerLink) -> None:
        """A link became ready (a new epoch): fetch its tools again."""
        self._schedule(link)

    def list_changed(self, link: ServerLink) -> None:
        """The server sent ``notifications/tools/list_changed``: fetch its tools again."""
        self._log.info("connector.tools.list_changed", server=link.server_id, epoch=link.epoch)
        self._schedule(link)

    def _schedule(self, link: ServerLink) -> None:
        state = self._refreshes.setdefault(link.server_id, _Refresh())
        state.dirty = True
        if state.running or self._nursery is None:
            return
        state.running = True
        try:
            self._nursery.start_soon(self._refresh_loop, link, state)
        except RuntimeError:
            state.running = False  # shutting down

    async def _refresh_loop(self, link: ServerLink, state: _Refresh) -> None:
        try:
            while state.dirty:
                state.dirty = False
                await self._refresh(link)
        except Exception:
            self._log.exception("connector.tools.refresh_crashed", server=link.server_id)
        finally:
            state.running = False

    async def _refresh(self, link: ServerLink) -> None:
        epoch = link.epoch
        log = self._log.bind(server=link.server_id, epoch=epoch)
        if link.session.unusable(TOOLS) is not None:
            log.info("connector.tools.skipped", state=link.state.value, granted=link.session.allows(TOOLS))
            return
        listed: list[Mapping[str, object]] = []
        cursor: str | None = None
        for _ in range(MAX_LIST_PAGES):
            try:
                answer = await link.session.list_tools(ToolsListParams(cursor=cursor or None), timeout=self.list_timeout)
            except (RpcError, RequestTimeout, PeerClosed, LinkUnavailable, CapabilityNotGranted) as exc:
                log.warning("connector.tools.list_failed", error=f"{type(exc).__name__}: {exc}")
                return
            page = answer.get("tools") if isinstance(answer, Mapping) else None
            if not isinstance(page, list):
                log.warning("connector.tools.list_malformed")
                return
            listed.extend(tool for tool in page if isinstance(tool, Mapping) and isinstance(tool.get("name"), str) and tool["name"])
            next_cursor = answer.get("nextCursor")
            if not isinstance(next_cursor, str) or not next_cursor:
                break
            cursor = next_cursor
        if link.epoch != epoch:
            log.info("connector.tools.stale", now=link.epoch)
            return  # a reconnect happened meanwhile; its own fetch is scheduled
        self._install(link, epoch, listed)

    def _install(self, link: ServerLink, epoch: int, listed: Sequence[Mapping[str, object]]) -> None:
        server_id = link.server_id
        prefix = link.config.tool_prefix
        catalog = _ServerCatalog(epoch)
        for spec in listed:
            name = spec["name"]
            if not isinstance(name, str) or name in catalog.tools:
                continue  # a server listing one name twice: the first stands
            catalog.tools[name] = ConnectorTool(server_id, name, exposed_name(prefix, name, server_id), dict(spec))
        self._catalogs[server_id] = catalog
        self._events.publish(ServerToolsChanged(server_id))
        self.generation += 1
        self._log.info(
            "connector.tools.listed",
            server=server_id,
            epoch=epoch,
            tools=list(catalog.tools),
            offered=[name for name in catalog.tools if link.config.tool_offered(name)],
        )

    # ------------------------------------------------------------------ ToolProvider

    def tool_names(self) -> Iterator[ToolName]:
        """Every tool of every configured server's catalog (ready or not), in config order."""
        for server_id in self._links:
            catalog = self._catalogs.get(server_id)
            for tool in catalog.tools.values() if catalog is not None else ():
                yield tool.tool_name

    def tools_for(self, agent: AgentSpec, run: TurnRun) -> list[ToolSpec]:
        """Every ready server's tools its config offers (the table drops refused names and
        applies the agent's allowed tools).

        The same list object while nothing it is made of has changed — each link's state,
        grant, config and catalog, all replaced (never changed in place) when they change, so
        compared by identity: every ``turn/open`` asks, and the table keeps its filtered answer
        while the lists it is given are the same ones.
        """
        basis = [(link, link.state, link.grant, link.config, self._catalogs.get(server_id)) for server_id, link in self._links.items()]
        parts = tuple(itertools.chain.from_iterable(basis))
        if self._offered is not None and same_objects(self._offered[0], parts):
            return self._offered[1]
        offered: list[ToolSpec] = []
        for _link, state, grant, config, catalog in basis:
            if catalog is None or state is not LinkState.READY or not grant.allows(TOOLS):
                continue
            offered.extend(tool.offered_spec() for tool in catalog.tools.values() if config.tool_offered(tool.name))
        self._offered = (parts, offered)
        return offered

    def is_send(self, tool: ToolName, arguments: Mapping[str, object]) -> bool:
        """Whether calling ``tool`` posts somewhere (send-silencing of its round's text)."""
        found = self._tool_of(tool.server_tool) if tool.server_tool is not None else None
        return found is not None and found.is_send

    async def call(self, call: ToolCall) -> dict[str, object]:
        """Forward one call to the tool's own server; refusals and outcomes as results."""
        pair = call.tool.server_tool
        log = self._log.bind(agent=call.run.turn.agent, call=call.call_id, tool=call.name)
        if pair is None:
            return tool_result(texts.unknown_tool(call.name), error=True, reason=texts.Reason.TOOL_UNKNOWN)
        server_id = pair.server_id
        log = log.bind(server=server_id, server_tool=pair.tool)
        link = self._links.get(server_id)
        data = {"serverId": server_id, "tool": pair.tool}
        tool = self._tool_of(pair)
        if tool is None:
            text = texts.connector_tool_gone(call.name, pair.tool, server_id)
            return tool_result(text, error=True, reason=texts.Reason.TOOL_UNKNOWN, data=data)
        if link is not None and not link.config.tool_offered(tool.name):
            # At dispatch, whatever the listing said: the operator's deny wins.
            log.info("connector.call.disabled")
            text = texts.connector_tool_disabled(call.name, tool.name, server_id)
            return tool_result(text, error=True, reason=texts.Reason.TOOL_DISABLED, data=data)
        if link is None or link.session.unusable(TOOLS) is not None:
            log.info("connector.call.unavailable", state=link.state.value if link else None)
            text = texts.connector_server_unavailable(call.name, server_id)
            return tool_result(text, error=True, reason=texts.Reason.NO_LINK, data=data)
        arguments = dict(call.arguments)
        channel = self._send_channel(tool, arguments) if tool.is_send else None
        if isinstance(channel, Refusal):
            # A name several of the server's channels answer to: sent to none of them.
            log.info("connector.call.channel_refused", kind=channel.kind)
            refused = {**data, "kind": channel.kind, "candidates": [ref.to_wire() for ref in channel.candidates]}
            return tool_result(channel.text, error=True, reason=channel.kind, data=refused)
        if channel is not None and arguments.get(tool.channel_argument) != channel.channel_id:
            # "b:general" given to b's own send: the server knows its channel by its own id.
            arguments[tool.channel_argument] = channel.channel_id
        timeout = self.call_timeout
        outcome = await link.session.call_tool(ToolCallParams(name=tool.name, arguments=arguments), timeout=timeout)
        if isinstance(outcome, ToolNotSent):
            log.info("connector.call.not_sent")
            text = texts.connector_server_unavailable(call.name, server_id)
            return tool_result(text, error=True, reason=texts.Reason.NO_LINK, data=data)
        if isinstance(outcome, ToolUnconfirmed):
            log.warning("connector.call.unconfirmed", reason=outcome.why, timeout=timeout)
            return self._unconfirmed(call, tool, channel, data, timeout)
        if isinstance(outcome, ToolRefused):
            log.info("connector.call.refused", code=outcome.code)
            text = texts.connector_failed(call.name, server_id, outcome.message)
            return tool_result(text, error=True, reason=texts.Reason.SERVER_REFUSED, data={**data, "code": outcome.code})
        result = outcome.result
        content = result.get("content")
        if not isinstance(content, list):
            content = []
        failed = result.get("isError") is True
        notices: list[str] = []
        if tool.is_send and not failed:
            channel = self._result_channel(tool, result) or channel
            notices = await self._engage(call, channel, log)
        result["content"] = [*content, *({"type": "text", "text": n} for n in notices)]
        result["isError"] = failed
        if failed:
            result.setdefault("reason", texts.Reason.TOOL_FAILED)
        result["_meta"] = {**_meta(result), "mcpl-router": self._about(data, channel)}
        log.info("connector.call.answered", error=failed, send=tool.is_send,
                 channel=channel.channel_id if channel else None)
        return result

    # ------------------------------------------------------------------ sends

    def _send_channel(self, tool: ConnectorTool, arguments: Mapping[str, object]) -> ChannelRef | Refusal | None:
        """A send's channel, on the tool's own server only (never another server's).

        Read by the one resolver: the server's channel with that id, else the one of its
        channels the name picks ("b:general" to b's tool, a DM's label); a name several of its
        channels answer to is refused. A name none of them answers to is passed on as the
        server's own id (the server may know channels it never registered).
        """
        value = arguments.get(tool.channel_argument)
        if not isinstance(value, str) or not value:
            return None
        resolved = self._router.names.channel_on_server(value, tool.server_id, not_done=texts.PUBLISH_NOT_SENT)
        if isinstance(resolved, Resolved):
            return resolved.ref
        if resolved is not None:
            return resolved
        return ChannelRef(tool.server_id, value)

    def _result_channel(self, tool: ConnectorTool, result: Mapping[str, object]) -> ChannelRef | None:
        structured = result.get("structuredContent")
        channel_id = structured.get("channelId") if isinstance(structured, Mapping) else None
        if isinstance(channel_id, str) and channel_id:
            return ChannelRef(tool.server_id, channel_id)
        return None

    async def _engage(self, call: ToolCall, channel: ChannelRef | None, log: Logger) -> list[str]:
        """Count a send: engage its channel for the calling turn, open it if it was closed.

        Opened as ``channel_open`` opens one: ``channels/open`` on the channel's own server,
        the agent's decision journaled (so its server is held to it after a restart). The
        notice says so only when the server took the open; without the lifecycle grant, or
        when it refused, the channel stays as it was and nothing is claimed.
        """
        if channel is None:
            return []
        registry = self._router.registry
        entry = registry.get(channel)
        if entry is None:
            log.info("connector.send.unregistered_channel", channel=channel.channel_id)
            return []
        record_explicit_send(call, channel)
        if entry.open:
            return []
        link = self._links.get(channel.server_id)
        if link is None or link.session.unusable(LIFECYCLE) is not None:
            log.info("connector.send.left_closed", channel=channel.channel_id, why="not-granted")
            return []
        reason = await self._channels.send_open(link.session, channel)
        if reason is not None:
            log.warning("connector.send.open_failed", channel=channel.channel_id, reason=reason)
            return []
        self._channels.decide(call.run.turn.agent, channel, OPEN)
        log.info("connector.send.opened", channel=channel.channel_id)
        return [texts.connector_send_opened(self._router.names.name_shown(channel))]

    def _unconfirmed(
        self, call: ToolCall, tool: ConnectorTool, channel: ChannelRef | None, data: Mapping[str, object], timeout: float
    ) -> dict[str, object]:
        # Possibly sent: a send engages its channel, as an unconfirmed publish does, so the
        # round's plain text isn't posted beside words that may already be there.
        if tool.is_send and channel is not None and self._router.registry.get(channel) is not None:
            # Not opened: whether the send went is unknown, so nothing is claimed of it.
            record_explicit_send(call, channel)
        text = texts.connector_unconfirmed(call.name, tool.server_id, timeout)
        result = tool_result(text, reason=texts.Reason.UNCONFIRMED, data={**data, "outcome": "unknown"})
        result["_meta"] = {"mcpl-router": {**self._about(data, channel), "outcome": "unknown"}}
        return result

    def _about(self, data: Mapping[str, object], channel: ChannelRef | None) -> dict[str, object]:
        about = dict(data)
        if channel is not None:
            about["channel"] = {**channel.to_wire(), "shown": self._router.names.name_shown(channel)}
        return about
