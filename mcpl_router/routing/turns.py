"""Turns: the routing state of one agent's turn, held as refs only, and the rules that read it.

Pure: no sockets, no trio. The shell (:mod:`mcpl_router.turns`) owns the turns and runs
their effects (typing, publishing, context fan-out); everything it decides about *where* goes
through here.

The rules (seed ``000_…``, DESIGN §2):

- A turn's channel comes from ONE request: the newest addressed wake's ref (else the newest
  wake's), or the channel the host named. Its server is never re-read from a bare id.
- A host naming a channel by a string that means none or several channels gives the turn no
  channel and no fallback (never "the latest inbound channel").
- ``wasIn`` is the trigger plus every channel a mid-turn message or ``channel_open`` moved the
  turn to: a move adds one and drops none.
- Within a turn, the id of a channel in ``wasIn`` means that channel on its server
  (:func:`own_channel_named`), and is refused once that server withdraws it.
- Only a call made inside the turn (:meth:`TurnTable.calling_turn_of`) may read the turn's own
  channels or move its routing.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Final, Literal

import attrs

from mcpl_router.routing import texts
from mcpl_router.routing.names import ChannelNames, Refusal, Resolved
from mcpl_router.routing.refs import ChannelRef
from mcpl_router.routing.registry import ChannelRegistry

__all__ = [
    "KIND_OWN_CHANNEL_WITHDRAWN",
    "OUTCOMES",
    "RULE_OWN_CHANNEL",
    "Delivery",
    "CallScope",
    "MalformedChannel",
    "Turn",
    "TurnRouting",
    "TurnTable",
    "WakeFact",
    "call_scope",
    "own_channel_named",
    "ref_from_wire",
    "requested_channel",
    "trigger_of",
]

#: How a turn may end (``turn/close``'s ``outcome``; the daemon adds none of its own).
OUTCOMES: Final = frozenset({"completed", "aborted", "failed", "refused"})

#: The resolver rule for a name that is the id of one of the turn's own channels.
RULE_OWN_CHANNEL: Final = "own-channel"
#: The refusal kind for a turn's own channel its server no longer registers.
KIND_OWN_CHANNEL_WITHDRAWN: Final = "own-channel-withdrawn"

DeliveryOutcome = Literal["delivered", "failed", "unknown"]


@attrs.frozen
class Delivery:
    """Where one round's words went, and what the server said (PROSE: publishing outcomes).

    ``outcome`` is ``delivered`` only on an explicit ``delivered: true``; ``failed`` when the
    request never left or the server said no; ``unknown`` otherwise (never retried).
    """

    ref: ChannelRef
    shown: str
    outcome: DeliveryOutcome
    round: int
    message_id: str | None = None
    reason: texts.Reason | None = None

    def to_wire(self) -> dict[str, object]:
        """The delivery as the host API writes it."""
        wire: dict[str, object] = {**self.ref.to_wire(), "shown": self.shown, "outcome": self.outcome, "round": self.round}
        if self.message_id is not None:
            wire["messageId"] = self.message_id
        if self.reason is not None:
            wire["reason"] = self.reason
        return wire


@attrs.define
class TurnRouting:
    """Where a turn is: every field a ref (or refs), never a bare id.

    ``trigger`` is the channel the turn's message came from; ``locus`` where its plain speech
    goes; ``sticky_target`` a pin (``>>>``) that wins over the locus; ``typing_channel`` where
    the daemon shows typing; ``was_in`` the trigger plus every channel the turn moved to (add
    only, in order); ``engaged`` the channels the turn sent into; ``speech_targets_set`` how
    many times a ``channel_open`` set the speech target (a deliberate move, told apart from a
    continuation's or an arrival's).
    """

    trigger: ChannelRef | None = None
    locus: ChannelRef | None = None
    sticky_target: ChannelRef | None = None
    typing_channel: ChannelRef | None = None
    was_in: tuple[ChannelRef, ...] = ()
    engaged: tuple[ChannelRef, ...] = ()
    deliveries: list[Delivery] = attrs.field(factory=list)
    speech_targets_set: int = 0

    @classmethod
    def starting_at(cls, trigger: ChannelRef | None) -> TurnRouting:
        """A new turn's routing: speech and typing at the trigger (locus mode), or nowhere."""
        return cls(
            trigger=trigger,
            locus=trigger,
            typing_channel=trigger,
            was_in=(trigger,) if trigger is not None else (),
        )

    def moved_to(self, ref: ChannelRef, *, set_locus: bool = False) -> None:
        """A mid-turn message or ``channel_open`` moved the turn to ``ref``: add it to ``was_in``.

        Drops nothing: the channels the turn was in stay its own. ``set_locus`` (an open with
        ``setSpeechTarget``, locus and hybrid modes only) also makes it where later plain speech
        goes, and typing follows the speech there (the shell stops it on the old channel).
        Explicit mode never sets the locus, so its typing stays on the trigger.
        """
        if ref not in self.was_in:
            self.was_in = (*self.was_in, ref)
        if set_locus:
            self.locus = ref
            self.sticky_target = None
            self.typing_channel = ref
            self.speech_targets_set += 1

    @property
    def deliberate_locus(self) -> bool:
        """Whether the locus is the agent's choice (a ``channel_open`` that set the speech
        target), not inferred from wakes: a later start or arrival moves or holds only an
        inferred one. Told by the open itself; a locus apart from the trigger is one too."""
        return self.locus is not None and (self.speech_targets_set > 0 or self.locus != self.trigger)

    def engage(self, ref: ChannelRef) -> None:
        """The turn sent into ``ref`` (each channel recorded once, in order)."""
        if ref not in self.engaged:
            self.engaged = (*self.engaged, ref)

    def record(self, delivery: Delivery) -> None:
        """Append a delivery; a delivered or unknown one engages its channel."""
        self.deliveries.append(delivery)
        if delivery.outcome != "failed":
            self.engage(delivery.ref)

    def withdrawn(self, refs: Iterable[ChannelRef]) -> ChannelRef | None:
        """Channels withdrawn: returns the typing channel if it was one of them (stop it).

        The locus and ``was_in`` keep the ref: a reply to a withdrawn channel is refused as
        such, never re-read as another server's channel with the id.
        """
        gone = set(refs)
        typing = self.typing_channel
        if typing is not None and typing in gone:
            self.typing_channel = None
            return typing
        return None


