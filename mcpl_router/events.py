"""What happened, told to whoever cares: the daemon's domain events and their one dispatcher.

A part that must react to something another part did (a server registered channels, an event
committed, a host connection closed) subscribes to that event's type when it is built; the part
that did it publishes the event and knows nothing of who listens. So the daemon builds its parts
in floor order, each given what it uses at construction, and no part is tied to another after
it (docs/architecture.md, "Events").

The dispatcher is synchronous and in-process: :meth:`EventBus.publish` calls each subscriber in
the order they subscribed, on the publisher's trio task, before it returns. So a subscriber sees
the state the event describes (the journal has committed, the registry has changed) and nothing
after it; a subscriber that must wait for something queues work for its own task. One
subscriber's failure is logged and counted, and the others still hear the event: a bug in the
demo's printer must not stop a wake.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final, TypeVar

import attrs
import msgspec

from mcpl_router.logs import get_logger
from mcpl_router.routing.refs import ChannelRef
from mcpl_router.routing.registry import DescriptorResult
from mcpl_router.routing.wakes import Wake
from mcpl_router.store.records import Delivery, InboundEvent


@attrs.frozen
class ServerStateChanged:
    """A server link moved from ``old`` to ``new`` (``LinkState`` values: ``connecting``, ``ready``…)."""

    server_id: str
    old: str
    new: str


@attrs.frozen
class ServerRegranted:
    """A reload changed a server's grant and the server has been told (what the new grant adds
    holds from its answer on): what was skipped for want of a capability may be done now."""

    server_id: str


@attrs.frozen
class ServerWithdrawn:
    """Everything a server registered is gone: its connection ended (a link epoch ended; a
    reconnect registers again), or a reload took ``channels.register`` away (``why`` says so)."""

    server_id: str
    why: str | None = None


@attrs.frozen
class ChannelsChanged:
    """Channels a server registered (``added``) or that are gone (``removed``), each by its ref."""

    server_id: str
    added: tuple[ChannelRef, ...] = ()
    removed: tuple[ChannelRef, ...] = ()


@attrs.frozen
class RegistrationsAnswered:
    """A server's ``channels/register`` or ``channels/changed`` was answered: each descriptor's
    result, accepted or refused (with its reason's sentence and stable value)."""

    server_id: str
    results: tuple[DescriptorResult, ...]


class InboundAccepted(msgspec.Struct, frozen=True):
    """An inbound event committed to the journal as ``seq``, with the deliveries decided for it.

    This and :class:`WakeDelivered`, published per message, are msgspec Structs for the reason
    :class:`~mcpl_router.store.records.InboundEvent` is."""

    seq: int
    event: InboundEvent
    deliveries: tuple[Delivery, ...]


class WakeDelivered(msgspec.Struct, frozen=True):
    """A wake went to its agent's host (alone, or as the route of a gate's batch)."""

    wake: Wake


@attrs.frozen
class ServerToolsChanged:
    """A server's tool list changed (it was listed again): the name table is rebuilt."""

    server_id: str


@attrs.frozen
class HostOpened:
    """A host connection was accepted. ``connection`` is compared by identity only."""

    connection: object


@attrs.frozen
class HostClosed:
    """A host connection is gone (its turns end now; its agents are held for the grace)."""

    connection: object


Event = ServerStateChanged | ServerRegranted | ServerWithdrawn | ChannelsChanged | RegistrationsAnswered | InboundAccepted | WakeDelivered | ServerToolsChanged | HostOpened | HostClosed
E = TypeVar("E", bound=Event)

#: Every event type, in the order docs/architecture.md lists them.
EVENT_TYPES: Final = (ServerStateChanged, ServerRegranted, ServerWithdrawn, ChannelsChanged, RegistrationsAnswered, InboundAccepted, WakeDelivered, ServerToolsChanged,
                      HostOpened, HostClosed)


class EventBus:
    """The one dispatcher: subscribers by event type, called in subscription order."""

    def __init__(self) -> None:
        # Keyed by exact type: publish looks up type(event), so a subscriber only ever gets its kind.
        self._subscribers: dict[type, list[Callable[..., None]]] = {kind: [] for kind in EVENT_TYPES}
        #: Subscriber calls that raised, by event type name (``status`` and the tests read it).
        self.failures: dict[str, int] = {}
        self._log = get_logger()

    def subscribe(self, kind: type[E], subscriber: Callable[[E], None]) -> None:
        """Call ``subscriber`` with every ``kind`` event published from now on."""
        self._subscribers[kind].append(subscriber)

    def subscribers(self, kind: type[Event]) -> int:
        """How many subscribe to ``kind`` (the wiring test reads it)."""
        return len(self._subscribers[kind])

    def publish(self, event: Event) -> None:
        """Tell every subscriber of ``event``'s type, in order; a failing one is logged."""
        for subscriber in self._subscribers[type(event)]:
            try:
                subscriber(event)
            except Exception:
                name = type(event).__name__
                self.failures[name] = self.failures.get(name, 0) + 1
                self._log.exception("event.subscriber.crashed", kind=name, subscriber=getattr(subscriber, "__qualname__", repr(subscriber)))
