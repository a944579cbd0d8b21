# The worker's Prometheus metrics, public: `Metrics` for `open_worker(metrics=...)` on a registry
# of your own, and `serve_metrics` for the /metrics endpoint (docs/metrics.md).
from __future__ import annotations

from ._core.metrics import Metrics, default_metrics
from ._core.metrics_endpoint import serve_metrics

__all__ = ["Metrics", "default_metrics", "serve_metrics"]
