"""The README's screenshots of the run viewer (docs/screenshots/), from real runs: the
newsroom example on Claude through the local Messages API imitation (a gated fan-out with its
cache figures, and its event history), a run parked at an approval, a rejected one and a
stopped one (each with a person's reason), in headless Chromium at 1280 px and at a phone's
390 px. `make screenshots`; needs Debian's chromium (`make setup`)."""

from __future__ import annotations

import sys
from pathlib import Path

from laneflow_dev import browser as harness
from laneflow_dev.demo import IMITATION_MODEL, INPUT, demo_responder

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "screenshots"
FIXTURES = ROOT / "tests" / "fixtures"


def main() -> int:
    if reason := harness.missing():
        print(f"viewer_screenshots: {reason}", file=sys.stderr)
        return 1
    from playwright.sync_api import sync_playwright

    workspaces = {
        "newsroom": ROOT / "examples" / "newsroom",
        "ws_control": FIXTURES / "ws_control",
        "ws_gate": FIXTURES / "ws_gate",
    }
    with harness.served(workspaces, responder=demo_responder) as served, sync_playwright() as playwright:
        stopped = served.start("ws_gate", "stop")
        served.wait(stopped, "running")
        served.post(f"/runs/{stopped}/stop", {"reason": "wrong input"})  # through the API, as the viewer's dialog does
        rejected = served.start("ws_control", "approval")
        served.wait(rejected, "awaiting-approval")
        served.post(f"/runs/{rejected}/approval", {"approve": False, "reason": "the draft needs a source"})
        newsroom = served.start("newsroom", "brief", input=INPUT, model=IMITATION_MODEL)
        served.wait(newsroom, "completed", "failed", timeout_s=120)
        parked = served.start("ws_control", "approval")
        served.wait(parked, "awaiting-approval")
        served.wait(stopped, "failed")

        browser = playwright.chromium.launch(executable_path=harness.CHROMIUM, args=harness.CHROMIUM_ARGS)
        for width, height, name in ((1280, 800, "desktop"), (390, 844, "phone")):
            page = browser.new_page(viewport={"width": width, "height": height}, device_scale_factor=1)
            page.goto(served.url + "/")
            page.wait_for_selector("tr.run-row")
            page.wait_for_timeout(400)
            page.screenshot(path=str(OUT / f"runs-{name}.png"), full_page=True)
            page.goto(f"{served.url}/#/runs/{newsroom}")
            page.wait_for_selector(".run")
            page.locator('.step[data-step="1"] > button.row').click()
            page.wait_for_timeout(400)
            page.screenshot(path=str(OUT / f"run-{name}.png"), full_page=True)
            if name == "desktop":
                page.goto(f"{served.url}/#/runs/{newsroom}/history")
                page.wait_for_selector('[data-k="history"]')
                page.wait_for_timeout(400)
                page.screenshot(path=str(OUT / "history-desktop.png"), full_page=True)
            page.close()
        browser.close()
    print(f"viewer_screenshots: wrote {', '.join(sorted(p.name for p in OUT.glob('*.png')))} in {OUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
