# Python's garbage collector as a `jobs-trio worker` process runs it: start-up's objects frozen
# out of its scans, a young generation sized for a worker's bursts. Apart because it is the one
# place the CLI changes its process's runtime, which the library, inside an application, never does.
from __future__ import annotations

import gc
import logging

from .._core.logs import log_event

# Python's own thresholds (3.8 to 3.13): a process that has other ones was tuned by its
# application's module, and is left as it is.
PYTHON_THRESHOLDS = (700, 10, 10)
# The young generation's size for a worker. Each claimed job brings ~20 objects the collector
# tracks (its claim, run scope, cancel scope, task, coroutine, payload, settlement...), alive
# until its batch settles, so at concurrency 50 one claim's answer crosses Python's 700 by itself:
# a young collection every ~160 jobs, traversing the jobs in flight and freeing nothing, 2.5-5 µs
# of a no-op job's CPU (issue 44, measured with gc.callbacks). At 10,000 a collection comes ~70
# times less often, and one takes a few ms at most (docs/cli.md).
WORKER_YOUNG = 10_000


def tune_for_worker(keep_python: bool) -> bool:
    """Freeze what start-up made (the modules, the application's registry: never garbage, and
    rescanned by every full collection) and size the young generation for a worker, unless
    ``keep_python`` (``--python-gc``) or the application's module tuned the collector itself
    (disabled it, or set other thresholds). Answers whether it did. Call it once the
    application's module is imported, before the worker opens."""
    if keep_python or not gc.isenabled() or gc.get_threshold() != PYTHON_THRESHOLDS:
        return False
    # Start-up's garbage collected first: frozen, it would never be.
    gc.collect()
    gc.freeze()
    gc.set_threshold(WORKER_YOUNG, *PYTHON_THRESHOLDS[1:])
    log_event(
        "jobs.worker.gc-tuned",
        logging.DEBUG,
        frozen=gc.get_freeze_count(),
        thresholds=gc.get_threshold(),
    )
    return True
