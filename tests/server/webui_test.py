"""The browser chat page (GET /, issue 16 item 1) in headless Chromium against a live
`larder serve` with the real SmolLM2-135M-Instruct (scripts/fetch_models.sh; the tests skip when
the models folder is absent). The page is driven like a user drives it: type, click Send, click
Stop, reload. Checks: no console errors and no request leaving the server, tokens stream in,
the second turn reports cached tokens from the KV store, Stop ends the stream and the server
cancels the generation, Markdown code blocks become <pre><code>, model text with <script> stays
text, conversations survive a reload, the --api-key flow, --no-webui. A screenshot of the page
is written to $LARDER_ARTIFACTS_DIR (default: the system temp dir)."""
import json
import os
import tempfile
import time
import unittest
import urllib.parse

from server_harness import STORIES, Server
from webdriver import Browser, find_browser

MODELS = os.environ.get("LARDER_MODELS_DIR") or os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../.cache/models")
SMOLLM2 = os.path.join(MODELS, "SmolLM2-135M-Instruct.Q4_1.gguf")
ARTIFACTS = os.environ.get("LARDER_ARTIFACTS_DIR") or tempfile.gettempdir()

LAST = "Array.from(document.querySelectorAll('#messages .msg.assistant')).pop()"
# The answer's text as shown, without the Copy buttons of its code blocks.
LAST_TEXT = ("(() => { const b = %s.querySelector('.body').cloneNode(true); "
             "b.querySelectorAll('button.copy').forEach(x => x.remove()); return b.textContent; })()" % LAST)


def need_browser():
    b = find_browser()
    if b is None:
        raise AssertionError("chromium and chromedriver are needed (Debian packages chromium, chromium-driver: "
                             "scripts/setup.sh installs them)")
    return b


def need_model():
    if not os.path.exists(SMOLLM2):
        raise unittest.SkipTest(f"{SMOLLM2} is absent (scripts/fetch_models.sh fetches it)")


def severe_console(browser, allow=()):
    entries = [e for e in browser.log("browser") if e.get("level") == "SEVERE"]
    return [e for e in entries if not any(a in e.get("message", "") for a in allow)]


