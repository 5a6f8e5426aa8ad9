"""The tune-out table (pure): holding, the cap, cadence, max wakes and duration; and which saved
tune-outs the daemon resumes at start-up (over a real journal)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import trio
from structlog.testing import capture_logs

from mcpl_router.routing.refs import ChannelRef
from mcpl_router.routing.router import Router
from mcpl_router.routing.tuneout import TuneOutSettings, TuneOutTable
from mcpl_router.store.journal import SavedTuneOut
from mcpl_router.testing.journal import open_journal
from mcpl_router.tools.tune_out import TuneOuts
from mcpl_router.turns import TurnTimings

A, B = ChannelRef("a", "general"), ChannelRef("b", "general")


def test_only_the_tuned_out_ref_is_held_and_the_cap_drops_the_oldest() -> None:
    table = TuneOutTable()
    table.enter("ann", B, TuneOutSettings(cadence=10, backlog_cap=2), now=0)
    assert not table.divert("ann", A, 1)  # a's general: same id, other channel
    assert not table.divert("bob", B, 2)  # another agent
    assert all(table.divert("ann", B, seq) for seq in (3, 4, 5))
    assert table.due(5) == []
    [summary] = table.due(10)
    assert (summary.held, summary.dropped, summary.final) == ((4, 5), 1, False)
    assert table.due(20) == []  # nothing held: no wake
    assert table.tuned_out("ann") == {B}


def test_max_wakes_and_duration_end_a_tune_out_with_a_final_summary() -> None:
    table = TuneOutTable()
    table.enter("ann", A, TuneOutSettings(cadence=1, max_wakes=1), now=0)
    table.enter("ann", B, TuneOutSettings(cadence=100, duration=5), now=0)
    table.divert("ann", A, 1)
    table.divert("ann", B, 2)
    [first] = table.due(1)
    assert first.ref == A and first.final and table.tuned_out("ann") == {B}
    [last] = table.due(5)
    assert last.ref == B and last.final and last.held == (2,)
    assert table.next_deadline() is None


def test_settings_refuse_what_cant_be_used() -> None:
    assert TuneOutSettings.from_arguments({"cadence": -1}) == ("cadence", "must be at least 0.05")
    assert TuneOutSettings.from_arguments({"backlogCap": 1.5})[0] == "backlogCap"  # type: ignore[index]
    assert TuneOutSettings.from_arguments({"maxWakes": True})[0] == "maxWakes"  # type: ignore[index]
    assert TuneOutSettings.from_arguments({"duration": 30, "cadence": 5}) == TuneOutSettings(cadence=5.0, duration=30.0)


def test_entering_again_keeps_what_is_held() -> None:
    table = TuneOutTable()
    table.enter("ann", B, TuneOutSettings(cadence=10), now=0)
    table.divert("ann", B, 7)
    table.enter("ann", B, TuneOutSettings(cadence=1), now=3)
    [summary] = table.due(4)
    assert summary.held == (7,)
    assert table.end("ann", A) is None


def test_a_summary_hands_over_through_its_newest_seq_and_entering_again_keeps_that() -> None:
    table = TuneOutTable()
    table.enter("ann", B, TuneOutSettings(cadence=10), now=0, handed_through=7)
    table.divert("ann", B, 8)
    table.divert("ann", B, 9)
    table.due(10)
    assert table.get("ann", B).handed_through == 9
    table.enter("ann", B, TuneOutSettings(cadence=5), now=11, handed_through=20)
    assert table.get("ann", B).handed_through == 9  # what it still holds after 9 is still its own


def test_a_resumed_tune_out_keeps_its_rhythm_its_count_and_its_cap() -> None:
    table = TuneOutTable()
    settings = TuneOutSettings(cadence=10, backlog_cap=2, max_wakes=3, duration=100)
    # Started 25 s ago on this clock, 2 summaries sent; 3 wakes held at the restart, the cap is 2.
    table.resume("ann", B, settings, started=75, now=100, wakes=2, handed_through=4, summary="calm", held=[5, 6, 7])
    assert not table.holds("ann", A, 6) and table.holds("ann", B, 6) and not table.holds("ann", B, 5)
    assert table.next_deadline() == 105  # the next step of its cadence, not now + cadence
    assert table.due(104) == []
    [last] = table.due(105)
    assert (last.held, last.dropped, last.summary, last.final) == ((6, 7), 1, "calm", True)  # its 3rd: maxWakes
    assert table.tuned_out("ann") == frozenset()
    # One resumed after a long stop still ends at its start + duration.
    table.resume("ann", A, settings, started=0, now=95, wakes=0, handed_through=0, summary=None, held=[])
    assert table.get("ann", A).ends_at == 100 and table.next_deadline() == 100


async def test_at_start_up_a_live_tune_out_is_resumed_and_a_gone_or_ended_one_deleted(tmp_path: Path) -> None:
    path = tmp_path / "journal.sqlite3"
    now = time.time()

    def saved(server: str, channel: str, **fields: Any) -> SavedTuneOut:
        return SavedTuneOut(**{"agent": "ann", "server_id": server, "channel_id": channel, "cadence": 30.0, "backlog_cap": 5,
                               "max_wakes": None, "duration": None, "started_at": now - 45, "ends_at": None, **fields})

    async with open_journal(path) as journal:
        journal.save_tune_out(saved("b", "general", wakes=1, summary="calm"))
        journal.save_tune_out(saved("a", "general", duration=40.0, ends_at=now - 5))  # ended while stopped
        journal.save_tune_out(saved("gone", "general"))  # its server is no longer configured
        await journal.flush()

    async def notify(agent: str, method: str, params: Any) -> bool:
        return False

    async with open_journal(path) as journal:
        # Only the configured servers' ids matter at start-up; no link is used.
        links: dict[str, Any] = {"a": None, "b": None}
        tune_outs = TuneOuts(Router(), links, TurnTimings(), notify, journal=journal)
        with capture_logs() as logs:
            async with trio.open_nursery() as nursery:
                await nursery.start(tune_outs.run)
                nursery.cancel_scope.cancel()
        assert tune_outs.tuned_out("ann") == {B}
        resumed = tune_outs.table.get("ann", B)
        assert resumed is not None and (resumed.wakes, resumed.summary, resumed.settings.cadence) == (1, "calm", 30.0)
        # 45 s into a 30 s cadence: the next summary is 15 s away, not a whole cadence.
        assert 14 < resumed.next_summary - trio.current_time() <= 15.5
        await journal.flush()
        assert [(row.server_id, row.channel_id) for row in await journal.saved_tune_outs()] == [("b", "general")]
    events = {entry["event"]: entry for entry in logs if entry["event"].startswith("tuneout.")}
    assert events["tuneout.dropped"]["server"] == "gone" and events["tuneout.dropped"]["reason"] == "server-not-configured"
    assert events["tuneout.ended"]["server"] == "a" and events["tuneout.ended"]["why"] == "ended-while-stopped"
    assert events["tuneout.resumed"]["server"] == "b"
