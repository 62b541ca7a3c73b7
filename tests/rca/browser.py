"""Headless Debian Chromium driven over the DevTools protocol, for the page tests.

The protocol is JSON over one websocket; aiohttp (already the services' HTTP stack) has
the client, so no browser-automation package is needed for: load a URL, wait for the
load event, evaluate an expression in the page, take a screenshot, and collect every
console error, uncaught exception and failed load the page produced.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking")


@dataclass
class Visit:
    value: Any  # what the expression returned
    errors: list[str] = field(default_factory=list)  # console errors, exceptions, failed loads
    screenshot: Path | None = None


async def _visit(ws_url: str, url: str, expression: str, screenshot: Path | None, timeout_s: float,
                 height: int, scale: float = 1.0) -> Visit:
    errors: list[str] = []
    ids = iter(range(1, 1_000_000))
    pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
    loaded = asyncio.Event()
    async with aiohttp.ClientSession() as session, session.ws_connect(ws_url, max_msg_size=64 << 20) as ws:

        async def reader() -> None:
            async for msg in ws:
                data = json.loads(msg.data)
                if "id" in data and data["id"] in pending:
                    pending.pop(data["id"]).set_result(data)
                    continue
                method, params = data.get("method"), data.get("params", {})
                if method == "Page.loadEventFired":
                    loaded.set()
                elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
                    errors.append("console: " + " ".join(str(a.get("value", a.get("description", "")))
                                                         for a in params.get("args", [])))
                elif method == "Runtime.exceptionThrown":
                    errors.append("exception: " + json.dumps(params.get("exceptionDetails", {}))[:500])
                elif method == "Log.entryAdded" and params.get("entry", {}).get("level") == "error":
                    entry = params["entry"]
                    errors.append(f"log: {entry.get('text')} {entry.get('url', '')}")

        async def call(method: str, **params: Any) -> dict[str, Any]:
            i = next(ids)
            fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
            pending[i] = fut
            await ws.send_str(json.dumps({"id": i, "method": method, "params": params}))
            reply = await asyncio.wait_for(fut, timeout_s)
            if "error" in reply:
                raise RuntimeError(f"{method}: {reply['error']}")
            return dict(reply.get("result", {}))

        task = asyncio.create_task(reader())
        try:
            for domain in ("Page", "Runtime", "Log"):
                await call(f"{domain}.enable")
            await call("Emulation.setDeviceMetricsOverride", width=1280, height=height, deviceScaleFactor=1,
                       mobile=False)
            nav = await call("Page.navigate", url=url)
            if nav.get("errorText"):
                errors.append(f"navigate: {nav['errorText']}")
            await asyncio.wait_for(loaded.wait(), timeout_s)
            result = await call("Runtime.evaluate", expression=expression, returnByValue=True)
            if "exceptionDetails" in result:
                errors.append("evaluate: " + json.dumps(result["exceptionDetails"])[:500])
            value = result.get("result", {}).get("value")
            shot = None
            if screenshot is not None:
                png = await call("Page.captureScreenshot", format="png", captureBeyondViewport=False,
                                 clip={"x": 0, "y": 0, "width": 1280, "height": height, "scale": scale})
                screenshot.parent.mkdir(parents=True, exist_ok=True)
                screenshot.write_bytes(base64.b64decode(png["data"]))
                shot = screenshot
            await asyncio.sleep(0.2)  # late console messages
            return Visit(value, errors, shot)
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task


class Browser:
    """One headless Chromium with a fresh profile; `visit()` opens a page in its first tab."""

    def __init__(self, timeout_s: float = 30.0) -> None:
        if CHROMIUM is None:
            raise RuntimeError("chromium is not installed (./dev.sh setup installs it as root)")
        self.timeout_s = timeout_s
        self.profile = tempfile.mkdtemp(prefix="mycroft-chromium-")
        self.proc = subprocess.Popen([CHROMIUM, *FLAGS, f"--user-data-dir={self.profile}", "--remote-debugging-port=0",
                                      "--window-size=1280,800", "--hide-scrollbars", "about:blank"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        port_file = Path(self.profile) / "DevToolsActivePort"
        deadline = time.monotonic() + timeout_s
        while not port_file.exists() or len(port_file.read_text().splitlines()) < 2:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.close()
                raise RuntimeError("chromium did not open its DevTools port")
            time.sleep(0.1)
        self.port = int(port_file.read_text().splitlines()[0])

    def _page_ws(self) -> str:
        import urllib.request

        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/json/list", timeout=10) as r:
            targets = json.loads(r.read())
        return str(next(t for t in targets if t.get("type") == "page")["webSocketDebuggerUrl"])

    def visit(self, url: str, expression: str, screenshot: Path | None = None, height: int = 800,
              scale: float = 1.0) -> Visit:
        """Load `url` in a 1280 x `height` viewport, evaluate `expression`, optionally screenshot (scaled)."""
        return asyncio.run(_visit(self._page_ws(), url, expression, screenshot, self.timeout_s, height, scale))

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        shutil.rmtree(self.profile, ignore_errors=True)


ARTEFACTS = Path(os.environ.get("MYCROFT_TEST_ARTEFACTS", Path(__file__).resolve().parents[2] / "test-artefacts"))


def main() -> None:
    """Screenshot a saved page: the README's picture is
    `python -m tests.rca.browser test-artefacts/incident-chain.html docs/img/incident-page.png 1180 0.7`."""
    import sys

    page, out = Path(sys.argv[1]).resolve(), Path(sys.argv[2])
    height = int(sys.argv[3]) if len(sys.argv) > 3 else 800
    scale = float(sys.argv[4]) if len(sys.argv) > 4 else 1.0
    browser = Browser()
    try:
        visit = browser.visit(page.as_uri(), "1", out, height, scale)
    finally:
        browser.close()
    print(out, "errors:", visit.errors)


if __name__ == "__main__":
    main()
