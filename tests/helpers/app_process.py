# Running a test app as a real process: started from the repository root (so `tests.apps.*`
# imports), its stderr kept for failure messages, and killed if a test leaves it running.
from __future__ import annotations

import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import trio

ROOT = Path(__file__).resolve().parents[2]


@asynccontextmanager
async def app_process(log: Path, *argv: str) -> AsyncIterator[trio.Process]:
    """``python -m`` + ``argv``, with stderr into ``log``."""
    with log.open("wb") as stderr:
        process = await trio.lowlevel.open_process(
            [sys.executable, "-m", *argv], cwd=ROOT, stdin=subprocess.DEVNULL, stderr=stderr
        )
    try:
        yield process
    finally:
        if process.returncode is None:
            process.kill()
        with trio.CancelScope(shield=True):
            await process.wait()


async def wait_until(what: str, within: float, check: Callable[[], Awaitable[bool]]) -> None:
    """Poll ``check`` until True: the other side is another process, so there is no event to
    wait on, only its database rows or files, under a deadline."""
    with trio.move_on_after(within):
        while not await check():
            await trio.sleep(0.05)
        return
    raise AssertionError(f"timed out after {within}s waiting for {what}")
