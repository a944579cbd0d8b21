# Makes every attribute a class's instances may set part of the keys CPython shares between
# them. Apart because it works around an interpreter's layout, not anything a job queue decides.
from __future__ import annotations

import types
from typing import TypeVar

T = TypeVar("T", bound=type)


def share_keys(cls: T, *set_in_init: str) -> T:
    """Set, on one instance made and dropped here, each name ``set_in_init`` (in the order
    ``__init__`` sets them) and then each plain value on the class (an attribute an instance
    sets only when it changes from the class's default).

    Why: CPython keeps an instance's attributes beside it, without a dict of its own, while
    their names are in the keys its class shares; those keys stop taking new names after a
    few dozen instances. A name an instance first sets later (a held claim's ``_on_cancel``,
    a settled run's ``settling``) gave it a dict of its own: an object more per job for the
    garbage collector to count, and a claim's answer at concurrency 50 crossed its threshold
    more often (issue 44). Harmless where the interpreter lays instances out otherwise."""
    # A probe must be inert: no finalizer to run on it half-made, no slots (an instance of a
    # slotted class keeps no shared keys), and only plain attributes set on it.
    if "__slots__" in vars(cls) or hasattr(cls, "__del__"):
        raise TypeError(f"share_keys: {cls.__name__} has __slots__ or __del__")
    for name in set_in_init:
        if hasattr(getattr(cls, name, None), "__get__"):
            raise TypeError(f"share_keys: {cls.__name__}.{name} is a descriptor on the class")
    names = list(set_in_init)
    for name, value in vars(cls).items():
        if name.startswith("__") or name in names:
            continue
        if isinstance(value, types.FunctionType | property | classmethod | staticmethod):
            continue
        if hasattr(value, "__get__"):  # any other descriptor (cached_property...)
            continue
        names.append(name)
    probe: object = object.__new__(cls)
    for name in names:
        object.__setattr__(probe, name, None)
    return cls
