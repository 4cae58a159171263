"""Regenerate docs/tui.svg: a real conversation with the default model, greedy so it is reproducible.
Run: python -m tui.screenshot [OUT.svg]. Uses a throw-away data directory, never the user's."""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
from pathlib import Path

PROMPTS = [
    "What is the capital of France?",
    "Show me a Python function that reverses a string, in one short code block.",
]


async def _shoot(out: Path) -> None:
    from edgellm.models.catalog import DEFAULT_MODEL
    from tui.app import ChatApp
    from tui.local_backend import LocalBackend
    from tui.messages import GenerationSettings

    app = ChatApp(LocalBackend, DEFAULT_MODEL)
    app.settings = GenerationSettings(system_prompt="Answer briefly.", temperature=0.0, max_tokens=200)
    async with app.run_test(size=(110, 28)) as pilot:
        while app.state not in ("ready", "error"):
            await pilot.pause(0.1)
        if app.state == "error":
            raise SystemExit("the model did not load: " + " / ".join(app.query_one("#loading").lines))
        for prompt in PROMPTS:
            n = len(app.conversation.messages)
            await pilot.press(*prompt, "enter")
            while len(app.conversation.messages) < n + 2 or app.replying:
                await pilot.pause(0.1)
        await pilot.pause(0.5)
        app.save_screenshot(filename=out.name, path=str(out.parent))


def main() -> None:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "docs/tui.svg").resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    os.environ["EDGELLM_DATA_DIR"] = tempfile.mkdtemp(prefix="edgellm-shot-")
    asyncio.run(_shoot(out))
    print(out)


if __name__ == "__main__":
    main()
