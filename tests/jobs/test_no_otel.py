# Without OpenTelemetry installed, jobs_trio imports, enqueues with a context and runs a job as
# before, and never imports opentelemetry: a fresh interpreter in which importing it fails.
from __future__ import annotations

import subprocess
import sys
import textwrap

from tests.helpers.process_helpers import ROOT

SCRIPT = textwrap.dedent(
    """
    import importlib.abc
    import sys

    class NotInstalled(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name == "opentelemetry" or name.startswith("opentelemetry."):
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None

    sys.meta_path.insert(0, NotInstalled())

    import trio
    import jobs_trio
    from jobs_trio.testing import memory_driver, new_worker, run_until_idle

    registry = jobs_trio.Registry()
    seen = []

    @registry.job("t.ok")
    async def ok(ctx, payload):
        seen.append(dict(ctx.context))
        return payload

    async def main():
        driver = memory_driver()
        job_id = await ok.enqueue(driver, 7, context={"tenant": "t1"})
        [outcome] = await run_until_idle(new_worker(driver, registry))
        stored = (await driver.get(job_id)).context
        return outcome.kind, stored

    kind, stored = trio.run(main)
    assert (kind, seen, stored) == ("completed", [{"tenant": "t1"}], '{"tenant":"t1"}'), (
        kind, seen, stored
    )
    loaded = sorted(m for m in sys.modules if m.split(".")[0] == "opentelemetry")
    assert not loaded, loaded
    print("ran without opentelemetry")
    """
)


def test_the_package_runs_a_job_without_opentelemetry_and_never_imports_it() -> None:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ran without opentelemetry"
