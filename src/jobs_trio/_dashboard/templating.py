# How stored text reaches a page: Jinja2 with autoescaping on, and filters that make the
# characters a browser would hide or choke on visible. Apart so that no page can render a
# database value any other way.
from __future__ import annotations

import json
import math
import time
from pathlib import Path
from urllib.parse import quote

import jinja2

from .._core import render as cli_render

TEMPLATES = Path(__file__).with_name("templates")


def shown(value: object) -> str:
    """One line of stored text as a person should read it: NUL, ESC, bidi overrides and lone
    surrogates as escapes (``\\x00``, ``\\u202e``, ``\\udcff``). HTML-escaping is left to
    autoescape, which runs after; a lone surrogate left in would make the response
    unencodable (UTF-8 has no form for it) and fail the whole page."""
    if value is None:
        return "-"
    return cli_render.visible(str(value))


def shown_block(text: str | None) -> str:
    """Multi-line stored text (an error's traceback, pretty JSON): every line `shown`, the
    line breaks kept."""
    if text is None:
        return "-"
    return "\n".join(cli_render.visible(line) for line in text.split("\n"))


def pretty_json(text: str | None) -> str:
    """Stored JSON indented for reading; text that does not parse is shown as it is."""
    if text is None:
        return "-"
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return shown_block(text)
    return shown_block(json.dumps(value, indent=2, ensure_ascii=False))


def pretty_value(value: object) -> str:
    """A stored value (a job's result, already decoded) indented for reading."""
    if value is None:
        return "-"
    return shown_block(json.dumps(value, indent=2, ensure_ascii=False, default=repr))


def url_part(value: object) -> str:
    """Stored text as one URL path segment or query value. A lone surrogate (which UTF-8
    cannot encode) becomes a backslash escape instead of failing the page."""
    return quote(str(value), safe="", errors="backslashreplace")


def clock(when: float) -> str:
    """``14:05`` (UTC): a chart bar's minute."""
    return time.strftime("%H:%M", time.gmtime(when))


def environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES),
        # Every template is HTML: escape everything, whatever the file is called.
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(
        shown=shown,
        shown_block=shown_block,
        pretty_json=pretty_json,
        pretty_value=pretty_value,
        urlencode=url_part,
        duration=lambda s: "-" if s is None or not math.isfinite(s) else cli_render.duration(s),
        iso=lambda t: "-" if t is None else cli_render.iso(t),
        clock=clock,
        relative=cli_render.relative,
    )
    return env
