# The name a process gives itself in shared records (a worker's claims, a relay's leases, a
# prune turn): host, pid and a few random bits. Apart because three writers share one format.
from __future__ import annotations

import os
import socket


def instance_id() -> str:
    """``host:pid:rand``: the random bits keep two instances of one process apart."""
    return f"{socket.gethostname()}:{os.getpid()}:{os.urandom(2).hex()}"
