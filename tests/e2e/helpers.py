"""Helpers for the browser tests: the app's page list (read from the router's source, never imported), the server
process, and waiting on Streamlit in a real browser."""
from __future__ import annotations

import ast
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "artifacts"
SCREENSHOTS = ARTIFACTS / "screenshots"
CHROMIUM = os.environ.get("TRIAGE_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-dev-shm-usage"]
# The router the suite starts. Default: the real app. TRIAGE_E2E_APP points at another router (an absolute path, run
# from the repository root) to try pages that are not registered yet.
APP = os.environ.get("TRIAGE_E2E_APP", "app.py")
EXCEPTION = '[data-testid="stException"]'
ERROR_TEXTS = ("This app has encountered an error", "Traceback (most recent call last)")
# Generous bounds: this suite must pass on 2 busy cores, and never hang.
START_TIMEOUT_S = float(os.environ.get("TRIAGE_E2E_START_TIMEOUT_S", 180))
LOAD_TIMEOUT_S = float(os.environ.get("TRIAGE_E2E_LOAD_TIMEOUT_S", 300))  # first load of the embedded model


# A machine set up with `bash scripts/setup.sh --dev` (CI's) has Playwright and Chromium: missing, they mean a broken
# setup, and the browser tests fail rather than skip, unless this variable says to skip them on purpose.
SKIP_BROWSER_ENV = "TRIAGE_TESTS_WITHOUT_BROWSER"


def browser_missing() -> str | None:
    """Why the browser tests cannot run here, or None."""
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "the browser tests need Playwright (bash scripts/setup.sh --dev)"
    if not Path(CHROMIUM).exists():
        return f"no Chromium at {CHROMIUM} (bash scripts/setup.sh --dev installs Debian's)"
    return None


def require_browser() -> None:
    """At a browser test module's top: fail its collection when the browser is missing, or skip it when
    SKIP_BROWSER_ENV=1 says so."""
    reason = browser_missing()
    if reason is None:
        return
    if os.environ.get(SKIP_BROWSER_ENV) == "1":
        pytest.skip(reason, allow_module_level=True)
    pytest.fail(f"{reason}. Set {SKIP_BROWSER_ENV}=1 to skip the browser tests on purpose.", pytrace=False)


def app_pages(app: str | os.PathLike = APP) -> list[tuple[str, str, str]]:
    """The router's PAGES list of (file, title, icon), read with ast: importing app.py would run Streamlit."""
    path = Path(app) if Path(app).is_absolute() else ROOT / app
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in tree.body:
        targets = (node.targets if isinstance(node, ast.Assign)
                   else [node.target] if isinstance(node, ast.AnnAssign) else [])
        if any(isinstance(t, ast.Name) and t.id == "PAGES" for t in targets):
            pages = ast.literal_eval(node.value)
            return [tuple(p) for p in pages]
    raise AssertionError(f"{path} has no literal PAGES = [...] list; the e2e tests read the pages from it.")


def url_path(page_file: str) -> str:
    """The URL Streamlit gives an st.Page made from a file: its name without a leading number and extension."""
    return re.sub(r"^[0-9]+[_ -]*", "", Path(page_file).stem)


def page_registered(page_file: str) -> bool:
    return any(p[0] == page_file for p in app_pages())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_get(url: str, timeout: float = 10.0) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:  # noqa: S310 - loopback only
            return r.status, r.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode("utf-8", "replace")


def _die_with_parent() -> None:
    """In the child before exec: get SIGTERM if the test process dies without stopping us (killed pytest)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


@dataclass
class AppServer:
    """One `streamlit run` of the app on 127.0.0.1, in its own process group, with the checkout's
    .streamlit/config.toml as the README's command has it (its file watcher off among the rest)."""

    app: str
    db: Path
    log: Path
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen | None = None
    env: dict[str, str] = field(default_factory=dict)  # added to the server's environment
    root: Path = ROOT  # the checkout whose app is served (a benchmark may serve an older one)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> "AppServer":
        env = dict(os.environ, TRIAGE_DB=str(self.db), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
                   PYTHONUNBUFFERED="1", STREAMLIT_BROWSER_GATHER_USAGE_STATS="false", **self.env)
        self.log.parent.mkdir(parents=True, exist_ok=True)
        out = self.log.open("wb")
        cmd = [sys.executable, "-m", "streamlit", "run", self.app, "--server.port", str(self.port),
               "--server.address", "127.0.0.1", "--server.headless", "true", "--browser.gatherUsageStats", "false"]
        self.proc = subprocess.Popen(cmd, cwd=self.root, env=env, stdout=out, stderr=subprocess.STDOUT,
                                     start_new_session=True, preexec_fn=_die_with_parent)
        out.close()
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"The app exited with {self.proc.returncode} while starting:\n{self.log_tail()}")
            if self.healthy(timeout=3):
                return self
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"The app did not answer /_stcore/health within {START_TIMEOUT_S:.0f} s:\n{self.log_tail()}")

    def healthy(self, timeout: float = 10.0) -> bool:
        try:
            return http_get(self.url + "/_stcore/health", timeout) == (200, "ok")
        except OSError:
            return False

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        for sig, wait_s in ((signal.SIGTERM, 20), (signal.SIGKILL, 10)):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                return
            try:
                self.proc.wait(wait_s)
                return
            except subprocess.TimeoutExpired:
                continue

    def log_text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def log_tail(self, n: int = 60) -> str:
        return "\n".join(self.log_text().splitlines()[-n:])

    def rss_bytes(self) -> int:
        """Resident memory of the server process (it holds the models), from /proc."""
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        raise AssertionError("no VmRSS")

    def cpu_seconds(self, main_thread_only: bool = False) -> float:
        """CPU time used so far by the server (or its main thread: the event loop that serves every websocket)."""
        pid = self.proc.pid
        stat = Path(f"/proc/{pid}/task/{pid}/stat" if main_thread_only else f"/proc/{pid}/stat").read_text()
        fields = stat[stat.rindex(")") + 2:].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def metrics(self) -> str:
        return http_get(self.url + "/_stcore/metrics")[1]


