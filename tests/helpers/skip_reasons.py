# The reason of a skip inside a Trio test, kept: pytest-trio (0.8) turns a `pytest.skip("why")`
# raised in an async test or fixture into a bare `pytest.skip()`, so the summary said
# "python.py:187: Skipped" for every one of them, never why. Apart from conftest.py because it
# is a plugin of its own (tests/conftest.py loads it; test_skip_reasons.py loads it alone).
from __future__ import annotations

from collections.abc import Generator, Iterator

import pytest
from _pytest.outcomes import Skipped


def _leaves(error: BaseException) -> Iterator[BaseException]:
    if isinstance(error, BaseExceptionGroup):
        for inner in error.exceptions:
            yield from _leaves(inner)
    else:
        yield error


def _original_skip(error: BaseException) -> Skipped | None:
    """The skip pytest-trio re-raised without its reason: the one leaf of the group it caught
    (the context of its own bare skip), else None."""
    context = error.__context__
    if not isinstance(context, BaseExceptionGroup):
        return None
    leaves = list(_leaves(context))
    if len(leaves) == 1 and isinstance(leaves[0], Skipped) and leaves[0].msg:
        return leaves[0]
    return None


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    excinfo = call.excinfo
    if not (report.skipped and excinfo is not None and isinstance(excinfo.value, Skipped)):
        return report
    original = _original_skip(excinfo.value)
    if original is not None:
        # Where the skip was called, and why, as pytest reports a skip raised in a plain test.
        crash = pytest.ExceptionInfo.from_exception(original)._getreprcrash()
        if crash is not None:
            report.longrepr = (str(crash.path), crash.lineno, f"Skipped: {original.msg}")
    return report
