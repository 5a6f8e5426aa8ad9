"""The channel registry: every server's registered channels, each held by its :class:`ChannelRef`.

An MCPL channel id is unique only within one server's connection (SPEC §14.2), so nothing here is
keyed by a bare id or by a joined ``server:id`` string. The registry is pure data in, results
out: no sockets, no trio. Its owner (the router) calls it with what a server sent and the grant
current at receipt, and every mutating method returns what changed, so the caller can stop
typing and streams for exactly those refs and answer the server item by item.

This module decides: which descriptors are registered (:class:`RegistrationPolicy`, refusals
and their reasons), whether a message may enter a channel (:class:`Admission`), which channel a
push belongs to (:class:`PushChannel`), and what stays registered as servers come and go. What a
descriptor is lives in :mod:`mcpl_router.routing.descriptors`; the indexes a name is resolved
through (by id, by qualified name, by label, by a DM's label, by native address) in
:mod:`mcpl_router.routing.name_index`. The registry *is* that index (a subclass, so a lookup is
one call) and keeps it up to date on every add and removal, so a lookup costs O(1) in the number
of registered channels. :mod:`mcpl_router.routing.names` reads it; nothing else writes it.
"""

from __future__ import annotations

import fnmatch
import itertools
from collections.abc import Iterable, Mapping
from typing import Final, Literal

import attrs

from mcpl_router.logs import get_logger
from mcpl_router.routing import texts
from mcpl_router.routing.descriptors import DIRECTIONS, DM_TYPE, NATIVE_CHANNEL_KEY, ChannelDescriptor
from mcpl_router.routing.name_index import ChannelNameIndex
from mcpl_router.routing.refs import ChannelRef

__all__ = [
    "CHANNEL_NOT_PERMITTED",
    "DIRECTIONS",
    "DM_TYPE",
    "UNKNOWN_CHANNEL",
    "Admission",
    "ChangeResult",
    "ChannelDescriptor",
    "ChannelEntry",
    "ChannelRegistry",
    "DescriptorResult",
    "PushChannel",
    "RegistrationPolicy",
]

#: JSON-RPC error code for a channel the sending server has not registered (PROTOCOL §5).
UNKNOWN_CHANNEL: Final = -32023
#: JSON-RPC error code for a channel the server's grant does not permit (PROTOCOL §5).
CHANNEL_NOT_PERMITTED: Final = -32017


Form = Literal["request", "notification"]


def _patterns_tuple(patterns: Iterable[str]) -> tuple[str, ...]:
    return tuple(patterns)


@attrs.frozen
class RegistrationPolicy:
    """What one server may do with channels, as its grant stands when a message is received.

    The caller builds it from the grant current at receipt and passes it with every call, so a
    narrowed grant applies from the next message on. The default grants nothing (an absent
    grant is a grant of nothing, PROTOCOL §2).

    ``id_patterns`` narrows which channel ids the server may register or receive on: empty means
    any id; otherwise an id must match one of them with :func:`fnmatch.fnmatchcase`. There,
    ``*`` matches any run of characters, colons included, so ``discord:acme:*`` also admits
    ``discord:acme:x:y``; ``?`` and ``[...]`` work as in fnmatch.
    """

    may_register: bool = False
    may_receive: bool = False
    id_patterns: tuple[str, ...] = attrs.field(default=(), converter=_patterns_tuple)

    @classmethod
    def permissive(cls, *id_patterns: str) -> RegistrationPolicy:
        """A policy granting ``channels.register`` and ``channels.incoming`` (within patterns)."""
        return cls(may_register=True, may_receive=True, id_patterns=id_patterns)

    def permits_id(self, channel_id: str) -> bool:
        """Whether ``channel_id`` is within this server's id patterns (always, when it has none)."""
        if not self.id_patterns:
            return True
        return any(fnmatch.fnmatchcase(channel_id, pattern) for pattern in self.id_patterns)


@attrs.frozen
class DescriptorResult:
    """The answer for one descriptor of a register or change: ``{id, accepted, reason?}``."""

    id: str
    accepted: bool
    reason: str | None = None
    #: The reason as a stable value (the metrics' label), beside its sentence.
    refusal: texts.RegistrationRefusal | None = None

    def to_wire(self) -> dict[str, object]:
        """The result as ``channels/register`` answers it."""
        wire: dict[str, object] = {"id": self.id, "accepted": self.accepted}
        if self.reason is not None:
            wire["reason"] = self.reason
        return wire


