"""A page opened in headless Chromium, driven over the DevTools protocol with the standard
library only (``--remote-debugging-pipe``: JSON messages ending in a NUL byte, commands on the
browser's fd 3, answers and events on its fd 4).

What a test needs from a real browser: the console errors and uncaught exceptions a page
raises, the requests it makes, where an element lands on the first screen, and a screenshot.
"""

from __future__ import annotations

import base64
import json
import os
import select
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: Names Debian and others give the browser; ``$BMOE_CHROMIUM`` names another.
NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")

#: Flags that keep a headless browser to itself: no sandbox (containers run as root), no GPU,
#: nothing fetched in the background, a profile of its own.
FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--disable-extensions", "--hide-scrollbars", "--mute-audio",
)  # fmt: skip


def find_chromium() -> str | None:
    """The browser to run, or None when none is installed."""
    named = os.environ.get("BMOE_CHROMIUM")
    if named:
        return shutil.which(named) or (named if os.access(named, os.X_OK) else None)
    return next((path for name in NAMES if (path := shutil.which(name))), None)


@dataclass
class PageVisit:
    """What opening a page showed."""

    errors: list[str] = field(default_factory=list)  # console errors, uncaught exceptions
    requests: list[str] = field(default_factory=list)  # every URL the page asked for
    evaluated: Any = None  # the value of the expression evaluated once the page loaded
    screenshot: bytes = b""  # PNG of the first screen


class DevTools:
    """One browser process and its protocol pipe."""

    def __init__(self, browser: str, timeout: float = 60.0) -> None:
        self.timeout = timeout
        self.profile = tempfile.mkdtemp(prefix="bmoe-chromium-")
        to_browser_r, self._to_browser = os.pipe()
        self._from_browser, from_browser_w = os.pipe()

        def fds() -> None:  # the browser reads commands on 3 and writes answers on 4
            os.dup2(to_browser_r, 3)
            os.dup2(from_browser_w, 4)

        self.process = subprocess.Popen(
            [browser, *FLAGS, f"--user-data-dir={self.profile}", "--remote-debugging-pipe",
             "about:blank"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            pass_fds=(3, 4), preexec_fn=fds,
        )  # fmt: skip
        os.close(to_browser_r)
        os.close(from_browser_w)
        self._next = 0
        self._buffer = b""
        self.events: list[dict[str, Any]] = []

    def send(self, method: str, params: dict | None = None, session: str | None = None) -> Any:
        """Send a command and wait for its answer (events that come first are kept)."""
        self._next += 1
        message: dict[str, Any] = {"id": self._next, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        os.write(self._to_browser, json.dumps(message).encode() + b"\0")
        while True:
            reply = self._read()
            if reply.get("id") == self._next:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)

    def wait_for(self, method: str) -> dict[str, Any]:
        """The first event `method` (kept ones first)."""
        for event in self.events:
            if event.get("method") == method:
                return event
        while True:
            event = self._read()
            self.events.append(event)
            if event.get("method") == method:
                return event

    def _read(self) -> dict[str, Any]:
        deadline = time.monotonic() + self.timeout
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._from_browser], [], [], left)[0]:
                raise TimeoutError(f"no answer from the browser in {self.timeout:g} s")
            chunk = os.read(self._from_browser, 1 << 16)
            if not chunk:
                raise RuntimeError("the browser closed its protocol pipe")
            self._buffer += chunk
        message, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(message)

    def close(self) -> None:
        try:
            if self.process.poll() is None:
                self.send("Browser.close")
        except (OSError, RuntimeError, TimeoutError):
            pass
        finally:
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
            os.close(self._to_browser)
            os.close(self._from_browser)
            shutil.rmtree(self.profile, ignore_errors=True)


def visit(
    browser: str, page: Path, expression: str, width: int = 1280, height: int = 720
) -> PageVisit:
    """Open `page` in a `width` x `height` viewport, wait for it to load, evaluate
    `expression` (its JSON value is returned) and take a screenshot of the first screen."""
    tools = DevTools(browser)
    try:
        target = tools.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = tools.send("Target.attachToTarget", {"targetId": target, "flatten": True})[
            "sessionId"
        ]
        for domain in ("Runtime", "Log", "Page", "Network"):
            tools.send(f"{domain}.enable", session=session)
        tools.send(
            "Emulation.setDeviceMetricsOverride",
            {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
            session=session,
        )
        tools.events.clear()  # what about:blank said is not the page's
        tools.send("Page.navigate", {"url": page.resolve().as_uri()}, session=session)
        tools.wait_for("Page.loadEventFired")
        value = tools.send(
            "Runtime.evaluate",
            {"expression": expression, "returnByValue": True, "awaitPromise": True},
            session=session,
        )
        shot = tools.send("Page.captureScreenshot", {"format": "png"}, session=session)
        out = PageVisit(
            evaluated=value.get("result", {}).get("value"),
            screenshot=base64.b64decode(shot["data"]),
        )
        for event in tools.events:
            method, params = event.get("method"), event.get("params", {})
            if method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
                out.errors.append(
                    "console: " + " ".join(str(a.get("value", a)) for a in params["args"])
                )
            elif method == "Runtime.exceptionThrown":
                details = params["exceptionDetails"]
                said = details.get("exception", {}).get("description") or details.get("text")
                out.errors.append(f"exception: {said}")
            elif method == "Log.entryAdded" and params["entry"].get("level") == "error":
                out.errors.append(f"log: {params['entry'].get('text')}")
            elif method == "Network.requestWillBeSent":
                out.requests.append(params["request"]["url"])
        return out
    finally:
        tools.close()
