"""`--chat-template NAME|FILE|TEXT`, `--chat-template-file FILE` and the ChatML fallback
(issue 12 item 4), black-box through `larder serve`, `larder info` and `larder generate`.

Every rendering larder makes is compared with jinja2 rendering the same template text through
transformers' own chat-template code (tests/ref/chat_template_golden.py: render_chat), with the
same messages, BOS/EOS strings and add_generation_prompt — for every template file in
../shared/chat-templates (given with --chat-template-file), every built-in name
(src/larder/runtime/chat_templates/*.jinja) and the fallback. The rendered prompt comes from
POST /apply-template (llama-server's route); the prompt larder actually runs is checked through
usage.prompt_tokens against /tokenize of that rendering (built-in templates get the tokenizer's
BOS in front, as llama-server does).
"""
import glob
import json
import os
import subprocess
import sys
import unittest

from server_harness import BIN, SHARED, STORIES, Server, chat_model

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.environ.get("LARDER_SOURCE_DIR") or os.path.join(HERE, "../..")
sys.path.insert(0, os.path.join(SOURCE, "tests/ref"))
import chat_template_golden  # noqa: E402
from chat_template_golden import render_chat  # noqa: E402

# The golden script pins strftime_now() to a fixed date for its own corpus; larder renders with
# the real clock, so give transformers' renderer the real clock back.
chat_template_golden.ctu.datetime = chat_template_golden._dt.datetime

BUILTIN_DIR = os.path.join(SOURCE, "src/larder/runtime/chat_templates")
HEADER = "x-larder-chat-template"
# One tool on every request: the tool-use templates iterate over `tools` and fail without it;
# the others ignore it.
TOOLS = [chat_template_golden.WEATHER]
MESSAGES = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "What is 2+2?"},
    {"role": "assistant", "content": "4"},
    {"role": "user", "content": "And  3+3 ?\nShow <b>work</b>."},
]


def stories_special():
    """BOS/EOS strings of stories260K's GGUF vocabulary (gguf-py, not larder)."""
    import gguf
    r = gguf.GGUFReader(STORIES)
    toks = r.fields["tokenizer.ggml.tokens"].contents()
    return (toks[int(r.fields["tokenizer.ggml.bos_token_id"].contents())],
            toks[int(r.fields["tokenizer.ggml.eos_token_id"].contents())])


def read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def cli(*args):
    p = subprocess.run([BIN, *args], capture_output=True, text=True, timeout=120)
    return p.returncode, p.stdout, p.stderr


