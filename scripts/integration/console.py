#!/usr/bin/env python3
"""The console page (clients/console/index.html) in headless Chromium against a live server.

    python3 scripts/integration/console.py path/to/switchboard [--page-url URL] [--token TOKEN]

Starts `switchboard serve --port 0`, loads the page the server serves at `/` (or --page-url, for
development: a page served elsewhere, given the server's WebSocket address in `?server=`; `{port}` in
the URL is replaced by the server's port), and drives it as a person would: the Call, Listen (with
Pause, Resume and Stop) and Post forms, the live counters and chart, the channel and connection tables
and a connection's Close button. Prints a PASS or FAIL line per check and exits nonzero on any failure,
leaving a screenshot and the browser's console log in .build/console-test/. With SAVE_SCREENSHOT=1 a
successful run saves docs/console.png (docs/operations.md shows it). With --token, the server wants that token:
the page is given it in `?token=` (which must leave the address bar), then, in a tab without it, asks
for it in the page, refuses a wrong one and connects with the right one.

Needs Debian's chromium, chromium-driver and python3-selenium.
"""
import argparse
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse

try:
    from selenium import webdriver
    from selenium.common.exceptions import WebDriverException
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
except ImportError:
    # python3 may be another interpreter (pyenv) than the one Debian's python3-selenium is installed for.
    if os.path.exists("/usr/bin/python3") and os.path.realpath(sys.executable) != os.path.realpath("/usr/bin/python3"):
        os.execv("/usr/bin/python3", ["/usr/bin/python3"] + sys.argv)
    print("FAIL selenium is missing: apt-get install -y chromium chromium-driver python3-selenium")
    sys.exit(1)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FAILURE_DIR = os.path.join(ROOT, ".build", "console-test")
ECHO_ARGS = {"a": [1, 2.5, "x"]}


class Run:
    """Counts checks and prints one PASS/FAIL line each."""

    def __init__(self):
        self.passed = 0
        self.failed = 0

    def check(self, name, ok, detail=""):
        if ok:
            self.passed += 1
            print(f"PASS {name}")
        else:
            self.failed += 1
            print(f"FAIL {name}" + (f": {detail}" if detail else ""))
        sys.stdout.flush()
        return ok

    def wait(self, name, probe, timeout=10.0, interval=0.1):
        """Checks that probe() returns a truthy value within timeout s; probe may raise while waiting.
        probe returns (ok, what) or ok."""
        deadline = time.monotonic() + timeout
        last = None
        while True:
            try:
                got = probe()
                ok, last = got if isinstance(got, tuple) else (got, got)
                if ok:
                    return self.check(name, True)
            except Exception as e:  # the element may not be there yet
                last = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
            if time.monotonic() >= deadline:
                return self.check(name, False, f"not within {timeout:g} s; last seen: {last!r}")
            time.sleep(interval)


def start_server(binary, log, token=None):
    proc = subprocess.Popen([binary, "serve", "--port", "0", "--log-level", "notice"] + (["--token", token] if token else []),
                            stdout=subprocess.DEVNULL, stderr=log)
    pattern = re.compile(r"listening on [0-9.]+:(\d+)")
    for _ in range(200):
        with open(log.name) as f:
            m = pattern.search(f.read())
        if m:
            return proc, int(m.group(1))
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    with open(log.name) as f:
        print("FAIL server did not start:\n" + f.read())
    proc.kill()
    sys.exit(1)


