"""docs/webui.png: the chat page after a real reply, as README.md shows it. Starts `edgellm serve
smollm2-135m`, asks one question in headless Chromium (edgellm/testing/browser.py) and saves the window.

    python scripts/webui_screenshot.py [--dark] [--out docs/webui.png]
"""

from __future__ import annotations

import argparse
import json
import time

from edgellm.testing import browser
from edgellm.testing.servers import ROOT, start_server, stop_server

QUESTIONS = ["Write a Python function that adds two numbers, in a code block."]  # SmolLM2 gets it right


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dark", action="store_true")
    ap.add_argument("--out", default=str(ROOT / "docs" / "webui.png"))
    args = ap.parse_args()
    if reason := browser.missing():
        raise SystemExit(f"no browser: {reason}")
    proc, url = start_server("smollm2-135m", "--ctx", "2048", "--threads", "1")
    driver = browser.chromium()
    try:  # the page's own size, not the headless window's (its frame takes a part)
        metrics = {"width": 1200, "height": 640, "deviceScaleFactor": 1, "mobile": False}
        driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", metrics)
        driver.get(f"{url}/favicon.ico")  # the origin, to set the page's settings before it loads
        settings = {"temperature": 0.0, "max_tokens": 400, "theme": "dark" if args.dark else "light"}
        driver.execute_script("localStorage.setItem('edgellm.settings', arguments[0])", json.dumps(settings))
        driver.get(f"{url}/")
        for question in QUESTIONS:
            box = driver.find_element("id", "message")
            box.send_keys(question)
            driver.find_element("id", "send").click()
            deadline = time.monotonic() + 300
            while driver.execute_script("return document.getElementById('send').disabled"):
                if time.monotonic() > deadline:
                    raise SystemExit("no reply in 300 s")
                time.sleep(0.2)
        time.sleep(0.5)
        driver.save_screenshot(args.out)
        print(f"wrote {args.out}")
    finally:
        driver.quit()
        stop_server(proc)


if __name__ == "__main__":
    main()
