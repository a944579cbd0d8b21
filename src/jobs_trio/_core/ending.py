# Ending this process at once, its log lines written first. Apart because a wedged worker, a
# forked child and a shutdown past its grace all end the process the same way, from any layer.
from __future__ import annotations

import logging
import os
import sys
from typing import NoReturn


def end_process(code: int) -> NoReturn:
    """End this process at once with ``code``, its log lines written first: a Trio nursery
    cannot be left while a task in it ignores cancellation, nor an interpreter while a thread
    that is not a daemon runs on; a process that must not go on (a forked child, a wedged
    worker) or was going away anyway is ended here rather than hang."""
    logging.shutdown()
    sys.stderr.flush()
    os._exit(code)
