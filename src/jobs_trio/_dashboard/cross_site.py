# The dashboard's guard against cross-site requests and DNS rebinding: which Host names it
# answers to, and whether a POST (an action on jobs or a queue) came from one of its own pages.
# Apart because the actions are the only writes the dashboard makes; each check is one way in.
from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from collections.abc import Iterable
from urllib.parse import urlsplit

import attrs

COOKIE = "jobs_trio_csrf"
FORM_FIELD = "csrf"
LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1", "[::1]"})


@attrs.frozen
class Refusal:
    status: int
    reason: str


class CrossSiteGuard:
    """Signed double-submit tokens plus an Origin check.

    A browser keeps a random nonce in a ``SameSite=Strict``, ``HttpOnly`` cookie; every form
    carries ``HMAC(secret, nonce)``. A POST is accepted only with both, matching, and with an
    ``Origin`` (or, from browsers that send none, a ``Referer``) naming this dashboard. Another
    site can make a browser send the cookie (not with SameSite=Strict, but older browsers
    ignore it) and cannot read the page to learn the token; a site that plants its own cookie
    (a sibling subdomain can) still cannot sign it without the process's secret."""

    def __init__(self, allowed_hosts: Iterable[str], secret: bytes | None = None) -> None:
        self.allowed_hosts = frozenset(h.lower() for h in allowed_hosts)
        self._secret = secret if secret is not None else os.urandom(32)

    def host_allowed(self, host_header: str | None) -> bool:
        """Whether a request's Host names this dashboard. A page of another site whose name
        was re-pointed at 127.0.0.1 (DNS rebinding) arrives with that site's name here; it
        must not be answered, or that site could read every job."""
        if not host_header:
            return False
        host = _hostname(host_header)
        return host in self.allowed_hosts or "*" in self.allowed_hosts

    def new_nonce(self) -> str:
        return secrets.token_urlsafe(24)

    def token_for(self, nonce: str) -> str:
        return hmac.new(self._secret, nonce.encode(), hashlib.sha256).hexdigest()

    def check_post(
        self,
        *,
        host: str | None,
        origin: str | None,
        referer: str | None,
        nonce: str | None,
        token: str | None,
    ) -> Refusal | None:
        """None when the POST may act; else why not (403)."""
        source = origin if origin and origin != "null" else referer
        if not source:
            return Refusal(403, "the request names no Origin or Referer: refused as cross-site")
        parts = urlsplit(source)
        if not host or parts.netloc.lower() != host.lower():
            return Refusal(403, "the request came from another site (its Origin is not this one)")
        if not nonce or not token:
            return Refusal(403, "the form's cross-site token is missing: reload the page")
        # As bytes: compare_digest refuses a str that is not ASCII (TypeError), and a forged
        # token of any text must be a 403, not a 500.
        if not hmac.compare_digest(
            self.token_for(nonce).encode(), token.encode("utf-8", "replace")
        ):
            return Refusal(403, "the form's cross-site token does not match: reload the page")
        return None


def _hostname(host_header: str) -> str:
    host = host_header.strip().lower()
    if host.startswith("["):  # [::1]:8000
        return host[: host.find("]") + 1] if "]" in host else host
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host
