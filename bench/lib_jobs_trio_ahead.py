# jobs_trio with claim_ahead on: `jobs-trio worker --claim-ahead 32`, otherwise lib_jobs_trio.py
# unchanged. Apart so that bench/run.py runs it as a column of its own beside the default.
from __future__ import annotations

import lib_jobs_trio

# One value for every concurrency (as a user would set it for a queue of short jobs), not tuned
# per cell: c=1 ran 1,126-1,195 jobs/s with 0, 3,701-4,227 with 16, 4,460 with 32, 5,144 with
# 64 (python bench/worker_cpu.py --ahead N, 2026-12-01 02:15).
lib_jobs_trio.CLAIM_AHEAD = 32

if __name__ == "__main__":
    lib_jobs_trio.main()
