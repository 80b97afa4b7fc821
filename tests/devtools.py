"""Headless Chromium driven through the DevTools protocol: what a user does in a page (type into a
field, click a button), for tests of the Temporal Web UI's forms.

Debian's `chromium` and the `websockets` package the test extra already has; no playwright, no
driver download. Typing goes through `Input.insertText` into the focused element, as a keyboard
would, so the page's own input handlers (Svelte bindings, CodeMirror) see it.
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import subprocess
import time
import urllib.request
from pathlib import Path

import websockets

from tests.test_ops import chromium_binary


class Browser:
    """One headless Chromium with one page, until `close()` (or the `async with` ends)."""

    def __init__(self, profile: Path, *, width: int = 1280, height: int = 1100) -> None:
        profile.mkdir(parents=True, exist_ok=True)
        (profile / "DevToolsActivePort").unlink(missing_ok=True)
        self.profile = profile
        self.process = subprocess.Popen(
            [chromium_binary(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={profile}", "--remote-debugging-port=0", f"--window-size={width},{height}",
             "about:blank"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self._ids = itertools.count(1)
        self._ws = None

    async def __aenter__(self) -> Browser:
        port_file = self.profile / "DevToolsActivePort"
        deadline = time.monotonic() + 60
        while not (port_file.exists() and port_file.read_text().strip()):
            assert self.process.poll() is None and time.monotonic() < deadline, "chromium did not start"
            await asyncio.sleep(0.1)
        port = port_file.read_text().split()[0]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list") as answer:
            page = next(t for t in json.load(answer) if t["type"] == "page")
        self._ws = await websockets.connect(page["webSocketDebuggerUrl"], max_size=None)
        await self.call("Page.enable")
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._ws is not None:
            await self._ws.close()
        self.process.kill()
        self.process.wait(10)

    async def call(self, method: str, **params) -> dict:
        """One DevTools command; events that arrive meanwhile are dropped (nothing here waits on them)."""
        call_id = next(self._ids)
        await self._ws.send(json.dumps({"id": call_id, "method": method, "params": params}))
        while True:
            message = json.loads(await self._ws.recv())
            if message.get("id") == call_id:
                assert "error" not in message, f"{method}: {message['error']}"
                return message["result"]

    async def evaluate(self, expression: str):
        result = await self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        assert "exceptionDetails" not in result, f"{expression[:80]}: {result['exceptionDetails']}"
        return result["result"].get("value")

    async def wait_for(self, expression: str, timeout: float, what: str):
        """Poll `expression` until it is truthy (a loaded machine renders the app late)."""
        deadline = time.monotonic() + timeout
        while not (value := await self.evaluate(expression)):
            assert time.monotonic() < deadline, f"{what}: not on the page after {timeout:.0f} s"
            await asyncio.sleep(0.25)
        return value

    async def goto(self, url: str) -> None:
        await self.call("Page.navigate", url=url)

    async def type_into(self, selector: str, text: str) -> None:
        """Focus the element and type `text` as a keyboard does."""
        await self.wait_for(f"!!document.querySelector({json.dumps(selector)})", 60, selector)
        await self.evaluate(f"document.querySelector({json.dumps(selector)}).focus()")
        await self.call("Input.insertText", text=text)

    async def click(self, selector: str) -> None:
        await self.evaluate(f"document.querySelector({json.dumps(selector)}).click()")

    async def text(self) -> str:
        return await self.evaluate("document.body.innerText")

    async def screenshot(self, png: Path) -> None:
        png.write_bytes(base64.b64decode((await self.call("Page.captureScreenshot", format="png"))["data"]))
