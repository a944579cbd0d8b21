# A Playwright script run in a process of its own for the browser tests, talking with the test
# line by line on its stdin and stdout. Apart because Playwright needs a plain asyncio, which
# trio-asyncio (imported by the PostgreSQL driver) changes for the whole test process.
from __future__ import annotations

import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import trio

from tests.helpers.process_helpers import ROOT


class Browser:
    """The script's process: what it says (``said``), what it is told (``tell``)."""

    def __init__(self, process: trio.Process, log: Path) -> None:
        self.process = process
        self.log = log  # its stderr: a failed assertion's traceback
        self._heard = b""

    async def said(self, within: float = 60) -> str:
        """The script's next line, once it says it."""
        assert self.process.stdout is not None
        with trio.fail_after(within):
            while b"\n" not in self._heard:
                chunk = await self.process.stdout.receive_some()
                assert chunk, f"the browser ended early:\n{self.log.read_text()}"
                self._heard += chunk
        line, self._heard = self._heard.split(b"\n", 1)
        return line.decode()

    async def tell(self, line: str) -> None:
        assert self.process.stdin is not None
        await self.process.stdin.send_all(line.encode() + b"\n")

    async def ended(self, within: float = 60) -> None:
        """The script ended, and well."""
        with trio.fail_after(within):
            code = await self.process.wait()
        assert code == 0, self.log.read_text()


@asynccontextmanager
async def a_browser(module: str, *argv: str, log: Path) -> AsyncIterator[Browser]:
    """``python -m MODULE ARGV...``, killed on the way out if it still runs."""
    with log.open("wb") as stderr:
        process = await trio.lowlevel.open_process(
            [sys.executable, "-m", module, *argv],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=stderr,
        )
    try:
        yield Browser(process, log)
    finally:
        if process.returncode is None:
            process.kill()
            with trio.CancelScope(shield=True):
                await process.wait()
