# The package's public face: every name in jobs_trio.__all__ resolves (loaded on first use) and is
# said once; every public module (no part of its path starts with `_`) is the one docs/reference.md
# lists; and the console script holds SIGTERM before it imports anything heavy.
from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import jobs_trio

SRC = Path(jobs_trio.__file__).parent
DOCS = Path(__file__).resolve().parents[2] / "docs"


def test_every_public_name_resolves_and_each_is_said_once() -> None:
    # One table (_PUBLIC) says each name once; the lazy imports and __all__ are made from it.
    names = [name for names in jobs_trio._PUBLIC.values() for name in names]
    assert len(names) == len(set(names))
    assert sorted(jobs_trio.__all__) == sorted([*names, "__version__"])
    for name in jobs_trio.__all__:
        assert getattr(jobs_trio, name) is not None
    assert set(jobs_trio.__all__) <= set(dir(jobs_trio))
    # The imports the type checker reads say what the table says, name for name, each an
    # explicit re-export (`X as X`); on a difference, the block the table calls for is shown.
    tree = ast.parse((SRC / "__init__.py").read_text())
    [checking] = [n for n in tree.body if isinstance(n, ast.If) and n.orelse]
    imported = {
        alias.name: ("." * node.level + (node.module or ""), alias.asname)
        for node in checking.body
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }
    wanted = {name: (module, name) for module, names in jobs_trio._PUBLIC.items() for name in names}
    block = "\n".join(
        f"    from {module} import {name} as {name}" for name, (module, _) in sorted(wanted.items())
    )
    assert imported == wanted, f"jobs_trio/__init__.py's TYPE_CHECKING block should read:\n{block}"


def test_dir_lists_the_public_surface_only() -> None:
    import jobs_trio.driver

    listed = set(dir(jobs_trio))
    assert set(jobs_trio.__all__) <= listed
    assert listed - set(jobs_trio.__all__) <= {
        m.split(".")[1] for m in public_modules() if "." in m
    }
    assert "driver" in listed
    for helper in ("_importlib", "_typing", "_types", "annotations", "_WHERE", "_PUBLIC"):
        assert helper not in listed, helper


def public_modules() -> set[str]:
    """Every module and package of jobs_trio no part of whose path starts with ``_`` (the
    conformance suite's own modules stand under its package's name)."""
    found = set()
    for path in SRC.rglob("*.py"):
        parts = ["jobs_trio", *path.relative_to(SRC).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts = parts[:-1]
        if any(part.startswith("_") for part in parts):
            continue
        dotted = ".".join(parts)
        if dotted.startswith("jobs_trio.testing.conformance."):
            continue
        found.add(dotted)
    return found


def test_the_reference_lists_exactly_the_public_modules() -> None:
    page = (DOCS / "reference.md").read_text()
    table = page.split("## Public modules", 1)[1].split("\n\n::: ", 1)[0]
    listed = set(re.findall(r"^\| `(jobs_trio[\w.]*)` \|", table, re.M))
    assert listed == public_modules()


def test_the_console_script_loads_nothing_heavy_before_it_holds_the_signals() -> None:
    # `import jobs_trio` used to import trio and every module (~1 s on a loaded machine), and a
    # SIGTERM in that second killed a starting worker with nothing in its log (issue 32).
    probe = (
        "import sys, jobs_trio._cli.console;"
        "heavy = sorted(m for m in ('trio', 'jobs_trio._run.worker', 'attrs') if m in sys.modules);"
        "print(heavy)"
    )
    shown = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    ).stdout
    assert shown.strip() == "[]"
