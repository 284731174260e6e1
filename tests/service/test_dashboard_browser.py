"""The operator dashboard in a real browser: Debian's Chromium, driven by Selenium, watches a job train; a page on
another port of the same host cannot use the login to cancel it; logging out ends the login.

The test set-up installs Chromium and its driver with apt when they are missing (once per machine, under a file
lock so parallel workers do not run apt at once); a failed install fails the test with apt's output."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import httpx
import pytest
from filelock import FileLock
from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException, TimeoutException, WebDriverException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as EC
from selenium.webdriver.support.ui import WebDriverWait

from tests.json_server import http_server

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
APT_LOCK = Path(tempfile.gettempdir()) / "artsvc-chromium-apt.lock"
APT_TIMEOUT_S = 900


def ensure_chromium() -> float | None:
    """Install Debian's chromium and chromium-driver if either is missing; the seconds apt took (None: nothing to do).

    Raises RuntimeError with apt's output when the install fails."""
    with FileLock(str(APT_LOCK), timeout=APT_TIMEOUT_S + 60):
        if CHROMIUM.exists() and CHROMEDRIVER.exists():
            return None
        started = time.monotonic()
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        for command in (
            ["apt-get", "update"],
            ["apt-get", "install", "-y", "--no-install-recommends", "chromium", "chromium-driver"],
        ):
            try:
                done = subprocess.run(
                    command, check=False, env=env, capture_output=True, text=True, timeout=APT_TIMEOUT_S
                )
            except (OSError, subprocess.TimeoutExpired) as exc:
                raise RuntimeError(f"{' '.join(command)} could not run: {exc}") from None
            if done.returncode != 0:
                output = f"{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
                raise RuntimeError(f"{' '.join(command)} exited {done.returncode}:\n{output}")
        if not (CHROMIUM.exists() and CHROMEDRIVER.exists()):
            raise RuntimeError(f"apt installed chromium but {CHROMIUM} or {CHROMEDRIVER} is still missing")
        return time.monotonic() - started


@pytest.fixture(scope="session")
def chromium() -> Path:
    """Debian's Chromium, installed by the set-up when missing. Never a skip: CI must run the browser test."""
    try:
        took = ensure_chromium()
    except RuntimeError as exc:
        pytest.fail(f"installing Chromium failed:\n{exc}", pytrace=False)
    if took is not None:
        print(f"installed chromium and chromium-driver with apt in {took:.0f} s")
    return CHROMIUM


SPEC = {
    "environment": "math",
    "model": {"base_model": "embedded/char-gpt-0.2m"},  # the smallest policy: this watches the page, not learning
    "training": {"warm_start_examples": 0, "max_steps": 200, "groups_per_step": 2, "group_size": 2},
    # never stops by itself while the browser watches (no plateau): the test cancels it once it has seen enough
    "validation": {"every_n_steps": 2, "max_examples": 8, "patience": 1000, "min_delta": 0.0},
}
ARTIFACT = Path(__file__).resolve().parents[2] / "artifacts" / "dashboard-job.png"
CHROME_ARGS = ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-quic",
               "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync",
               "--window-size=1280,1000")  # fmt: skip