@attrs.frozen
class ChangeResult:
    """What a ``channels/changed`` did: a result per added and updated descriptor, and the
    refs its removals withdrew (stop their typing and streams)."""

    added: tuple[DescriptorResult, ...] = ()
    updated: tuple[DescriptorResult, ...] = ()
    withdrawn: tuple[ChannelRef, ...] = ()

    @property
    def results(self) -> tuple[DescriptorResult, ...]:
        """The itemized answer a Request-form call gets: added, then updated."""
        return self.added + self.updated


@attrs.frozen
class Admission:
    """Whether one ``channels/incoming`` message is admitted, and into which channel.

    ``ref`` is the channel the message was admitted into, or, for a message refused by the
    grant, the sending server's channel it named; it is ``None`` where that server registers no
    such channel. ``code`` is :data:`UNKNOWN_CHANNEL` or :data:`CHANNEL_NOT_PERMITTED` when
    refused.
    """

    accepted: bool
    ref: ChannelRef | None
    code: int | None = None
    reason: str | None = None


@attrs.frozen
class PushChannel:
    """The channel a push belongs to: always one of the pushing server's, or none.

    ``registered_lazily`` is True when this push registered the channel (announce it as
    added); ``reason`` says why there is no channel when ``ref`` is None.
    """

    ref: ChannelRef | None
    registered_lazily: bool = False
    reason: str | None = None


@attrs.frozen
class ChannelEntry:
    """A registered channel: its ref, its descriptor, and the daemon's state for it.

    A value: the registry replaces an entry when anything about it changes, so an entry a
    caller holds is a snapshot that never shifts under it. ``order`` is the global registration
    sequence (used to list candidates in a stable order, never to choose between them);
    ``lazy`` marks a channel a push registered rather than its server's register call.
    """

    ref: ChannelRef
    descriptor: ChannelDescriptor
    lazy: bool
    open: bool
    order: int


