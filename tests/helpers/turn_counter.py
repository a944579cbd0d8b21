# A task that only counts its own turns: how many times the scheduler let another task run while
# a test's code looped. Apart because two suites (stepper and driver) prove a checkpoint with it.
from __future__ import annotations

import trio


class TurnCounter:
    """``nursery.start_soon(counter.run)``, then read ``turns`` before and after the loop."""

    def __init__(self) -> None:
        self.turns = 0

    async def run(self) -> None:
        while True:
            self.turns += 1
            await trio.lowlevel.checkpoint()
