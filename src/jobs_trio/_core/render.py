# How the CLI shows jobs, steps and queues: aligned tables, ISO times with ages, and JSON; every
# stored text made visible (escapes) before it reaches a terminal. Apart from cli.py so that the
# commands read as "fetch, then render", and so the demo's final table looks like `jobs-trio list`.
from __future__ import annotations

import datetime as dt
import json
import math
from collections.abc import Iterable, Sequence

from .records import (
    ORPHAN_LIMIT,
    SUSPECT_AT,
    WAITING_STATES,
    AttemptRecord,
    JobRecord,
    JobState,
    QueueStats,
    RelayHold,
    StepRecord,
)

# The states a queue's depth is shown in, in the order a job usually moves through them.
STATE_ORDER = tuple(state.value for state in JobState)

# A duration this long is shown in years: days would print a number hundreds of digits long
# for a job enqueued with an absurd delay.
_YEAR = 365.25 * 86400


def visible(text: str) -> str:
    """``text`` with every character a terminal would act on or hide shown as an escape.

    Names, queues, keys, errors and results are written by code and people the operator does
    not control: an ESC in a job name could recolour the screen, retitle the window (OSC 0),
    plant a hidden link (OSC 8) or forge a line with a newline. What `str.isprintable` calls
    unprintable (C0 and C1 controls, DEL, format characters such as the bidi overrides, line
    separators, lone surrogates) becomes ``\\x1b``, ``\\u202e``, ...; the rest is kept, so
    ordinary text in any language reads as it was written. `--json` is the exact form.
    """
    if text.isprintable():
        return text  # the common case costs one C-level scan
    return "".join(ch if ch.isprintable() else _escape(ch) for ch in text)


