"""What a prose mode decides about a round beyond its segments: the invitation an agent reads
for a closed channel, and whether mid-turn arrivals hold an inferred route.

Pure, like :mod:`mcpl_router.routing.prose` (the grammar) and :mod:`mcpl_router.routing.modes`
(the modes that read it): this module sits above both, asking the agent's mode its questions
with the grammar's answers, so neither of them needs the other's faces.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from mcpl_router.routing import texts
from mcpl_router.routing.modes import ProseMode
from mcpl_router.routing.names import ChannelNames
from mcpl_router.routing.prose import ProseState, target_token
from mcpl_router.routing.refs import ChannelRef
from mcpl_router.routing.turns import TurnRouting

__all__ = ["Arrival", "hold_for_arrivals", "invitation_text"]


def invitation_text(
    mode: ProseMode,
    names: ChannelNames,
    ref: ChannelRef,
    author: str | None,
    *,
    may_publish: bool,
) -> str:
    """The closed-channel invitation for an agent in ``mode`` addressed in ``ref``.

    The first option reaches that channel alone in the agent's mode
    (:meth:`ProseMode.invitation_reply <mcpl_router.routing.modes.ProseMode.invitation_reply>`):
    a ``>>``/``>>>`` line with :func:`target_token`'s token, the turn's plain text, a
    ``channel_publish`` call with the name that picks it alone (a ``channelId`` is no target
    line, so ``skip_reply`` or a name with a space is fine there), or a note that no name does
    (then: a server's send tool).
    """
    reply = mode.invitation_reply(names.pick_name(ref), token=target_token(names, ref), may_publish=may_publish)
    return texts.invitation(author, names.name_shown(ref), reply, channel_id=ref.channel_id, server_id=ref.server_id)


@attrs.frozen
class Arrival:
    """A message that arrived for the agent while its turn was open."""

    ref: ChannelRef | None
    thread_id: str | None
    addressed: bool
    conversational: bool = True


def hold_for_arrivals(
    mode: ProseMode, routing: TurnRouting, state: ProseState, arrivals: Sequence[Arrival], *, deliberate: bool
) -> tuple[ChannelRef, ...]:
    """Whether mid-turn arrivals hold an inferred route (PROSE: mid-turn hold).

    A message from a *different* conversation that addresses the agent, or continues one the
    agent sent into this turn, holds an inferred locus for the rest of the turn. Deliberate
    routes (a ``channel_open``, a ``>>>`` pin) and same-conversation arrivals change nothing.

    Returns:
        The competing channels (the old locus first) when the route becomes held, else ``()``.
    """
    locus = routing.locus
    if not mode.infers_locus or locus is None or deliberate or state.pin is not None:
        return ()
    others = [
        arrival.ref
        for arrival in arrivals
        if arrival.ref is not None
        and arrival.conversational
        and arrival.ref != locus
        and (arrival.addressed or arrival.ref in routing.engaged)
    ]
    if not others:
        return ()
    return tuple(dict.fromkeys([locus, *others]))
