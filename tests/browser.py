"""Headless Chromium for the browser tests (tests/serve/test_browsers.py, test_chat_page.py), driven by Playwright:
Debian's chromium (make install-test installs it where it is missing), never a browser Playwright would download."""

from __future__ import annotations

import contextlib
import shutil

import pytest

CHROMIUM = "/usr/bin/chromium"


@contextlib.contextmanager
def chromium(*args: str):
    """A headless Chromium, closed however the test ends; the test is skipped where Chromium is not installed."""
    sync_api = pytest.importorskip("playwright.sync_api")
    if not shutil.which(CHROMIUM):
        pytest.skip(f"no Chromium at {CHROMIUM} (make install-test installs Debian's chromium)")
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=list(args))
        try:
            yield browser
        finally:
            browser.close()