class ChatPageTest(unittest.TestCase):
    """One server and one browser for the whole page flow; the tests run in name order."""

    @classmethod
    def setUpClass(cls):
        need_model()
        chrome, driver = need_browser()
        cls.server = Server(SMOLLM2, "--ctx", 2048, "--parallel", 2).start()
        cls.b = Browser(chrome, driver)

    @classmethod
    def tearDownClass(cls):
        cls.b.close()
        cls.server.stop()

    def set_field(self, css, value):
        self.b.type(css, value)

    def open_settings(self):
        if self.b.js("return document.getElementById('settings').hidden"):
            self.b.click("#toggle-settings")

    def send(self, text):
        self.b.type("#input", text)
        self.b.click("#send")

    def wait_answer(self, timeout=60):
        return self.b.wait(f"const m = {LAST}; return m && m.dataset.state !== 'streaming' && m.dataset.state;",
                           timeout, "the answer to finish")

    def test_0_no_html_parsing_of_text(self):
        # The page's scripts never hand a string to the HTML parser: model text can only become
        # text nodes (test_4 checks the rendering itself).
        web = os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../src/larder/server/web")
        for name in ("app.js", "markdown.js"):
            with open(os.path.join(web, name), encoding="utf-8") as f:
                code = [l for l in f.read().splitlines() if not l.lstrip().startswith("//")]  # whole-line comments may name them
            for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "new Function",
                         "createContextualFragment", "DOMParser"):
                uses = [l.strip() for l in code if sink in l]
                self.assertEqual(uses, [], f"{name} uses {sink}")

    def test_1_page_loads_clean(self):
        s, b = self.server, self.b
        r = s.request("GET", "/", headers={"Accept": "text/html,application/xhtml+xml,*/*;q=0.8"})
        self.assertEqual(r.status, 200, r)
        self.assertTrue(r.headers["content-type"].startswith("text/html"), r.headers)
        csp = r.headers.get("content-security-policy", "")
        for directive in ("default-src 'none'", "script-src 'self'", "connect-src 'self'", "frame-ancestors 'none'"):
            self.assertIn(directive, csp)
        self.assertNotIn("unsafe-inline", csp)
        self.assertIn(b"/webui/app.js", r.body)
        # API clients keep the JSON index at /.
        j = s.request("GET", "/", headers={"Accept": "*/*"})
        self.assertEqual(j.status, 200, j)
        self.assertIn("routes", j.json())
        for path, ctype in (("/webui/app.js", "text/javascript"), ("/webui/markdown.js", "text/javascript"),
                            ("/webui/app.css", "text/css")):
            a = s.request("GET", path)
            self.assertEqual(a.status, 200, f"{path}: {a}")
            self.assertTrue(a.headers["content-type"].startswith(ctype), a.headers)
            self.assertEqual(a.headers.get("x-content-type-options"), "nosniff")
        self.assertEqual(s.request("GET", "/webui/nope.js").status, 404)

        b.get(s.base + "/")
        model = s.model_id()
        b.wait("return document.getElementById('model-name').textContent === arguments[0]", 30,
               "the model id in the header", model)
        self.assertEqual(severe_console(b), [], "console errors on load")
        origin = s.base + "/"
        urls = b.requested_urls(origin)
        for must in ("/webui/app.js", "/webui/markdown.js", "/webui/app.css", "/v1/models"):
            self.assertIn(s.base + must, urls, "the page's own requests are seen")
        outside = [u for u in urls if not (u.startswith(origin) or u.startswith("data:"))]
        self.assertEqual(outside, [], "requests outside the server")

    def test_2_stream_then_cached_second_turn(self):
        b = self.b
        self.open_settings()
        self.set_field("#temperature", "0")
        self.set_field("#max-tokens", "40")
        # Record every text the answer shows while it streams: a streamed answer shows several.
        b.js("""window.__seen = [];
                new MutationObserver(() => {
                  const m = %s;
                  if (m && m.dataset.state === 'streaming') window.__seen.push(m.querySelector('.body').textContent);
                }).observe(document.getElementById('messages'), {childList: true, subtree: true, characterData: true});""" % LAST)
        self.send("What is the capital of France?")
        b.wait(f"const m = {LAST}; return m && m.dataset.state === 'streaming' && m.getAttribute('aria-busy') === 'true'",
               10, "the answer to start streaming")
        self.assertEqual(b.js("return document.getElementById('stop').hidden"), False, "Stop is shown while streaming")
        self.assertEqual(self.wait_answer(), "done")
        seen = b.js("return window.__seen")
        partial = sorted({t for t in seen if t.strip()}, key=len)
        self.assertGreaterEqual(len(partial), 2, f"the answer appeared at once, not streamed: {seen!r}")
        text = b.js(f"return {LAST_TEXT}")
        self.assertTrue(text.strip(), "an empty answer")
        self.assertIsNone(b.js(f"return {LAST}.getAttribute('aria-busy')"), "aria-busy ends with the answer")
        self.assertTrue(text.startswith(partial[0]), "a partial answer is a prefix of the final one")
        st = b.js(f"return Object.assign({{}}, {LAST}.querySelector('.stats').dataset)")
        self.assertGreater(int(st["completionTokens"]), 0, st)
        self.assertGreater(int(st["promptTokens"]), 0, st)
        self.assertGreater(float(st["tps"]), 0, st)
        self.assertGreaterEqual(float(st["ttftMs"]), 0, st)
        self.assertIn("tok/s", b.js(f"return {LAST}.querySelector('.stats').textContent"))

        self.send("And the capital of Germany?")
        self.assertEqual(self.wait_answer(), "done")
        st2 = b.js(f"return Object.assign({{}}, {LAST}.querySelector('.stats').dataset)")
        self.assertGreater(int(st2["promptTokens"]), int(st["promptTokens"]), st2)
        self.assertGreater(int(st2["cachedTokens"]), 0, f"the second turn reused no KV: {st2}")
        self.assertIn("cached", b.js(f"return {LAST}.querySelector('.stats').textContent"))
        self.assertEqual(b.js("return document.querySelectorAll('#messages .msg').length"), 4)
        kv = b.wait("const t = document.getElementById('kv').textContent; return /[1-9]\\d* tokens reused/.test(t) && t", 10,
                    "the KV store line with reused tokens")
        self.assertIn("KV store:", kv)
        # Regenerate replaces the last answer; its prompt is the one just run, so nearly all of
        # it comes from the KV store.
        self.assertEqual(b.js("return document.querySelectorAll('#messages .regenerate').length"), 1, "one Regenerate")
        b.click("#messages .regenerate")
        self.assertEqual(self.wait_answer(), "done")
        st3 = b.js(f"return Object.assign({{}}, {LAST}.querySelector('.stats').dataset)")
        self.assertEqual(b.js("return document.querySelectorAll('#messages .msg').length"), 4, "the answer was replaced")
        self.assertEqual(st3["promptTokens"], st2["promptTokens"], st3)
        self.assertGreaterEqual(int(st3["cachedTokens"]), int(st3["promptTokens"]) - 2, f"regenerate reused little: {st3}")
        b.click("#toggle-settings")  # closed for the picture
        b.screenshot(os.path.join(ARTIFACTS, "larder-webui.png"))
        self.assertEqual(severe_console(b), [], "console errors while chatting")

    def test_3_stop(self):
        s, b = self.server, self.b
        ids = s.post("/tokenize", {"content": "<|im_end|><|endoftext|>", "add_special": False}).json()["tokens"]
        self.assertEqual(len(ids), 2, ids)
        b.click("#new-chat")
        self.open_settings()
        self.set_field("#max-tokens", "1500")  # with the end tokens banned, far longer than the wait below
        self.set_field("#extra-json", json.dumps({"logit_bias": {str(i): -100 for i in ids}}))
        self.send("Tell me a very long story about a dragon.")
        b.wait(f"const m = {LAST}; return m.dataset.state === 'streaming' && m.querySelector('.body').textContent.length > 40",
               30, "some streamed text")
        b.click("#stop")
        t_stop = time.time()
        self.assertEqual(b.wait(f"return {LAST}.dataset.state !== 'streaming' && {LAST}.dataset.state", 5, "the stop"), "stopped")
        n1 = len(b.js(f"return {LAST}.querySelector('.body').textContent"))
        # The server cancels on the closed connection: nothing running within a second or two,
        # far before 1500 tokens could be done, and the request is logged as a client disconnect.
        while True:
            stats = s.request("GET", "/stats").json()
            if stats["server"]["active"] == 0:
                break
            self.assertLess(time.time() - t_stop, 3, f"the generation still runs after Stop: {stats['server']}")
            time.sleep(0.05)
        time.sleep(0.5)
        self.assertEqual(len(b.js(f"return {LAST}.querySelector('.body').textContent")), n1, "text kept coming after Stop")
        log = s.log()
        self.assertRegex(log, r"POST /v1/chat/completions 499 .*finish=cancelled|POST /v1/chat/completions 499 .*client disconnected",
                         "the server did not log the stopped request as cancelled")
        self.assertTrue(b.js("return document.getElementById('stop').hidden"), "Stop hides again")
        # Escape stops too (keyboard users).
        self.send("Another story, please.")
        b.wait(f"const m = {LAST}; return m.dataset.state === 'streaming' && m.querySelector('.body').textContent.length > 20",
               30, "the second story streaming")
        b.s("POST", f"/element/{b.find('#input')}/value", {"text": "\ue00c"})
        self.assertEqual(b.wait(f"return {LAST}.dataset.state !== 'streaming' && {LAST}.dataset.state", 5, "Escape"), "stopped")
        self.set_field("#extra-json", "")
        self.set_field("#max-tokens", "40")

    def test_4_markdown_and_escaping(self):
        b = self.b
        content = ("Here is code:\n```python\nprint('<b>hi</b>')\n```\n"
                   "Inline `x<y` and **bold**.\n\n<script>window.__pwned = 1</script>\n"
                   "<img src=x onerror=\"window.__pwned = 2\"> [bad](javascript:window.__pwned=3) "
                   "[good](https://example.invalid/)")
        conv = {"id": "mdtest", "title": "markdown test", "created": 1,
                "messages": [{"role": "user", "content": "<i>show</i> code"},
                             {"role": "assistant", "content": content, "state": "done", "stats": {}}]}
        b.js("""const c = JSON.parse(localStorage.getItem('larder.conversations.v1') || '[]');
                c.unshift(arguments[0]);
                localStorage.setItem('larder.conversations.v1', JSON.stringify(c));
                localStorage.setItem('larder.current.v1', JSON.stringify('mdtest'));""", conv)
        b.log("browser")  # drop what came before
        b.get(self.server.base + "/")
        b.wait("return document.querySelector('#messages .msg.assistant pre')", 10, "the stored answer")
        code = b.js("const c = document.querySelector('#messages .msg.assistant pre > code'); "
                    "return c && [c.textContent, c.className]")
        self.assertEqual(code, ["print('<b>hi</b>')", "language-python"])
        self.assertEqual(b.js("return document.querySelectorAll('#messages pre > button.copy').length"), 1, "a Copy button")
        self.assertEqual(b.js("return document.querySelector('#messages .msg.assistant p code').textContent"), "x<y")
        self.assertEqual(b.js("return document.querySelector('#messages .msg.assistant strong').textContent"), "bold")
        body = b.js("return document.querySelector('#messages .msg.assistant .body').textContent")
        self.assertIn("<script>window.__pwned = 1</script>", body)
        self.assertIn('<img src=x onerror="window.__pwned = 2">', body)
        self.assertEqual(b.js("return document.querySelectorAll('#messages script, #messages img, #messages b, #messages i').length"), 0)
        self.assertEqual(b.js("return document.querySelector('#messages .msg.user .body').textContent"), "<i>show</i> code")
        links = b.js("return Array.from(document.querySelectorAll('#messages a')).map(a => a.getAttribute('href'))")
        self.assertEqual(links, ["https://example.invalid/"], "only http(s) links become links")
        self.assertIsNone(b.js("return window.__pwned === undefined ? null : window.__pwned"))
        self.assertEqual(severe_console(b), [])

    def test_5_conversations_survive_reload_and_delete(self):
        b = self.b
        before = b.js("return Array.from(document.querySelectorAll('#conversations li')).map(li => li.textContent)")
        self.assertGreaterEqual(len(before), 3, before)  # tests 2, 3 and 4
        b.click("#conversations li:nth-child(3) .open")  # test 2's: the oldest
        texts = b.js("return Array.from(document.querySelectorAll('#messages .msg .body')).map(e => e.textContent)")
        self.assertEqual(len(texts), 4, texts)
        b.get(self.server.base + "/")
        b.wait("return document.querySelectorAll('#messages .msg').length === 4", 10, "the conversation after reload")
        self.assertEqual(b.js("return Array.from(document.querySelectorAll('#messages .msg .body')).map(e => e.textContent)"), texts)
        self.assertEqual(b.js("return Array.from(document.querySelectorAll('#conversations li')).map(li => li.textContent)"), before)
        self.assertEqual(b.js("return document.getElementById('temperature').value"), "0", "settings survive too")
        b.click("#conversations li:nth-child(1) .delete")
        after = b.js("return Array.from(document.querySelectorAll('#conversations li')).map(li => li.textContent)")
        self.assertEqual(after, before[1:])
        b.get(self.server.base + "/")
        b.wait("return document.querySelectorAll('#conversations li').length === arguments[0]", 10, "the deletion kept", len(after))

    def test_6_narrow_window(self):
        b = self.b
        b.s("POST", "/window/rect", {"width": 420, "height": 800})
        try:
            b.get(self.server.base + "/")
            b.wait("return getComputedStyle(document.getElementById('toggle-sidebar')).display !== 'none'", 10,
                   "the sidebar toggle on a narrow window")
            w = b.js("return [document.documentElement.scrollWidth, window.innerWidth]")
            self.assertLessEqual(w[0], w[1], "the page scrolls sideways on a narrow window")
            b.click("#toggle-sidebar")
            b.wait("const r = document.getElementById('sidebar').getBoundingClientRect(); return r.left >= 0 && r.right > 100",
                   5, "the conversation list sliding in")
            b.screenshot(os.path.join(ARTIFACTS, "larder-webui-narrow.png"))
            b.click("#close-sidebar")
            b.wait("return document.getElementById('sidebar').getBoundingClientRect().right <= 0", 5, "the list closing")
            b.click("#toggle-sidebar")
            b.wait("return document.getElementById('sidebar').getBoundingClientRect().left >= 0", 5, "the list again")
            b.click("#conversations li:nth-child(1) .open")  # choosing a conversation closes the list
            b.wait("return document.getElementById('sidebar').getBoundingClientRect().right <= 0", 5, "the list closing")
        finally:
            b.s("POST", "/window/rect", {"width": 1100, "height": 900})


