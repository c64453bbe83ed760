"""A minimal W3C WebDriver client over urllib for headless Chromium (Debian's `chromium` and
`chromium-driver` packages): start chromedriver, open a session, navigate, run scripts, click,
type, read the browser console and network logs, take screenshots. Enough for webui_test.py
without a Selenium dependency."""
import base64
import json
import os
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.request

ELEMENT = "element-6066-11e4-a52e-4f735466cecf"  # the W3C web element key


def find_browser():
    """(chromium, chromedriver) paths, or None when either is missing."""
    chrome = os.environ.get("LARDER_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    driver = os.environ.get("LARDER_CHROMEDRIVER") or shutil.which("chromedriver")
    return (chrome, driver) if chrome and driver else None


class WebDriverError(Exception):
    pass


class Browser:
    def __init__(self, chrome, driver, width=1100, height=900):
        self.tmp = tempfile.mkdtemp(prefix="larder_webui_chrome_")
        import socket
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        self.driver = subprocess.Popen([driver, f"--port={port}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.time() + 30
        while True:
            try:
                if self._call("GET", "/status")["ready"]:
                    break
            except (OSError, WebDriverError):
                pass
            if time.time() > deadline:
                self.close()
                raise WebDriverError("chromedriver did not become ready within 30 s")
            time.sleep(0.1)
        caps = {"browserName": "chrome",
                "goog:chromeOptions": {"binary": chrome,
                                       "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                                                "--no-first-run", "--disable-extensions", "--disable-background-networking",
                                                "--disable-component-update", "--disable-sync", "--disable-default-apps",
                                                f"--window-size={width},{height}", f"--user-data-dir={self.tmp}/profile"]},
                "goog:loggingPrefs": {"browser": "ALL", "performance": "ALL"}}
        r = self._call("POST", "/session", {"capabilities": {"alwaysMatch": caps}})
        self.session = r["sessionId"]

    def _call(self, method, path, body=None, timeout=60):
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.url + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"} if data else {})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                return json.loads(r.read())["value"]
        except urllib.error.HTTPError as e:
            try:
                v = json.loads(e.read())["value"]
                raise WebDriverError(f"{method} {path}: {v.get('error')}: {v.get('message', '')[:500]}") from None
            except (ValueError, KeyError):
                raise WebDriverError(f"{method} {path}: HTTP {e.code}") from None

    def s(self, method, path, body=None, timeout=60):
        return self._call(method, f"/session/{self.session}{path}", body, timeout)

    def get(self, url):
        self.log("performance")  # only this page's requests from here on
        self.s("POST", "/url", {"url": url})

    def js(self, script, *args):
        return self.s("POST", "/execute/sync", {"script": script, "args": list(args)})

    def find(self, css):
        return self.s("POST", "/element", {"using": "css selector", "value": css})[ELEMENT]

    def click(self, css):
        self.s("POST", f"/element/{self.find(css)}/click", {})

    def type(self, css, text):
        self.s("POST", f"/element/{self.find(css)}/clear", {})
        self.s("POST", f"/element/{self.find(css)}/value", {"text": text})

    def wait(self, script, timeout=30, what="condition", *args):
        """Polls a script until it returns something truthy; returns that value."""
        deadline = time.time() + timeout
        while True:
            v = self.js(script, *args)
            if v:
                return v
            if time.time() > deadline:
                raise AssertionError(f"timed out after {timeout}s waiting for {what}")
            time.sleep(0.05)

    def log(self, kind):
        """New entries of the 'browser' (console) or 'performance' (DevTools events) log."""
        return self.s("POST", "/se/log", {"type": kind})

    def requested_urls(self, document_prefix):
        """URLs requested by documents whose URL starts with document_prefix (the browser's own
        pages, such as the new-tab page headless Chromium opens first, are left out)."""
        urls = []
        for e in self.log("performance"):
            msg = json.loads(e["message"])["message"]
            if msg.get("method") == "Network.requestWillBeSent":
                if msg["params"].get("documentURL", "").startswith(document_prefix):
                    urls.append(msg["params"]["request"]["url"])
        return urls

    def screenshot(self, path):
        with open(path, "wb") as f:
            f.write(base64.b64decode(self.s("GET", "/screenshot")))

    def close(self):
        try:
            if getattr(self, "session", None):
                self._call("DELETE", f"/session/{self.session}", timeout=20)
        except (OSError, WebDriverError):
            pass
        self.driver.terminate()
        try:
            self.driver.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.driver.kill()
        shutil.rmtree(self.tmp, ignore_errors=True)