# ---- the browser side ----------------------------------------------------------------------------------------------
def watch_dialogs(page, dialogs: list[str]) -> None:
    """Record (and dismiss) every JavaScript dialog: alert(), confirm(), prompt() must never open."""
    page.on("dialog", lambda d: (dialogs.append(f"{d.type}: {d.message}"), d.dismiss()))


def new_page(browser, dialogs: list[str]):
    """A fresh browser context (a new Streamlit session) and a page in it."""
    context = browser.new_context(viewport={"width": 1400, "height": 1000}, accept_downloads=True)
    context.set_default_timeout(60_000)
    page = context.new_page()
    watch_dialogs(page, dialogs)
    return context, page


IDLE_JS = """() => {
  const app = document.querySelector('[data-testid="stApp"]');
  return !!app && app.getAttribute('data-test-connection-state') === 'CONNECTED'
      && app.getAttribute('data-test-script-state') === 'notRunning';
}"""


def wait_idle(page, timeout_s: float = 120.0, settle_s: float = 0.5) -> None:
    """Until the script run finished and the page stayed idle for settle_s (a rerun may follow a run)."""
    deadline = time.monotonic() + timeout_s
    while True:
        page.wait_for_function(IDLE_JS, timeout=max(1.0, deadline - time.monotonic()) * 1000)
        page.wait_for_timeout(settle_s * 1000)
        if page.evaluate(IDLE_JS):
            return
        if time.monotonic() > deadline:
            raise TimeoutError("Streamlit kept rerunning")


def goto(page, server: AppServer, path: str = "", timeout_s: float = 120.0) -> None:
    page.goto(f"{server.url}/{path}", timeout=timeout_s * 1000, wait_until="domcontentloaded")
    page.wait_for_selector('[data-testid="stApp"]', timeout=timeout_s * 1000)
    page.wait_for_selector('[data-testid="stMainBlockContainer"] h1', timeout=timeout_s * 1000)
    wait_idle(page, timeout_s)


def errors_on(page) -> list[str]:
    """Streamlit exception boxes and error texts on the page (empty when clean)."""
    found = [e.inner_text()[:500] for e in page.locator(EXCEPTION).all()]
    body = page.inner_text("body")
    found += [t for t in ERROR_TEXTS if t in body]
    return found


def screenshot(page, name: str, max_height: int = 5000) -> Path:
    """The whole page: Streamlit scrolls inside its main block, so the viewport is made as tall as the content."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"{re.sub(r'[^A-Za-z0-9_.-]+', '_', name)}.png"
    size = page.viewport_size
    height = page.evaluate("() => { const m = document.querySelector('[data-testid=\"stMain\"]');"
                           " return m ? m.scrollHeight : document.body.scrollHeight; }")
    page.set_viewport_size({"width": size["width"], "height": max(size["height"], min(int(height) + 40, max_height))})
    page.wait_for_timeout(400)
    page.screenshot(path=str(path), full_page=True)
    page.set_viewport_size(size)
    return path


def metric_value(page, label: str) -> str:
    metric = page.locator('[data-testid="stMetric"]').filter(
        has=page.locator('[data-testid="stMetricLabel"]', has_text=label))
    return metric.first.locator('[data-testid="stMetricValue"]').inner_text()


def keep_only_chip(page, multiselect: str, name: str) -> None:
    """Remove every chosen option of the multiselect labelled `multiselect` except `name`, with the chips' own remove
    buttons, one at a time: each removal reruns the page, and a click while it reruns can be lost."""
    box = page.locator('[data-testid="stMultiSelect"]').filter(has_text=multiselect)

    def chosen() -> list[str]:
        return box.locator("[data-tag]").evaluate_all("tags => tags.map(t => t.getAttribute('aria-label'))")

    if len(chosen()) > 3:  # the built-in set has 48 prompts: clear them all at once, then choose the one
        box.get_by_role("button", name="Clear all").click()
        wait_idle(page)
        box.locator("input").first.click()
        page.get_by_role("option", name=name, exact=True).click()
        page.keyboard.press("Escape")
        wait_idle(page)
    for _ in range(5):
        others = [t for t in chosen() if t != name]
        if not others:
            break
        box.get_by_role("button", name=f"Remove {others[0]}", exact=True).click()
        wait_idle(page)
    assert chosen() == [name], chosen()
