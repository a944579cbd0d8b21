# The memory driver's cron marks: each task's last tick, advanced once per fleet.
# Apart because a tick's firing is its own write (invariant 11), beside no job's.
from __future__ import annotations

from collections.abc import Sequence

import attrs
import trio

from ..._core.records import (
    TaskAdvance,
    TaskMark,
)
from .._rules import (
    FIRE_HISTORY,
)
from ._store import MemoryStore


class MemoryCron(MemoryStore):
    """Cron tasks' marks: each tick fired once, whoever advances it."""

    async def task_marks(self) -> Sequence[TaskMark]:
        await trio.lowlevel.checkpoint()
        self._check_open()
        return [self._task_marks[name] for name in sorted(self._task_marks)]

    async def advance_task(self, advance: TaskAdvance) -> bool:
        await trio.lowlevel.checkpoint()
        self._check_open()
        mark = self._task_marks.get(advance.task)
        if (None if mark is None else mark.handled_until) != advance.expected:
            return False
        fired = self._task_fires.setdefault(advance.task, {})
        if any(f.scheduled in fired for f in advance.fires):
            return False
        now = self.now()
        answers = self._insert([f.job for f in advance.fires], now)
        for fire, answer in zip(advance.fires, answers, strict=True):
            fired[fire.scheduled] = answer.job_id
        for old in sorted(fired)[:-FIRE_HISTORY]:
            del fired[old]
        moved = mark or TaskMark(advance.task, advance.advance_to)
        if answers:
            moved = attrs.evolve(
                moved,
                last_fired=advance.fires[-1].scheduled,
                last_fired_at=now,
                last_job_id=answers[-1].job_id,
            )
        self._task_marks[advance.task] = attrs.evolve(moved, handled_until=advance.advance_to)
        self._wake()
        return True
