# Python's garbage collector as a `jobs-trio worker` process runs it: a young generation sized for
# a worker's bursts. Apart because it is the one place the CLI changes its process's runtime,
# which the library, inside an application, never does.
from __future__ import annotations

import gc
import logging

from .._core.logs import log_event

# The collector as this Python set it, read when the CLI loads, before the application's module
# is imported: a process whose collector differs by the time the worker opens was tuned by that
# module, and is left as it is. (Python's own thresholds vary: 700 to 3.12, 2,000 in 3.13.)
PYTHON_COLLECTOR = (gc.isenabled(), gc.get_threshold())
# The young generation's size for a worker. Each claimed job brings ~20 objects the collector
# tracks (its claim, run scope, cancel scope, task, coroutine, payload, settlement...), alive
# until its batch settles, so at concurrency 50 one claim's answer crosses Python's 700 by itself:
# a young collection every ~160 jobs, traversing the jobs in flight and freeing nothing, 2.5-7 µs
# of a no-op job's CPU (issue 44, measured with gc.callbacks). At 10,000 a collection comes ~70
# times less often, and one takes a few ms at most (docs/cli.md).
WORKER_YOUNG = 10_000


def tune_for_worker(keep_python: bool) -> bool:
    """Size the young generation for a worker, unless ``keep_python`` (``--python-gc``) or the
    application's module set the collector itself (disabled it, or set its thresholds). Answers
    whether it did. Call it once the application's module is imported, before the worker
    opens. Nothing is frozen (``gc.freeze``): what the module made at import and dropped later
    would never be collected."""
    young, *older = PYTHON_COLLECTOR[1]
    if keep_python or (gc.isenabled(), gc.get_threshold()) != PYTHON_COLLECTOR:
        return False
    if young >= WORKER_YOUNG:
        return False
    gc.set_threshold(WORKER_YOUNG, *older)
    log_event("jobs.worker.gc-tuned", logging.DEBUG, thresholds=gc.get_threshold())
    return True
