# The docs (issue 17): every Python example on every page runs, the Prometheus config and alert
# rules parse and name metrics the worker exports, and the site builds with warnings as errors.
# Apart from the feature tests because a page, not a module, is what each test here guards.
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.process_helpers import ROOT

DOCS = ROOT / "docs"
BLOCK = re.compile(
    r"(?P<before>(?:<!-- fragment:[^>]*-->\n)?)```(?P<lang>\w*)\n(?P<code>.*?)^```", re.S | re.M
)
# A block that starts with this line is a file the page's later blocks import, not a script.
FILE_MARK = re.compile(r"# file: (?P<name>[\w.]+)\n")


def blocks(page: Path, lang: str) -> list[tuple[bool, str]]:
    """``(is_fragment, code)`` for each block of ``lang``, in page order."""
    return [
        (bool(m["before"]), m["code"])
        for m in BLOCK.finditer(page.read_text(encoding="utf-8"))
        if m["lang"] == lang
    ]


PAGES = sorted(p.name for p in DOCS.glob("*.md") if blocks(p, "python"))


def test_every_python_example_is_run_or_marked_a_fragment() -> None:
    runnable = [
        code for p in PAGES for fragment, code in blocks(DOCS / p, "python") if not fragment
    ]
    # The tutorial's three, testing, dashboard and metrics: the count drops if one is lost.
    assert len(runnable) >= 6, PAGES


@pytest.mark.slow
@pytest.mark.parametrize("page", PAGES)
def test_the_python_examples_on_a_page_run(page: str, tmp_path: Path) -> None:
    """Each page's examples run in order in one fresh directory, as a reader would run them;
    a ``# file: NAME`` block is saved for the later ones to import."""
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    for number, (fragment, code) in enumerate(blocks(DOCS / page, "python"), 1):
        if fragment:
            continue
        named = FILE_MARK.match(code)
        if named:
            (tmp_path / named["name"]).write_text(code, encoding="utf-8")
            continue
        script = tmp_path / f"example_{number}.py"
        script.write_text(code, encoding="utf-8")
        done = subprocess.run(
            [sys.executable, str(script)],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, f"{page} example {number}:\n{code}\n{done.stderr}"


def test_the_tutorial_prints_what_it_says() -> None:
    text = (DOCS / "tutorial.md").read_text(encoding="utf-8")
    assert 'It prints `completed 1 {"sent_to":"ada@example.com","attempt":1}`' in text


def test_the_scrape_config_and_alert_rules_parse_and_name_real_metrics() -> None:
    yaml = pytest.importorskip("yaml")
    from prometheus_client import CollectorRegistry

    from jobs_trio.metrics import Metrics

    registry = CollectorRegistry()
    Metrics(registry)
    # A counter's family is named without its _total suffix; its samples carry it.
    exported = {m.name + ("_total" if m.type == "counter" else "") for m in registry.collect()}
    page = (DOCS / "metrics.md").read_text(encoding="utf-8")
    for name in exported:
        assert f"| `{name}` |" in page, f"{name} is exported but not in the metrics table"
    scrape, rules = (yaml.safe_load(code) for _, code in blocks(DOCS / "metrics.md", "yaml"))
    assert [job["job_name"] for job in scrape["scrape_configs"]] == [
        "jobs-worker",
        "jobs-worker-k8s",
    ]
    alerts = rules["groups"][0]["rules"]
    assert [a["alert"] for a in alerts] == [
        "JobsDeadLettersGrowing",
        "JobsOldestReadyTooOld",
        "JobsDrainAbandoned",
    ]
    for alert in alerts:
        found = re.findall(r"\b((?:jobs|queue)_[a-z_]+?)(?:_bucket|_sum|_count)?\b", alert["expr"])
        named = set(found)
        assert named <= exported, (alert["alert"], named - exported)


@pytest.mark.slow
def test_the_docs_site_builds_with_warnings_as_errors(tmp_path: Path) -> None:
    try:
        import material  # noqa: F401
        import mkdocs  # noqa: F401
        import mkdocstrings  # noqa: F401
    except ImportError as exc:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true but the docs tools are missing: {exc}")
        pytest.skip(f"the docs extra is not installed ({exc.name}): pip install -e '.[docs]'")
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "site" / "reference" / "index.html").read_text().count("open_worker") > 0
