# jobs_trio with claim_ahead on: `jobs-trio worker --claim-ahead 128`, otherwise lib_jobs_trio.py
# unchanged. Apart so that bench/run.py runs it as a column of its own beside the default.
from __future__ import annotations

import lib_jobs_trio

# One value for every concurrency (as a user would set it for a queue of short jobs, sized as
# docs/model.md says: half of it covers the jobs run during one claim's round trip), not tuned
# per cell. python bench/worker_cpu.py --jobs 20000 --ahead N, alternating, 2026-12-01 13:05
# (a slow day): c=10 32 -> 4,155/4,677/3,965 jobs/s, 64 -> 4,953/4,899/4,000, 128 ->
# 5,703/6,445/5,829; c=1 32 -> 4,425/3,525, 128 -> 5,175/4,050; c=50 32 -> 4,525/4,445, 128 ->
# 4,990/4,872. 32 until then: larger values gained little while the settler's bound (2 per
# slot, fixed in bab416c) stalled every claim.
lib_jobs_trio.CLAIM_AHEAD = 128

if __name__ == "__main__":
    lib_jobs_trio.main()
