# The web dashboard: queues, jobs and one job's steps, with retry and cancel only when enabled.
# A package apart because it needs the `dashboard` extra (Starlette, hypercorn, Jinja2).
from __future__ import annotations

from .._dashboard.app import dashboard_app
from .._dashboard.serve import (
    DashboardOptions,
    open_dashboard_driver,
    read_only_url,
    serve_dashboard,
)

__all__ = [
    "DashboardOptions",
    "dashboard_app",
    "open_dashboard_driver",
    "read_only_url",
    "serve_dashboard",
]
