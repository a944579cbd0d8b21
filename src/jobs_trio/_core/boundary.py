# The input boundary: every name, key, number, duration and JSON document a driver will store is
# checked here, and error text made storable, before any driver sees it. Apart so that one call
# succeeds with the same stored value on memory, SQLite and PostgreSQL, or fails the same way.
from __future__ import annotations

import datetime as dt
import json
import math
import re
import time
from collections.abc import Callable, Mapping
from typing import Any, Final

from .errors import InvalidArgument, PayloadNotSerialisable, TooLarge

# PostgreSQL stores priority, attempts and max_attempts as int4; SQLite and memory would take
# far more, and a value only one driver can store is refused on all of them.
INT4_MIN = -(2**31)
INT4_MAX = 2**31 - 1

MAX_NAME_CHARS = 200  # job, queue, event and step names
MAX_KEY_CHARS = 512  # unique keys and event keys; 512 x 4 UTF-8 bytes fits a btree index entry
MAX_ERROR_CHARS = 4000  # error text stored with a job; longer text is cut and marked
# A run's context (tenant, request id: docs/context.md) is read on every attempt: small.
MAX_CONTEXT_ENTRIES = 32
MAX_CONTEXT_NAME_CHARS = 100

# A duration or a point in time at most this far ahead: past it a run-at no longer renders as a
# date (year 9999 overflows datetime) long before a double stops holding it.
MAX_SECONDS = 100 * 365.25 * 86400.0

# JSON documents (payloads, results, step results, event payloads).
MAX_JSON_DEPTH = 100  # json's C encoder and decoder recurse: deeper nesting is a RecursionError
# 640 digits: the lowest int<->str limit a Python process may set (sys.set_int_max_str_digits),
# so every worker, whatever its setting, can read back an int that was let in.
MAX_INT_DIGITS = 640
_INT_BOUND = 10**MAX_INT_DIGITS
DEFAULT_MAX_PAYLOAD_BYTES = 1024 * 1024
DEFAULT_MAX_RESULT_BYTES = 1024 * 1024
# The ceiling a registry or job may raise its limits to: SQLite refuses strings over 10**9
# bytes and PostgreSQL fields over 1 GB; a quarter of that keeps a batch of them writable.
MAX_CONFIGURABLE_BYTES = 256 * 1024 * 1024

_JSON_FIX = (
    "pass only JSON values (dict with str keys, list, str, int, float, bool, None): send a "
    "storage key or id instead of an object, str() a date or UUID, base64-encode bytes"
)

# ensure_ascii (the default): NUL and lone surrogates inside JSON strings become \u escapes,
# plain ASCII that every driver stores byte for byte. Built once: json.dumps with any
# non-default option builds a new encoder on every call (4.6% of a worker's CPU at 5,000/s).
_ENCODER = json.JSONEncoder(separators=(",", ":"), allow_nan=False)


# -- text ---------------------------------------------------------------------------------


def shown(value: object) -> str:
    """``value`` for an error message: short, and never raising — repr() of an int past 4,300
    digits raises ValueError, and a user's __repr__ may raise anything."""
    if isinstance(value, int) and value.bit_length() > 100:
        return f"an int of {value.bit_length()} bits"
    try:
        text = repr(value)
    except Exception:
        return f"a {type(value).__name__}"
    return text if len(text) <= 80 else text[:77] + "..."


def raised_text(exc: BaseException) -> str:
    """``Type: message`` of an error user code raised, for a message: never raising itself."""
    try:
        message = str(exc)
    except Exception:
        message = "<its str() raised>"
    return f"{type(exc).__name__}: {storable_text(message, 200)}"


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate: os.listdir's answer for a non-UTF-8 name
        return False
    return True


def check_name(value: object, *, argument: str, max_chars: int = MAX_NAME_CHARS) -> str:
    """A name (job, queue, event, step): a non-empty str of printable characters (no control,
    format or separator characters but the space), at most ``max_chars`` long."""
    if not isinstance(value, str) or not value or len(value) > max_chars:
        raise InvalidArgument(
            argument,
            f"{shown(value)} is not a non-empty str of at most {max_chars} characters",
            fix=f"name it with a short str, e.g. 'emails.send' (1 to {max_chars} characters)",
        )
    if not value.isprintable():
        raise InvalidArgument(
            argument,
            f"{shown(value)} holds a control, format or unencodable character",
            fix="use printable characters only: a name is shown in logs, metrics and the CLI",
        )
    return value


