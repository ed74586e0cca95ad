"""A real headless browser for the tests that look at what a person sees (the Snakemake report,
the MLflow UI): Playwright driving Debian's Chromium.

Playwright's own browser download comes from a CDN these machines cannot reach, so the browser is
Debian's ``chromium`` package, installed where missing (it needs root and apt, as in CI; elsewhere
the test is skipped with the reason). Playwright itself is a dev dependency (pyproject.toml).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from services import apt_install

CANDIDATES = ("chromium", "chromium-browser", "google-chrome")


def _chromium() -> str | None:
    return next((found for name in CANDIDATES if (found := shutil.which(name))), None)


def _install_chromium() -> str:
    apt_install("chromium")
    found = _chromium()
    assert found, "apt-get installed chromium, but no chromium on PATH"
    return found


@contextmanager
def browser_page(width: int = 1400, height: int = 1000) -> Iterator[Any]:
    """A Playwright page in headless Chromium; skips the test where neither can be had."""
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright (the dev extra)")
    executable = _chromium()
    if executable is None:
        if os.geteuid() != 0 or shutil.which("apt-get") is None:
            pytest.skip("Chromium from Debian's packages needs root and apt-get (as in CI)")
        executable = _install_chromium()
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=executable, args=["--no-sandbox", "--disable-gpu"]
        )
        try:
            yield browser.new_page(viewport={"width": width, "height": height})
        finally:
            browser.close()


def screenshot(page: Any, path: Path) -> None:
    """Save what ``page`` shows (for the documentation's screenshots: GRADINV_SCREENSHOTS)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(path))
