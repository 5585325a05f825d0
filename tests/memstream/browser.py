"""A headless Chromium driven over the DevTools protocol (a websocket, aiohttp's client): open pages, run
script, take screenshots, and collect what went wrong in the page (exceptions, console and log errors)."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import os
import shutil
import subprocess
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp

__all__ = ["Browser", "Page", "chromium", "launch"]


def chromium() -> str | None:
    """The Chromium executable (Debian's `chromium` package), or None."""
    return os.environ.get("MEMSTREAM_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")


class Browser:
    """One DevTools websocket: commands answered by id, events kept in order."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws = ws
        self.events: list[tuple[str, dict[str, Any], str | None]] = []
        self._ids = itertools.count(1)
        self._waiting: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._changed = asyncio.Event()
        self._reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        async for message in self.ws:
            if message.type != aiohttp.WSMsgType.TEXT:
                break
            data = message.json()
            if "id" in data:
                future = self._waiting.pop(data["id"], None)
                if future is not None and not future.done():
                    if "error" in data:
                        future.set_exception(RuntimeError(f"DevTools error: {data['error']}"))
                    else:
                        future.set_result(data.get("result", {}))
            else:
                self.events.append((data["method"], data.get("params", {}), data.get("sessionId")))
                self._changed.set()
        for future in self._waiting.values():
            if not future.done():
                future.set_exception(ConnectionError("the browser closed its DevTools connection"))

    async def send(self, method: str, params: dict[str, Any] | None = None, *, session: str | None = None,
                   timeout: float = 30.0) -> dict[str, Any]:
        """A command and its result."""
        ident = next(self._ids)
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._waiting[ident] = future
        message: dict[str, Any] = {"id": ident, "method": method, "params": params or {}}
        if session is not None:
            message["sessionId"] = session
        await self.ws.send_json(message)
        return await asyncio.wait_for(future, timeout)

    async def event(self, method: str, *, session: str | None, after: int, timeout: float = 30.0
                    ) -> dict[str, Any]:
        """The first event `method` of `session` at or after index `after` of `events`."""
        deadline = time.monotonic() + timeout
        while True:
            for name, params, where in self.events[after:]:
                if name == method and where == session:
                    return params
            self._changed.clear()
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no {method} within {timeout} s")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), left)

    async def page(self) -> Page:
        """A new tab, attached, with its runtime, log and page events on."""
        target = await self.send("Target.createTarget", {"url": "about:blank"})
        attached = await self.send("Target.attachToTarget", {"targetId": target["targetId"], "flatten": True})
        page = Page(self, attached["sessionId"])
        for domain in ("Page", "Runtime", "Log", "Network"):
            await page.send(f"{domain}.enable")
        return page

    async def close(self) -> None:
        """Close the connection."""
        await self.ws.close()
        self._reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._reader


class Page:
    """One tab."""

    def __init__(self, browser: Browser, session: str) -> None:
        self.browser = browser
        self.session = session

    async def send(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        """A command to this tab."""
        return await self.browser.send(method, params, session=self.session)

    async def goto(self, url: str) -> int:
        """Load a page (following redirects) and wait for its load event; the main document's HTTP status."""
        mark = len(self.browser.events)
        navigated = await self.send("Page.navigate", {"url": url})
        if navigated.get("errorText"):
            raise RuntimeError(f"{url}: {navigated['errorText']}")
        await self.browser.event("Page.loadEventFired", session=self.session, after=mark)
        statuses = [params["response"]["status"] for name, params, where in self.browser.events[mark:]
                    if name == "Network.responseReceived" and where == self.session and params["type"] == "Document"]
        return int(statuses[-1])

    async def run(self, expression: str) -> Any:
        """The value of a script expression in the page (awaited if it is a promise)."""
        result = await self.send("Runtime.evaluate", {"expression": expression, "returnByValue": True,
                                                      "awaitPromise": True})
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    async def wait_for(self, expression: str, timeout: float = 10.0) -> Any:
        """Poll a script expression until it is truthy; its value."""
        deadline = time.monotonic() + timeout
        while True:
            value = await self.run(expression)
            if value:
                return value
            if time.monotonic() > deadline:
                raise TimeoutError(f"{expression} stayed falsy for {timeout} s")
            await asyncio.sleep(0.05)

    async def screenshot(self, path: Path) -> Path:
        """The whole page (not only the window) as a PNG file."""
        size = (await self.send("Page.getLayoutMetrics"))["cssContentSize"]
        shot = await self.send("Page.captureScreenshot", {
            "format": "png", "captureBeyondViewport": True,
            "clip": {"x": 0, "y": 0, "width": size["width"], "height": size["height"], "scale": 1}})
        await asyncio.to_thread(_write, path, base64.b64decode(shot["data"]))
        return path

    def problems(self) -> list[str]:
        """Uncaught exceptions, console errors, error log entries (CSP violations, failed loads), dialogs."""
        found = []
        for name, params, where in self.browser.events:
            if where != self.session:
                continue
            if name == "Runtime.exceptionThrown":
                details = params["exceptionDetails"]
                found.append(f"exception: {details.get('exception', {}).get('description') or details['text']}")
            elif name == "Runtime.consoleAPICalled" and params["type"] in ("error", "assert"):
                found.append("console: " + " ".join(str(a.get("value", a.get("description")))
                                                     for a in params["args"]))
            elif name == "Log.entryAdded" and params["entry"]["level"] == "error":
                found.append(f"log ({params['entry']['source']}): {params['entry']['text']}")
            elif name == "Page.javascriptDialogOpening":
                found.append(f"dialog: {params['message']}")
        return found


def _write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


@contextlib.asynccontextmanager
async def launch(executable: str, profile: Path) -> AsyncIterator[Browser]:
    """A headless Chromium with a fresh profile, and its DevTools connection."""
    args = [executable, "--headless=new", "--remote-debugging-port=0", f"--user-data-dir={profile}",
            "--no-first-run", "--no-default-browser-check", "--disable-gpu", "--disable-extensions",
            "--disable-background-networking", "--disable-sync", "--disable-dev-shm-usage",
            "--window-size=1280,900", "about:blank"]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        args.insert(1, "--no-sandbox")  # Chromium refuses to run as root with its sandbox (containers, CI)
    log_path = profile.parent / "chromium.log"
    with log_path.open("wb") as log:
        process = await asyncio.create_subprocess_exec(*args, stdout=log, stderr=subprocess.STDOUT)
    try:
        port_file = profile / "DevToolsActivePort"
        deadline = time.monotonic() + 60
        while not (port_file.exists() and len(port_file.read_text().splitlines()) >= 2):
            if process.returncode is not None or time.monotonic() > deadline:
                raise RuntimeError(f"chromium did not start (exit {process.returncode}): "
                                   f"{log_path.read_text(errors='replace')[-2000:]}")
            await asyncio.sleep(0.05)
        port, path = port_file.read_text().splitlines()[:2]
        async with aiohttp.ClientSession() as http:
            ws = await http.ws_connect(f"ws://127.0.0.1:{port}{path}", max_msg_size=0)
            browser = Browser(ws)
            try:
                yield browser
            finally:
                await browser.close()
    finally:
        if process.returncode is None:
            process.terminate()
            try:
                await asyncio.wait_for(process.wait(), 10)
            except TimeoutError:
                process.kill()
                await process.wait()