def _escape(ch: str) -> str:
    code = ord(ch)
    if code < 0x100:
        return f"\\x{code:02x}"
    if code < 0x10000:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def table(headers: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    """Columns padded to their widest cell; the last one is not padded (no trailing blanks).
    Every cell is made `visible` here, so no caller can forget to."""
    body = [[visible(str(cell)) for cell in row] for row in rows]
    widths = [max([len(h), *(len(row[i]) for row in body)]) for i, h in enumerate(headers)]
    lines = []
    for row in [list(headers), *body]:
        cells = [cell.ljust(width) for cell, width in zip(row[:-1], widths, strict=False)]
        lines.append("  ".join([*cells, row[-1]]).rstrip())
    return "\n".join(lines)


def short(text: str | None, width: int = 60) -> str:
    """One visible line of at most ``width`` characters: errors carry newlines and long reprs.
    Escaped before it is cut, so the width counts what is shown."""
    if not text:
        return "-"
    line = visible(" ".join(text.split()))
    return line if len(line) <= width else line[: width - 1] + "…"


def duration(seconds: float) -> str:
    """``0.25s``, ``42s``, ``3m12s``, ``2h05m``, ``3d04h``: enough precision to act on."""
    seconds = abs(seconds)
    if seconds < 10:
        return f"{seconds:.2f}s" if seconds < 1 else f"{seconds:.1f}s"
    if seconds < 60:
        return f"{seconds:.0f}s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours}h{minutes:02d}m"
    if seconds >= 1000 * 86400:
        return f"{seconds / _YEAR:.3g}y"
    days, hours = divmod(hours, 24)
    return f"{days}d{hours:02d}h"


def iso(when: float) -> str:
    """UTC with milliseconds: the stored times are epoch seconds on the driver's clock. A time
    no calendar date can show (a job enqueued through the library with delay=1e308) is shown
    as its epoch seconds rather than crashing `show` and `list`."""
    try:
        moment = dt.datetime.fromtimestamp(when, dt.UTC)
    except (OverflowError, OSError, ValueError):
        return f"epoch {when:.6g}s (beyond the calendar)"
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def relative(when: float, now: float) -> str:
    delta = when - now
    return f"in {duration(delta)}" if delta > 0 else f"{duration(delta)} ago"


def timed(when: float | None, now: float) -> str:
    if when is None or not math.isfinite(when):
        return "-"
    return f"{iso(when)} ({relative(when, now)})"


def attempts(record: JobRecord) -> str:
    return f"{record.attempts}/{record.max_attempts}"


# Jobs.


def job_json(
    record: JobRecord,
    steps: Sequence[StepRecord] | None = None,
    history: Sequence[AttemptRecord] | None = None,
) -> dict[str, object]:
    answer = record.to_json()
    if steps is not None:
        answer["steps"] = [step.to_json() for step in steps]
    if history is not None:
        # "history", beside the job's count "attempts": its ended attempts, oldest first.
        answer["history"] = [attempt.to_json() for attempt in history]
    return answer


def _orphaned(record: JobRecord) -> str:
    """The orphan rule's count, in words (docs/model.md, "A worker's death"). What a suspect
    does next only while it has a next: a job that ended (completed, or dead-lettered by the
    rule, its last orphaning counted) is told its count alone."""
    orphans = record.orphans
    if not orphans:
        return "never (no worker died under it)"
    times = "once" if orphans == 1 else f"{orphans} times"
    if orphans < SUSPECT_AT or record.state not in (*WAITING_STATES, JobState.RUNNING):
        rule = f"of {ORPHAN_LIMIT}" + (", uncounted" if record.state is not JobState.DEAD else "")
    elif record.state is JobState.RUNNING:
        rule = f"of {ORPHAN_LIMIT}, uncounted; a suspect, running alone"
    else:
        rule = f"of {ORPHAN_LIMIT}, uncounted; a suspect: it runs alone on an idle worker"
    return f"{times} ({rule})"


def job_text(
    record: JobRecord,
    steps: Sequence[StepRecord],
    now: float,
    history: Sequence[AttemptRecord] = (),
) -> str:
    """Everything `show` knows about one job, one field a line, then its step records and its
    attempt history."""
    fields: list[tuple[str, str]] = [
        ("id", record.id),
        ("name", record.name),
        ("queue", record.queue),
        ("state", _state_detail(record, now)),
        ("attempts", f"{attempts(record)} (counted at claim; a drained attempt is handed back)"),
        ("orphaned", _orphaned(record)),
        ("priority", str(record.priority)),
        ("key", record.key or "-"),
        ("payload", short(record.payload, 200)),
        ("created", timed(record.created_at, now)),
        ("run at", timed(record.run_at, now)),
        ("updated", timed(record.updated_at, now)),
    ]
    if record.state is JobState.RUNNING:
        fields.append(("lease until", timed(record.lease_until, now)))
        fields.append(("worker", record.worker_id or "-"))
    if record.cancel_requested:
        fields.append(("cancel", "requested: the worker stops the run at its next lease renewal"))
    if record.wait_event:
        key = "" if record.wait_key is None else f" with key {record.wait_key!r}"
        fields.append(("waits for", f"event {record.wait_event!r}{key}"))
    if record.limits is not None:
        fields.append(("fleet limits", _limits_text(record)))
    if record.context is not None:
        fields.append(("context", short(record.context, 200)))
    fields.append(("last error", record.last_error or "-"))
    fields.append(
        ("result", "-" if record.result is None else short(value_text(record.result), 200))
    )
    width = max(len(label) for label, _ in fields)
    lines = [f"{label.ljust(width)}  {visible(value)}" for label, value in fields]
    lines.append("")
    lines.append(f"steps ({len(steps)})" + (":" if steps else ": none recorded"))
    if steps:
        lines.append(_indent(steps_table(steps, now), "  "))
    lines.append("")
    lines.append(f"attempts ended ({len(history)})" + (":" if history else ": none yet"))
    if history:
        lines.append(_indent(history_table(history, now), "  "))
        if any(attempt.traceback for attempt in history):
            lines.append("  (tracebacks: --json, or the dashboard's job page)")
    return "\n".join(lines)


def history_table(history: Sequence[AttemptRecord], now: float) -> str:
    """A job's ended attempts, oldest first, as the history keeps them (the newest 20)."""
    rows = [
        [
            str(a.seq),
            str(a.attempt),
            a.outcome,
            short(a.worker_id, 30),
            relative(a.ended_at, now),
            "-" if a.seconds is None else duration(a.seconds),
            short(a.error, 60),
        ]
        for a in history
    ]
    return table(["#", "ATTEMPT", "OUTCOME", "WORKER", "ENDED", "RAN", "ERROR"], rows)


def _limits_text(record: JobRecord) -> str:
    """A job's fleet limits as its declaration reads (docs/limits.md)."""
    parts = []
    if record.slot_key is not None:
        parts.append(f"at most {record.slots} at once of key {record.slot_key!r}")
    if record.rate_key is not None:
        parts.append(
            f"at most {record.starts} starts per {record.per:g} s of key {record.rate_key!r}"
        )
    return "; ".join(parts)


def _state_detail(record: JobRecord, now: float) -> str:
    waiting = _waiting_text(record)
    if record.state is JobState.READY and record.run_at > now:
        return f"ready (due {relative(record.run_at, now)}{waiting})"
    if record.state is JobState.READY and waiting:
        return f"ready ({waiting.removeprefix(', ')})"
    if record.state is JobState.SUSPENDED:
        return f"suspended (looks again {relative(record.run_at, now)})"
    return record.state.value


def _waiting_text(record: JobRecord) -> str:
    """ ", put off for a full slot of key 'K'", or for a rate: why a ready job has not run
    (a claim put it off; it stays ready, its attempt uncounted)."""
    if record.waiting_on is None or record.state not in WAITING_STATES:
        return ""
    kind, _, key = record.waiting_on.partition(":")
    what = "a full slot" if kind == "slot" else "a rate limit" if kind == "rate" else kind
    return f", put off for {what} of key {key!r}"


def steps_table(steps: Sequence[StepRecord], now: float) -> str:
    rows = []
    for step in steps:
        took = "-" if step.finished_at is None else duration(step.finished_at - step.started_at)
        if step.result is not None:
            detail = f"result {short(step.result, 60)}"
        elif step.event is not None:
            match = f" matching {step.match!r}" if step.match else ""
            detail = f"event {step.event!r}{match}, gives up {relative(step.wake_at or now, now)}"
        elif step.wake_at is not None:
            detail = f"wakes {timed(step.wake_at, now)}"
        else:
            detail = "-"
        rows.append([step.name, step.status.value, iso(step.started_at), took, detail])
    return table(["STEP", "STATUS", "STARTED", "TOOK", "DETAIL"], rows)


def jobs_table(records: Sequence[JobRecord], now: float) -> str:
    rows = [
        [
            r.id,
            r.name,
            r.queue,
            r.state.value,
            attempts(r),
            relative(r.run_at, now),
            short(r.last_error, 50),
        ]
        for r in records
    ]
    return table(["ID", "NAME", "QUEUE", "STATE", "ATTEMPTS", "RUN AT", "LAST ERROR"], rows)


# Queues.


def stats_json(stats: Sequence[QueueStats]) -> list[dict[str, object]]:
    return [
        {
            "queue": s.queue,
            "depth": {state: s.depth.get(state, 0) for state in STATE_ORDER},
            "due": s.due,
            "oldest_ready_age": s.oldest_ready_age,
            "dead": s.dead,
            "limit_waiting": [
                {"job": job, "limit": kind, "waiting": n} for job, kind, n in s.limit_waiting
            ],
            "paused": s.paused,
        }
        for s in stats
    ]


def stats_table(stats: Sequence[QueueStats]) -> str:
    headers = ["QUEUE", *(state.upper() for state in STATE_ORDER), "DUE", "OLDEST READY"]
    rows = [
        [
            # Paused: nothing of it starts until `jobs-trio resume` (its jobs still count here).
            f"{s.queue} (paused)" if s.paused else s.queue,
            *(str(s.depth.get(state, 0)) for state in STATE_ORDER),
            str(s.due),
            "-" if s.oldest_ready_age is None else duration(s.oldest_ready_age),
        ]
        for s in stats
    ]
    waiting = [[s.queue, job, kind, str(n)] for s in stats for job, kind, n in s.limit_waiting]
    if not waiting:
        return table(headers, rows)
    # Ready jobs a claim put off for a fleet limit: counted in READY above, and not failing.
    limits = table(["QUEUE", "JOB", "WAITING ON", "JOBS"], waiting)
    return f"{table(headers, rows)}\n\nWaiting on a fleet limit (docs/limits.md):\n{limits}"


def relay_hold(hold: RelayHold, now: float) -> str:
    """One relay's hold on outbox rows, as an operator reads it: a lapsed one is a relay that
    died or is paused, whose rows another relay takes over (and whose write it then fences)."""
    rows = f"{hold.rows} row{'' if hold.rows == 1 else 's'} held by relay {visible(hold.relay_id)}"
    if hold.lapsed(now):
        return (
            f"{rows}: lease lapsed {duration(now - hold.until)} ago (the relay died or is"
            " paused; the next pass of any relay takes them over)"
        )
    return f"{rows}: lease {duration(hold.until - now)} left"


def value_text(value: object) -> str:
    """A stored value (a job's result) as one line of JSON, as `show` prints it."""
    return json.dumps(value, ensure_ascii=False, default=_not_json)


def dumps(value: object) -> str:
    return json.dumps(value, indent=2, sort_keys=False, default=_not_json)


def _not_json(value: object) -> str:
    """What --json prints for a stored value JSON has no form for: a payload or result written
    outside jobs_trio as a SQLite BLOB made the whole listing fail (X_UNEXPECTED), one bad row
    hiding every other."""
    if isinstance(value, bytes | bytearray | memoryview):
        data = bytes(value)
        return f"<{len(data)} bytes, not text: {data[:200]!r}>"
    return f"<{type(value).__name__}: {value!r}>"


def _indent(text: str, prefix: str) -> str:
    return "\n".join(prefix + line if line else line for line in text.splitlines())
