# The `jobs-trio` console script: holds SIGTERM and SIGINT for a long-running command, THEN loads
# the CLI. Apart from cli.py because importing that (trio, the drivers) takes up to a second.
from __future__ import annotations

import sys

from .._run.early_signals import EarlySignals

# The commands that run until signalled: each ends through a lifecycle, which acts on a signal
# held here. Any other command dies of SIGTERM as usual (nothing to drain).
LONG_RUNNING = frozenset({"worker", "relay"})


def main() -> int:
    command = next((arg for arg in sys.argv[1:] if not arg.startswith("-")), None)
    early = EarlySignals.install() if command in LONG_RUNNING else None
    from .main import main as cli_main

    return cli_main(early=early)


if __name__ == "__main__":
    sys.exit(main())
