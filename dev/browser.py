"""Driving farm-label's page in a real Chromium: the browser tests (tests/browser/) and the scripted
labelling run (dev/label_scripted.py) share these.

Debian's `chromium` and `chromium-driver` (`make test-browser` installs them), through Selenium:
chromedriver comes from the same Debian package version as the browser, so the two always speak the
same protocol, and nothing is downloaded (Selenium's own driver manager is never called when the
driver's path is given).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

CHROMIUM = Path(os.environ.get("FARMKIT_CHROMIUM", "/usr/bin/chromium"))
CHROMEDRIVER = Path(os.environ.get("FARMKIT_CHROMEDRIVER", "/usr/bin/chromedriver"))
# what a headless Chromium needs on a CI machine run as root, without a GPU, with no network beyond
# loopback: nothing started in the background that would phone home or update itself
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)
FARM_LABEL = Path(sys.executable).parent / "farm-label"
WAIT_SECONDS = 15.0


def chromium_missing() -> str | None:
    """Why the browser cannot be driven here (one line), or None when it can."""
    for path, package in ((CHROMIUM, "chromium"), (CHROMEDRIVER, "chromium-driver")):
        if not path.exists():
            return f"{path} is missing (Debian's {package}; `make test-browser` installs it)"
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (the dev extra; `make test-browser` installs it)"
    return None


@contextmanager
def open_browser(width: int = 1280, height: int = 800) -> Iterator:
    """A fresh headless Chromium (its own user-data-dir, removed afterwards) whose page area is
    WIDTH x HEIGHT CSS pixels; quit when the block ends."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    with tempfile.TemporaryDirectory(prefix="farmkit-chromium-") as profile:
        options = webdriver.ChromeOptions()
        options.binary_location = str(CHROMIUM)
        for flag in (*CHROMIUM_FLAGS, f"--user-data-dir={profile}"):
            options.add_argument(flag)
        # a dialog left open is reported by the test that looks for it, not dismissed on the way
        options.set_capability("unhandledPromptBehavior", "ignore")
        driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
        try:
            # the window includes the headless frame; the page area is what a screenshot shows
            driver.execute_cdp_cmd(
                "Emulation.setDeviceMetricsOverride",
                {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
            )
            yield driver
        finally:
            driver.quit()


class LabelServer:
    """A real `farm-label` process: started with ARGS, its links read from its stderr."""

    def __init__(
        self, *args: str | Path, env: dict | None = None, preexec_fn: Callable | None = None
    ) -> None:
        self.args = [str(FARM_LABEL), *map(str, args)]
        self.stderr: list[str] = []
        self.links: dict[str, str] = {}
        self._ready = threading.Event()
        self.process = subprocess.Popen(
            self.args,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, **(env or {})},
            preexec_fn=preexec_fn,  # a test's limits for the server (a full disk)
        )
        # stderr is drained all along, so a chatty server never blocks on a full pipe
        threading.Thread(target=self._read_stderr, daemon=True).start()
        if not self._ready.wait(WAIT_SECONDS * 2) or "status" not in self.links:
            self.stop()
            raise RuntimeError(f"farm-label printed no status link:\n{''.join(self.stderr)}")

    def _read_stderr(self) -> None:
        for line in self.process.stderr:
            self.stderr.append(line)
            words = line.split()
            if len(words) == 3 and words[0] == "farm-label:" and words[2].startswith("http"):
                self.links[words[1]] = words[2]
                if words[1] == "status":
                    self._ready.set()
        self._ready.set()

    @property
    def port(self) -> int:
        return int(self.links["status"].split("/")[2].rsplit(":", 1)[1])

    def kill(self) -> None:
        """SIGKILL: no chance to clean up, as when the machine loses power."""
        self.process.kill()
        self.process.wait(WAIT_SECONDS)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(WAIT_SECONDS)
            except subprocess.TimeoutExpired:
                self.kill()

    def __enter__(self) -> LabelServer:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def wait_until(driver, condition, message: str):
    """CONDITION(driver)'s first truthy value within WAIT_SECONDS, or a failure saying MESSAGE."""
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, WAIT_SECONDS, poll_frequency=0.02).until(condition, message)


