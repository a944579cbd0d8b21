# The operators' surfaces: the CLI, the dashboard, metrics, logs, the wheel.