class ApiKeyAndSwitchTest(unittest.TestCase):
    def test_api_key_flow(self):
        need_model()
        chrome, driver = need_browser()
        s = Server(SMOLLM2, "--ctx", 1024, "--parallel", 1, "--api-key", "sekrit-123").start()
        b = Browser(chrome, driver)
        try:
            # The page itself needs no key; every API call does.
            self.assertEqual(s.request("GET", "/", headers={"Accept": "text/html"}).status, 200)
            self.assertEqual(s.request("GET", "/", headers={"Accept": "application/json"}).status, 401)
            self.assertEqual(s.request("GET", "/webui/app.js").status, 200)
            b.get(s.base + "/")
            b.wait("return !document.getElementById('key-panel').hidden", 10, "the key prompt")
            b.type("#api-key", "wrong")
            b.click("#save-key")
            b.wait("return document.getElementById('status').textContent.includes('not accepted')", 10, "the refusal")
            b.type("#api-key", "sekrit-123")
            b.click("#save-key")
            b.wait("return document.getElementById('key-panel').hidden", 10, "the key accepted")
            b.type("#input", "Hi!")
            b.click("#send")
            state = b.wait(f"const m = {LAST}; return m && m.dataset.state !== 'streaming' && m.dataset.state;", 60, "the answer")
            self.assertEqual(state, "done", b.js("return document.getElementById('status').textContent"))
            self.assertTrue(b.js(f"return {LAST}.querySelector('.body').textContent").strip())
        finally:
            b.close()
            s.stop()

    def test_no_webui(self):
        s = Server(STORIES, "--no-webui").start()
        try:
            r = s.request("GET", "/", headers={"Accept": "text/html"})
            self.assertEqual(r.status, 200, r)
            self.assertIn("routes", r.json(), "--no-webui: GET / is the JSON index")
            self.assertEqual(s.request("GET", "/webui/app.js").status, 404)
        finally:
            s.stop()


if __name__ == "__main__":
    unittest.main()
