# The package's public face: every name in jobs_trio.__all__ resolves (loaded on first use), and
# the console script holds SIGTERM before it imports anything heavy.
from __future__ import annotations

import subprocess
import sys

import jobs_trio


def test_every_public_name_resolves_and_each_is_said_once() -> None:
    assert sorted(jobs_trio._WHERE) == sorted(set(jobs_trio.__all__) - {"__version__"})
    for name in jobs_trio.__all__:
        assert getattr(jobs_trio, name) is not None
    assert set(jobs_trio.__all__) <= set(dir(jobs_trio))


def test_a_public_name_that_is_also_a_module_name_stays_the_function() -> None:
    import jobs_trio.current_transaction
    import jobs_trio.open_driver

    assert callable(jobs_trio.open_driver)
    assert callable(jobs_trio.current_transaction)


def test_the_console_script_loads_nothing_heavy_before_it_holds_the_signals() -> None:
    # `import jobs_trio` used to import trio and every module (~1 s on a loaded machine), and a
    # SIGTERM in that second killed a starting worker with nothing in its log (issue 32).
    probe = (
        "import sys, jobs_trio.console;"
        "heavy = sorted(m for m in ('trio', 'jobs_trio.worker', 'attrs') if m in sys.modules);"
        "print(heavy)"
    )
    shown = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    ).stdout
    assert shown.strip() == "[]"
