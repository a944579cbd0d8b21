# A process forked by a job body is ended before it can act as a worker: at its body's end, and
# at any database call. Apart because it is the one place a worker kills the process it runs in.
from __future__ import annotations

import logging
import os

import trio

from .ending import end_process
from .logs import log_event

# A forked child that returned from the body, or reached the database: a mistake in the body,
# and EX_SOFTWARE says so to whoever waits for the child.
FORKED_CHILD_EXIT_CODE = 70


class _ThisProcess:
    """This process's pid, read once and kept current by an at-fork hook in the child (below):
    the fork check runs at every attempt and database call, and a getpid() system call for each
    was the price (issue 44). A child forked by os.fork runs the hook before any Python code of
    its own; a C library that forks and then runs Python in its child without it is not a case
    a worker can tell."""

    pid = os.getpid()


def own_pid() -> int:
    """``os.getpid()``, without its system call."""
    return _ThisProcess.pid


def end_if_forked(owner: int, *, job_id: str | None = None, code: int | None = None) -> None:
    """End this process at once when it is not ``owner`` (the pid that opened the worker or the
    connection): a child forked by a job body carries a copy of the worker — its Trio loop, its
    database connections, the job's claim — and, left to go on, settled the job with its own
    result, renewed leases and outlived its parent (issue 32). Its copies of the connections are
    the parent's sockets: nothing is closed or flushed to them, and it never returns here.
    ``code`` is the exit status a child that raised SystemExit asked for."""
    if _ThisProcess.pid == owner:
        return
    log_event(
        "jobs.worker.forked-child",
        logging.ERROR,
        job_id=job_id,
        parent=owner,
        child=os.getpid(),
        why="a job body forked its worker's process and the child went on in worker code",
        fix="end the child yourself (os._exit) once its work is done, or start it with"
        " subprocess / multiprocessing's spawn context; the parent's attempt is unaffected",
    )
    end_process(FORKED_CHILD_EXIT_CODE if code is None else code)


# Whether this Trio run holds a worker: a run-scoped value (one per trio.run), not module state.
_WORKER_RUN = trio.lowlevel.RunVar[bool]("jobs_trio_worker_run", default=False)


def guard_forks() -> None:
    """Called by a worker as it starts, in its Trio run: a child a body forks from this run is
    ended before Trio runs anything more in it (``_EndAtFirstStep``). The pid checks above
    catch a child that returns from its body; a child that AWAITS first would have resumed
    the parent's other jobs on its copy of the loop (their side effects done twice: issue 32,
    found by review)."""
    _WORKER_RUN.set(True)


class _EndAtFirstStep(trio.abc.Instrument):
    """In a forked child only: the first scheduling pass ends the process."""

    def _end(self) -> None:
        log_event(
            "jobs.worker.forked-child",
            logging.ERROR,
            parent=os.getppid(),
            child=os.getpid(),
            why="a job body forked its worker's process and the child went back to the"
            " worker's event loop",
            fix="end the child yourself (os._exit) once its work is done, without awaiting,"
            " or start it with subprocess / multiprocessing's spawn context; the parent's"
            " attempt is unaffected",
        )
        end_process(FORKED_CHILD_EXIT_CODE)

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        self._end()

    def before_io_wait(self, timeout: float) -> None:
        self._end()


def _after_fork_in_child() -> None:
    _ThisProcess.pid = os.getpid()
    # In the child, on the thread that forked. The Trio thread of a worker's run: the run's
    # copy gets an instrument (nothing in the parent changes or pays for it). Any other thread
    # (a sync body's): no Trio loop runs in the child at all, and the pid checks end it.
    try:
        if _WORKER_RUN.get():
            trio.lowlevel.add_instrument(_EndAtFirstStep())
    except RuntimeError:
        return


# Registered once, at import: os.register_at_fork has no way to unregister, and the hook does
# nothing outside a worker's Trio run.
os.register_at_fork(after_in_child=_after_fork_in_child)