@attrs.define
class Turn:
    """One agent's turn: identity, progress and routing.

    ``turn_id`` is opaque; ``round`` the latest round the host reported; ``outcome`` is None
    while open. ``wakes`` are the seqs the turn answers. Text arrives per round and is routed
    as each round ends (:meth:`take_text`).
    """

    turn_id: str
    inference_id: str
    agent: str
    routing: TurnRouting
    wakes: tuple[int, ...] = ()
    conversation_id: str = ""
    turn_index: int = 0
    trigger_message_id: str | None = None
    trigger_thread_id: str | None = None
    round: int = 0
    outcome: str | None = None
    _text: dict[int, list[str]] = attrs.field(factory=dict, init=False)
    _routed: set[int] = attrs.field(factory=set, init=False)

    @property
    def is_open(self) -> bool:
        """Whether the turn has not ended."""
        return self.outcome is None

    def add_text(self, round_: int, delta: str) -> bool:
        """Buffer a text delta of ``round_``; False (ignored) for a round already routed."""
        if round_ in self._routed:
            return False
        self._text.setdefault(round_, []).append(delta)
        self.round = max(self.round, round_)
        return True

    def take_text(self, round_: int) -> str:
        """The whole text of ``round_``, once; the round counts as routed afterwards."""
        self._routed.add(round_)
        self.round = max(self.round, round_)
        return "".join(self._text.pop(round_, ()))

    def unrouted_rounds(self) -> list[int]:
        """Rounds with buffered text not yet routed, in order (routed at close)."""
        return sorted(self._text)


@attrs.frozen
class WakeFact:
    """What routing needs of one wake: its seq, its channel (a ref), whether it addressed the
    agent, and the message it carries (for ``incoming``)."""

    seq: int
    channel: ChannelRef | None
    addressed: bool = False
    message_id: str | None = None
    thread_id: str | None = None


def trigger_of(wakes: Sequence[WakeFact]) -> WakeFact | None:
    """The one wake a (batched) turn takes its channel, server and message from.

    The newest addressed wake; where none is addressed, the newest. Channel and server come
    from that wake's ref together, never from two wakes and never from a bare id.
    """
    if not wakes:
        return None
    addressed = [wake for wake in wakes if wake.addressed]
    return max(addressed or wakes, key=lambda wake: wake.seq)


class MalformedChannel(ValueError):
    """A channel given to the host API that is neither a name nor a whole ref."""


def requested_channel(names: ChannelNames, channel: str | Mapping[str, object]) -> ChannelRef | None:
    """The channel a host named for a turn, or None: no fallback is ever taken.

    A string goes through the one resolver: exactly one channel → it; none or several → None
    (the turn has no channel, rather than a guess). A ref ``{serverId, channelId}`` is that
    exact pair.

    Raises:
        MalformedChannel: a ref with an empty or missing ``serverId``/``channelId``. An empty
            ``serverId`` is not read as "a bare id": the host meant a pair and didn't give one.
    """
    if isinstance(channel, str):
        resolved = names.channel_named(channel)
        return resolved.ref if isinstance(resolved, Resolved) else None
    return ref_from_wire(channel)


