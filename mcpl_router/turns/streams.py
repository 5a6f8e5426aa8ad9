"""Outgoing streams: a turn's decided words as chunks, to each destination's own server.

Only words whose delivery is known not to have failed are streamed, so a stream (and its
``complete``) carries only words that went out. A stream belongs to its ref and to the
transport epoch of its first chunk: a reconnected server, or another server with the same
channel id, never gets the rest of it. Every channel that got chunks gets one ``complete``,
whichever way the turn ends.
"""

from __future__ import annotations

from collections.abc import Mapping
from mcpl_router.logs import get_logger
from mcpl_router.mcpl.session import STREAMING, ChunkParams, CompleteParams, Queued, ServerSession
from mcpl_router.routing.refs import ChannelRef
from mcpl_router.turns.run import TurnRun

__all__ = ["OutgoingStreams"]


class OutgoingStreams:
    """Sends each turn's chunks and completes its streams, over the servers' sessions."""

    def __init__(self, servers: Mapping[str, ServerSession]) -> None:
        self._servers = servers
        self._log = get_logger()

    async def chunk(self, run: TurnRun, ref: ChannelRef, text: str) -> None:
        """Send decided words to ``ref``'s own server as a chunk, if it is granted streaming.

        ``index`` counts per inference across channels.
        """
        session = self._servers.get(ref.server_id)
        if session is None or session.unusable(STREAMING) is not None:
            return
        stream = run.streams.get(ref)
        if stream is not None and stream[0] != session.epoch:
            return
        turn = run.turn
        index = run.stream_index
        run.stream_index += 1
        # Each channel's deltas join into its complete text: later words start a new paragraph.
        delta = text if stream is None else "\n\n" + text
        params = ChunkParams(inference_id=turn.inference_id, conversation_id=turn.conversation_id, channel_id=ref.channel_id,
                             index=index, delta=delta)
        # Recorded before the send: whoever completes the streams meanwhile completes this one.
        if stream is None:
            run.streams[ref] = stream = (session.epoch, [])
        stream[1].append(delta)
        if not await session.stream_chunk(params):
            self._log.info("stream.chunk.failed", agent=turn.agent, turn=turn.turn_id, server=ref.server_id, channel=ref.channel_id)
            if delta in stream[1]:
                stream[1].remove(delta)
            if not stream[1] and run.streams.get(ref) is stream:
                del run.streams[ref]

    async def complete(self, run: TurnRun) -> None:
        """``complete`` once per channel that got chunks, with its full text (every exit path)."""
        streams, run.streams = run.streams, {}
        for ref, stream in streams.items():
            sendable = self._completion(run, ref, stream)
            if sendable is None:
                continue
            session, params = sendable
            if not await session.stream_complete(params):
                self._complete_failed(run, ref)

    def complete_nowait(self, run: TurnRun) -> bool:
        """:meth:`complete` without waiting: each stream's ``complete`` queued while its server's
        outbox has room, and the stream taken off the turn. False at the first with no room:
        it and the streams after it are left on the turn for :meth:`complete`."""
        for ref, stream in list(run.streams.items()):
            sendable = self._completion(run, ref, stream)
            if sendable is not None:
                session, params = sendable
                queued = session.stream_complete_nowait(params)
                if queued is Queued.FULL:
                    return False
                if queued is Queued.GONE:
                    self._complete_failed(run, ref)
            del run.streams[ref]
        return True

    def _completion(self, run: TurnRun, ref: ChannelRef, stream: tuple[int, list[str]]) -> tuple[ServerSession, CompleteParams] | None:
        """The session and params of ``ref``'s ``complete``; None when its server can't hear it (gone,
        not ready, or reconnected since the stream's first chunk)."""
        epoch, parts = stream
        session = self._servers.get(ref.server_id)
        if session is None or session.epoch != epoch or not session.ready:
            return None
        turn = run.turn
        return session, CompleteParams(inference_id=turn.inference_id, conversation_id=turn.conversation_id, channel_id=ref.channel_id,
                                    content="".join(parts))

    def _complete_failed(self, run: TurnRun, ref: ChannelRef) -> None:
        self._log.info("stream.complete.failed", agent=run.turn.agent, turn=run.turn.turn_id, server=ref.server_id)
