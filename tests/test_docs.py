"""The documentation: the README is a guide of at most ~250 lines, and the site under docs/ builds
with MkDocs in strict mode (no broken link, every page in the navigation)."""

from __future__ import annotations

import html
import os
import re
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def test_the_readme_is_a_guide_not_a_notebook():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 250
    assert not re.search(r"\b20\d\d-\d\d-\d\d\b", text), "a date in the README: it goes to docs/"
    assert not re.search(r"\b[0-9a-f]{7,40}\b", text), "a commit hash in the README: docs/"
    for link in re.findall(r"\]\((docs/[^)#]+)", text):
        assert (ROOT / link).exists(), link


def _nav_pages(node) -> list[str]:
    if isinstance(node, str):
        return [node]
    if isinstance(node, list):
        return [p for item in node for p in _nav_pages(item)]
    return [p for value in node.values() for p in _nav_pages(value)]


def test_every_page_is_in_the_navigation():
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    listed = set(_nav_pages(config["nav"]))
    pages = {
        str(p.relative_to(ROOT / "docs"))
        for p in (ROOT / "docs").rglob("*.md")
        if "runs/data" not in str(p)  # raw outputs of measured runs, excluded from the site
    }
    assert pages == listed, (pages - listed, listed - pages)


def test_the_site_builds_in_strict_mode(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert (tmp_path / "censor" / "index.html").exists()
    # The home page is the README itself (docs/index.md includes it): every section of the README
    # is on it, and its links into docs/ point at the site's pages, not at docs/ paths.
    home = (tmp_path / "index.html").read_text()
    readme = (ROOT / "README.md").read_text()
    for heading in re.findall(r"^## (.+)$", readme, re.MULTILINE):
        assert html.escape(heading, quote=False) in home, heading
    assert 'href="costs/"' in home and 'src="images/table1.png"' in home
    assert not re.search(r'(href|src)="(\.\./)*docs/', home)
