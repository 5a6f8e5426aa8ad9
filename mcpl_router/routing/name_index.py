"""The name index: for each string a name is matched against, the registered refs answering to it.

The resolver (:mod:`mcpl_router.routing.names`) asks, for a name an agent or a host wrote, which
channels have it as their id, their ``serverId:channelId``, their label, a DM's label, or a
native id in their address. Each answer is a dict lookup here, so resolving a name costs O(1) in
the number of registered channels. Apart from the registry because keeping these indexes
exact (sets that share a string, emptied buckets dropped, a re-register re-indexing only what it
can change) is its own concern; the registry decides *what* is registered and tells the index
at each add and removal. :class:`~mcpl_router.routing.registry.ChannelRegistry` is a
:class:`ChannelNameIndex`, so a lookup is one method call on the registry, as before.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Final

import attrs

from mcpl_router.routing.descriptors import NATIVE_CHANNEL_KEY, ChannelDescriptor
from mcpl_router.routing.refs import ChannelRef

__all__ = ["ChannelNameIndex"]

_EMPTY: Final[tuple[ChannelRef, ...]] = ()

#: A name index maps a string to the one ref answering to it, or to the refs (in registration
#: order) when several do. Most names pick one channel: holding the ref itself rather than a
#: one-item dict is most of what a registered channel costs in memory (docs/performance.md).
_Bucket = ChannelRef | dict[ChannelRef, None]


def _index_add(index: dict[str, _Bucket], key: str, ref: ChannelRef) -> None:
    bucket = index.get(key)
    if bucket is None:
        index[key] = ref
    elif isinstance(bucket, ChannelRef):
        if bucket != ref:
            index[key] = {bucket: None, ref: None}
    else:
        bucket[ref] = None


def _index_discard(index: dict[str, _Bucket], key: str, ref: ChannelRef) -> None:
    bucket = index.get(key)
    if bucket is None:
        return
    if isinstance(bucket, ChannelRef):
        if bucket == ref:
            del index[key]
        return
    bucket.pop(ref, None)
    if len(bucket) == 1:
        index[key] = next(iter(bucket))
    elif not bucket:
        # Drop empty buckets, so the index's size follows the channels registered now and a
        # lookup of a withdrawn name finds nothing rather than an empty set.
        del index[key]


def _view(index: dict[str, _Bucket], key: str) -> Collection[ChannelRef]:
    bucket = index.get(key)
    if bucket is None:
        return _EMPTY
    if isinstance(bucket, ChannelRef):
        return (bucket,)
    return bucket.keys()


@attrs.define(eq=False)
class ChannelNameIndex:
    """The indexes by id, by qualified name, by label, by a DM's label and by native address.

    Written only by the registry that is this index (the ``_index_*`` / ``_unindex_*``
    methods, at every add and removal); read by the resolver through the ``refs_with_*`` views.
    """

    # Dicts used as insertion-ordered sets of refs. Keys are the string a name is matched
    # against (an id, a qualified name, a casefolded label), values the one ref or, when two
    # channels share the string, all of them in registration order (_Bucket): the index must
    # keep both.
    _by_id: dict[str, _Bucket] = attrs.field(factory=dict, init=False)
    _by_qualified: dict[str, _Bucket] = attrs.field(factory=dict, init=False)
    _by_label: dict[str, _Bucket] = attrs.field(factory=dict, init=False)
    _by_dm_label: dict[str, _Bucket] = attrs.field(factory=dict, init=False)
    # server id -> (address key, native id) -> refs: a native id is looked up only among the
    # pushing server's own channels, so the server is part of the path, not of a joined key.
    _by_native: dict[str, dict[tuple[str, str], dict[ChannelRef, None]]] = attrs.field(
        factory=dict, init=False
    )

    # ------------------------------------------------------------------ writes (the registry's)

    def _index_ref(self, ref: ChannelRef) -> None:
        """Index what a channel answers to for as long as it is registered: its id and pair."""
        _index_add(self._by_id, ref.channel_id, ref)
        _index_add(self._by_qualified, ref.qualified_name, ref)

    def _unindex_ref(self, ref: ChannelRef) -> None:
        _index_discard(self._by_id, ref.channel_id, ref)
        _index_discard(self._by_qualified, ref.qualified_name, ref)

    def _index_description(self, ref: ChannelRef, descriptor: ChannelDescriptor) -> None:
        """Index what a re-register can change: labels and native ids (id and pair never do)."""
        if descriptor.label:
            folded = descriptor.label.casefold()
            _index_add(self._by_label, folded, ref)
            if descriptor.is_dm:
                _index_add(self._by_dm_label, folded, ref)
        if descriptor.address:
            natives = self._by_native.setdefault(ref.server_id, {})
            for pair in descriptor.address:
                natives.setdefault(pair, {})[ref] = None

    def _unindex_description(self, ref: ChannelRef, descriptor: ChannelDescriptor) -> None:
        if descriptor.label:
            folded = descriptor.label.casefold()
            _index_discard(self._by_label, folded, ref)
            if descriptor.is_dm:
                _index_discard(self._by_dm_label, folded, ref)
        natives = self._by_native.get(ref.server_id)
        if natives is not None:
            for pair in descriptor.address:
                refs = natives.get(pair)
                if refs is not None:
                    refs.pop(ref, None)
                    if not refs:
                        del natives[pair]
            if not natives:
                del self._by_native[ref.server_id]

    # ------------------------------------------------------------------ views (the resolver's)

    # Each view is live and read-only: use it at once, don't hold it across a mutation.

    def refs_with_id(self, channel_id: str) -> Collection[ChannelRef]:
        """The registered channels whose own id is ``channel_id`` (any server)."""
        return _view(self._by_id, channel_id)

    def refs_with_qualified_name(self, name: str) -> Collection[ChannelRef]:
        """The registered channels whose ``serverId:channelId`` is exactly ``name``.

        Matched against the registered pairs, never by splitting ``name`` at a colon: server
        ``a``'s ``b:room`` and server ``a:b``'s ``room`` are both here under ``a:b:room``.
        """
        return _view(self._by_qualified, name)

    def refs_with_label(self, label: str) -> Collection[ChannelRef]:
        """The registered channels whose label is ``label``, compared without case."""
        return _view(self._by_label, label.casefold())

    def dm_refs_with_label(self, label: str) -> Collection[ChannelRef]:
        """The registered DMs whose label is ``label``, compared without case."""
        return _view(self._by_dm_label, label.casefold())

    def refs_with_native_id(
        self, server_id: str, native_id: str, key: str = NATIVE_CHANNEL_KEY
    ) -> Collection[ChannelRef]:
        """This server's channels whose address gives ``native_id`` under ``key``."""
        refs = self._by_native.get(server_id, {}).get((key, native_id))
        return refs.keys() if refs else _EMPTY
