"""One open turn's shell state (:class:`TurnRun`) and the constants turns are kept by.

The routing decisions a turn holds are :class:`~mcpl_router.routing.turns.Turn`'s (pure);
``TurnRun`` adds what carrying them out needs: the host connection that owns it, its lease
and keeper, its inference lifecycle, its prose-routing state and its outgoing streams.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final, Generic, Protocol, TypeVar, overload

import attrs
import trio

from mcpl_router.mcpl.context import BEFORE_INFERENCE_TIMEOUT
from mcpl_router.routing import prose
from mcpl_router.routing.modes import ProseMode, SilentAction
from mcpl_router.routing.refs import ChannelRef
from mcpl_router.routing.turns import Turn

if TYPE_CHECKING:
    from mcpl_router.jsonrpc import Peer

#: Typing expires by itself on most platforms; refresh it this often while a turn runs.
TYPING_INTERVAL: Final = 7.0
#: A turn the host says nothing about for this long is aborted (a crashed host stops typing).
LEASE: Final = 60.0
#: How long a publish may take before its outcome is "unknown".
PUBLISH_TIMEOUT: Final = 10.0
#: How often a keeper checks that its host connection is still there.
CONNECTION_POLL: Final = 0.5
#: A host's own ``channels/typing start`` holds this long unless renewed by another start;
#: then the daemon sends the stop itself, so a crashed host can't leave a channel typing.
HOST_TYPING_LEASE: Final = 30.0
#: The most an ending turn waits on its stop and lifecycle sends (shielded from cancellation).
FINISH_GRACE: Final = 5.0

# Host API error codes owned by turns (documented in docs/host-api.md).
TURN_NOT_OPEN: Final = -32050
WAKE_UNKNOWN: Final = -32051
CHANNEL_REFUSED: Final = -32052
DAEMON_DRAINING: Final = -32053



class HostLink(Protocol):
    """A host's connection, as a turn holds it: the identity of its owner, and whether it is
    still there (its peer closed: the turn ends at its keeper's next look). Turns sit below the
    host API, so they know a connection by this much only."""

    @property
    def peer(self) -> Peer | None: ...


@attrs.define
class TurnTimings:
    """How turns are kept, in seconds. Constants by default; tests shorten them on
    ``TurnManager`` (whose attributes of the same names read and set these)."""

    typing_interval: float = TYPING_INTERVAL
    lease: float = LEASE
    context_timeout: float = BEFORE_INFERENCE_TIMEOUT
    #: None: each server's own ``requestTimeout``; a number overrides it for every server.
    publish_timeout: float | None = None
    connection_poll: float = CONNECTION_POLL
    host_typing_lease: float = HOST_TYPING_LEASE


#: A timing's value: seconds, or None where a timing may be unset.
_Value = TypeVar("_Value")


class _Timed(Protocol):
    @property
    def timings(self) -> TurnTimings: ...


class Timing(Generic[_Value]):
    """A ``TurnManager`` attribute that reads and sets one field of its :class:`TurnTimings`
    (the parts read the timings; tests shorten them on the manager)."""

    def __set_name__(self, owner: type, name: str) -> None:
        self._field = name

    @overload
    def __get__(self, manager: None, owner: type | None = None) -> Timing[_Value]: ...

    @overload
    def __get__(self, manager: _Timed, owner: type | None = None) -> _Value: ...

    def __get__(self, manager: _Timed | None, owner: type | None = None) -> Timing[_Value] | _Value:
        if manager is None:
            return self
        value: _Value = getattr(manager.timings, self._field)
        return value

    def __set__(self, manager: _Timed, value: _Value) -> None:
        # In place: the parts hold this one TurnTimings.
        setattr(manager.timings, self._field, value)


@attrs.define(eq=False)
class TurnRun:
    """The shell's state for one open turn: its connection, lease, keeper and lifecycle."""

    turn: Turn
    connection: HostLink | None
    mode: ProseMode
    lease_deadline: float
    #: The keeper's scope, and the scope of the typing start the turn opens with: each made
    #: by its task as it starts (most turns end before their keeper's first look, and their
    #: typing start needs no task), which returns at once if the turn has already ended.
    cancel: trio.CancelScope | None = None
    first_typing: trio.CancelScope | None = None
    lock: trio.Lock = attrs.field(factory=trio.Lock)
    # Where a typing "start" went (and in which transport epoch), so "stop" goes exactly there.
    typing_sent: tuple[ChannelRef, int] | None = None
    next_typing: float = 0.0
    # None until inference starts; then the servers told "started", with their epochs. On an
    # end that goes to one server, the server leaves once its terminal is queued
    # (InferenceLifecycle.end_nowait), so the waiting path that may follow can't end it twice.
    started: dict[str, int] | None = None
    started_done: trio.Event = attrs.field(factory=trio.Event)
    held: int = 0
    finished: bool = False
    # Rounds in which a send tool delivered (for send-silencing of that round's plain text).
    explicit_send_rounds: set[int] = attrs.field(factory=set)
    # Prose routing: the turn's pins and holds; each round's route when its first words came.
    prose: prose.ProseState = attrs.field(factory=prose.ProseState)
    #: Per round: the locus, the pin and ``TurnRouting.speech_targets_set`` when its first words came.
    round_routes: dict[int, tuple[ChannelRef | None, ChannelRef | None, int]] = attrs.field(factory=dict)
    notices: list[str] = attrs.field(factory=list)
    private: int = 0
    suppressed: int = 0
    kept: int = 0
    drafts: list[str] = attrs.field(factory=list)
    again: bool = False
    subagent: bool = False
    # Outgoing streams: per destination ref, the epoch its chunks went in and the words sent.
    streams: dict[ChannelRef, tuple[int, list[str]]] = attrs.field(factory=dict)
    stream_index: int = 0
    # The journal's last inbound seq this turn has looked at (mid-turn arrivals come after it).
    seen_seq: int = 0
    # Starts of the turn: 1 at turn/open, one more per turn/continue.
    starts: int = 1
    # ``TurnRouting.speech_targets_set`` as the last routed round saw it: more since means a
    # channel_open set the speech target (it supersedes a >>>skip_reply or a failed >>>).
    speech_targets_seen: int = 0

    @property
    def host_gone(self) -> bool:
        """The owning host's connection has closed (its turns end at the keeper's next look)."""
        peer = None if self.connection is None else self.connection.peer
        return peer is not None and peer.closed

    def ends_on_one_server(self) -> bool:
        """Whether the turn's end (typing stop, streams' completes, lifecycle terminal) goes to
        one server at most: known only once ``started`` has been sent wherever it went."""
        if self.started is not None and not self.started_done.is_set():
            return False
        servers = {ref.server_id for ref in self.streams}
        servers.update(self.started or ())
        if self.typing_sent is not None:
            servers.add(self.typing_sent[0].server_id)
        return len(servers) <= 1

    def count_silent(self, action: SilentAction) -> None:
        """Count words a mode never posts (``suppressed`` or ``kept``)."""
        if action == "kept":
            self.kept += 1
        else:
            self.suppressed += 1