def check_key(value: object, *, argument: str, max_chars: int = MAX_KEY_CHARS) -> str:
    """A key (unique key, event key, event match): any non-empty text every driver stores —
    no NUL (PostgreSQL refuses it) and no lone surrogate (UTF-8 cannot encode it)."""
    if not isinstance(value, str) or not value or len(value) > max_chars:
        raise InvalidArgument(
            argument,
            f"{shown(value)} is not a non-empty str of at most {max_chars} characters",
            fix="pass a short str such as 'welcome:42'",
        )
    if "\x00" in value or not _encodable(value):
        raise InvalidArgument(
            argument,
            f"{shown(value)} holds a NUL or a lone surrogate, which not every driver can store",
            fix="build the key from ids or hex/base64 text, not from raw bytes",
        )
    return value


def storable_text(text: object, max_chars: int = MAX_ERROR_CHARS) -> str:
    """``text`` as every driver stores it: NUL and lone surrogates written as visible escapes
    (``\\x00``, ``\\udcff``), and cut to ``max_chars`` with the cut marked. For error text,
    which comes from code nobody checked and must be written anyway."""
    if not isinstance(text, str):
        text = str(text)
    marker = ""
    if len(text) > max_chars:
        marker = f" … [truncated: {len(text)} characters]"
    # Cut before escaping: escaping a 100 MB message only to throw most of it away would cost
    # the worker that much memory; cut again after, as escapes make text longer.
    head = text[:max_chars]
    if "\x00" in head or not _encodable(head):
        head = head.replace("\x00", "\\x00").encode("utf-8", "backslashreplace").decode("utf-8")
    if marker or len(head) > max_chars:
        marker = marker or f" … [truncated: {len(text)} characters]"
        head = head[: max_chars - len(marker)] + marker
    return head


# -- numbers and durations ------------------------------------------------------------------


def check_int(value: object, *, argument: str, low: int = INT4_MIN, high: int = INT4_MAX) -> int:
    """An int (not a bool) in ``low..high``."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise InvalidArgument(argument, f"{shown(value)} is not an int", fix="pass an int")
    if not low <= value <= high:
        raise InvalidArgument(
            argument,
            f"{shown(value)} is outside {low}..{high}, the range every driver stores",
            fix=f"pass an int from {low} to {high}",
        )
    return value


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        number = float(value)
    except OverflowError:  # an int past a double
        return None
    return number if math.isfinite(number) else None


def check_seconds(value: object, *, argument: str, high: float = MAX_SECONDS) -> float:
    """A duration: a finite number of seconds from 0 to ``high`` (100 years by default)."""
    number = _number(value)
    if number is None or number < 0 or number > high:
        raise InvalidArgument(
            argument,
            f"{shown(value)} is not a number of seconds from 0 to {high:.0f}",
            fix=f"pass a finite number of seconds, 0 <= {argument} <= {high:.0f}",
        )
    return number


def seconds_until(value: object, *, argument: str, now: float) -> float:
    """A point in time (an aware datetime, or epoch seconds on the clock ``now`` is read from)
    as seconds from ``now``: 0 for a time already past, refused beyond ``MAX_SECONDS`` ahead."""
    if isinstance(value, dt.datetime):
        if value.tzinfo is None:
            raise InvalidArgument(
                argument,
                f"{shown(value)} has no time zone",
                fix="pass an aware datetime, e.g. datetime.now(timezone.utc) + timedelta(...)",
            )
        number: float | None = value.timestamp()
    else:
        number = _number(value)
    if number is None or number - now > MAX_SECONDS:
        raise InvalidArgument(
            argument,
            f"{shown(value)} is not a time within {MAX_SECONDS:.0f} seconds from now",
            fix="pass an aware datetime or finite epoch seconds, at most 100 years ahead",
        )
    return max(0.0, number - now)


def delay_from(delay: object, run_at: object) -> float:
    """The seconds from now an enqueued job becomes due, from ``delay=`` or ``run_at=``."""
    if delay is not None and run_at is not None:
        raise InvalidArgument("delay", "both delay= and run_at= were given", fix="pass one")
    if run_at is not None:
        return seconds_until(run_at, argument="run_at", now=time.time())
    return 0.0 if delay is None else check_seconds(delay, argument="delay")


def check_limit(value: object, *, argument: str) -> int:
    """A configured size limit in bytes: 1 to ``MAX_CONFIGURABLE_BYTES``."""
    return check_int(value, argument=argument, low=1, high=MAX_CONFIGURABLE_BYTES)


def check_context(
    value: object, *, argument: str = "context", reserved: frozenset[str] = frozenset()
) -> dict[str, str] | None:
    """A run's context: a mapping of at most ``MAX_CONTEXT_ENTRIES`` names (printable, 1 to
    ``MAX_CONTEXT_NAME_CHARS``, none of ``reserved``) to keys' text (``check_key``). An empty
    one is None: nothing is stored."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise InvalidArgument(
            argument,
            f"{shown(value)} is not a mapping of names to strs",
            fix="pass a dict of str to str, e.g. {'tenant': 't1', 'request_id': 'r-42'}",
        )
    if len(value) > MAX_CONTEXT_ENTRIES:
        raise InvalidArgument(
            argument,
            f"{len(value)} entries, more than the {MAX_CONTEXT_ENTRIES} a context holds",
            fix="keep the context to ids (tenant, request, user); put data in the payload",
        )
    checked: dict[str, str] = {}
    for name, text in value.items():
        check_name(name, argument=f"{argument} name", max_chars=MAX_CONTEXT_NAME_CHARS)
        if name in reserved:
            raise InvalidArgument(
                argument,
                f"{name!r} is reserved for the W3C trace context jobs_trio stores itself",
                fix="name it otherwise; with OpenTelemetry installed the trace is carried",
            )
        checked[name] = check_key(text, argument=f"{argument}[{name!r}]")
    return checked or None


