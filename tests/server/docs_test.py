"""docs/server-api.md stays true: its route table equals the route table the server serves
(GET /), and the BOS rule it states holds for templates that write BOS and for ones that don't."""
import os
import re
import shutil
import unittest

from server_harness import HERE, Server, STORIES, chat_model, tmp_root

DOC = os.path.join(os.environ.get("LARDER_SOURCE_DIR") or os.path.join(HERE, "../.."), "docs", "server-api.md")
ROW = re.compile(r"^\|\s*(GET|POST|PUT|DELETE|PATCH)\s*\|\s*`([^`]+)`\s*\|")


def documented_routes():
    with open(DOC, encoding="utf-8") as f:
        text = f.read()
    section = text.split("## Routes", 1)[1].split("\n## ", 1)[0]
    return {(m.group(1), m.group(2)) for line in section.splitlines() if (m := ROW.match(line.strip()))}


class RouteTableTest(unittest.TestCase):
    def test_documented_routes_equal_served_routes(self):
        s = Server(STORIES).start()
        try:
            served = {(r["method"], r["path"]) for r in s.request("GET", "/").json()["routes"]}
            for method, path in served:  # every served route answers something other than 404
                probe = path.replace("{id}", "stories260K")
                r = s.request(method, probe, body=b"{}" if method == "POST" else None,
                              headers={"Content-Type": "application/json"})
                self.assertNotEqual(r.status, 404, f"{method} {path} is in the table but not served: {r}")
        finally:
            s.stop()
        docs = documented_routes()
        self.assertTrue(docs, "no route rows found in docs/server-api.md")
        self.assertEqual(sorted(docs - served), [], "documented but not served")
        self.assertEqual(sorted(served - docs), [], "served but not documented in docs/server-api.md")


NO_BOS_TEMPLATE = ("{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n{{ m['content'] }}"
                   "<|eot_id|>{% endfor %}{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>"
                   "\n\n{% endif %}")


class BosRuleTest(unittest.TestCase):
    def prompt_ids(self, model_dir):
        s = Server(model_dir).start()
        try:
            msgs = [{"role": "user", "content": "Hello there"}]
            rendered = s.post("/apply-template", {"messages": msgs}).json()["prompt"]
            plain = s.post("/tokenize", {"content": rendered, "add_special": False}).json()["tokens"]
            special = s.post("/tokenize", {"content": "x", "add_special": True}).json()["tokens"]
            r = s.post("/v1/chat/completions", {"messages": msgs, "max_tokens": 1, "temperature": 0})
            self.assertEqual(r.status, 200, r)
            return plain, r.json()["usage"]["prompt_tokens"], special
        finally:
            s.stop()

    def test_template_writes_bos(self):
        info = chat_model()
        plain, n, special = self.prompt_ids(info["dir"])
        bos = info["bos_id"]
        self.assertEqual(special[0], bos, "this tokenizer adds BOS to plain text")
        self.assertEqual(plain[0], bos, "the Llama 3 template writes BOS itself")
        self.assertNotEqual(plain[1], bos)
        self.assertEqual(n, len(plain), "one BOS: the prompt is the rendered template, nothing added")

    def test_template_without_bos(self):
        info = chat_model()
        d = os.path.join(tmp_root(), "tiny-chat-no-bos")
        if not os.path.exists(d):
            shutil.copytree(info["dir"], d)
            with open(os.path.join(d, "chat_template.jinja"), "w") as f:
                f.write(NO_BOS_TEMPLATE)
        plain, n, special = self.prompt_ids(d)
        self.assertEqual(special[0], info["bos_id"], "the tokenizer would add BOS to plain text")
        self.assertNotEqual(plain[0], info["bos_id"], "this template writes no BOS")
        self.assertEqual(n, len(plain), "no BOS is added to a chat prompt whose template does not write one")


if __name__ == "__main__":
    unittest.main()
