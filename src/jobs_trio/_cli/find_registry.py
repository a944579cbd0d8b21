# `MODULE[:ATTR]` to the Registry a worker runs (and `enqueue --app` checks names against).
# Apart because this is where the user's own code first runs: every way an import can go wrong
# becomes an error with a fix here, not a traceback in the CLI.
from __future__ import annotations

import importlib
import os
import sys
import traceback
from types import ModuleType

from .._core.errors import ConfigError
from .._jobs.registry import Registry

IMPORT_CODE = "X_IMPORT"


def load_registry(spec: str) -> Registry:
    """``myapp.jobs:registry``, or ``myapp.jobs`` when it holds exactly one Registry."""
    module_name, _, attr = spec.partition(":")
    if not module_name or (":" in spec and not attr):
        raise ConfigError(
            f"{spec!r} does not name a module", fix="write MODULE or MODULE:ATTR, e.g. myapp.jobs"
        )
    module = import_app(module_name)
    if attr:
        return _named(module, attr)
    return _only(module)


def import_app(module_name: str) -> ModuleType:
    # A console script's sys.path starts at its own bin/ folder, not where the user stands;
    # `jobs-trio worker myapp.jobs` run from a project must find myapp/ as `python -m` would.
    here = os.getcwd()
    if here not in sys.path:
        sys.path.insert(0, here)
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        if module_name == missing or module_name.startswith(missing + "."):
            fix = (
                f"check the spelling, and run from the folder that holds {missing.split('.')[0]}"
                " (the current folder is on the path) or install it into this environment"
            )
        else:
            fix = f"the module needs {missing!r}, which is not installed here: install it"
        raise ConfigError(
            f"cannot import {module_name!r}: {exc}", fix=fix, code=IMPORT_CODE
        ) from exc
    except Exception as exc:
        # The module was found and raised while running its top level.
        raise ConfigError(
            f"importing {module_name!r} failed: {type(exc).__name__}: {exc}{_where(exc)}",
            fix="fix the error in that module; `python -c 'import "
            f"{module_name}'` shows the whole traceback",
            code=IMPORT_CODE,
        ) from exc


def _where(exc: Exception) -> str:
    if isinstance(exc, SyntaxError) and exc.filename:
        return f" ({exc.filename}, line {exc.lineno})"
    frames = traceback.extract_tb(exc.__traceback__)
    # The innermost frame outside the import machinery is the line that raised.
    ours = [f for f in frames if "importlib" not in f.filename]
    return f" ({ours[-1].filename}, line {ours[-1].lineno})" if ours else ""


def _named(module: ModuleType, attr: str) -> Registry:
    found: object = module
    for part in attr.split("."):
        if not hasattr(found, part):
            raise ConfigError(
                f"module {module.__name__!r} has no attribute {attr!r}",
                fix=_listing(module, "name one of its registries"),
            )
        found = getattr(found, part)
    if not isinstance(found, Registry):
        raise ConfigError(
            f"{module.__name__}:{attr} is a {type(found).__name__}, not a jobs_trio.Registry",
            fix=_listing(module, "name the Registry your jobs are declared on"),
        )
    return found


def _only(module: ModuleType) -> Registry:
    found = _registries(module)
    distinct = {id(registry): registry for registry in found.values()}
    if len(distinct) == 1:
        return next(iter(distinct.values()))
    if not distinct:
        raise ConfigError(
            f"module {module.__name__!r} holds no jobs_trio.Registry",
            fix="declare `registry = jobs_trio.Registry()` there, or name the module that does",
        )
    raise ConfigError(
        f"module {module.__name__!r} holds {len(distinct)} registries ({', '.join(sorted(found))})",
        fix=f"pick one: {module.__name__}:{sorted(found)[0]}",
    )


def _registries(module: ModuleType) -> dict[str, Registry]:
    return {
        name: value
        for name, value in vars(module).items()
        if isinstance(value, Registry) and not name.startswith("__")
    }


def _listing(module: ModuleType, advice: str) -> str:
    names = sorted(_registries(module))
    if not names:
        return f"{advice}; the module holds no Registry at all"
    return f"{advice}: " + ", ".join(f"{module.__name__}:{name}" for name in names)
