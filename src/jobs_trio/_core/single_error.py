# A block's single exception raised as itself, not inside the ExceptionGroup a nursery wrapped it
# in. Apart because every open_* block of the public surface does the same for its callers.
from __future__ import annotations

import contextlib
from collections.abc import Iterator


@contextlib.contextmanager
def unwrap_single_error() -> Iterator[None]:
    """Raise a group holding exactly one exception (at any depth) as that exception, so a
    caller's ``except ValueError`` around an ``async with open_...`` block works; a group of
    two or more is raised as it is (both happened, and neither may be dropped)."""
    try:
        yield
    except BaseExceptionGroup as group:
        only: BaseException = group
        while isinstance(only, BaseExceptionGroup) and len(only.exceptions) == 1:
            only = only.exceptions[0]
        if isinstance(only, BaseExceptionGroup):
            raise
        # Raising it here would chain the group as its __context__ and overwrite what it had:
        # put back the error's own cause and context, so it reads as the body raised it.
        cause, context, suppress = only.__cause__, only.__context__, only.__suppress_context__
        try:
            raise only
        finally:
            only.__cause__, only.__context__ = cause, context
            only.__suppress_context__ = suppress