def ref_from_wire(channel: Mapping[str, object]) -> ChannelRef:
    """A ``{serverId, channelId}`` object as a ref.

    Raises:
        MalformedChannel: either member missing, empty or not a string.
    """
    server_id = channel.get("serverId")
    channel_id = channel.get("channelId")
    if not isinstance(server_id, str) or not server_id:
        raise MalformedChannel(texts.MALFORMED_REF_SERVER)
    if not isinstance(channel_id, str) or not channel_id:
        raise MalformedChannel(texts.MALFORMED_REF_CHANNEL)
    return ChannelRef(server_id, channel_id)


def own_channel_named(
    routing: TurnRouting, name: str, registry: ChannelRegistry, *, not_done: str = texts.NOTHING_DONE
) -> Resolved | Refusal | None:
    """Within a turn: the channel in ``was_in`` whose id is ``name``, before any other reading.

    Returns:
        ``Resolved`` (rule ``own-channel``) for the one such channel its server registers now;
        a ``Refusal`` (kind ``own-channel-withdrawn``) where its server no longer registers it,
        never another server's channel with that id; None where the name is not the id of
        exactly one channel the turn was in (none, or two on different servers: neither), so
        the caller resolves it as any name.
    """
    if not name:
        return None
    mine = [ref for ref in routing.was_in if ref.channel_id == name]
    if len(mine) != 1:
        return None
    ref = mine[0]
    if registry.is_registered(ref):
        return Resolved(ref, RULE_OWN_CHANNEL)
    text = texts.own_channel_withdrawn(ref.channel_id, ref.server_id, not_done)
    return Refusal(KIND_OWN_CHANNEL_WITHDRAWN, text, (ref,), name, ref.server_id)


@attrs.define
class TurnTable:
    """Every open turn, by id, and each agent's open turn (at most one)."""

    _turns: dict[str, Turn] = attrs.field(factory=dict, init=False)
    _open_by_agent: dict[str, str] = attrs.field(factory=dict, init=False)
    _indexes: dict[str, int] = attrs.field(factory=dict, init=False)

    def next_index(self, agent: str) -> int:
        """The agent's next turn index (``turnIndex`` in hooks and lifecycle), from 0."""
        index = self._indexes.get(agent, 0)
        self._indexes[agent] = index + 1
        return index

    def add(self, turn: Turn) -> Turn | None:
        """Make ``turn`` its agent's open turn; returns the turn it supersedes, if any."""
        previous_id = self._open_by_agent.get(turn.agent)
        self._turns[turn.turn_id] = turn
        self._open_by_agent[turn.agent] = turn.turn_id
        return self._turns.get(previous_id) if previous_id is not None else None

    def get(self, turn_id: str) -> Turn | None:
        """An open turn by id."""
        return self._turns.get(turn_id)

    def open_turn_of(self, agent: str) -> Turn | None:
        """The agent's open turn, if any."""
        turn_id = self._open_by_agent.get(agent)
        return self._turns.get(turn_id) if turn_id is not None else None

    def remove(self, turn: Turn) -> None:
        """Forget an ended turn."""
        self._turns.pop(turn.turn_id, None)
        if self._open_by_agent.get(turn.agent) == turn.turn_id:
            del self._open_by_agent[turn.agent]

    def all(self) -> list[Turn]:
        """Every open turn."""
        return list(self._turns.values())

    def calling_turn_of(self, caller_turn_id: str | None, agent: str) -> Turn | None:
        """The turn a call was made in, when that turn is the agent's open turn; else None.

        ``caller_turn_id`` is the turn the call carries (a script's calls carry the turn that
        started the script). Only a call whose caller turn is the one open now may read the
        turn's own channels or move its routing: a script left running after its turn, or a
        call carrying no turn, gets None.
        """
        if not caller_turn_id:
            return None
        turn = self.open_turn_of(agent)
        if turn is None or turn.turn_id != caller_turn_id or not turn.is_open:
            return None
        return turn


@attrs.frozen
class CallScope:
    """What a tool call may touch of a turn: decided by :meth:`TurnTable.calling_turn_of`.

    ``turn`` is the turn the call was made in when that turn is open now, else None; then the
    call reads no turn's own channels (``own_channels`` is empty) and moves no routing.
    """

    turn: Turn | None
    own_channels: tuple[ChannelRef, ...] = ()

    @property
    def may_move_routing(self) -> bool:
        """Whether the call may change the turn's locus, ``was_in`` or engaged channels."""
        return self.turn is not None


def call_scope(table: TurnTable, agent: str, caller_turn_id: str | None) -> CallScope:
    """The scope of a call by ``agent`` carrying ``caller_turn_id`` (see ``calling_turn_of``)."""
    turn = table.calling_turn_of(caller_turn_id, agent)
    if turn is None:
        return CallScope(None)
    return CallScope(turn, turn.routing.was_in)