def plain(text: str | None) -> str | None:
    """TEXT with its whitespace collapsed."""
    return None if text is None else " ".join(text.split())


def shown_text(markdown: str) -> str:
    """What the page shows of an output (the text of its rendered markdown, whitespace collapsed),
    to compare with plain() of an element's textContent: a list's "1." or a code fence's backticks
    are markup, not text."""
    from html.parser import HTMLParser

    from farmkit.annotate.label.render import markdown_html

    texts: list[str] = []
    parser = HTMLParser(convert_charrefs=True)
    parser.handle_data = texts.append
    parser.feed(markdown_html(markdown))
    parser.close()
    return " ".join("".join(texts).split())


def page_state(driver) -> dict | None:
    """What the annotator sees: progress, whether all is done, the texts, the error, the buttons
    (None while the page is not farm-label's)."""
    return driver.execute_script(
        """
        if (!document.getElementById("progress")) return null;
        const text = (selector) => document.querySelector(selector).textContent;
        const shown = (id) => !document.getElementById(id).hidden;
        return {
          progress: text("#progress"),
          done: shown("done"),
          task: shown("task"),
          instruction: text("#instruction"),
          input: shown("input") ? text("#input") : null,
          left: text("#left .markdown"),
          right: text("#right .markdown"),
          error: shown("error") ? text("#error") : null,
          skipped_before: shown("skipped-before"),
          comment: document.getElementById("comment").value,
          ready: !document.querySelector("#undo").disabled ||
                 !document.querySelector("#choices button").disabled,
          can_undo: !document.querySelector("#undo").disabled,
        };
        """
    )


def open_page(driver, link: str) -> dict:
    """Load LINK and wait until the page has shown its first state."""
    driver.get(link)
    return wait_until(driver, _loaded, f"the page at {link} showed no state")


def reload_page(driver) -> dict:
    """Reload the page, as an annotator would, and wait until it has shown its state."""
    driver.refresh()
    return wait_until(driver, _loaded, "the reloaded page showed no state")


def _loaded(driver):
    state = page_state(driver)
    return (
        state
        if state and state["progress"].count("/") == 1 and (state["task"] or state["done"])
        else None
    )


def _settled(driver, before: dict):
    """The page's state once a request sent from BEFORE has been answered (the progress moved, or
    an error is shown), else None."""
    state = page_state(driver)
    if state["progress"] != before["progress"] or (state["error"] and not before["error"]):
        return state if state["ready"] or state["done"] or state["error"] else None
    return None


def act(driver, action) -> dict:
    """Do ACTION (a callable on the driver: a click, a key) and wait for the page to move on."""
    before = page_state(driver)
    action(driver)
    return wait_until(driver, lambda d: _settled(d, before), "the page did not move on")


def click(selector: str):
    """An action: click the element SELECTOR (a real mouse click, through chromedriver)."""
    from selenium.webdriver.common.by import By

    return lambda driver: driver.find_element(By.CSS_SELECTOR, selector).click()


def double_click(selector: str):
    """An action: double-click the element SELECTOR."""
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By

    return lambda driver: (
        ActionChains(driver).double_click(driver.find_element(By.CSS_SELECTOR, selector)).perform()
    )


def press(key: str):
    """An action: press KEY on the page (a real key event, through chromedriver)."""
    from selenium.webdriver.common.action_chains import ActionChains

    return lambda driver: ActionChains(driver).send_keys(key).perform()


def choose(choice: str):
    """An action: click the button of CHOICE (A_much, A_slightly, tie, B_slightly, B_much)."""
    return click(f'button[data-choice="{choice}"]')
