# The package as a user installs it (issue 36): a wheel built from the tracked files holds the
# templates, the SQL and migrations, the license and py.typed; installed into a fresh venv it
# answers `jobs-trio --version` and runs `jobs-trio demo`, reading its SQL and templates from
# the installed package, not from this checkout.
from __future__ import annotations

import importlib.metadata
import os
import shutil
import subprocess
import sys
import sysconfig
import venv
import zipfile
from pathlib import Path

import pytest

import jobs_trio
from tests.helpers.process_helpers import ROOT

pytestmark = pytest.mark.slow

# What the wheel must carry besides the modules: without them an install fails at run time.
DATA = [
    "jobs_trio/py.typed",
    "jobs_trio/drivers/postgres/_jobs.sql",
    "jobs_trio/drivers/postgres/_settle_statements.sql",
    "jobs_trio/drivers/postgres/_steps_events.sql",
    "jobs_trio/drivers/postgres/_cron.sql",
    "jobs_trio/drivers/postgres/_outbox_relay.sql",
    "jobs_trio/drivers/postgres/_fleet.sql",
    "jobs_trio/drivers/postgres/_admin.sql",
    "jobs_trio/drivers/postgres/_schema.sql",
    "jobs_trio/_dashboard/templates/base.html",
    "jobs_trio/_dashboard/templates/queues.html",
    "jobs_trio/_dashboard/templates/job.html",
    "jobs_trio/_dashboard/static/live.js",
]


def _run(*argv: str | Path, cwd: Path, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(
        [str(a) for a in argv],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, f"{argv}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def _tracked_copy(into: Path) -> Path:
    """The files git tracks (and new ones it does not ignore), copied: the wheel is built from
    what a release is built from, and the build writes nothing into this checkout."""
    listed = _run("git", "ls-files", "--cached", "--others", "--exclude-standard", "-z", cwd=ROOT)
    for name in filter(None, listed.split("\0")):
        source = ROOT / name
        if source.is_file():
            target = into / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
    return into


def _build_wheel(source: Path, out: Path) -> Path:
    # Without build isolation when this environment has a recent enough setuptools (no index
    # needed, seconds faster); else pip fetches the build requirements as any user's pip does.
    try:
        offline = int(importlib.metadata.version("setuptools").split(".")[0]) >= 68
        importlib.metadata.version("wheel")
    except importlib.metadata.PackageNotFoundError:
        offline = False
    isolation = ["--no-build-isolation"] if offline else []
    _run(sys.executable, "-m", "pip", "wheel", "--no-deps", *isolation, "-w", out, source, cwd=out)
    [wheel] = out.glob("jobs_trio-*.whl")
    return wheel


def _fresh_venv(where: Path) -> Path:
    """A venv with no jobs_trio, whose dependencies are this environment's: a .pth line names
    this environment's site-packages, so nothing is downloaded, and the editable install of
    this checkout is not seen (a path in a .pth file does not run the .pth files there)."""
    venv.EnvBuilder(with_pip=False, symlinks=True).create(where)
    python = where / "bin" / "python"
    site = _run(
        python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])", cwd=where
    )
    ours = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    (Path(site.strip()) / "deps_from_test_env.pth").write_text("\n".join(sorted(ours)) + "\n")
    return python


def test_the_wheel_installs_and_runs_in_a_fresh_venv(tmp_path: Path) -> None:
    wheel = _build_wheel(_tracked_copy(tmp_path / "source"), tmp_path)
    assert wheel.name.startswith(f"jobs_trio-{jobs_trio.__version__}-")
    names = set(zipfile.ZipFile(wheel).namelist())
    missing = [name for name in DATA if name not in names]
    assert not missing, missing
    for folder in ("postgres_migrations", "sqlite_migrations"):
        shipped = {n for n in names if n.startswith(f"jobs_trio/drivers/{folder}/")}
        here = {
            f"jobs_trio/drivers/{folder}/{p.name}"
            for p in (ROOT / "src" / "jobs_trio" / "drivers" / folder).glob("*.sql")
        }
        assert shipped == here, folder
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    # The index's page: the readme is README then CHANGELOG, with the project's URLs, the
    # classifiers (typed: py.typed ships) and the extras.
    [metadata_name] = [n for n in names if n.endswith(".dist-info/METADATA")]
    metadata = zipfile.ZipFile(wheel).read(metadata_name).decode()
    assert "Description-Content-Type: text/markdown" in metadata
    assert "\n# jobs_trio\n" in metadata and "\n# Changelog\n" in metadata
    assert "Upgrading from 0.1" in metadata
    for label in ("Homepage", "Documentation", "Changelog", "Source", "Issues"):
        assert f"Project-URL: {label}, https://" in metadata, label
    assert "Classifier: Typing :: Typed" in metadata and "Provides-Extra: psycopg" in metadata
    assert "](docs/" not in metadata  # a relative link is dead on the index's page

    python = _fresh_venv(tmp_path / "venv")
    _run(
        sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", wheel, cwd=tmp_path
    )
    script = tmp_path / "venv" / "bin" / "jobs-trio"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JOBS_TRIO", "PYTHON"))}
    assert _run(script, "--version", cwd=tmp_path, env=env) == (
        f"jobs-trio {jobs_trio.__version__}\n"
    )
    # From the installed package: its files, its templates and migrations.
    installed = _run(
        python,
        "-c",
        "import jobs_trio, jobs_trio._dashboard.templating as t;"
        " from jobs_trio.drivers._migration_files import read_migrations as r;"
        " t.environment().get_template('queues.html');"
        " print(jobs_trio.__file__, len(r('sqlite_migrations')), len(r('postgres_migrations')))",
        cwd=tmp_path,
        env=env,
    ).split()
    assert installed[0].startswith(str(tmp_path / "venv")), installed
    assert int(installed[1]) > 0 and int(installed[2]) > 0
    out = _run(script, "demo", cwd=tmp_path, env=env)
    assert "dead" in out and "completed" in out and "interrupted" in out, out


def test_the_sdist_carries_the_changelog(tmp_path: Path) -> None:
    source = _tracked_copy(tmp_path / "source")
    _run(
        sys.executable,
        "-c",
        "import sys; from setuptools import build_meta; build_meta.build_sdist(sys.argv[1])",
        tmp_path,
        cwd=source,
    )
    [sdist] = tmp_path.glob("jobs[-_]trio-*.tar.gz")
    import tarfile

    with tarfile.open(sdist) as archive:
        names = {name.split("/", 1)[1] for name in archive.getnames() if "/" in name}
    assert {"CHANGELOG.md", "README.md", "LICENSE", "src/jobs_trio/py.typed"} <= names