class ChatTemplateFlags(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.bos, cls.eos = stories_special()

    def serve(self, *flags, model=STORIES):
        srv = Server(model, *flags).start()
        self.addCleanup(srv.kill)
        self.addCleanup(srv.stop)
        return srv

    def expected(self, source, bos=None, eos=None):
        return render_chat(source, MESSAGES, TOOLS, True, bos or self.bos, eos or self.eos, {})

    def apply(self, srv):
        return srv.post("/apply-template", {"messages": MESSAGES, "tools": TOOLS})

    def check_rendering(self, srv, source, header, bos_prepended, bos=None, eos=None):
        exp = self.expected(source, bos, eos)
        r = self.apply(srv)
        if not exp["ok"]:  # the template refuses these messages (e.g. no system role): so must larder
            self.assertEqual(r.status, 400, f"jinja2 raised {exp['error']!r}; larder answered {r}")
            if exp["raised"]:
                self.assertIn(exp["error"], r.json()["error"]["message"])
            return None
        self.assertEqual(r.status, 200, f"/apply-template: {r}\n{srv.log()}")
        self.assertEqual(r.json()["prompt"], exp["output"], "rendering differs from jinja2's")
        self.assertEqual(r.headers.get(HEADER), header)
        # The prompt that runs: the rendering tokenized without specials, plus BOS in front for
        # templates larder supplies when the tokenizer adds one.
        ids = srv.post("/tokenize", {"content": exp["output"], "add_special": bos_prepended}).json()["tokens"]
        if len(ids) + 2 > 2048:  # longer than stories260K's context: the rendering check is enough
            return exp["output"]
        c = srv.post("/v1/chat/completions", {"messages": MESSAGES, "tools": TOOLS, "max_tokens": 2, "temperature": 0})
        self.assertEqual(c.status, 200, f"chat: {c}")
        self.assertEqual(c.headers.get(HEADER), header, "every chat response names its template")
        self.assertEqual(c.json()["usage"]["prompt_tokens"], len(ids), "prompt = tokenized rendering")
        return exp["output"]

    def test_every_shared_template_as_file(self):
        files = sorted(glob.glob(os.path.join(SHARED, "chat-templates", "*.jinja")))
        self.assertGreaterEqual(len(files), 10, "../shared/chat-templates holds the real templates")
        rendered = 0
        for f in files:
            with self.subTest(template=os.path.basename(f)):
                srv = self.serve("--chat-template-file", f)
                rendered += self.check_rendering(srv, read(f), "file", bos_prepended=False) is not None
                srv.stop()
        self.assertGreaterEqual(rendered, len(files) - 3, "most real templates render this conversation")

    def test_builtin_names(self):
        files = sorted(glob.glob(os.path.join(BUILTIN_DIR, "*.jinja")))
        names = [os.path.basename(f)[:-6] for f in files]
        self.assertIn("chatml", names)
        for f, name in zip(files, names):
            with self.subTest(builtin=name):
                srv = self.serve("--chat-template", name)
                self.assertIsNotNone(self.check_rendering(srv, read(f), f"built-in {name}", bos_prepended=True))
                srv.stop()
                code, out, err = cli("info", STORIES, "--chat-template", name)
                self.assertEqual(code, 0, err)
                self.assertIn(f"chat template:  built-in {name}\n", out)

    def test_fallback_is_chatml_and_announced(self):
        srv = self.serve()
        self.check_rendering(srv, read(os.path.join(BUILTIN_DIR, "chatml.jinja")), "chatml (fallback)",
                             bos_prepended=True)
        # The official client gets an answer (not a 400) and can read the header.
        client = srv.openai()
        raw = client.chat.completions.with_raw_response.create(
            model="x", messages=[{"role": "user", "content": "Hello"}], max_tokens=4, temperature=0)
        self.assertEqual(raw.headers.get(HEADER), "chatml (fallback)")
        self.assertEqual(raw.parse().object, "chat.completion")
        # Anthropic surface too.
        m = srv.post("/v1/messages", {"model": "x", "max_tokens": 2, "messages": [{"role": "user", "content": "Hi"}]})
        self.assertEqual(m.status, 200, f"/v1/messages: {m}")
        self.assertEqual(m.headers.get(HEADER), "chatml (fallback)")
        # Completions render nothing and carry no template header.
        p = srv.post("/v1/completions", {"prompt": "Once", "max_tokens": 2})
        self.assertIsNone(p.headers.get(HEADER))
        srv.stop()
        self.assertIn("ChatML template as a fallback", srv.log(), "the log announces the fallback")
        self.assertIn("chat template chatml (fallback)", srv.log())
        code, out, err = cli("info", STORIES)
        self.assertEqual(code, 0, err)
        self.assertIn("chat template:  chatml (fallback)\n", out)

    def test_text_and_file_through_chat_template(self):
        text = "{% for m in messages %}[{{ m.role | upper }}] {{ m.content }}\n{% endfor %}{{ eos_token }}"
        srv = self.serve("--chat-template", text)
        self.check_rendering(srv, text, "text", bos_prepended=False)
        srv.stop()
        f = os.path.join(SHARED, "chat-templates", "Qwen-Qwen2.5-7B-Instruct.jinja")
        srv = self.serve("--chat-template", f)
        self.check_rendering(srv, read(f), "file", bos_prepended=False)

    def test_model_template_and_override_on_a_chat_model(self):
        model = chat_model()["dir"]
        tcfg = json.loads(read(os.path.join(model, "tokenizer_config.json")))
        bos, eos = tcfg["bos_token"], tcfg["eos_token"]
        bos = bos if isinstance(bos, str) else bos["content"]
        eos = eos if isinstance(eos, str) else eos["content"]
        code, out, _ = cli("info", model)
        self.assertEqual(code, 0)
        self.assertIn("chat template:  model (tokenizer_config.json)\n", out)
        srv = self.serve(model=model)
        self.check_rendering(srv, tcfg["chat_template"], "model", bos_prepended=False, bos=bos, eos=eos)
        srv.stop()
        # The built-in llama3 on a llama3 tokenizer: BOS from the tokenizer, same ids as the
        # model's own template for a conversation without tools or dates.
        srv = self.serve("--chat-template", "llama3", model=model)
        self.check_rendering(srv, read(os.path.join(BUILTIN_DIR, "llama3.jinja")), "built-in llama3",
                             bos_prepended=True, bos=bos, eos=eos)

    def test_generate_uses_the_flag(self):
        f = os.path.join(BUILTIN_DIR, "phi3.jinja")
        for flags in (["--chat-template-file", f], ["--chat-template", "phi3"]):
            code, out, err = cli("generate", STORIES, "--chat", "--prompt", "Hi", "-n", "2", "--show-prompt", *flags)
            self.assertEqual(code, 0, err)
            self.assertTrue(out.startswith("<|user|>\nHi<|end|>\n<|assistant|>\n"), out)
        code, out, err = cli("generate", STORIES, "--chat", "--prompt", "Hi", "-n", "2", "--show-prompt")
        self.assertEqual(code, 0, err)
        self.assertTrue(out.startswith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"), out)
        self.assertIn("fallback", err, "generate --chat announces the fallback")

    def test_bad_flags_are_refused_with_a_reason(self):
        code, _, err = cli("info", STORIES, "--chat-template", "nosuch")
        self.assertEqual(code, 2)
        self.assertIn("'nosuch'", err)
        self.assertIn("chatml", err, "the message lists the built-in names")
        code, _, err = cli("info", STORIES, "--chat-template-file", "/nonexistent/t.jinja")
        self.assertEqual(code, 3)
        self.assertIn("/nonexistent/t.jinja", err)
        code, _, err = cli("info", STORIES, "--chat-template", "chatml", "--chat-template-file", "x")
        self.assertEqual(code, 2)
        self.assertIn("not both", err)
        code, _, err = cli("info", STORIES, "--chat-template", "{% if %}")
        self.assertNotEqual(code, 0)
        self.assertIn("--chat-template text", err, "a template that does not parse is named")
        code, _, err = cli("generate", STORIES, "--prompt", "Hi", "--chat-template", "chatml")
        self.assertEqual(code, 2)
        self.assertIn("--chat", err)
        p = subprocess.run([BIN, "serve", STORIES, "--port", "0", "--chat-template", "nosuch"],
                           capture_output=True, text=True, timeout=60)
        self.assertEqual(p.returncode, 2, "serve refuses an unknown template before serving")


if __name__ == "__main__":
    unittest.main()