def stop_server(proc):
    """SIGINT, as a person would; returns the exit status (None if it had to be killed)."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
    try:
        return proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        return None


def open_browser():
    options = webdriver.ChromeOptions()
    options.binary_location = "/usr/bin/chromium"
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1280,800",
                "--force-device-scale-factor=1", "--disable-gpu"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)
    # A 1280×800 viewport: the window's size less what the browser keeps for itself.
    driver.set_window_size(1280, 800)
    inner = driver.execute_script("return [window.innerWidth, window.innerHeight]")
    driver.set_window_size(1280 + 1280 - inner[0], 800 + 800 - inner[1])
    driver.set_page_load_timeout(20)
    driver.set_script_timeout(20)
    return driver


def page_url(args, port):
    url = args.page_url.replace("{port}", str(port)) if args.page_url else f"http://127.0.0.1:{port}/"
    if args.page_url and "server=" not in url:
        url += ("&" if "?" in url else "?") + "server=" + urllib.parse.quote(f"ws://127.0.0.1:{port}/", safe="")
    if args.token:
        url += ("&" if "?" in url else "?") + "token=" + urllib.parse.quote(args.token, safe="")
    return url


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("switchboard", help="path to the switchboard binary")
    parser.add_argument("--page-url", help="load the page from here instead of the server's / "
                        "({port} is replaced; ?server=ws://127.0.0.1:PORT/ is added unless given)")
    parser.add_argument("--token", help="start the server with --token TOKEN and give the page ?token=TOKEN")
    args = parser.parse_args()

    run = Run()
    for stale in ("screenshot.png", "browser-console.log", "server.log"):  # a previous failure's leftovers
        if os.path.exists(os.path.join(FAILURE_DIR, stale)):
            os.unlink(os.path.join(FAILURE_DIR, stale))
    log = tempfile.NamedTemporaryFile("w+", prefix="switchboard-console-", suffix=".log", delete=False)
    server, port = start_server(args.switchboard, log, args.token)
    driver = None
    browser_log = []
    try:
        driver = open_browser()
        exercise(run, driver, port, page_url(args, port), served_by_server=not args.page_url, token=args.token)
        browser_log = driver.get_log("browser")
        errors = [e for e in browser_log if e.get("level") == "SEVERE"]
        run.check("no errors in the browser console", not errors, "; ".join(e.get("message", "") for e in errors)[:800])
        if run.failed == 0 and os.environ.get("SAVE_SCREENSHOT") == "1":
            driver.execute_script("window.scrollTo(0, 0)")
            os.makedirs(os.path.join(ROOT, "docs"), exist_ok=True)
            driver.save_screenshot(os.path.join(ROOT, "docs", "console.png"))
            print("saved docs/console.png")
    except WebDriverException as e:
        run.check("the browser session", False, str(e).strip().splitlines()[0] if str(e).strip() else repr(e))
    except Exception as e:  # a bug in this script still counts as a failure, with its cause
        run.check("the test script ran to its end", False, f"{type(e).__name__}: {e}")
    finally:
        if run.failed and driver is not None:
            save_failure(driver, browser_log)
        if driver is not None:
            driver.quit()
        status = stop_server(server)
        run.check("server exits with status 0 on SIGINT", status == 0, f"status {status}")
        if run.failed:
            with open(log.name) as f:
                server_log = f.read()
            os.makedirs(FAILURE_DIR, exist_ok=True)
            with open(os.path.join(FAILURE_DIR, "server.log"), "w") as f:
                f.write(server_log)
            print(f"(screenshot, browser console and server log in {os.path.relpath(FAILURE_DIR, os.getcwd())}/)")
        os.unlink(log.name)
    print(f"{run.passed} passed, {run.failed} failed")
    sys.exit(1 if run.failed else 0)


def save_failure(driver, browser_log):
    os.makedirs(FAILURE_DIR, exist_ok=True)
    try:
        driver.execute_script("window.scrollTo(0, 0)")
        driver.save_screenshot(os.path.join(FAILURE_DIR, "screenshot.png"))
        browser_log = browser_log or driver.get_log("browser")
    except WebDriverException:
        pass
    with open(os.path.join(FAILURE_DIR, "browser-console.log"), "w") as f:
        for e in browser_log:
            f.write(f"{e.get('level')} {e.get('message')}\n")


# ---------- The page, driven ----------

# Reads go through one script each: the page replaces table rows and event items all the time, so
# element references held across calls would go stale.
def text(driver, css):
    """The rendered text of the first element matching css (raises if there is none)."""
    got = driver.execute_script("const e = document.querySelector(arguments[0]); return e ? e.innerText : null", css)
    if got is None:
        raise LookupError(f"no {css}")
    return got.strip()


def table_rows(driver, table):
    """The rows of #table's body that hold data: a dict of cell class → text, plus the row's data- fields."""
    return driver.execute_script("""
        return [...document.querySelectorAll(`#${arguments[0]} tbody tr`)].filter(r => Object.keys(r.dataset).length).map(r => {
            const row = {...r.dataset};
            for (const td of r.cells) for (const c of td.classList) if (c !== 'num') row[c] = td.innerText.trim();
            return row;
        })""", table)


def fill(driver, element_id, value):
    """Sets a field's value as typing and leaving it would (its change handler runs). Set from a script:
    send_keys would be slow for JSON, and the channel fields' suggestions could interfere."""
    driver.execute_script("const e = document.getElementById(arguments[0]); e.value = arguments[1];"
                          "e.dispatchEvent(new Event('change'))", element_id, value)


