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

from tests.helpers.process_helpers import ROOT

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


# The tutorial's worker command, but for the port: 0 takes a free one.
STEP_4_OPTIONS = ("--db", "sqlite:///tutorial.db", "--grace", "25", "--metrics-port", "0")


@pytest.mark.slow
def test_the_tutorials_worker_logs_what_the_page_shows(tmp_path: Path) -> None:
    """Step 4 as a reader runs it: a worker process, the application's script, Ctrl-C. The
    worker's output is the page's, event for event (times, ids and the port differ)."""
    import signal
    import time

    from tests.helpers.process_helpers import JOBS_TRIO

    page = DOCS / "tutorial.md"
    [shop_jobs] = [c for _, c in blocks(page, "python") if c.startswith("# file: shop_jobs.py")]
    [shop_app] = [c for _, c in blocks(page, "python") if "async def signup(driver" in c]
    [shown] = [c for _, c in blocks(page, "text") if "jobs.worker.started" in c]
    (tmp_path / "shop_jobs.py").write_text(shop_jobs, encoding="utf-8")
    (tmp_path / "shop_app.py").write_text(shop_app, encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    log = tmp_path / "worker.log"
    with log.open("w") as stderr:
        worker = subprocess.Popen(
            [*JOBS_TRIO, "worker", "shop_jobs:registry", *STEP_4_OPTIONS],
            cwd=tmp_path,
            env=env,
            stderr=stderr,
        )
    try:

        def wait_for(what: str, count: int = 1) -> None:
            deadline = time.monotonic() + 30
            while log.read_text().count(what) < count:
                assert time.monotonic() < deadline, f"no {what} in:\n{log.read_text()}"
                time.sleep(0.05)

        wait_for("jobs.worker.started")
        ran = subprocess.run(
            [sys.executable, "shop_app.py"], cwd=tmp_path, env=env, capture_output=True, text=True
        )
        assert ran.returncode == 0, ran.stderr
        assert len(ran.stdout.split()) == 2  # "It prints the two jobs' ids."
        wait_for("jobs.attempt.completed", 2)
        worker.send_signal(signal.SIGINT)
        assert worker.wait(timeout=30) == 0, log.read_text()
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()

    def events(text: str) -> list[str]:
        return re.findall(r" jobs_trio: (jobs\.[a-z.-]+) ", text)

    assert events(log.read_text()) == events(shown), log.read_text()


def test_the_scrape_config_and_alert_rules_parse_and_name_real_metrics() -> None:
    yaml = pytest.importorskip("yaml")
    from prometheus_client import CollectorRegistry

    from jobs_trio._core.metrics import Metrics
    from jobs_trio._core.records import OutboxStats

    registry = CollectorRegistry()
    Metrics(registry).outbox_observed(OutboxStats(0, None))  # a relay's gauges too
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


def test_every_page_is_in_the_sites_navigation() -> None:
    # mkdocs.yml's validation makes a left-out page a warning, so the strict build fails on
    # it too; this says which page, without building.
    yaml = pytest.importorskip("yaml")
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))
    assert config["validation"]["omitted_files"] == "warn"

    def pages(nav: object) -> list[str]:
        if isinstance(nav, str):
            return [nav]
        if isinstance(nav, list):
            return [p for item in nav for p in pages(item)]
        if isinstance(nav, dict):
            return [p for value in nav.values() for p in pages(value)]
        return []

    assert sorted(pages(config["nav"])) == sorted(p.name for p in DOCS.glob("*.md"))


def test_diagrams_render_offline_and_no_page_cites_internal_documents() -> None:
    for page in DOCS.glob("*.md"):
        text = page.read_text(encoding="utf-8")
        # A mermaid block needs a script from a CDN to render: offline it is raw text.
        assert "```mermaid" not in text, page.name
        # Users have the docs, not the design notes the code was built from.
        assert "DESIGN" not in text, page.name


def test_every_logged_event_is_on_the_logging_page() -> None:
    from jobs_trio import OutcomeKind

    source = "\n".join(p.read_text() for p in (ROOT / "src" / "jobs_trio").rglob("*.py"))
    events = set(re.findall(r'log_event\(\s*"(jobs\.[a-z_.-]+)"', source))
    events |= {f"jobs.attempt.{kind.value}" for kind in OutcomeKind}
    events |= {
        f"jobs.{who}.{what}"
        for who in ("worker", "relay")
        for what in ("lifecycle-opened", "no-drain")
    }
    assert len(events) > 40, sorted(events)
    page = (DOCS / "logging.md").read_text(encoding="utf-8")
    missing = sorted(e for e in events if f"`{e}`" not in page)
    assert not missing, missing


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
    reference = (tmp_path / "site" / "reference" / "index.html").read_text()
    assert reference.count("open_worker") > 0
    # The reference is made from docstrings: none may send a user to the design notes.
    assert "DESIGN" not in reference
    # The changelog page is the repository's CHANGELOG.md, included.
    changelog = (tmp_path / "site" / "changelog" / "index.html").read_text()
    assert "Upgrading from 0.1" in changelog
