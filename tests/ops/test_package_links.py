# The package's face on a package index (issue 47): the README's links are absolute and name
# files of this repository (a relative docs/… link is dead on the index's page), the project
# URLs name the repository's changelog and docs, and every classifier is one the index accepts.
from __future__ import annotations

import re
import tomllib

import pytest

from tests.helpers.process_helpers import ROOT

PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
SOURCE = PROJECT["urls"]["Source"]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _repository_path(url: str) -> str | None:
    """The file or folder of this repository ``url`` names (None: not one of ours)."""
    for kind in ("blob", "tree"):
        prefix = f"{SOURCE}/{kind}/main/"
        if url.startswith(prefix):
            return url.removeprefix(prefix).split("#", 1)[0]
    return None


def test_the_readme_and_changelog_links_work_from_the_package_index() -> None:
    checked = 0
    for name in ("README.md", "CHANGELOG.md"):  # the readme is both (pyproject: readme)
        for target in LINK.findall((ROOT / name).read_text(encoding="utf-8")):
            assert target.startswith(("https://", "http://", "#")), (name, target)
            path = _repository_path(target)
            if path is not None:
                assert (ROOT / path).exists(), (name, target)
                checked += 1
    assert checked >= 15  # the docs pages the README lists


def test_the_project_urls_name_the_repository_s_files() -> None:
    urls = PROJECT["urls"]
    assert set(urls) >= {"Homepage", "Documentation", "Changelog", "Source", "Issues"}
    assert _repository_path(urls["Changelog"]) == "CHANGELOG.md"
    assert _repository_path(urls["Documentation"]) == "docs"


def test_every_classifier_is_one_the_index_accepts() -> None:
    trove = pytest.importorskip("trove_classifiers")
    unknown = [c for c in PROJECT["classifiers"] if c not in trove.classifiers]
    assert not unknown
    assert "Typing :: Typed" in PROJECT["classifiers"]
    assert (ROOT / "src" / "jobs_trio" / "py.typed").exists()