def click(driver, element_id):
    driver.find_element(By.ID, element_id).click()


def number(s):
    """'1,234' → 1234.0; anything else raises."""
    return float(s.replace(",", ""))


def event_count(driver):
    return int(text(driver, "#listen-count"))


def event_values(driver):
    """The values of the event rows of #events, newest first, as JSON."""
    texts = driver.execute_script("return [...document.querySelectorAll('#events li.event .value')].map(e => e.textContent)")
    return [json.loads(t) for t in texts]


def submit(driver, form, busy, timeout_what):
    """Clears the form's status and result, presses its button, and returns (status, result text) once
    the status says something other than `busy`."""
    driver.execute_script(f"document.getElementById('{form}-result').textContent = ''; document.getElementById('{form}-status').textContent = ''")
    click(driver, f"{form}-submit")
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        status = text(driver, f"#{form}-status")
        if status and status != busy:
            return status, text(driver, f"#{form}-result")
        time.sleep(0.05)
    return f"(no {timeout_what} within 10 s)", text(driver, f"#{form}-result")


def call(driver, channel, method, args, codec="standard"):
    """Submits the Call form; returns (status, result text) once the call has finished."""
    fill(driver, "call-channel", channel)
    fill(driver, "call-method", method)
    fill(driver, "call-args", json.dumps(args))
    fill(driver, "call-codec", codec)
    return submit(driver, "call", "calling…", "answer")


def post(driver, channel, codec, message):
    fill(driver, "post-codec", codec)
    fill(driver, "post-channel", channel)
    fill(driver, "post-message", message)
    return submit(driver, "post", "sending…", "reply")


def listen(driver, channel, args):
    fill(driver, "listen-channel", channel)
    fill(driver, "listen-args", "" if args is None else json.dumps(args))
    click(driver, "listen-submit")


def own_listens(driver):
    """The listens cell of the page's own connection in the connection table (one ws connection named console)."""
    rows = [r for r in table_rows(driver, "connections") if r.get("client") == "console" and r.get("transport") == "ws"]
    if len(rows) != 1:
        raise LookupError(f"{len(rows)} rows for the page's own connection")
    return rows[0].get("listens")


def settled_count(driver, quiet=1.0, timeout=8.0):
    """The event count once it has not changed for `quiet` s (None if it never settles)."""
    deadline = time.monotonic() + timeout
    last, since = event_count(driver), time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(0.1)
        now = event_count(driver)
        if now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= quiet:
            return last
    return None


def json_or_none(s):
    try:
        return json.loads(s)
    except ValueError:
        return None


# Recorded from the page's first moment: when the badge first says connected and when the requests/s
# counter first shows a number (times from performance.now()).
FIRST_PAINT_RECORDER = """
    window.firstPaint = {};
    new MutationObserver(() => {
        const state = document.getElementById('state'), rate = document.getElementById('stat-requests-rate');
        if (state && state.textContent === 'connected' && firstPaint.connected == null) firstPaint.connected = performance.now();
        if (rate && /\\d/.test(rate.textContent) && firstPaint.rates == null) firstPaint.rates = performance.now();
    }).observe(document, {subtree: true, childList: true, characterData: true});"""
POLL_MS = 1000  # the page's polling interval (POLL_MS in index.html)


def exercise_token(run, driver, url, token):
    """A server that wants a token: ?token= is read and leaves the address bar; without it the page asks."""
    run.check("?token= is taken out of the address bar once read", "token" not in driver.current_url, driver.current_url)
    run.check("the token is kept in sessionStorage (this tab only)",
              token in driver.execute_script("return Object.values(sessionStorage)"), "not in sessionStorage")
    # A fresh tab's state: no token anywhere. The page asks for it in a form of its own.
    driver.execute_script("sessionStorage.clear()")
    plain = re.sub(r"[?&]token=[^&]*", "", url)
    driver.get(plain)
    shown = lambda: driver.execute_script("const f = document.getElementById('token-form'); return !!f && f.offsetParent !== null")
    run.wait("refused without a token, the page asks for one", lambda: (shown(), text(driver, "#banner")), timeout=15)
    run.check("the badge does not say connected while refused", text(driver, "#state") != "connected", text(driver, "#state"))
    run.check("the request for a token names the server's address, in the page's own words",
              re.search(r"The server at wss?://[^ ]+ wants a token\.", text(driver, "#banner")) is not None, text(driver, "#banner"))
    driver.find_element(By.ID, "token-input").send_keys("not-" + token)
    click(driver, "token-submit")
    run.wait("a wrong token is refused and asked for again",
             lambda: (shown() and "refused" in text(driver, "#banner"), text(driver, "#banner")), timeout=15)
    field = driver.find_element(By.ID, "token-input")
    field.clear()
    field.send_keys(token)
    click(driver, "token-submit")
    run.wait("the right token connects", lambda: (text(driver, "#state") == "connected", text(driver, "#state")), timeout=15)
    run.check("the form is gone once connected", not shown())
    run.check("the typed token never reaches the address", "token" not in driver.current_url and token not in driver.current_url,
              driver.current_url)
    driver.refresh()
    run.wait("a reload in the same tab connects without asking", lambda: (text(driver, "#state") == "connected" and not shown(),
                                                                         text(driver, "#state")), timeout=15)


