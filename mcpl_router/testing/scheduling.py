"""Telling, in a test, whether a call is a scheduling point (lets other tasks run)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import attrs
import trio


@attrs.define
class SchedulerPasses:
    """How many times a spinning task has run: unchanged across a call, the call let no task run."""

    count: int = 0


@asynccontextmanager
async def scheduler_passes() -> AsyncIterator[SchedulerPasses]:
    """A task that counts each turn it gets to run, for as long as the block lasts.

    Trio may run a batch's tasks in either order, so one yield can go unseen: make the call
    under test several times in a row and compare the count before and after.
    """
    passes = SchedulerPasses()

    async def spin() -> None:
        while True:
            passes.count += 1
            await trio.lowlevel.checkpoint()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(spin)
        await trio.lowlevel.checkpoint()  # the spinner is running before the block starts
        yield passes
        nursery.cancel_scope.cancel()
