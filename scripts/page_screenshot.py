"""Drive the page of `aiayn serve` in headless Chromium as a user would, and screenshot it.

    python scripts/page_screenshot.py runs/demo docs/serve-page.png

starts `aiayn serve RUN_DIR` on a free port, opens the page, types a sentence, waits for the
translation and the heatmap, and writes the screenshot. `tests/test_serve.py` runs the same
`drive_page` against a tiny model. Needs Playwright (`pip install playwright`, in the dev extra)
and a Chromium: Debian's (`apt-get install chromium`) is found on PATH.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

SENTENCE = "And God said, Let there be light: and there was light."


def find_chromium() -> str | None:
    """A Chromium or Chrome binary on PATH, or None."""
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        if path := shutil.which(name):
            return path
    return None


def drive_page(url: str, sentence: str, screenshot: Path, chromium: str, api_key: str | None = None,
               fields: dict | None = None) -> dict:
    """Open `url`, translate `sentence` through the page (typing `api_key` where the page asks for
    one, and each of `fields`, {element id: text}), and return what a user would see:
    {"translations", "numbers" (the list's number of each), "status", "key_field" (whether the page
    asked for a key), "sentences" (the attention's sentence picker), "caption", "colors" (distinct
    colours on the heatmap), "drawn" (the heatmaps drawn, as kind:layer:head; none where the answer
    has no attention), "requests" (every URL the page loaded), "bodies" (the JSON it posted),
    "focus" (the focused element's id after)}. Saves a screenshot."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1100, "height": 900})
            requests: list[str] = []
            bodies: list[dict] = []
            page.on("request", lambda request: requests.append(request.url))
            page.on("request", lambda request: request.method == "POST" and bodies.append(request.post_data_json))
            page.goto(url)
            page.wait_for_load_state("networkidle")  # /info and /frontend/settings answered
            key_field = page.is_visible("#api-key")
            if api_key is not None:
                page.fill("#api-key", api_key)
            for element, text in (fields or {}).items():
                page.fill(f"#{element}", text)
            page.fill("#source", sentence)
            page.focus("#translate")
            page.keyboard.press("Enter")  # disables the button until the answer is shown
            page.wait_for_function("!document.getElementById('translate').disabled", timeout=60_000)
            drawn, colors = [], 0
            if page.is_visible("#attention-section"):
                drawn.append(page.eval_on_selector("#heatmap", "c => c.dataset.drawn"))
                page.select_option("#head", "0")  # one head, then the encoder's self-attention
                page.select_option("#kind", "encoder")
                drawn.append(page.eval_on_selector("#heatmap", "c => c.dataset.drawn"))
                page.select_option("#kind", "cross")
                page.select_option("#head", "mean")
                drawn.append(page.eval_on_selector("#heatmap", "c => c.dataset.drawn"))
                colors = page.eval_on_selector("#heatmap", """c => {
                    const data = c.getContext("2d").getImageData(0, 0, c.width, c.height).data;
                    const seen = new Set();
                    for (let i = 0; i < data.length; i += 4) seen.add(data[i] << 16 | data[i + 1] << 8 | data[i + 2]);
                    return seen.size;
                }""")
            result = {
                "translations": page.locator("#translations li").all_inner_texts(),
                "numbers": page.eval_on_selector_all("#translations li", "items => items.map(i => i.value)"),
                "focus": page.evaluate("document.activeElement.id"),
                "bodies": bodies,
                "status": page.inner_text("#status"),
                "key_field": key_field,
                "sentences": page.locator("#sentence option").all_inner_texts(),
                "caption": page.inner_text("#caption"),
                "colors": colors,
                "drawn": drawn,
                "requests": requests,
            }
            screenshot.parent.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(screenshot), full_page=True)
            return result
        finally:
            browser.close()


def main() -> int:
    from aiayn.serve.process import ServerProcess

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", help="the model to serve (default demo run: runs/demo)", nargs="?", default="runs/demo")
    parser.add_argument("out", help="the PNG to write", nargs="?", default="docs/serve-page.png")
    parser.add_argument("--sentence", default=SENTENCE)
    args = parser.parse_args()
    chromium = find_chromium()
    if chromium is None:
        parser.exit(2, "error: no chromium on PATH (apt-get install chromium)\n")
    try:
        server = ServerProcess(args.run_dir)
    except RuntimeError as error:
        parser.exit(2, f"error: {error}\n")
    with server:
        seen = drive_page(server.url, args.sentence, Path(args.out), chromium)
    print(f"{args.out}: {seen['translations'][0]!r}; heatmaps drawn: {', '.join(seen['drawn'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
