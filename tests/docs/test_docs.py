# The docs (issue 17): every Python example on every page runs, the Prometheus config and alert
# rules parse and name metrics the worker exports, and the site builds with warnings as errors.
# Apart from the feature tests because a page, not a module, is what each test here guards.
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import attrs
import pytest

from tests.conftest import require_postgres
from tests.docs.preludes import PRELUDES
from tests.helpers.process_helpers import ROOT

DOCS = ROOT / "docs"
BLOCK = re.compile(
    r"(?P<before>(?:<!-- (?P<mark>[^>]*)-->\n)?)```(?P<lang>\w*)\n(?P<code>.*?)^```", re.S | re.M
)
# A block that starts with this line is a file the page's later blocks import, not a script.
FILE_MARK = re.compile(r"# file: (?P<name>[\w.]+)\n")
# What a block's mark may say: completed by a prelude of the docs test (preludes.py), checked
# another way (parsed), run by a named test of this module, or not run, with the reason.
MARK = re.compile(r"(?P<kind>prelude|checked|run by|not run): (?P<what>\S[^—]*?)(?: — .*)?\s*$")
# Shown output, not code: nothing to run.
OUTPUT_LANGS = ("text",)


@attrs.frozen
class Block:
    page: str
    lang: str
    code: str
    mark: str | None  # "prelude", "checked", "run by", "not run"; None: a program as it is
    what: str | None  # the prelude's name, the test's, or why not


def page_blocks(page: Path) -> list[Block]:
    found = []
    for m in BLOCK.finditer(page.read_text(encoding="utf-8")):
        kind = what = None
        if m["mark"] is not None:
            parsed = MARK.match(m["mark"].strip())
            assert parsed, f"{page.name}: a block's mark says {m['mark']!r}"
            kind, what = parsed["kind"], parsed["what"].strip()
        found.append(Block(page.name, m["lang"], m["code"], kind, what))
    return found


def blocks(page: Path, lang: str) -> list[tuple[bool, str]]:
    """``(is_completed_by_a_prelude, code)`` for each block of ``lang``, in page order."""
    return [(b.mark is not None, b.code) for b in page_blocks(page) if b.lang == lang]


PAGES = sorted(p.name for p in DOCS.glob("*.md") if blocks(p, "python"))


def test_every_block_is_run_checked_or_marked_not_run() -> None:
    """Every block of every page: a Python program (run below, as it is or completed by a
    named prelude), output (``text``), checked another way, run by a named test, or marked not
    run with the reason."""
    counts: dict[str, int] = {}
    for page in sorted(DOCS.glob("*.md")):
        for block in page_blocks(page):
            where = f"{page.name}: {block.lang or 'unlabelled'} block {block.code[:40]!r}"
            assert block.lang, f"{where}: give it a language (text for output)"
            if block.mark == "prelude":
                assert block.lang == "python" and block.what in PRELUDES, where
            elif block.mark == "run by":
                assert f"def {block.what}(" in Path(__file__).read_text(), where
            elif block.mark is None:
                assert block.lang == "python" or block.lang in OUTPUT_LANGS, (
                    f"{where}: run it, or mark it <!-- not run: why -->"
                )
            kind = block.mark or ("output" if block.lang in OUTPUT_LANGS else "run")
            counts[kind] = counts.get(kind, 0) + 1
    # The count drops if a page's programs are lost: the tutorial's three, testing's, ...
    assert counts["run"] >= 12 and counts["prelude"] >= 9, counts


def test_every_json_and_yaml_block_parses() -> None:
    yaml = pytest.importorskip("yaml")
    for page in sorted(DOCS.glob("*.md")):
        for block in page_blocks(page):
            if block.lang == "json":
                json.loads(block.code)
            elif block.lang == "yaml":
                assert list(yaml.safe_load_all(block.code)), block


