"""What a turn speaks and types with, built before the turns themselves.

The tools that reach into a turn's words (speak, draft, stop typing in a closed channel) are
built before the name table, and the table before the turn manager that lists it; so these
parts come first, and the manager is given them (docs/architecture.md, "Building the parts").
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection, Mapping
from typing import TYPE_CHECKING

import attrs

from mcpl_router.host_notices import HostNotice
from mcpl_router.routing.refs import ChannelRef
from mcpl_router.turns.drafts import DraftBook
from mcpl_router.turns.lifecycle import InferenceLifecycle
from mcpl_router.turns.run import TurnRun, TurnTimings
from mcpl_router.turns.speech import Speech
from mcpl_router.turns.streams import OutgoingStreams
from mcpl_router.turns.typing import TypingIndicators

if TYPE_CHECKING:
    from mcpl_router.mcpl.session import ServerSession
    from mcpl_router.routing.router import Router
    from mcpl_router.store.journal import Journal

__all__ = ["TurnParts"]

NotifyAgent = Callable[[str, HostNotice], Awaitable[bool]]


@attrs.frozen(eq=False)
class TurnParts:
    """The open turns by id, and the parts that carry out their words and typing."""

    timings: TurnTimings
    typing: TypingIndicators
    drafts: DraftBook
    speech: Speech
    lifecycle: InferenceLifecycle
    #: Every open turn by id (the manager opens and ends them; typing reads them).
    runs: dict[str, TurnRun] = attrs.field(factory=dict)

    @classmethod
    def build(
        cls,
        *,
        router: Router,
        servers: Mapping[str, ServerSession],
        journal: Journal,
        notify_agent: NotifyAgent,
        timings: TurnTimings | None = None,
        tuned_out: Callable[[str], Collection[ChannelRef]] = lambda _agent: (),
    ) -> TurnParts:
        timings = timings if timings is not None else TurnTimings()
        typing = TypingIndicators(servers=servers, router=router, timings=timings)
        drafts = DraftBook(journal=journal, names=router.names)
        streams = OutgoingStreams(servers)
        speech = Speech(router=router, servers=servers, journal=journal, drafts=drafts, typing=typing, streams=streams, timings=timings,
                        tuned_out=tuned_out)
        lifecycle = InferenceLifecycle(servers=servers, streams=streams, notify_agent=notify_agent)
        return cls(timings=timings, typing=typing, drafts=drafts, speech=speech, lifecycle=lifecycle)

    async def stop_typing_in(self, ref: ChannelRef) -> None:
        """``channel_close`` of ``ref``: stop the typing of the turns typing in exactly that channel."""
        await self.typing.stop_in(ref, self.runs.values())
