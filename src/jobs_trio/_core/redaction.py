# A database URL as it may be shown: its password replaced by ***, for every error message and
# log line that names the database. Apart so that each place that echoes a URL (the opener, the
# drivers, the CLI) calls one function, and none leaks a password by writing its own.
from __future__ import annotations

import re

# `password=...` in the query string, which asyncpg reads as well as the one in the userinfo.
_QUERY_PASSWORD = re.compile(r"([?&]password=)[^&#]*", re.IGNORECASE)
MASK = "***"


def redact_url(url: str) -> str:
    """``url`` with any password masked: ``postgresql://app:***@host/db``.

    The userinfo is everything before the LAST ``@`` after the scheme, as urllib and asyncpg
    read it, so a password holding an unescaped ``@`` or ``/`` is masked whole. When in doubt
    this masks too much (a host that followed such a password), never too little.
    """
    scheme, sep, rest = url.partition("://")
    if not sep:
        return _QUERY_PASSWORD.sub(rf"\1{MASK}", url)
    userinfo, at, host = rest.rpartition("@")
    if at and ":" in userinfo:
        user = userinfo.split(":", 1)[0]
        rest = f"{user}:{MASK}@{host}"
    return _QUERY_PASSWORD.sub(rf"\1{MASK}", f"{scheme}://{rest}")