def exercise(run, driver, port, url, served_by_server, token=None):
    driver.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": FIRST_PAINT_RECORDER})
    driver.get(url)
    run.check("the page loads", driver.title == "Switchboard console", f"title {driver.title!r}")
    run.wait("#state becomes connected", lambda: (text(driver, "#state") == "connected", text(driver, "#state")), timeout=15)
    # The first paint: the page samples at once, so the rates are shown well before the first regular poll.
    run.wait("the rates are shown", lambda: (driver.execute_script("return firstPaint.rates") is not None,
                                              driver.execute_script("return firstPaint")), timeout=5)
    painted = driver.execute_script("return firstPaint")
    run.check(f"the first paint has rates within {POLL_MS} ms of connecting (sampled at once, not at the first poll)",
              painted["rates"] - painted["connected"] < POLL_MS, repr(painted))
    if token:
        exercise_token(run, driver, url, token)
    run.wait("the header shows the server version from the WELCOME",
             lambda: (text(driver, "#server-version").startswith("switchboard/"), text(driver, "#server-version")))
    # The page the server serves carries its client inside (a data: URL in place of '../js/client.js')
    # and fetches nothing besides itself.
    composed = "'../js/client.js'" not in driver.execute_script("return document.querySelector('script[type=module]').textContent")
    if served_by_server:
        run.check("the served page carries its client inside", composed)
    if composed:
        fetched = driver.execute_script("return performance.getEntriesByType('resource').map(e => e.name)")
        run.check("the page fetches nothing else", fetched == [], repr(fetched))

    # Call: echo, the error of fail, the JSON codec
    status, result = call(driver, "switchboard/echo", "echo", ECHO_ARGS)
    run.check("call switchboard/echo echo shows its arguments", status.startswith("ok") and json_or_none(result) == ECHO_ARGS,
              f"status {status!r}, result {result!r}")
    status, result = call(driver, "switchboard/echo", "fail", ECHO_ARGS)
    error = json_or_none(result) or {}
    run.check("call switchboard/echo fail shows the error demo_error",
              "demo_error" in status and error.get("code") == "demo_error" and error.get("message") == "requested failure"
              and error.get("details") == ECHO_ARGS, f"status {status!r}, result {result!r}")
    status, result = call(driver, "switchboard/echo.json", "echo", {"n": 3, "s": "json"}, codec="json")
    run.check("call switchboard/echo.json with the JSON codec", status.startswith("ok") and json_or_none(result) == {"n": 3, "s": "json"},
              f"status {status!r}, result {result!r}")
    status, result = call(driver, "switchboard/echo", "nothing", None)
    run.check("call an unimplemented method says so", status == "not implemented", f"status {status!r}, result {result!r}")

    # Listen: the ticker, paused, resumed, stopped
    listen(driver, "switchboard/ticker", {"count": 1000, "intervalMs": 20})
    run.wait("ticker events appear in #events", lambda: (len(event_values(driver)) >= 10, len(event_values(driver))), timeout=10)
    values = event_values(driver)[:10]
    run.check("events are listed newest first, in order", values == list(range(values[0], values[0] - 10, -1)) if values else False, repr(values))
    click(driver, "listen-pause")
    paused_at = settled_count(driver)
    run.check("Pause: the events stop within a few in flight", paused_at is not None, "the count kept growing for 8 s")
    if paused_at is not None:
        time.sleep(2)
        run.check("Pause: no event for 2 s", event_count(driver) == paused_at, f"{paused_at} → {event_count(driver)}")
        run.check("Pause: the stream did not end", paused_at < 1000 and text(driver, "#listen-pause") == "Resume",
                  f"count {paused_at}, button {text(driver, '#listen-pause')!r}")
        # The server's side of it: the connection table shows the stream's credit, used up.
        run.wait("Pause: the server holds the stream with no credit left (connection table)",
                 lambda: (own_listens(driver) == "switchboard/ticker (0)", own_listens(driver)), timeout=4)
    click(driver, "listen-pause")
    before = event_count(driver)
    run.wait("Resume: the events flow again", lambda: (event_count(driver) >= before + 10, event_count(driver)), timeout=10)
    click(driver, "listen-stop")
    time.sleep(0.5)
    stopped_at = event_count(driver)
    time.sleep(1.5)
    run.check("Stop: no event after the stream is cancelled", event_count(driver) == stopped_at and stopped_at < 1000,
              f"{stopped_at} → {event_count(driver)}")
    run.wait("Stop: the server no longer streams to this connection (connection table)",
             lambda: (own_listens(driver) == "", own_listens(driver)), timeout=4)
    run.check("Stop: the buttons are disabled again", not driver.find_element(By.ID, "listen-stop").is_enabled()
              and not driver.find_element(By.ID, "listen-pause").is_enabled())

    # A short stream shows its end; a refused listen shows the error
    listen(driver, "switchboard/ticker", {"count": 3, "intervalMs": 0})
    run.wait("a finished stream shows its events and its end",
             lambda: (driver.execute_script("return document.querySelectorAll('#events li.end').length") == 1
                      and event_values(driver) == [2, 1, 0], (event_values(driver), text(driver, "#listen-status"))), timeout=10)
    listen(driver, "switchboard/ticker", {"count": -1})
    run.wait("a refused listen shows bad_arguments",
             lambda: ("bad_arguments" in text(driver, "#events li.error"), text(driver, "#events")), timeout=10)

    # Post: message channels, and a room post seen by the room's listener
    status, result = post(driver, "switchboard/message.string", "string", "héllo ✓")
    run.check("post a string to switchboard/message.string", status.startswith("reply") and json_or_none(result) == "héllo ✓",
              f"status {status!r}, result {result!r}")
    status, result = post(driver, "switchboard/message", "standard", json.dumps({"k": [1, 2], "t": True}))
    run.check("post a standard message to switchboard/message", status.startswith("reply") and json_or_none(result) == {"k": [1, 2], "t": True},
              f"status {status!r}, result {result!r}")
    status, result = post(driver, "switchboard/message.binary", "binary", "AB")
    run.check("post bytes to switchboard/message.binary", status.startswith("reply") and json_or_none(result.split("\n")[0]) == [65, 66]
              and 'as UTF-8: "AB"' in result,
              f"status {status!r}, result {result!r}")
    listen(driver, "switchboard/room", None)
    run.wait("listening to switchboard/room", lambda: ("listening" in text(driver, "#listen-status"), text(driver, "#listen-status")))
    time.sleep(0.3)  # the listen's reply
    status, result = post(driver, "switchboard/room.post", "binary", "hi room")
    run.check("post to switchboard/room.post gets a null reply", status.startswith("reply") and result.strip() == "null",
              f"status {status!r}, result {result!r}")
    run.wait("the room's event holds the posted bytes", lambda: (event_values(driver)[:1] == [list(b"hi room")], event_values(driver)[:1]))

    # Counters and chart
    run.wait("#stat-connections ≥ 1", lambda: (number(text(driver, "#stat-connections")) >= 1, text(driver, "#stat-connections")))
    call(driver, "switchboard/echo", "echo", "rate")
    run.wait("requests/s > 0", lambda: (number(text(driver, "#stat-requests-rate")) > 0, text(driver, "#stat-requests-rate")), timeout=5)
    run.wait("the uptime is shown", lambda: (re.fullmatch(r"\d+[smhd].*", text(driver, "#uptime")) is not None, text(driver, "#uptime")))
    points = lambda: int(driver.execute_script("return document.getElementById('rate-chart').dataset.points || 0"))
    run.wait("the rate chart has points", lambda: (points() >= 3, points()))
    painted = driver.execute_script("""
        const c = document.getElementById('rate-chart'), d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
        let blue = 0;  // pixels near the requests line's colour #2563eb
        for (let i = 0; i < d.length; i += 4) if (d[i + 3] > 200 && d[i] < 90 && d[i + 1] > 70 && d[i + 1] < 130 && d[i + 2] > 200) blue++;
        return {w: c.width, h: c.height, blue};""")
    run.check("the chart is drawn (requests line visible)", painted["w"] >= 300 and painted["h"] >= 80 and painted["blue"] >= 20, repr(painted))

    # Tables
    def channel(name):
        rows = [r for r in table_rows(driver, "channels") if r["name"] == name]
        return rows[0] if rows else {"table": text(driver, "#channels tbody")[:200]}
    run.wait("switchboard/echo is in the channel table as a method channel with the standard codec",
             lambda: (channel("switchboard/echo").get("kind") == "method" and channel("switchboard/echo").get("codec") == "standard",
                      channel("switchboard/echo")))
    run.wait("switchboard/ticker is in the channel table as an event channel",
             lambda: (channel("switchboard/ticker").get("kind") == "event", channel("switchboard/ticker")))

    def own_row():
        rows = table_rows(driver, "connections")
        mine = [r for r in rows if r.get("client") == "console" and r.get("transport") == "ws"]
        return len(mine) == 1, rows or text(driver, "#connections tbody")[:300]
    run.wait("its own connection (ws, client console) is in the connection table", own_row)
    # At 1280 px every row's Close button is on screen, also beside a row as wide as real ones get (a
    # long client name): brought into view vertically only, each is what a click at its centre hits
    # (not cut off by the table's scroller, nor outside the window).
    wide = socket.create_connection(("127.0.0.1", port), timeout=5)
    try:
        wide_name = "orders-service integration tests, worker gw3"
        hello = {"client": wide_name, **({"token": token} if token else {})}
        wide.sendall(json.dumps({"id": 1, "hello": hello}).encode() + b"\n")
        wide.recv(1000)
        run.wait("a connection with a long client name is in the table",
                 lambda: (any(r.get("client") == wide_name for r in table_rows(driver, "connections")), table_rows(driver, "connections")),
                 timeout=5)
        width = driver.execute_script("return window.innerWidth")
        hidden = driver.execute_script("""
            const hidden = [];
            for (const button of document.querySelectorAll('#connections tbody button.close')) {
                window.scrollBy(0, button.getBoundingClientRect().top - innerHeight / 2);
                const r = button.getBoundingClientRect(), x = r.left + r.width / 2, y = r.top + r.height / 2;
                if (document.elementFromPoint(x, y) !== button || r.right > innerWidth) {
                    hidden.push({row: button.closest('tr').dataset.id, left: Math.round(r.left), right: Math.round(r.right)});
                }
            }
            window.scrollTo(0, 0);
            return hidden;""")
        run.check(f"at {width} px the connection table's Close buttons are all visible", width == 1280 and hidden == [], repr(hidden))
    finally:
        wide.close()
    run.wait("the connection total is shown", lambda: (re.fullmatch(r"\d+ connections?", text(driver, "#connections-total")) is not None,
                                                       text(driver, "#connections-total")))

    # Close: a text-mode connection of ours, closed with its row's button
    victim = socket.create_connection(("127.0.0.1", port), timeout=5)
    try:
        victim.sendall(b'{"id":1,"ping":true}\n')
        victim.recv(100)
        local = f"127.0.0.1:{victim.getsockname()[1]}"

        def victim_row():
            rows = [r for r in table_rows(driver, "connections") if r.get("remote") == local]
            return rows[0] if rows else None
        if run.wait("a new TCP connection appears in the connection table (tcp, text mode)",
                    lambda: (victim_row() is not None and victim_row().get("transport") == "tcp" and victim_row().get("mode") == "text",
                             victim_row() or local), timeout=5):
            # Clicked from a script: the row is rebuilt every second, an element reference could go stale.
            driver.execute_script("document.querySelector(`#connections tbody tr[data-id='${arguments[0]}'] button.close`).click()",
                                  victim_row()["id"])
            victim.settimeout(5)
            try:
                closed = victim.recv(100) == b""
            except (ConnectionResetError, socket.timeout) as e:
                closed = isinstance(e, ConnectionResetError)
            run.check("its Close button closes the connection", closed)
            run.wait("the closed connection leaves the table", lambda: (victim_row() is None, local), timeout=5)
    finally:
        victim.close()

    # A fuller page for the screenshot: a running ticker and a result
    if os.environ.get("SAVE_SCREENSHOT") == "1":
        call(driver, "switchboard/echo", "echo", {"greeting": "hello", "numbers": [1, 2, 3], "nested": {"ok": True}})
        listen(driver, "switchboard/ticker", {"count": 100000, "intervalMs": 50})
        time.sleep(4)


if __name__ == "__main__":
    main()
