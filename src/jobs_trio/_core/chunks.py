# A batch of new jobs cut into the writes that carry it, each bounded in jobs and in characters.
# Apart because the Trio API, the producers' plans and the PostgreSQL relay all cut alike.
from __future__ import annotations

from collections.abc import Sequence

from .records import NewJob

# The most jobs one enqueue_many writes in one driver call (one statement on PostgreSQL): a
# statement of 20,000 rows takes about a second here, far inside any statement timeout.
ENQUEUE_CHUNK = 20_000
# And at most this many characters of payload and context (at most four bytes each): PostgreSQL
# refuses a message past 1 GB, and 20,000 payloads at the 1 MiB limit are 20 GB. A psycopg
# producer's enqueue_many of 1,100 payloads of 1 MiB had its connection closed by the server,
# with a fix that said to retry it.
ENQUEUE_CHUNK_CHARS = 64 * 1024 * 1024


def enqueue_chunks(jobs: Sequence[NewJob]) -> list[Sequence[NewJob]]:
    """``jobs`` cut into the driver calls (statements, on PostgreSQL) that write them: in order,
    each of at most ``ENQUEUE_CHUNK`` jobs and ``ENQUEUE_CHUNK_CHARS`` characters of payload and
    context (a job past that alone is a call of its own)."""
    chunks: list[Sequence[NewJob]] = []
    start = chars = 0
    for i, job in enumerate(jobs):
        size = len(job.payload) + (len(job.context) if job.context else 0)
        if i > start and (i - start == ENQUEUE_CHUNK or chars + size > ENQUEUE_CHUNK_CHARS):
            chunks.append(jobs[start:i])
            start, chars = i, 0
        chars += size
    chunks.append(jobs[start:])
    return chunks
