"""Each agent's default channel: where ``channel_publish`` with no ``channelId`` posts. Pure.

The default is the channel of the latest message that woke the agent, held as a ref with that
message's id and thread, so it is always **on the server whose message set it**. Rules (issue 6,
seed ``000_…``):

- ``channel_publish`` with no ``channelId`` posts to the default's ref; with only a ``serverId``,
  to the default's id on that server. Either is refused where that channel isn't registered, and
  the refusal names no other channel: the channel left with that id is another server's, perhaps
  another community's.
- A server's removal (its connection ended) clears the default's message id and thread when the
  default is that server's channel, and **keeps its ref**: a later publish is refused as "default
  gone", naming it, never sent to the other server's channel with that id.
- A message admitted after its server was removed (its channel no longer registered) sets no
  default, so a server that's gone can't displace a live one's.
- For an agent in ``named`` prose routing nothing goes to a default channel: a missing
  ``channelId`` is refused however the rest of the call reads.
"""

from __future__ import annotations

from typing import Final

import attrs
import msgspec

from mcpl_router.routing import texts
from mcpl_router.routing.names import ChannelNames, Refusal
from mcpl_router.routing.refs import ChannelRef

__all__ = [
    "KIND_CHANNEL_REQUIRED",
    "KIND_DEFAULT_GONE",
    "KIND_DEFAULT_NOT_ON_SERVER",
    "KIND_NO_DEFAULT",
    "DefaultChannel",
    "DefaultChannels",
    "DefaultTarget",
]

#: No message has woken the agent since the daemon started: there is no default channel.
KIND_NO_DEFAULT: Final = "no-default"
#: The default channel's server no longer registers it.
KIND_DEFAULT_GONE: Final = "default-gone"
#: A ``serverId`` was given alone, and that server has no channel with the default's id.
KIND_DEFAULT_NOT_ON_SERVER: Final = "default-not-on-server"
#: A ``named`` agent's publish with no ``channelId``: nothing goes to a default channel.
KIND_CHANNEL_REQUIRED: Final = "channel-required"


class DefaultChannel(msgspec.Struct, frozen=True):
    """An agent's default channel, and the message that set it (cleared when its server left).

    A value made for every wake: a msgspec Struct, made in C (docs/performance.md)."""

    ref: ChannelRef
    message_id: str | None = None
    thread_id: str | None = None


@attrs.frozen
class DefaultTarget:
    """Where a publish with no ``channelId`` goes: the channel, and the thread to reply in."""

    ref: ChannelRef
    thread_id: str | None = None


@attrs.define
class DefaultChannels:
    """Every agent's default channel, in memory; at a start (a restart, a cluster's takeover)
    each agent's latest acked wake on a channel sets it again (:meth:`restore`)."""

    _by_agent: dict[str, DefaultChannel] = attrs.field(factory=dict)

    def get(self, agent: str) -> DefaultChannel | None:
        """The agent's default channel, if a message has set one."""
        return self._by_agent.get(agent)

    def woke(
        self,
        agent: str,
        ref: ChannelRef,
        *,
        message_id: str | None,
        thread_id: str | None,
        registered: bool,
    ) -> bool:
        """A message on ``ref`` woke ``agent``: it becomes the agent's default.

        ``registered`` is whether ``ref`` is registered as the message is admitted; a message
        admitted after its server was removed (False) sets nothing. Returns whether it set.
        """
        if not registered:
            return False
        self._by_agent[agent] = DefaultChannel(ref, message_id, thread_id)
        return True

    def restore(self, agent: str, default: DefaultChannel) -> bool:
        """At a start: the default the agent's latest acked wake set before (read from the
        journal), unless a wake delivered since has set one. Returns whether it was kept."""
        if agent in self._by_agent:
            return False
        self._by_agent[agent] = default
        return True

    def server_removed(self, server_id: str) -> list[str]:
        """Server ``server_id`` is gone: clear the message and thread of defaults on it.

        The ref is kept, so a publish that would default to it is refused as its default gone.
        Returns the agents whose default changed.
        """
        changed = []
        for agent, default in self._by_agent.items():
            if default.ref.server_id == server_id and (default.message_id or default.thread_id):
                self._by_agent[agent] = DefaultChannel(default.ref)
                changed.append(agent)
        return changed

    def target(
        self,
        agent: str,
        names: ChannelNames,
        *,
        server_id: str | None = None,
        named_mode: bool = False,
        not_done: str = texts.NOTHING_DONE,
    ) -> DefaultTarget | Refusal:
        """Where a publish with no ``channelId`` goes for ``agent``, or the refusal.

        Args:
            server_id: a ``serverId`` given alone (empty = not given): the default's id on that
                server, that exact pair.
            named_mode: the agent's prose routing is ``named``: always refused.
        """
        server_id = server_id or None
        if named_mode:
            return Refusal(KIND_CHANNEL_REQUIRED, texts.publish_needs_channel_id(), (), "", server_id)
        default = self._by_agent.get(agent)
        if default is None:
            return Refusal(KIND_NO_DEFAULT, texts.publish_no_default(not_done), (), "", server_id)
        registry = names.registry
        if server_id is not None and server_id != default.ref.server_id:
            ref = ChannelRef(server_id, default.ref.channel_id)
            if registry.is_registered(ref):
                # Another server's channel with the default's id: asked for by its server.
                return DefaultTarget(ref)
            text = texts.default_not_on_server(default.ref.channel_id, server_id, not_done)
            return Refusal(KIND_DEFAULT_NOT_ON_SERVER, text, (), default.ref.channel_id, server_id)
        ref = default.ref
        if not registry.is_registered(ref):
            text = texts.default_gone(names.name_shown(ref), ref.channel_id, ref.server_id, not_done)
            return Refusal(KIND_DEFAULT_GONE, text, (ref,), ref.channel_id, ref.server_id)
        return DefaultTarget(ref, default.thread_id)
