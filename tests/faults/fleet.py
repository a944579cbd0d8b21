# A cell's worker processes: started, signalled (the chaos faults kill and replace them), and
# each one's end recorded: its exit code, when it ended, and the signals it was sent. Apart so
# the ledger can judge every run against what happened to the process that ran it.
from __future__ import annotations

import signal
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path

import attrs
import trio

from tests.helpers.process_helpers import WorkerProcess, worker_processes

APP = "tests.apps.edges_app"


@attrs.define
class Member:
    """One worker process of the fleet."""

    worker: WorkerProcess
    pid: int
    signals: list[tuple[float, int]] = attrs.Factory(list)  # (time.time(), signal number)
    ended_at: float | None = None
    hung: bool = False  # did not exit within its bound after SIGTERM: killed by the harness

    @property
    def code(self) -> int | None:
        return self.worker.process.returncode

    def killed_at(self) -> float | None:
        """When the harness SIGKILLed it (its runs then could not report anything)."""
        kills = [at for at, signum in self.signals if signum == signal.SIGKILL]
        return kills[0] if kills else None

    def log(self) -> str:
        return self.worker.output()


class Fleet:
    def __init__(
        self,
        stack: AsyncExitStack,
        nursery: trio.Nursery,
        folder: Path,
        url: str,
        options: Sequence[str],
        env: Mapping[str, str],
    ) -> None:
        self._stack = stack
        self._nursery = nursery
        self._folder = folder
        self._url = url
        self._options = options
        self._env = env
        self.members: list[Member] = []

    async def add(self, count: int = 1) -> list[Member]:
        workers = await self._stack.enter_async_context(
            worker_processes(APP, self._folder, self._url, count, *self._options, env=self._env)
        )
        added = [Member(worker, worker.process.pid) for worker in workers]
        for member in added:
            self._nursery.start_soon(self._watch, member)
        self.members.extend(added)
        return added

    async def _watch(self, member: Member) -> None:
        await member.worker.process.wait()
        member.ended_at = time.time()

    def live(self) -> list[Member]:
        return [m for m in self.members if m.code is None and not m.signals]

    def signal(self, member: Member, signum: int) -> None:
        member.signals.append((time.time(), signum))
        if member.code is None:
            member.worker.signal(signum)

    async def started(self, members: Sequence[Member], within: float = 60) -> None:
        with trio.fail_after(within):
            while not all("jobs.worker.started" in m.log() for m in members):
                if any(m.code is not None for m in members):
                    ended = next(m for m in members if m.code is not None)
                    raise RuntimeError(f"a worker exited at start: {ended.log()[-3000:]}")
                await trio.sleep(0.1)

    async def stop(self, within: float) -> None:
        """SIGTERM every process still running, and wait for each; one still running after
        ``within`` seconds is hung: killed, and marked so."""
        for member in self.members:
            if member.code is None:
                self.signal(member, signal.SIGTERM)
        with trio.move_on_after(within):
            for member in self.members:
                await member.worker.process.wait()
        for member in self.members:
            if member.code is None:
                member.hung = True
                member.worker.process.kill()
                await member.worker.process.wait()


@asynccontextmanager
async def open_fleet(
    folder: Path, url: str, options: Sequence[str], env: Mapping[str, str]
) -> AsyncIterator[Fleet]:
    # The nursery outlives the stack: the stack kills what is still running on the way out,
    # and only then can the watchers, which wait for each process to end, finish.
    async with trio.open_nursery() as nursery, AsyncExitStack() as stack:
        yield Fleet(stack, nursery, folder, url, options, env)