# -- JSON documents ---------------------------------------------------------------------------


def _storable(value: object) -> bool:
    """Whether ``value`` is a JSON document every driver round-trips: the fast walk, run on
    every payload and result; only a refused one is walked again, slowly, to name the field.
    A loop over an explicit stack, not recursion: the nesting it measures is the user's."""
    stack: list[tuple[object, int]] = [(value, 0)]
    pop, push = stack.pop, stack.append
    while stack:
        item, depth = pop()
        kind = type(item)
        if kind is str or item is None or kind is bool:
            continue
        if kind is dict or isinstance(item, dict):
            if depth >= MAX_JSON_DEPTH:
                return False
            for key, child in item.items():  # type: ignore[attr-defined]
                if type(key) is not str and not isinstance(key, str):
                    return False
                push((child, depth + 1))
        elif kind is list or isinstance(item, list | tuple):
            if depth >= MAX_JSON_DEPTH:
                return False
            for child in item:  # type: ignore[attr-defined]
                push((child, depth + 1))
        elif isinstance(item, int):
            if not -_INT_BOUND < item < _INT_BOUND:
                return False
        elif isinstance(item, float):
            if not math.isfinite(item):
                return False
        elif not isinstance(item, str):
            return False
    return True


# A high surrogate then a low one, as two code points of a str (a decoded astral character is
# one): ensure_ascii writes both as escapes, and every JSON reader joins such a pair.
_SURROGATE_PAIR: Final = re.compile("[\ud800-\udbff][\udc00-\udfff]")


def _joined_surrogates(value: object, path: str) -> str | None:
    """Where ``value`` holds a text (a key too) with a surrogate pair as two code points."""
    stack: list[tuple[object, str]] = [(value, path)]
    while stack:
        item, where = stack.pop()
        if isinstance(item, str):
            if _SURROGATE_PAIR.search(item):
                return where
        elif isinstance(item, dict):
            for key, child in item.items():
                if _SURROGATE_PAIR.search(key):
                    return f"{where} (a key)"
                stack.append((child, f"{where}.{key}"))
        elif isinstance(item, list | tuple):
            stack.extend((c, f"{where}[{i}]") for i, c in enumerate(item))
    return None


