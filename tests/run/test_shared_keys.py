# The per-job objects whose defaults live on their class (a run's scope, a settlement waiting to
# be written) keep no dict of their own whatever they set, however many came before them: a
# dict each was one more object per job for the garbage collector to count (issue 44).
from __future__ import annotations

import gc
import sys
from typing import Any

import pytest

from jobs_trio._core.records import Claim
from jobs_trio._core.shared_keys import share_keys
from jobs_trio._run.run_scope import RunScope
from jobs_trio._run.settler import _Pending

pytestmark = pytest.mark.skipif(
    sys.implementation.name != "cpython", reason="CPython's layout of an instance's attributes"
)


def _has_own_dict(obj: object) -> bool:
    # A dict of its own is what the collector sees beside the instance's attribute values.
    return any(type(ref) is dict for ref in gc.get_referents(obj))


def _defaults(cls: type) -> list[str]:
    return [
        name
        for name, value in vars(cls).items()
        if not name.startswith("__") and not callable(value) and not hasattr(value, "__get__")
    ]


def _claim() -> Claim:
    return Claim("id", "tok", "job", "q", "null", 1, 3, 30.0)


@pytest.mark.parametrize(
    ("cls", "make"),
    [
        (RunScope, lambda: RunScope(_claim(), None, 1)),
        (_Pending, lambda: _Pending(object())),  # type: ignore[arg-type]
    ],
)
async def test_each_attribute_set_after_many_instances_keeps_no_dict(cls: type, make: Any) -> None:
    names = _defaults(cls)
    assert len(names) >= 5  # what the test is about: defaults an instance may set later
    many = [make() for _ in range(100)]
    for name in names:
        late = make()
        setattr(late, name, getattr(late, name))
        assert not _has_own_dict(late), name
    assert not any(_has_own_dict(one) for one in many)


def test_share_keys_shares_what_a_class_without_it_does_not() -> None:
    def made() -> type:
        class Plain:
            late = 0
            later = 0

            def __init__(self) -> None:
                self.first = 1

        return Plain

    plain, shared = made(), share_keys(made(), "first")
    for cls in (plain, shared):
        keep = [cls() for _ in range(100)]
        one = cls()
        one.late = one.later = 1
        assert _has_own_dict(one) is (cls is plain)
        del keep


class _Slotted:
    __slots__ = ("a",)


class _Finalized:
    def __del__(self) -> None:
        pass


class _Described:
    @property
    def a(self) -> int:
        return 1


@pytest.mark.parametrize(("cls", "names"), [(_Slotted, ()), (_Finalized, ()), (_Described, ("a",))])
def test_share_keys_refuses_a_class_its_probe_would_act_on(cls: type, names: tuple[str]) -> None:
    with pytest.raises(TypeError, match="share_keys"):
        share_keys(cls, *names)
