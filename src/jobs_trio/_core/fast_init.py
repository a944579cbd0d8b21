# A faster __init__ for the frozen values a worker makes for every job (a claim, its lease, its
# settlement and note, its outcome). Apart because it stands in for what attrs generates, for
# speed alone, and must stay equal to it (tests/jobs/test_fast_init.py holds it to that).
from __future__ import annotations

from typing import TypeVar

import attrs

T = TypeVar("T", bound=type)


def fast_init(cls: T) -> T:
    """Give the frozen slotted attrs class ``cls`` an ``__init__`` that sets each field through
    its slot's own setter, bound once here. attrs' sets each through ``object.__setattr__``
    (a frozen class's own refuses): a method bound per instance and the field's name looked up
    on the class for every field, ~0.2 µs of a claim's 0.9 and ~0.6 µs of a no-op job across
    the five values it makes (issue 44). The same parameters and defaults; still frozen after.
    Only for fields without a converter, validator, factory, alias or keyword-only mark: a
    class with one is refused here rather than given an __init__ that skips it."""
    namespace: dict[str, object] = {}
    parameters, body = [], []
    for i, field in enumerate(attrs.fields(cls)):
        if (
            field.converter is not None
            or field.validator is not None
            or isinstance(field.default, attrs.Factory)  # type: ignore[arg-type]
            or field.kw_only
            or not field.init
            or field.alias != field.name
        ):
            raise TypeError(f"fast_init: {cls.__name__}.{field.name} needs attrs' own __init__")
        namespace[f"_set_{i}"] = cls.__dict__[field.name].__set__
        if field.default is attrs.NOTHING:
            parameters.append(field.name)
        else:
            namespace[f"_default_{i}"] = field.default
            parameters.append(f"{field.name}=_default_{i}")
        body.append(f"    _set_{i}(self, {field.name})")
    source = f"def __init__(self, {', '.join(parameters)}):\n" + "\n".join(body) + "\n"
    exec(compile(source, f"<fast_init {cls.__qualname__}>", "exec"), namespace)
    init = namespace["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"  # type: ignore[attr-defined]
    init.__annotations__ = dict(cls.__init__.__annotations__)  # type: ignore[attr-defined,misc]
    cls.__init__ = init  # type: ignore[misc]
    return cls
