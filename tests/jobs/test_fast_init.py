# The frozen values made for every job take fast_init's __init__: it must make what attrs' own
# would (each field, each default, positional or by name), leave the value frozen, and refuse a
# class whose fields need attrs' own (a converter, a validator, a factory...).
from __future__ import annotations

import re
from typing import Any

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from jobs_trio._core.fast_init import fast_init
from jobs_trio._core.records import AttemptNote, Claim, Complete, Lease
from jobs_trio._run.attempt import Outcome

VALUES = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text())
FAST = [Lease, Claim, AttemptNote, Complete, Outcome]


def _twin(cls: type) -> Any:
    """The same class with attrs' own __init__."""
    fields = attrs.fields(cls)
    return attrs.make_class(
        cls.__name__,
        {f.name: attrs.field(default=f.default) for f in fields},
        frozen=True,
        slots=True,
    )


@pytest.mark.parametrize("cls", FAST, ids=lambda cls: cls.__name__)
@given(data=st.data())
def test_each_value_is_made_as_attrs_would_make_it(cls: Any, data: st.DataObject) -> None:
    fields = attrs.fields(cls)
    required = [f for f in fields if f.default is attrs.NOTHING]
    given_count = data.draw(st.integers(len(required), len(fields)), label="given")
    args = [data.draw(VALUES, label=f.name) for f in fields[:given_count]]
    by_name = data.draw(st.booleans(), label="by name")
    made = (
        cls(**{f.name: a for f, a in zip(fields[:given_count], args, strict=True)})
        if by_name
        else cls(*args)
    )
    reference = _twin(cls)(*args)
    assert [getattr(made, f.name) for f in fields] == [getattr(reference, f.name) for f in fields]
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        made.__setattr__(fields[0].name, 1)
    assert made == cls(*args) and hash(made) == hash(cls(*args))
    assert attrs.evolve(made) == made


@pytest.mark.parametrize("cls", FAST, ids=lambda cls: cls.__name__)
def test_a_missing_field_or_an_unknown_one_is_the_usual_type_error(cls: Any) -> None:
    with pytest.raises(TypeError):
        cls()
    required = [f.name for f in attrs.fields(cls) if f.default is attrs.NOTHING]
    with pytest.raises(TypeError):
        cls(*required, no_such_field=1)


@pytest.mark.parametrize(
    "field",
    [
        attrs.field(converter=int),
        attrs.field(validator=attrs.validators.instance_of(int)),
        attrs.field(factory=list),
        attrs.field(kw_only=True),
        attrs.field(alias="other"),
        attrs.field(init=False, default=0),
    ],
)
def test_a_field_that_needs_attrs_own_init_is_refused(field: Any) -> None:
    cls = attrs.make_class("Needs", {"x": field}, frozen=True, slots=True)
    with pytest.raises(TypeError, match=re.escape("Needs.x needs attrs' own __init__")):
        fast_init(cls)
