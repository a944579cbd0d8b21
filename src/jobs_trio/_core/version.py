# The release, said once: the package's __version__, pyproject.toml's version and what a worker
# announces to its fleet all read it here (CHANGELOG.md says what each release changed).
from __future__ import annotations

VERSION = "0.2.0"
