"""Headless Chromium under Selenium for the chat page's tests (tests/server/test_webui_browser.py) and its
screenshot (scripts/webui_screenshot.py): Debian's `chromium` and `chromium-driver` at their fixed paths,
so Selenium Manager has nothing to find or download (SE_OFFLINE makes sure of it)."""

from __future__ import annotations

import os
from pathlib import Path

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
# Run before the page's own scripts in every document (CDP, so the page's CSP does not apply to it):
# records CSP violations and any alert/confirm/prompt, which an injected script would call.
WATCH_PAGE = """
window.__cspViolations = [];
window.__dialogs = [];
document.addEventListener('securitypolicyviolation',
  e => window.__cspViolations.push(e.blockedURI + ' ' + e.violatedDirective));
for (const name of ['alert', 'confirm', 'prompt']) window[name] = m => { window.__dialogs.push(String(m)); };
"""


def missing() -> str | None:
    """Why no browser test can run here, or None."""
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (pip install -e '.[test]')"
    absent = [str(p) for p in (CHROMIUM, CHROMEDRIVER) if not p.exists()]
    if absent:
        return f"{' and '.join(absent)} absent (apt-get install -y chromium chromium-driver)"
    return None


def chromium(width: int = 1280, height: int = 860, dark: bool = False):
    """A headless Chromium WebDriver with the browser console logged and WATCH_PAGE installed."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    os.environ["SE_OFFLINE"] = "true"  # Selenium Manager: never download a browser or driver
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    quiet = [
        "--no-first-run",
        "--disable-extensions",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
    ]  # nothing but the page on the wire
    for arg in ["--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu", *quiet]:
        options.add_argument(arg)
    options.add_argument(f"--window-size={width},{height}")
    if dark:
        options.add_argument("--force-dark-mode")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(executable_path=str(CHROMEDRIVER)), options=options)
    driver.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": WATCH_PAGE})
    return driver
