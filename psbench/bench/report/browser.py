"""Open a report in headless Chromium and say what a reader would see: console errors, images that
did not load, and a full-page screenshot.

Chromium is driven over the DevTools protocol on a pipe (`--remote-debugging-pipe`: JSON messages
ending in NUL, commands on the child's fd 3, replies and events on its fd 4), so no driver package
and no port are needed; the browser runs under the process supervisor and always stops.
Chromium comes from Debian's `chromium` package (.ci/install-chromium.sh).
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

from psbench.core.atomic import atomic_write
from psbench.core.errors import ConfigError
from psbench.core.supervisor import Supervisor

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome")
# Headless as root, no network beyond the page (the machine's network is closed to it anyway).
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", "--hide-scrollbars", "--window-size=1280,900", "--remote-debugging-pipe"]
IMAGES_JS = """JSON.stringify(Array.from(document.images).map(i => ({alt: i.alt, complete: i.complete,
    width: i.naturalWidth, height: i.naturalHeight})))"""


@dataclass
class PageCheck:
    url: str
    errors: list[str] = field(default_factory=list)        # console errors, exceptions, failed loads
    images: list[dict[str, Any]] = field(default_factory=list)  # alt, complete, width, height
    screenshot: Path | None = None
    title: str = ""

    @property
    def broken_images(self) -> list[dict[str, Any]]:
        return [i for i in self.images if not i["complete"] or i["width"] == 0]

    @property
    def ok(self) -> bool:
        return not self.errors and not self.broken_images


def chromium_path() -> str | None:
    return next((p for p in map(shutil.which, CHROMIUM_NAMES) if p), None)


class DevTools:
    """The DevTools protocol over the two pipes: send a command, wait for its reply; events are kept."""

    def __init__(self, read_fd: int, write_fd: int):
        self.read_fd, self.write_fd = read_fd, write_fd
        self.buffer = b""
        self.next_id = 0
        self.events: list[dict[str, Any]] = []

    def send(self, method: str, params: dict[str, Any] | None = None, session: str | None = None,
             timeout_s: float = 30.0) -> dict[str, Any]:
        self.next_id += 1
        message: dict[str, Any] = {"id": self.next_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        os.write(self.write_fd, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + timeout_s
        while True:
            reply = self._receive(deadline)
            if reply.get("id") == self.next_id:
                if "error" in reply:
                    raise RuntimeError(f"chromium: {method}: {reply['error'].get('message')}")
                return reply.get("result", {})
            self.events.append(reply)

    def wait_event(self, method: str, timeout_s: float = 30.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while True:
            for event in self.events:
                if event.get("method") == method:
                    return event
            self.events.append(self._receive(deadline))

    def drain(self, quiet_s: float = 0.3) -> None:
        """Keep reading events until none has come for quiet_s (late console messages)."""
        while True:
            try:
                self.events.append(self._receive(time.monotonic() + quiet_s))
            except TimeoutError:
                return

    def _receive(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self.buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.read_fd], [], [], left)[0]:
                raise TimeoutError("chromium did not answer in time")
            chunk = os.read(self.read_fd, 1 << 20)
            if not chunk:
                raise RuntimeError("chromium closed its DevTools pipe (it exited)")
            self.buffer += chunk
        message, _, self.buffer = self.buffer.partition(b"\0")
        return json.loads(message)


def check_page(html: Path, screenshot: Path | None = None, timeout_s: float = 60.0) -> PageCheck:
    """Load `html` in headless Chromium; collect errors and image states; save a full-page PNG."""
    binary = chromium_path()
    if binary is None:
        raise ConfigError("opening the report in a browser needs Chromium: apt-get install -y chromium "
                          "(or run .ci/install-chromium.sh)")
    html = Path(html).resolve()
    check = PageCheck(html.as_uri())
    to_child, from_parent = os.pipe()    # commands: we write from_parent, chromium reads fd 3
    to_parent, from_child = os.pipe()    # replies: chromium writes fd 4, we read to_parent
    to_child, from_child = _above_4(to_child), _above_4(from_child)
    profile = tempfile.mkdtemp(prefix="psbench-chromium-")
    # bash puts the pipe ends on fds 3 and 4 (dash cannot name fds above 9), then becomes chromium.
    wrapper = f'exec "$0" "$@" 3<&{to_child} 4>&{from_child} {to_child}<&- {from_child}>&-'
    try:
        with Supervisor(grace_s=2.0) as sup:
            sup.spawn("chromium", ["bash", "-c", wrapper, binary, *FLAGS, f"--user-data-dir={profile}"],
                      pass_fds=(to_child, from_child), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            os.close(to_child)
            os.close(from_child)
            tools = DevTools(to_parent, from_parent)
            target = tools.send("Target.createTarget", {"url": "about:blank"}, timeout_s=timeout_s)["targetId"]
            session = tools.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
            for domain in ("Page", "Runtime", "Log", "Network"):
                tools.send(f"{domain}.enable", session=session)
            tools.send("Page.navigate", {"url": check.url}, session=session)
            tools.wait_event("Page.loadEventFired", timeout_s=timeout_s)
            tools.drain()
            result = tools.send("Runtime.evaluate", {"expression": IMAGES_JS, "returnByValue": True}, session=session)
            check.images = json.loads(result["result"]["value"])
            check.title = tools.send("Runtime.evaluate", {"expression": "document.title", "returnByValue": True},
                                     session=session)["result"].get("value", "")
            if screenshot is not None:
                size = tools.send("Page.getLayoutMetrics", session=session)["cssContentSize"]
                shot = tools.send("Page.captureScreenshot", {
                    "format": "png", "captureBeyondViewport": True,
                    "clip": {"x": 0, "y": 0, "width": size["width"], "height": size["height"], "scale": 1}},
                    session=session, timeout_s=timeout_s)
                png = base64.b64decode(shot["data"])
                atomic_write(Path(screenshot), lambda tmp: tmp.write_bytes(png))
                check.screenshot = Path(screenshot)
            tools.drain(0.1)
            check.errors = page_errors(tools.events)
            try:
                tools.send("Browser.close", timeout_s=5.0)
            except (TimeoutError, RuntimeError):
                pass  # the supervisor stops it
    finally:
        for fd in (to_parent, from_parent):
            try:
                os.close(fd)
            except OSError:
                pass
        shutil.rmtree(profile, ignore_errors=True)
    return check


def _above_4(fd: int) -> int:
    """The same pipe end on a number above 4, so moving it onto fd 3 or 4 in the child clobbers nothing."""
    import fcntl

    high = fcntl.fcntl(fd, fcntl.F_DUPFD, 10)
    os.close(fd)
    return high


def page_errors(events: list[dict[str, Any]]) -> list[str]:
    """Console errors, uncaught exceptions, error log entries and failed resource loads, as text."""
    errors = []
    for event in events:
        method, params = event.get("method"), event.get("params", {})
        if method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
            errors.append("console: " + " ".join(str(a.get("value", a.get("description", ""))) for a in params["args"]))
        elif method == "Runtime.exceptionThrown":
            details = params.get("exceptionDetails", {})
            errors.append("exception: " + str(details.get("exception", {}).get("description") or details.get("text")))
        elif method == "Log.entryAdded" and params.get("entry", {}).get("level") == "error":
            entry = params["entry"]
            errors.append(f"log ({entry.get('source')}): {entry.get('text')} {entry.get('url', '')}".strip())
        elif method == "Network.loadingFailed" and not params.get("canceled"):
            errors.append(f"load failed: {params.get('errorText')} ({params.get('type')})")
    return errors