@attrs.define(eq=False)
class ChannelRegistry(ChannelNameIndex):
    """Every server's channels, each held by its :class:`ChannelRef`; owned by the router.

    Mutated only by its owner, from one task. Every mutating method returns what changed.
    Refusals are logged (event ``channels.register.refused`` / ``channels.incoming.refused``,
    at warning, with ``server``, ``channel``, ``reason`` and ``form``), since a Notification-form
    call has no answer to carry them. The name indexes and their views (``refs_with_*``) are
    the base class's (:class:`~mcpl_router.routing.name_index.ChannelNameIndex`).
    """

    _entries: dict[ChannelRef, ChannelEntry] = attrs.field(factory=dict, init=False)
    # Each server's refs, in registration order (a dict used as an insertion-ordered set).
    _by_server: dict[str, dict[ChannelRef, None]] = attrs.field(factory=dict, init=False)
    _next_order: int = attrs.field(default=0, init=False)
    #: Bumped by every change to what is registered (or open): values derived from the
    #: registry (a resolved wake policy, a rendered invitation) are valid while it stands.
    generation: int = attrs.field(default=0, init=False)
    # Each admitted (server, channel id) with the policy it was admitted under, while the
    # generation stands: every message of a busy channel gets the same answer, so it is decided
    # once (refusals are not kept: each is logged). At most one per registered channel.
    _admitted: dict[tuple[str, str], tuple[RegistrationPolicy, Admission]] = attrs.field(factory=dict, init=False)
    _admitted_at: int = attrs.field(default=-1, init=False)

    # ------------------------------------------------------------------ register / change

    def register(
        self,
        server_id: str,
        descriptors: Iterable[ChannelDescriptor | object],
        policy: RegistrationPolicy,
        *,
        form: Form = "request",
    ) -> list[DescriptorResult]:
        """Apply a ``channels/register``: authorize and add each descriptor independently.

        A descriptor may come parsed or as received (any JSON value: a malformed one is
        refused with the parse error as its reason). Each is refused if the grant lacks ``channels.register``,
        if its id is outside ``policy.id_patterns``, or if the call carries its id more than
        once (every descriptor with that id is then refused: which one was meant is unknowable).
        A descriptor for an id this server already registered replaces that channel's
        descriptor, keeping its place and its open state.

        Returns:
            One result per descriptor, in the order given.
        """
        return self._add_batch(server_id, descriptors, policy, form=form, method="channels/register")

    def change(
        self,
        server_id: str,
        added: Iterable[ChannelDescriptor | object],
        removed: Iterable[str],
        updated: Iterable[ChannelDescriptor | object],
        policy: RegistrationPolicy,
        *,
        form: Form = "notification",
    ) -> ChangeResult:
        """Apply a ``channels/changed``: removals first, then additions, then updates.

        Removals need no grant (a server may always withdraw its own channels) and touch only
        this server's channels. Additions are authorized as :meth:`register` does. An update is
        authorized the same way and must name a channel this server has registered.
        """
        withdrawn = self.withdraw(server_id, removed)
        added_results = self._add_batch(server_id, added, policy, form=form, method="channels/changed")
        updated_results = self._add_batch(
            server_id, updated, policy, form=form, method="channels/changed", updating=True
        )
        return ChangeResult(
            added=tuple(added_results), updated=tuple(updated_results), withdrawn=tuple(withdrawn)
        )

    def _add_batch(
        self,
        server_id: str,
        descriptors: Iterable[ChannelDescriptor | object],
        policy: RegistrationPolicy,
        *,
        form: Form,
        method: str,
        updating: bool = False,
    ) -> list[DescriptorResult]:
        parsed: list[tuple[str, ChannelDescriptor | None, tuple[texts.RegistrationRefusal, str] | None]] = []
        for item in descriptors:
            if isinstance(item, ChannelDescriptor):
                parsed.append((item.id, item, None))
                continue
            try:
                read = ChannelDescriptor.from_wire(item)
            except ValueError as exc:
                # Refuse this descriptor alone; the rest of the call stands on its own.
                raw_id = item.get("id") if isinstance(item, Mapping) else None
                malformed = (texts.RegistrationRefusal.MALFORMED, texts.reason_malformed(str(exc)))
                parsed.append((raw_id if isinstance(raw_id, str) else "", None, malformed))
            else:
                parsed.append((read.id, read, None))
        seen: dict[str, int] = {}
        for channel_id, counted, _ in parsed:
            if counted is not None:
                seen[channel_id] = seen.get(channel_id, 0) + 1

        results: list[DescriptorResult] = []
        for channel_id, descriptor, refused in parsed:
            if descriptor is not None:
                refused = self._refusal_reason(server_id, descriptor, policy, seen, updating)
            if refused is not None:
                refusal, reason = refused
                results.append(DescriptorResult(channel_id, False, reason, refusal))
                self._log_refused("channels.register.refused", server_id, channel_id, reason, form, method)
                continue
            assert descriptor is not None
            self._put(ChannelRef(server_id, descriptor.id), descriptor, lazy=False)
            results.append(DescriptorResult(channel_id, True))
        return results

    def _refusal_reason(
        self,
        server_id: str,
        descriptor: ChannelDescriptor,
        policy: RegistrationPolicy,
        seen: Mapping[str, int],
        updating: bool,
    ) -> tuple[texts.RegistrationRefusal, str] | None:
        refusal = texts.RegistrationRefusal
        if not policy.may_register:
            return refusal.NOT_GRANTED, texts.REASON_REGISTER_NOT_GRANTED
        if not policy.permits_id(descriptor.id):
            return refusal.OUTSIDE_PATTERNS, texts.reason_outside_patterns(descriptor.id)
        if seen.get(descriptor.id, 0) > 1:
            return refusal.DUPLICATE_IN_CALL, texts.REASON_DUPLICATE_IN_CALL
        if updating and ChannelRef(server_id, descriptor.id) not in self._entries:
            return refusal.UPDATE_UNKNOWN, texts.REASON_UPDATE_UNKNOWN
        return None

    def _put(self, ref: ChannelRef, descriptor: ChannelDescriptor, *, lazy: bool) -> ChannelEntry:
        old = self._entries.get(ref)
        if old is None:
            entry = ChannelEntry(ref, descriptor, lazy=lazy, open=descriptor.initially_open, order=self._next_order)
            self._next_order += 1
            self._by_server.setdefault(ref.server_id, {})[ref] = None
            self._index_ref(ref)
        else:
            # Replacing keeps the channel's place in the listing. Open/closed is the daemon's
            # lifecycle state, so a re-register keeps it; only a channel a push registered,
            # which never had a descriptor of its own, takes the descriptor's initial state.
            is_open = descriptor.initially_open if old.lazy else old.open
            entry = ChannelEntry(ref, descriptor, lazy=lazy, open=is_open, order=old.order)
            self._unindex_description(old.ref, old.descriptor)
        self._entries[ref] = entry
        self.generation += 1
        self._index_description(ref, descriptor)
        return entry

    def _drop(self, ref: ChannelRef) -> bool:
        entry = self._entries.pop(ref, None)
        self.generation += 1
        if entry is None:
            return False
        self._unindex_description(entry.ref, entry.descriptor)
        self._unindex_ref(ref)
        server_refs = self._by_server.get(ref.server_id)
        if server_refs is not None:
            server_refs.pop(ref, None)
            if not server_refs:
                del self._by_server[ref.server_id]
        return True

    # ------------------------------------------------------------------ withdrawal

    def withdraw(self, server_id: str, ids: Iterable[str]) -> list[ChannelRef]:
        """Withdraw this server's channels with these ids; other servers' are untouched.

        Ids this server has not registered (or not strings) are skipped.

        Returns:
            Exactly the refs withdrawn, in the order given, each once.
        """
        withdrawn: list[ChannelRef] = []
        for channel_id in ids:
            if not isinstance(channel_id, str):
                continue
            ref = ChannelRef(server_id, channel_id)
            if self._drop(ref):
                withdrawn.append(ref)
        return withdrawn

    def remove_server(self, server_id: str) -> list[ChannelRef]:
        """Withdraw every channel of a server (it disconnected or was removed).

        Returns:
            The refs withdrawn, in registration order.
        """
        refs = list(self._by_server.get(server_id, {}))
        for ref in refs:
            self._drop(ref)
        return refs

    def set_open(self, ref: ChannelRef, is_open: bool) -> bool:
        """Record whether a registered channel is open; returns whether anything changed."""
        entry = self._entries.get(ref)
        if entry is None or entry.open == is_open:
            return False
        self._entries[ref] = attrs.evolve(entry, open=is_open)
        self.generation += 1
        return True

    # ------------------------------------------------------------------ inbound and pushes

    def admit_incoming(
        self,
        server_id: str,
        channel_id: str,
        policy: RegistrationPolicy,
        *,
        form: Form = "request",
    ) -> Admission:
        """Decide one ``channels/incoming`` message: admitted only into the sender's own channel.

        The channel is looked up as ``ChannelRef(server_id, channel_id)``: another server's
        channel with that id never admits it. Refused with :data:`UNKNOWN_CHANNEL` where this
        server registers no such channel, and with :data:`CHANNEL_NOT_PERMITTED` where the grant
        lacks ``channels.incoming``, the id is outside its patterns, or the channel is
        outbound-only. Tags are never consulted: they are claims, not authority. An admission
        is kept per (server, channel id, policy) until the generation moves.
        """
        if self._admitted_at != self.generation:
            self._admitted.clear()
            self._admitted_at = self.generation
        kept = self._admitted.get((server_id, channel_id)) if isinstance(channel_id, str) else None
        if kept is not None and (kept[0] is policy or kept[0] == policy):
            return kept[1]
        ref = ChannelRef(server_id, channel_id) if isinstance(channel_id, str) else None
        entry = self._entries.get(ref) if ref is not None else None
        if not policy.may_receive:
            admission = Admission(False, entry.ref if entry else None, CHANNEL_NOT_PERMITTED,
                                  texts.REASON_INCOMING_NOT_GRANTED)
        elif entry is None:
            admission = Admission(False, None, UNKNOWN_CHANNEL,
                                  texts.reason_incoming_unknown(str(channel_id)))
        elif not policy.permits_id(channel_id):
            admission = Admission(False, entry.ref, CHANNEL_NOT_PERMITTED,
                                  texts.reason_incoming_outside_patterns(channel_id))
        elif entry.descriptor.direction == "outbound":
            admission = Admission(False, entry.ref, CHANNEL_NOT_PERMITTED,
                                  texts.reason_incoming_outbound(channel_id))
        else:
            admitted = Admission(True, entry.ref)
            self._admitted[(server_id, channel_id)] = (policy, admitted)
            return admitted
        self._log_refused("channels.incoming.refused", server_id, str(channel_id),
                          admission.reason or "", form, "channels/incoming", code=admission.code)
        return admission

    def push_channel(
        self,
        server_id: str,
        policy: RegistrationPolicy,
        *,
        mcpl_channel_id: str | None = None,
        native_channel_id: str | None = None,
        label: str | None = None,
    ) -> PushChannel:
        """The channel a ``push/event`` names: always one of the pushing server's own.

        ``mcpl_channel_id`` (``origin.mcplChannelId``) is looked up among this server's channels
        only; ``native_channel_id`` (``origin.channelId``) through this server's descriptors'
        ``address`` (key ``channelId``) only. Where the MCPL id is not registered by this
        server and the server may register it, the push registers it for this server, marked
        lazy, and leaves any other server's channel with that id exactly as it was. A native id
        alone that resolves nowhere registers nothing (composing an MCPL id from it is
        server-specific; the caller may compose one and call again).
        """
        if mcpl_channel_id:
            ref = ChannelRef(server_id, mcpl_channel_id)
            if ref in self._entries:
                return PushChannel(ref)
            if not policy.may_register:
                return PushChannel(None, reason=texts.REASON_REGISTER_NOT_GRANTED)
            if not policy.permits_id(mcpl_channel_id):
                return PushChannel(None, reason=texts.reason_outside_patterns(mcpl_channel_id))
            address = ((NATIVE_CHANNEL_KEY, native_channel_id),) if native_channel_id else ()
            descriptor = ChannelDescriptor(
                id=mcpl_channel_id, label=label or mcpl_channel_id, address=address
            )
            self._put(ref, descriptor, lazy=True)
            get_logger().info("channels.push.registered", server=server_id, channel=mcpl_channel_id)
            return PushChannel(ref, registered_lazily=True)
        if native_channel_id:
            refs = self._by_native.get(server_id, {}).get((NATIVE_CHANNEL_KEY, native_channel_id), {})
            if len(refs) == 1:
                return PushChannel(next(iter(refs)))
            if refs:
                return PushChannel(None, reason=texts.reason_native_ambiguous(native_channel_id))
            return PushChannel(None, reason=texts.reason_native_unknown(native_channel_id))
        return PushChannel(None, reason=texts.REASON_PUSH_NAMES_NO_CHANNEL)

    # ------------------------------------------------------------------ reads

    def get(self, ref: ChannelRef) -> ChannelEntry | None:
        """The entry for exactly this pair, or None."""
        return self._entries.get(ref)

    def is_registered(self, ref: ChannelRef) -> bool:
        """Whether exactly this pair is registered now."""
        return ref in self._entries

    def channels_for(self, server_id: str) -> list[ChannelEntry]:
        """One server's channels, in registration order (the context that server is told)."""
        return [self._entries[ref] for ref in self._by_server.get(server_id, ())]

    def channel_count(self, server_id: str | None = None) -> int:
        """How many channels one server (or, with None, every server) has registered: no walk."""
        if server_id is None:
            return len(self._entries)
        return len(self._by_server.get(server_id, ()))

    def all_entries(self) -> list[ChannelEntry]:
        """Every registered channel, in registration order."""
        return list(self._entries.values())

    def entries_between(self, start: int, stop: int) -> list[ChannelEntry]:
        """The channels at positions ``start`` to ``stop`` in registration order (a page)."""
        return list(itertools.islice(self._entries.values(), start, stop))

    def position_of(self, ref: ChannelRef, hint: int) -> int | None:
        """Where ``ref`` stands in registration order (checking ``hint`` first), or None."""
        if ref not in self._entries:
            return None
        if 0 <= hint < len(self._entries):
            at_hint = next(itertools.islice(self._entries, hint, None), None)
            if at_hint == ref:
                return hint
        for position, candidate in enumerate(self._entries):
            if candidate == ref:
                return position
        return None

    def first_entries(self, limit: int) -> list[ChannelEntry]:
        """The first ``limit`` channels in registration order, without walking the rest."""
        return list(itertools.islice(self._entries.values(), limit))

    def servers(self) -> list[str]:
        """The servers that have at least one channel registered, by first registration."""
        return list(self._by_server)

    def __len__(self) -> int:
        return len(self._entries)

    def order_of(self, ref: ChannelRef) -> int:
        """The registration sequence number of a registered channel (KeyError if it isn't)."""
        return self._entries[ref].order

    # ------------------------------------------------------------------ logging

    def _log_refused(
        self,
        event: str,
        server_id: str,
        channel_id: str,
        reason: str,
        form: Form,
        method: str,
        **extra: object,
    ) -> None:
        # The logger is fetched per refusal, not held, so a logging configuration made after
        # the registry was built (or structlog's capture in a test) still applies. Refusals
        # are rare; this costs nothing on the accepted path.
        get_logger().warning(
            event, server=server_id, channel=channel_id, reason=reason, form=form, method=method, **extra
        )