def _pip_names(page_text: str) -> set[str]:
    """The distributions a page tells its reader to install: jobs-trio's extras it names
    (``jobs-trio[postgres]``) and what ``pip install`` lines name."""
    names: set[str] = set()
    for extras in re.findall(r"jobs-trio\[([\w,-]+)\]", page_text):
        for extra in extras.split(","):
            names |= EXTRAS[extra]
    for line in re.findall(r"pip install ([^`\n]+)", page_text):
        names |= {re.split(r"[\[<>=]", n.strip("'\""))[0].lower() for n in line.split()}
    return names


def _requirement_name(requirement: str) -> str:
    return re.split(r"[\[<>=~! ;]", requirement, maxsplit=1)[0].lower()


EXTRAS: dict[str, set[str]] = {
    extra: {_requirement_name(r) for r in requirements}
    for extra, requirements in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ].items()
}


def test_a_page_names_the_extra_or_package_of_every_import_its_programs_need() -> None:
    """A reader who installs jobs-trio and what the page names can run the page's programs:
    every module they import is the standard library's, jobs_trio's (and its dependencies'),
    the page's own files, or installed by an extra or a package the page names."""
    import importlib.metadata

    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    base = {"jobs-trio"} | {_requirement_name(r) for r in pyproject["project"]["dependencies"]}
    distributions = importlib.metadata.packages_distributions()
    for name in PAGES:
        text = (DOCS / name).read_text(encoding="utf-8")
        named = _pip_names(text)
        own = {m["name"].removesuffix(".py") for m in FILE_MARK.finditer(text)}
        for block in page_blocks(DOCS / name):
            if block.lang != "python":
                continue
            for module in re.findall(r"^\s*(?:import|from) (\w+)", block.code, re.M):
                if module in sys.stdlib_module_names or module in own or module == "jobs_trio":
                    continue
                needs = {d.lower() for d in distributions.get(module, [module])}
                assert needs & (named | base), (
                    f"{name} imports {module} ({', '.join(sorted(needs))}), which neither"
                    " jobs-trio nor an extra or package the page names installs"
                )


@pytest.mark.slow
@pytest.mark.parametrize("page", PAGES)
def test_the_python_examples_on_a_page_run(page: str, tmp_path: Path) -> None:
    """Each page's examples run in order in one fresh directory, as a reader would run them;
    a ``# file: NAME`` block is saved for the later ones to import, and a fragment runs inside
    the prelude its mark names (preludes.py)."""
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    database = None  # made at the page's first prelude that needs PostgreSQL, dropped after
    try:
        for number, block in enumerate(page_blocks(DOCS / page), 1):
            if block.lang != "python" or block.mark not in (None, "prelude"):
                continue
            code = block.code
            named = FILE_MARK.match(code)
            if named:
                (tmp_path / named["name"]).write_text(code, encoding="utf-8")
                continue
            if block.mark == "prelude":
                prelude = PRELUDES[block.what or ""]
                code = prelude.complete(code)
                if prelude.postgres and database is None:
                    database = fresh_database(require_postgres())
                    env["JOBS_URL"] = database.url
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
    finally:
        if database is not None:
            database.drop()


@attrs.frozen
class _Database:
    url: str
    name: str
    admin_url: str

    def drop(self) -> None:
        import psycopg

        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)')


def fresh_database(admin_url: str) -> _Database:
    """A new, empty database for a prelude that needs PostgreSQL (its tables in public, the
    jobs in the default schema, as an application's would be); dropped after its block."""
    import uuid
    from urllib.parse import urlsplit, urlunsplit

    import psycopg

    name = f"jt_docs_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    parts = urlsplit(admin_url)
    return _Database(urlunsplit(parts._replace(path=f"/{name}")), name, admin_url)


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
    # Every public name has its entry (the reference reads the package's __all__ as it runs:
    # it is made from a table, which a reading of the source alone does not see).
    import jobs_trio

    missing = [n for n in jobs_trio.__all__ if f'id="jobs_trio.{n}"' not in reference]
    assert missing == []
    # The reference is made from docstrings: none may send a user to the design notes.
    assert "DESIGN" not in reference
    # The changelog page is the repository's CHANGELOG.md, included.
    changelog = (tmp_path / "site" / "changelog" / "index.html").read_text()
    assert "Upgrading from 0.1" in changelog
