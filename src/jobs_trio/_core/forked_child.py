# A process forked by a job body is ended before it can act as a worker: at its body's end, and
# at any database call. Apart because it is the one place a worker kills the process it runs in.
from __future__ import annotations

import logging
import os

from .ending import end_process
from .logs import log_event

# A forked child that returned from the body, or reached the database: a mistake in the body,
# and EX_SOFTWARE says so to whoever waits for the child.
FORKED_CHILD_EXIT_CODE = 70


def end_if_forked(owner: int, *, job_id: str | None = None, code: int | None = None) -> None:
    """End this process at once when it is not ``owner`` (the pid that opened the worker or the
    connection): a child forked by a job body carries a copy of the worker — its Trio loop, its
    database connections, the job's claim — and, left to go on, settled the job with its own
    result, renewed leases and outlived its parent (issue 32). Its copies of the connections are
    the parent's sockets: nothing is closed or flushed to them, and it never returns here.
    ``code`` is the exit status a child that raised SystemExit asked for."""
    if os.getpid() == owner:
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
