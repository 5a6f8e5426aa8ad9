"""Names: the one resolver for a channel named by a string, and the names an agent is shown.

A *name* is a string an agent or a host gave. :meth:`ChannelNames.channels_named` is the only
place a name becomes channels: the channels whose id is the name, those whose qualified name
``serverId:channelId`` is the name (matched against the registered pairs, never by splitting at
a colon, since ids hold colons), and the DMs whose label is the name without regard to case,
taken together. Everything else here is built on it:

- :meth:`~ChannelNames.channel_named` picks one channel or refuses, with one refusal for a name
  several channels answer to (:meth:`~ChannelNames.refuse_ambiguous`);
- :meth:`~ChannelNames.channel_on_server` picks one channel of a given server (for a call that
  can reach no other, a server's own send tool) or refuses a name several of them answer to;
- :meth:`~ChannelNames.name_shown` is the string an agent is shown for a channel, which
  resolves back to that channel or is visibly not a name;
- :meth:`~ChannelNames.channel_list` gives the listing's rows in one O(n) pass;
- :meth:`~ChannelNames.explain` says how a name resolves and why.

Every lookup reads the registry's indexes, so it costs O(1) in the number of channels (O(k) in
the k channels that answer to the name). Nothing here keeps state of its own.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable
from typing import Final

import attrs

from mcpl_router.routing import texts
from mcpl_router.routing.decisions import Decisions
from mcpl_router.routing.name_results import Candidate, ChannelRow, Explanation, Refusal, Resolved
from mcpl_router.routing.refs import ChannelRef
from mcpl_router.routing.registry import ChannelEntry, ChannelRegistry

__all__ = [
    "MATCH_DM_LABEL",
    "MATCH_ID",
    "MATCH_PAIR",
    "MATCH_QUALIFIED",
    "Candidate",
    "ChannelNames",
    "ChannelRow",
    "Explanation",
    "Refusal",
    "Resolved",
]

# How a candidate answered to a name (stable strings, for explain's JSON).
MATCH_ID: Final = "id"
MATCH_QUALIFIED: Final = "qualified-name"
MATCH_DM_LABEL: Final = "dm-label"
MATCH_PAIR: Final = "server-and-id"

# Rules and refusal kinds (stable strings: hosts and tests match on them).
RULE_EXACT_PAIR: Final = "exact-pair"
RULE_ONE_MATCH: Final = "one-match"
RULE_QUALIFIED_PAIR: Final = "qualified-pair"
KIND_AMBIGUOUS: Final = "ambiguous"
KIND_UNKNOWN: Final = "unknown"
KIND_NOT_ON_SERVER: Final = "not-on-server"
KIND_QUALIFIED_WITH_SERVER: Final = "qualified-with-server"
KIND_NO_NAME: Final = "no-name"

#: How many channels an "unknown" refusal lists before saying how many more there are.
UNKNOWN_LISTING_CAP: Final = 10


#: Where a DM descriptor's ``address`` names its recipient (``<@id>`` targets).
RECIPIENT_KEYS: tuple[str, ...] = ("userId", "recipientId", "user")
#: Shown names remembered for one registry generation at most; past this many the memory
#: starts again (a turn asks for the same few half a dozen times).
SHOWN_NAMES_KEPT: Final = 4096


@attrs.define
class _ShownNames:
    """What ``name_shown`` answered, valid while the registry's ``generation`` stands (every
    change to what is registered bumps it, and a shown name is read from nothing else)."""

    generation: int = -1
    names: dict[ChannelRef, str] = attrs.field(factory=dict)


@attrs.frozen(eq=False)
class ChannelNames:
    """The resolver and the shown names, read from a :class:`ChannelRegistry`'s indexes."""

    registry: ChannelRegistry
    #: Refusals by ``kind`` since start (the daemon's ``/metrics`` reads them); explain's not counted.
    refusals: collections.Counter[str] = attrs.field(factory=collections.Counter, init=False)
    #: The router's last routing decisions: each counted refusal is one (``status``'s ``decisions``).
    decisions: Decisions = attrs.field(factory=Decisions, kw_only=True)
    _shown: _ShownNames = attrs.field(factory=_ShownNames, init=False)

    # ------------------------------------------------------------------ the one resolver

    def channels_named(self, name: str) -> list[ChannelRef]:
        """Every channel that answers to ``name``, in registration order.

        Those whose id is ``name``, those whose ``serverId:channelId`` is ``name`` (matched
        against registered pairs, never split at a colon), and the DMs whose label is ``name``
        compared without case, taken together, each once. An empty name names nothing.
        ``#label`` forms are not names here (that is a routing mode's grammar); see
        :meth:`channels_labelled`.
        """
        if not name:
            return []
        registry = self.registry
        by_id = registry.refs_with_id(name)
        by_qualified = registry.refs_with_qualified_name(name)
        by_dm_label = registry.dm_refs_with_label(name)
        if len(by_id) + len(by_qualified) + len(by_dm_label) < 2:
            # The common case, one channel or none: no set to build.
            return [*by_id, *by_qualified, *by_dm_label]
        found = dict.fromkeys(by_id)
        found.update(dict.fromkeys(by_qualified))
        found.update(dict.fromkeys(by_dm_label))
        if len(found) < 2:
            return list(found)
        # Registration order is for a stable listing only: nothing picks the first.
        return sorted(found, key=registry.order_of)

    def channels_labelled(self, label: str) -> list[ChannelRef]:
        """Every channel (of any type) whose label is ``label``, compared without case."""
        registry = self.registry
        refs = list(registry.refs_with_label(label)) if label else []
        return sorted(refs, key=registry.order_of) if len(refs) > 1 else refs

    def _sole(self, name: str) -> ChannelRef | None:
        """The one channel answering to ``name``, or None when none or several do.

        Stops at the second distinct channel, so it is O(1) however many share the name.
        """
        if not name:
            return None
        registry = self.registry
        found: ChannelRef | None = None
        for refs in (
            registry.refs_with_id(name),
            registry.refs_with_qualified_name(name),
            registry.dm_refs_with_label(name),
        ):
            for ref in refs:
                if found is None:
                    found = ref
                elif ref != found:
                    return None
        return found

    def _answers(self, name: str) -> bool:
        registry = self.registry
        return bool(
            registry.refs_with_id(name)
            or registry.refs_with_qualified_name(name)
            or registry.dm_refs_with_label(name)
        )

    # ------------------------------------------------------------------ shown names

    def dms_of_recipient(self, user_id: str) -> list[ChannelRef]:
        """The DMs with the person whose id is ``user_id`` (a ``<@id>`` target), on any server.

        A DM's recipient is read from its descriptor's ``address`` under one of
        :data:`RECIPIENT_KEYS`; the lookup is per server through the registry's native-id index,
        so it costs O(servers), not a scan of channels. One person may have a DM on each server:
        the caller refuses several as it refuses any name several channels answer to.
        """
        registry = self.registry
        found: dict[ChannelRef, None] = {}
        for server_id in registry.servers():
            for key in RECIPIENT_KEYS:
                for ref in registry.refs_with_native_id(server_id, user_id, key):
                    entry = registry.get(ref)
                    if entry is not None and entry.descriptor.is_dm:
                        found[ref] = None
        return sorted(found, key=registry.order_of)

    def picks_alone(self, name: str, ref: ChannelRef) -> bool:
        """Whether ``name`` picks ``ref`` and no other channel. O(1), however many share it."""
        return self._sole(name) == ref

    def pick_name(self, ref: ChannelRef) -> str | None:
        """The name that picks ``ref`` alone: its id, else its qualified name, else None.

        None also for a channel not registered now.
        """
        if not self.registry.is_registered(ref):
            return None
        if self._sole(ref.channel_id) == ref:
            return ref.channel_id
        qualified = ref.qualified_name
        if self._sole(qualified) == ref:
            return qualified
        return None

    def name_shown(self, ref: ChannelRef) -> str:
        """The string an agent is shown for ``ref``. O(1) in the number of channels.

        A registered channel: its id where the id picks it alone, else its qualified name where
        that picks it alone, else the id-and-server form (``"b:room" on server "a"``), which is
        visibly not a name. A channel no longer registered: its id, or its qualified name where
        another channel now answers to the id, or the id-and-server form where something
        answers to both, so what is shown never names another channel.
        """
        memo = self._shown
        if memo.generation == self.registry.generation:
            shown = memo.names.get(ref)
            if shown is not None:
                return shown
        else:
            memo.names.clear()
            memo.generation = self.registry.generation
        # Bounded where it grows: a hit (a turn asks several times) checks nothing more.
        if len(memo.names) >= SHOWN_NAMES_KEPT:
            memo.names.clear()
        shown = memo.names[ref] = self._name_shown_now(ref)
        return shown

    def _name_shown_now(self, ref: ChannelRef) -> str:
        if self.registry.is_registered(ref):
            picked = self.pick_name(ref)
            if picked is not None:
                return picked
            return texts.unnamed_channel(ref.channel_id, ref.server_id)
        if not self._answers(ref.channel_id):
            return ref.channel_id
        if not self._answers(ref.qualified_name):
            return ref.qualified_name
        return texts.unnamed_channel(ref.channel_id, ref.server_id)

    # ------------------------------------------------------------------ picking one

    def channel_named(
        self,
        name: str | None,
        server_id: str | None = None,
        *,
        not_done: str = texts.NOTHING_DONE,
        server_id_accepted: bool = True,
        counted: bool = True,
        lister: str = texts.AGENT_LISTER,
    ) -> Resolved | Refusal:
        """The one channel a name (and optional server) picks, or a refusal saying why not.

        Args:
            name: the ``channelId`` (an id, a qualified name, a DM's label). Empty or None
                means none was given.
            server_id: a ``serverId``; given (non-empty), ``name`` is that server's channel id
                and the pair is matched exactly, never read as another channel's name. An
                empty string (a model's way of leaving a field out) means not given.
            not_done: what the caller did not do, for the refusal ("Nothing was sent.").
            server_id_accepted: whether the caller's schema takes a ``serverId``; when not, a
                channel no string picks alone is said to be one no channelId reaches.
            counted: whether a refusal counts in :attr:`refusals` (``/metrics``). False for a
                name the daemon only tries (explain; a token it might offer an agent), so the
                count stays one of names agents and hosts gave.
            lister: what the refusal says lists the channels (the agent's tool, or for an
                operator their command).
        """
        result = self._channel_named(name, server_id, not_done, server_id_accepted, lister)
        if counted and isinstance(result, Refusal):
            self._count(result)
        return result

    def _channel_named(
        self, name: str | None, server_id: str | None, not_done: str, server_id_accepted: bool, lister: str
    ) -> Resolved | Refusal:
        server_id = server_id or None
        if not name:
            return Refusal(KIND_NO_NAME, texts.no_name(not_done, lister), (), "", server_id)
        if server_id is not None:
            ref = ChannelRef(server_id, name)
            if self.registry.is_registered(ref):
                return Resolved(ref, RULE_EXACT_PAIR)
            return self._refuse_not_on_server(name, server_id, not_done, server_id_accepted, lister)
        candidates = self.channels_named(name)
        if len(candidates) == 1:
            return Resolved(candidates[0], RULE_ONE_MATCH)
        if candidates:
            return self.refuse_ambiguous(
                name, candidates, not_done=not_done, server_id_accepted=server_id_accepted
            )
        return self._refuse_unknown(name, not_done, lister)

    def channel_qualified(self, name: str, *, not_done: str = texts.NOTHING_DONE) -> Resolved | Refusal:
        """The one registered pair whose ``serverId:channelId`` is ``name``, the qualified
        reading alone: never a channel whose id is ``name``, nor a DM's label.

        For a name that must say its server: a gate rule's channel entry
        (docs/wake-policy.md), where a discord-style bare id such as ``discord:123:456`` would
        otherwise mean whichever server registers that id. Matched against the registered
        pairs, never split at a colon, since server ids and channel ids both hold colons. Two
        pairs with one qualified name (a's ``b:room`` and a:b's ``room``) are refused as
        :meth:`refuse_ambiguous` refuses them; none is ``unknown``, saying where a channel has
        ``name`` as its id. A refusal is counted as :meth:`channel_named`'s are.
        """
        registry = self.registry
        refs = sorted(registry.refs_with_qualified_name(name), key=registry.order_of) if name else []
        if len(refs) == 1:
            return Resolved(refs[0], RULE_QUALIFIED_PAIR)
        if refs:
            refusal = self.refuse_ambiguous(name, refs, not_done=not_done)
        elif not name:
            refusal = Refusal(KIND_NO_NAME, texts.no_name(not_done), (), "", None)
        else:
            holders = sorted(registry.refs_with_id(name), key=registry.order_of)
            text = texts.no_qualified_pair(name, [ref.server_id for ref in holders], not_done)
            refusal = Refusal(KIND_UNKNOWN, text, (), name, None)
        self._count(refusal)
        return refusal

    def channel_on_server(
        self, name: str, server_id: str, *, not_done: str = texts.NOTHING_DONE
    ) -> Resolved | Refusal | None:
        """The one channel of server ``server_id`` a name picks, for a call that can only reach
        that server (a server's own send tool); None when none of its channels answers to it.

        The server's channel whose id is ``name`` first (the exact pair); else the channels
        :meth:`channels_named` finds for ``name`` that are on this server (``"b:general"`` is
        b's ``general``; a DM's label): one is picked, several are refused as ambiguous with
        the candidates, each named by its id (which picks it on this server). Channels of other
        servers the name also answers to are not this server's to pick, and don't make it
        ambiguous. A refusal is counted as :meth:`channel_named`'s are.
        """
        if not name:
            return None
        ref = ChannelRef(server_id, name)
        if self.registry.is_registered(ref):
            return Resolved(ref, RULE_EXACT_PAIR)
        own = [candidate for candidate in self.channels_named(name) if candidate.server_id == server_id]
        if not own:
            return None
        if len(own) == 1:
            return Resolved(own[0], RULE_ONE_MATCH)
        # Each is named by its id, which picks it alone on this server (the exact pair).
        lines = [texts.candidate_line(candidate.channel_id) for candidate in own]
        text = texts.ambiguous_on_server(name, server_id, lines, not_done)
        return self._count(Refusal(KIND_AMBIGUOUS, text, tuple(own), name, server_id))

    def _count(self, refusal: Refusal) -> Refusal:
        """A refusal of a name an agent or host gave: counted (``/metrics``) and kept as a decision."""
        self.refusals[refusal.kind] += 1
        self.decisions.refused(refusal.kind, refusal.name, refusal.candidates, refusal.server_id)
        return refusal

    def refuse_ambiguous(
        self,
        name: str,
        candidates: Iterable[ChannelRef],
        *,
        not_done: str = texts.NOTHING_DONE,
        server_id_accepted: bool = True,
    ) -> Refusal:
        """The one refusal for a name several channels answer to.

        Names each candidate by the name that picks it alone, or, where no string does, gives
        a line with its route (``channelId`` with ``serverId``). Says the name "is on more than
        one server" or "could mean more than one channel on server" s; never "not found".
        Also for candidates found another way (a ``#label`` target), so they read the same.
        """
        refs = tuple(dict.fromkeys(candidates))
        if not refs:
            return self._refuse_unknown(name, not_done, texts.AGENT_LISTER)
        lines = []
        for ref in refs:
            picked = self.pick_name(ref)
            if picked is not None:
                lines.append(texts.candidate_line(picked))
            else:
                lines.append(
                    texts.route_line(ref.channel_id, ref.server_id, server_id_accepted=server_id_accepted)
                )
        servers = dict.fromkeys(ref.server_id for ref in refs)
        if len(servers) > 1:
            text = texts.ambiguous_across_servers(name, lines, not_done)
        else:
            text = texts.ambiguous_on_server(name, next(iter(servers)), lines, not_done)
        return Refusal(KIND_AMBIGUOUS, text, refs, name, None)

    def _refuse_unknown(self, name: str, not_done: str, lister: str) -> Refusal:
        registry = self.registry
        # The first few in registration order, without walking the rest: a refusal must stay
        # cheap with 100k channels registered.
        first = registry.first_entries(UNKNOWN_LISTING_CAP)
        shown = [self.name_shown(entry.ref) for entry in first]
        text = texts.unknown_name(name, shown, len(registry) - len(first), not_done, lister)
        return Refusal(KIND_UNKNOWN, text, (), name, None)

    def _refuse_not_on_server(
        self, name: str, server_id: str, not_done: str, server_id_accepted: bool, lister: str
    ) -> Refusal:
        sole = self._sole(name)
        if sole is not None and sole.server_id == server_id and sole.qualified_name == name:
            # "a:general" with serverId "a": the pair (a, "a:general") is no channel, and the
            # name already says that server. Say the name works alone. With another server's
            # id beside it, it is not-on-server: pointing a call that chose server "c" at
            # server "a"'s channel would be pointing it at another community.
            text = texts.qualified_with_server(name, server_id, sole.channel_id, sole.server_id, not_done)
            return Refusal(KIND_QUALIFIED_WITH_SERVER, text, (sole,), name, server_id)
        registry = self.registry
        holders = sorted(registry.refs_with_id(name), key=registry.order_of)
        places = []
        for ref in holders:
            picked = self.pick_name(ref)
            if picked is not None:
                places.append(texts.place_by_name(ref.server_id, picked, advise=server_id_accepted))
            else:
                places.append(
                    texts.place_by_route(ref.channel_id, ref.server_id, server_id_accepted=server_id_accepted)
                )
        text = texts.not_on_server(name, server_id, places, not_done, lister)
        return Refusal(KIND_NOT_ON_SERVER, text, tuple(holders), name, server_id)

    # ------------------------------------------------------------------ listing

    def channel_list(self) -> list[ChannelRow]:
        """Every channel as a ``channel_list`` row, in registration order. O(n).

        One pass counts how many channels answer to each id, qualified name and DM label;
        each row is then named from those counts, with no lookup per row.
        """
        entries = self.registry.all_entries()
        by_id: dict[str, int] = {}
        by_qualified: dict[str, int] = {}
        by_dm_label: dict[str, int] = {}
        # A DM whose label equals its own id (or qualified name) without case answers to that
        # string twice; count it once, as channels_named does.
        twice_by_id: dict[str, int] = {}
        twice_by_qualified: dict[str, int] = {}
        for entry in entries:
            ref = entry.ref
            channel_id = ref.channel_id
            qualified = ref.qualified_name
            by_id[channel_id] = by_id.get(channel_id, 0) + 1
            by_qualified[qualified] = by_qualified.get(qualified, 0) + 1
            descriptor = entry.descriptor
            if descriptor.is_dm and descriptor.label:
                folded = descriptor.label.casefold()
                by_dm_label[folded] = by_dm_label.get(folded, 0) + 1
                if folded == channel_id.casefold():
                    twice_by_id[channel_id] = twice_by_id.get(channel_id, 0) + 1
                if folded == qualified.casefold():
                    twice_by_qualified[qualified] = twice_by_qualified.get(qualified, 0) + 1

        def answering(name: str) -> int:
            count = by_id.get(name, 0) + by_qualified.get(name, 0)
            if by_dm_label:
                count += by_dm_label.get(name.casefold(), 0)
                count -= twice_by_id.get(name, 0) + twice_by_qualified.get(name, 0)
            return count

        rows = []
        for entry in entries:
            ref = entry.ref
            name: str | None = None
            # Each row answers to its own id and qualified name, so a count of 1 is this row.
            if answering(ref.channel_id) == 1:
                shown = ref.channel_id
            elif answering(ref.qualified_name) == 1:
                name = shown = ref.qualified_name
            else:
                shown = texts.unnamed_channel(ref.channel_id, ref.server_id)
            rows.append(_row(entry, name, shown))
        return rows

    def channel_page(self, start: int, limit: int) -> list[ChannelRow]:
        """``limit`` rows of ``channel_list`` from position ``start``: each named through the
        indexes (O(1) a row), so a page costs its own size, not the registry's."""
        rows = []
        for entry in self.registry.entries_between(start, start + limit):
            ref = entry.ref
            picked = self.pick_name(ref)
            name = picked if picked is not None and picked != ref.channel_id else None
            shown = picked if picked is not None else texts.unnamed_channel(ref.channel_id, ref.server_id)
            rows.append(_row(entry, name, shown))
        return rows

    # ------------------------------------------------------------------ explain

    def _matches(self, name: str) -> dict[ChannelRef, list[str]]:
        registry = self.registry
        matches: dict[ChannelRef, list[str]] = {}
        if not name:
            return matches
        for how, refs in (
            (MATCH_ID, registry.refs_with_id(name)),
            (MATCH_QUALIFIED, registry.refs_with_qualified_name(name)),
            (MATCH_DM_LABEL, registry.dm_refs_with_label(name)),
        ):
            for ref in refs:
                matches.setdefault(ref, []).append(how)
        return dict(sorted(matches.items(), key=lambda item: registry.order_of(item[0])))

    def explain(self, name: str | None, server_id: str | None = None) -> Explanation:
        """How ``name`` (with an optional ``serverId``) resolves, and why.

        Lists every channel that answers to the name with how it matched, and, where a
        ``serverId`` was given, the exact pair; the rule that picked or refused; the refusal;
        and each candidate's shown name.
        """
        name = name or ""
        server_id = server_id or None
        # An operator reads it (``mcpl-router explain``): the refusal names their command.
        result = self.channel_named(name, server_id, counted=False, lister=texts.OPERATOR_LISTER)
        matches = self._matches(name)
        if server_id is not None:
            pair = ChannelRef(server_id, name)
            if self.registry.is_registered(pair):
                matches = {pair: [MATCH_PAIR, *matches.pop(pair, [])], **matches}
        candidates = tuple(
            Candidate(ref, tuple(how), self.name_shown(ref), self.pick_name(ref))
            for ref, how in matches.items()
        )
        if isinstance(result, Resolved):
            rule, resolved, refusal = result.rule, result.ref, None
        else:
            rule, resolved, refusal = result.kind, None, result
        return Explanation(
            name=name,
            server_id=server_id,
            rule=rule,
            rule_text=texts.rule_text(rule),
            resolved=resolved,
            refusal=refusal,
            candidates=candidates,
        )


def _row(entry: ChannelEntry, name: str | None, shown: str) -> ChannelRow:
    """A ``channel_list`` row for ``entry``, named as its caller worked out."""
    ref, descriptor = entry.ref, entry.descriptor
    return ChannelRow(
        server_id=ref.server_id,
        channel_id=ref.channel_id,
        label=descriptor.label,
        type=descriptor.type,
        direction=descriptor.direction,
        open=entry.open,
        lazy=entry.lazy,
        name=name,
        shown=shown,
    )