WAIT_S = 120


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def server(tmp_path) -> Iterator[tuple[str, str, Path]]:
    """`artsvc serve` (bearer tokens, one worker process) on a loopback port: its URL, a client token, its log."""
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("ARTSVC_")}
    env.update(ARTSVC_DATA_DIR=str(tmp_path / "data"), ARTSVC_CLIENT_BASE_MODELS=SPEC["model"]["base_model"],
               ARTSVC_WORKER_CPU_POLICY="nice")  # not SCHED_IDLE: the suite's other process keeps the cores busy
    cli = [sys.executable, "-m", "service"]
    subprocess.run([*cli, "db", "upgrade"], env=env, check=True, capture_output=True, timeout=120)
    made = subprocess.run([*cli, "token", "create", "--role", "client", "--name", "browser"], env=env, check=True,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    token = made.stdout.strip().splitlines()[-1]
    log = tmp_path / "server.log"
    with log.open("w") as sink:
        process = subprocess.Popen([*cli, "serve", "--port", str(port)], env=env, stdout=sink, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(f"{base}/healthz", timeout=1).json()["status"] == "ok":
                    break
            except (httpx.TransportError, ValueError, KeyError):
                pass
            assert process.poll() is None and time.monotonic() < deadline, log.read_text()[-4000:]
            time.sleep(0.2)
        yield base, token, log
    finally:
        process.terminate()
        process.wait(timeout=60)


@pytest.fixture
def browser(chromium, tmp_path) -> Iterator[webdriver.Chrome]:
    """Headless Chromium on a fresh profile, driven through Debian's chromedriver (Selenium Manager is never asked)."""
    options = webdriver.ChromeOptions()
    options.binary_location = str(chromium)
    for argument in CHROME_ARGS:
        options.add_argument(argument)
    options.add_argument(f"--user-data-dir={tmp_path / 'chromium-profile'}")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(executable_path=str(CHROMEDRIVER)), options=options)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture
def attacker() -> Iterator[str]:
    """A page on another loopback port (same site as the service: SameSite=Strict cookies go along) whose form
    posts to ``?target=``; yields its base URL."""

    class Page(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            target = self.path.split("?target=", 1)[-1]
            body = f'<form method="post" action="{target}"><button id="forge">win a prize</button></form>'.encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    with http_server(Page) as url:
        yield url


def _save_screenshot(driver: webdriver.Chrome) -> None:
    """The whole page, into artifacts/ at the repository root."""
    ARTIFACT.parent.mkdir(exist_ok=True)
    height, chrome = driver.execute_script(
        "return [document.documentElement.scrollHeight, window.outerHeight - window.innerHeight]"
    )
    driver.set_window_size(1280, min(int(height) + int(chrome), 8000))
    driver.save_screenshot(str(ARTIFACT))


def _text(driver: webdriver.Chrome, selector: str) -> str:
    """An element's shown text, found and read in one script: a page that is being replaced (a live update, a form's
    navigation) can drop an element between a find_element and its read, which Chrome reports as an inspector error
    that is not a StaleElementReferenceException. An element not there yet reads as empty."""
    return driver.execute_script(
        "const element = document.querySelector(arguments[0]); return element ? element.innerText : ''", selector
    )


def _step(driver: webdriver.Chrome) -> int:
    return int(_text(driver, "#step") or -1)


@pytest.mark.timeout(600)
def test_the_job_page_follows_a_training_job_live_in_chromium(server, browser, attacker):
    base, token, log = server
    headers = {"Authorization": f"Bearer {token}"}
    job = httpx.post(f"{base}/v1/jobs", json=SPEC, headers=headers, timeout=30)
    assert job.status_code == 201, job.text
    job_id = job.json()["id"]
    # A live page replaces what it updates: an element found a moment ago may be gone by the time it is read.
    wait = WebDriverWait(browser, WAIT_S, poll_frequency=0.25, ignored_exceptions=(StaleElementReferenceException,))
    try:
        browser.get(f"{base}/ui/jobs/{job_id}")  # no cookie yet: the login form, which returns to the job
        wait.until(EC.presence_of_element_located((By.NAME, "token"))).send_keys(token)
        browser.find_element(By.CSS_SELECTOR, "form.login button").click()
        wait.until(EC.presence_of_element_located((By.ID, "step")))
        assert browser.current_url == f"{base}/ui/jobs/{job_id}"
        browser.execute_script("window.__marker = 1")  # gone if the page reloads
        at_load = _step(browser)
        curves_at_load = browser.find_element(By.ID, "curves").get_attribute("src")

        wait.until(lambda d: _step(d) > at_load)  # a step event arrived over the stream and moved #step
        wait.until(lambda d: _step(d) >= 4 and "val accuracy" in _text(d, "#live-log"))
        assert browser.execute_script("return window.__marker") == 1, "the page reloaded"
        assert browser.find_element(By.ID, "status").text == "running"
        wait.until(lambda d: d.find_element(By.ID, "curves").get_attribute("src") != curves_at_load)
        assert "?step=" in browser.find_element(By.ID, "curves").get_attribute("src")
        loaded = "const image = document.getElementById('curves'); return image.complete && image.naturalWidth > 0"
        wait.until(lambda d: d.execute_script(loaded))  # the picture came, authorized by the login cookie
        [session_cookie] = [c for c in browser.get_cookies() if c["name"] == "artsvc_session"]
        assert session_cookie["value"] != token and session_cookie["httpOnly"]  # the browser never holds the token

        page = browser.current_window_handle  # the forged cancel happens in another tab; the job page keeps streaming
        browser.switch_to.new_window("tab")
        browser.get(f"{attacker}/?target={base}/v1/jobs/{job_id}/cancel")
        browser.find_element(By.ID, "forge").click()
        wait.until(lambda d: "cross-site request refused" in _text(d, "body"))  # cookie sent
        assert httpx.get(f"{base}/v1/jobs/{job_id}", headers=headers, timeout=30).json()["status"] == "running"
        browser.close()
        browser.switch_to.window(page)

        cancelled = httpx.post(f"{base}/v1/jobs/{job_id}/cancel", headers=headers, timeout=30)
        assert cancelled.status_code == 200, cancelled.text
        wait.until(lambda d: _text(d, "#status") == "cancelled")  # the finished event
        assert browser.execute_script("return window.__marker") == 1, "the page reloaded"
        assert "finished: cancelled" in browser.find_element(By.ID, "live-log").text

        browser.refresh()  # the server-rendered sections as of now, for the checks and the screenshot
        wait.until(EC.presence_of_element_located((By.ID, "step")))
        for section in ("alerts", "manifest", "cost", "failures", "rollouts"):
            assert browser.find_element(By.ID, section).is_displayed(), section
        assert "Not written yet" not in browser.find_element(By.ID, "manifest").text
        assert browser.find_elements(By.CSS_SELECTOR, "#failures tbody tr")  # outcome codes of validation at step 2+
        assert "No rollouts recorded yet" not in browser.find_element(By.ID, "rollouts").text
    except TimeoutException:
        live = browser.find_elements(By.ID, "live-log")
        shown = live[0].text if live else "(no job page)"
        pytest.fail(f"timed out; live log: {shown}\nserver log:\n{log.read_text()[-4000:]}")
    finally:
        try:
            _save_screenshot(browser)
        except WebDriverException:
            pass
    console = [entry["message"] for entry in browser.get_log("browser")]
    blocked = [message for message in console if "Content Security Policy" in message]
    assert not blocked, blocked

    browser.set_window_size(1280, 900)
    browser.get(f"{base}/ui")
    row = f'//a[@href="/ui/jobs/{job_id}"]/ancestor::tr'
    wait.until(lambda d: d.find_element(By.XPATH, row).find_element(By.CSS_SELECTOR, "svg.spark polyline.val").get_attribute("points"))
    assert "cancelled" in wait.until(lambda d: d.find_element(By.XPATH, row).text)
    browser.save_screenshot(str(ARTIFACT.with_name("dashboard-jobs.png")))

    kept = {"artsvc_session": session_cookie["value"]}
    browser.find_element(By.CSS_SELECTOR, 'form[action="/ui/logout"] button').click()
    wait.until(EC.presence_of_element_located((By.NAME, "token")))  # back at the login form
    browser.get(f"{base}/ui")
    wait.until(EC.presence_of_element_located((By.NAME, "token")))  # the pages ask for a login again
    assert httpx.get(f"{base}/v1/jobs", cookies=kept, timeout=30).status_code == 401  # the old value is dead