def _first_offender(value: object, path: str) -> tuple[str, str] | None:
    """The first value (in document order) the encoder would refuse or a driver could not
    round-trip, and where: the slow walk, for the error message."""
    stack: list[tuple[object, str, int]] = [(value, path, 0)]
    while stack:
        item, where, depth = stack.pop()
        if item is None or isinstance(item, bool | str):
            continue
        if isinstance(item, int):
            if -_INT_BOUND < item < _INT_BOUND:
                continue
            return (where, f"an int of more than {MAX_INT_DIGITS} digits")
        if isinstance(item, float):
            if math.isfinite(item):
                continue
            return (where, f"{item} is not a finite number")
        if isinstance(item, dict | list | tuple):
            if depth >= MAX_JSON_DEPTH:
                return (where, f"nested deeper than {MAX_JSON_DEPTH} levels (or holds itself)")
            if isinstance(item, dict):
                children: list[tuple[object, str, int]] = []
                for key, child in item.items():
                    if not isinstance(key, str):
                        return (where, f"key {shown(key)} is a {type(key).__name__}, not a str")
                    children.append((child, f"{where}.{key}", depth + 1))
            else:
                children = [(c, f"{where}[{i}]", depth + 1) for i, c in enumerate(item)]
            stack.extend(reversed(children))
            continue
        return (where, f"a {type(item).__name__} is not JSON-serialisable")
    return None


def load_json(text: str) -> Any:
    """``json.loads(text)``, the same value or the same error, at a quarter of its cost for the
    text this project stores (compact, as ``dump_json`` makes it): the C scanner called
    directly, where json.loads adds two whitespace matches and three calls around it, ~0.8 µs
    of a no-op job's payload (issue 44). Any other text (whitespace around it, extra data, not
    JSON at all) goes to json.loads itself, for its value or its error."""
    try:
        value, end = _SCAN(text, 0)
    except StopIteration:
        return json.loads(text)
    if end != len(text):
        return json.loads(text)
    return value


# json.loads' own decoder settings (none): the scanner json.loads ends up calling, set by
# JSONDecoder.__init__ (typeshed does not declare it).
_Scan = Callable[[str, int], tuple[Any, int]]
_SCAN: Final[_Scan] = json.JSONDecoder().scan_once  # type: ignore[attr-defined]


def dump_json(
    value: object,
    *,
    job: str,
    what: str = "payload",
    max_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
    too_large_fix: str | None = None,
) -> str:
    """``value`` as compact JSON text every driver stores, or ``PayloadNotSerialisable`` naming
    the field, or ``TooLarge`` naming the size. Nothing is written either way: callers check
    before any driver call."""
    if value is None:
        return "null"  # most results: no walk, no encoder
    try:
        if not _storable(value):
            field, cause = _first_offender(value, what) or (what, "not a JSON document")
            raise PayloadNotSerialisable(job=job, field=field, cause=cause, fix=_JSON_FIX)
        text = _ENCODER.encode(value)
        found = _joined_surrogates(value, what) if "\\ud" in text else None
    except PayloadNotSerialisable:
        raise
    except Exception as exc:
        # A subclass of dict, list, int or float runs its own code as it is walked and encoded
        # (an __iter__, items(), a comparison): whatever that raises is this value's refusal.
        # As a result it failed the worker, left the job running, and the next worker took it
        # and failed the same way.
        raise PayloadNotSerialisable(
            job=job,
            field=what,
            cause=f"walking it to encode it raised {raised_text(exc)}",
            fix=_JSON_FIX,
        ) from exc
    if found is not None:  # a surrogate's escape (or U+D000-U+D7FF's) led to the walk
        raise PayloadNotSerialisable(
            job=job,
            field=found,
            cause="a high surrogate followed by a low one, two code points that JSON reads"
            " back as the one character they would make (the value would come back changed)",
            fix="join them into that character (text.encode('utf-16', 'surrogatepass')"
            ".decode('utf-16')), or keep text that is not Unicode as bytes, base64-encoded",
        )
    if len(text) > max_bytes:  # ASCII (ensure_ascii): characters are bytes
        raise TooLarge(job=job, what=what, size=len(text), limit=max_bytes, fix=too_large_fix)
    return text
