"""`larder serve MODEL --lora NAME=PATH[:SCALE]` (issue 45 items 2 and 3): LoRA adapters picked per
request by `model` (NAME) or by llama-server's per-request `lora` list, decoded in one batch with
each other and the base, each in its own KV namespace (from the adapter's content and scale, not
its name); GET/POST /lora-adapters as llama-server has them; bad input answered 400 naming the field.

Model: the random-weight qwen3 of tiny_qwen3.py (real Qwen3 tokenizer). Adapters: random PEFT
adapters written here (adapter_config.json + adapter_model.safetensors, PEFT's key names), one of
them copied under another directory (same content, another name). The expected greedy output of
an adapter is `larder generate --lora PATH` (the CLI path through runtime::generate), and the
concurrent batch is compared with each request run alone on the same server."""
import concurrent.futures
import json
import os
import shutil
import sys
import time
import unittest

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from server_harness import SHARED, Server, free_port, run_cli, tmp_root  # noqa: E402
import tiny_qwen3  # noqa: E402

HIDDEN, HEADS, KV_HEADS, HEAD_DIM, INTER, LAYERS = 64, 4, 2, 16, 128, 2
SHAPES = {"self_attn.q_proj": (HEADS * HEAD_DIM, HIDDEN), "self_attn.k_proj": (KV_HEADS * HEAD_DIM, HIDDEN),
          "self_attn.v_proj": (KV_HEADS * HEAD_DIM, HIDDEN), "self_attn.o_proj": (HIDDEN, HEADS * HEAD_DIM),
          "mlp.gate_proj": (INTER, HIDDEN), "mlp.up_proj": (INTER, HIDDEN), "mlp.down_proj": (HIDDEN, INTER)}
PROMPTS = ["The weather today is", "One two three four", "My favourite colour is", "Once upon a time",
           "In the beginning", "Numbers: 1, 2, 3,", "The cat sat on", "A list of words:"]
N = 12  # tokens per answer


def write_peft(out, seed, modules, rank, alpha):
    from safetensors.numpy import save_file
    rng = np.random.default_rng(seed)
    os.makedirs(out, exist_ok=True)
    t = {}
    for layer in range(LAYERS):
        for m in modules:
            o, i = SHAPES[m]
            key = f"base_model.model.model.layers.{layer}.{m}"
            t[key + ".lora_A.weight"] = (rng.standard_normal((rank, i)) * i ** -0.5).astype(np.float32)
            t[key + ".lora_B.weight"] = (rng.standard_normal((o, rank)) * rank ** -0.5).astype(np.float32)
    save_file(t, os.path.join(out, "adapter_model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(out, "adapter_config.json"), "w") as f:
        json.dump({"peft_type": "LORA", "r": rank, "lora_alpha": alpha,
                   "target_modules": sorted({m.split(".")[1] for m in modules})}, f)
    return out


class ServeLoraTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        root = os.path.join(tmp_root(), "lora")
        cls.model = tiny_qwen3.make_qwen3_model(os.path.join(root, "tiny-qwen3"), SHARED)["dir"]
        cls.paths = {
            "x": write_peft(os.path.join(root, "x"), 1, list(SHAPES), 8, 32),
            "y": write_peft(os.path.join(root, "y"), 2, ["self_attn.q_proj", "self_attn.v_proj", "mlp.down_proj"], 4, 16),
            "z": write_peft(os.path.join(root, "z"), 3, ["mlp.gate_proj", "mlp.up_proj"], 16, 48),
        }
        cls.paths["x_copy"] = os.path.join(root, "renamed-x")  # same content, another file name
        shutil.copytree(cls.paths["x"], cls.paths["x_copy"])
        flags = ["--parallel", "8", "--ctx", "512"]
        for name in ("x", "y", "z", "x_copy"):
            flags += ["--lora", f"{name}={cls.paths[name]}"]
        cls.srv = Server(cls.model, *flags).start()
        cls.base_id = cls.srv.model_id()

    @classmethod
    def tearDownClass(cls):
        cls.srv.stop()

    def complete(self, prompt, model=None, extra=None):
        r = self.srv.post("/v1/completions", {"model": model or self.base_id, "prompt": prompt, "max_tokens": N,
                                              "temperature": 0, **(extra or {})})
        self.assertEqual(r.status, 200, r)
        return r.json()

    def test_models_and_tags_list_the_adapters(self):
        ids = [m.id for m in self.srv.openai().models.list().data]
        self.assertEqual(ids, [self.base_id, "x", "y", "z", "x_copy"])
        self.assertEqual(self.srv.request("GET", "/v1/models/y").json()["parent"], self.base_id)
        tags = [m["name"] for m in self.srv.request("GET", "/api/tags").json()["models"]]
        self.assertEqual(tags, [self.base_id, "x", "y", "z", "x_copy"])

    def test_adapter_output_equals_generate_with_lora(self):
        client = self.srv.openai()
        outs = {}
        for name in ("x", "y", "z"):
            got = client.completions.create(model=name, prompt=PROMPTS[0], max_tokens=N, temperature=0)
            code, out, err = run_cli("generate", self.model, "--prompt", PROMPTS[0], "-n", str(N), "--temp", "0",
                                     "--lora", self.paths[name])
            self.assertEqual(code, 0, err)
            self.assertEqual(got.choices[0].text, out[:-1], name)
            outs[name] = out
        base = client.completions.create(model=self.base_id, prompt=PROMPTS[0], max_tokens=N, temperature=0)
        # the adapters do change the output (else this test would prove nothing)
        self.assertEqual(len({base.choices[0].text, *(o[:-1] for o in outs.values())}), 4, outs)
        # the per-request lora list picks the same as the name (x at scale 1)
        by_list = self.complete(PROMPTS[0], extra={"lora": [{"id": 0, "scale": 1.0}]})
        self.assertEqual(by_list["choices"][0]["text"], outs["x"][:-1])

    def test_kv_namespaces_follow_adapter_content(self):
        prompt = "A prompt long enough to be cached: " + " ".join(str(i) for i in range(40))
        first = self.complete(prompt, "y")
        self.assertEqual(first["usage"]["prompt_tokens_details"]["cached_tokens"], 0)
        again = self.complete(prompt, "y")
        self.assertGreater(again["usage"]["prompt_tokens_details"]["cached_tokens"], 0)
        other = self.complete(prompt, "z")  # another adapter: never the first one's KV
        self.assertEqual(other["usage"]["prompt_tokens_details"]["cached_tokens"], 0)
        base = self.complete(prompt)  # the base neither
        self.assertEqual(base["usage"]["prompt_tokens_details"]["cached_tokens"], 0)
        p2 = "Another cached prompt: " + " ".join(str(i) for i in range(40, 80))
        self.assertEqual(self.complete(p2, "x")["usage"]["prompt_tokens_details"]["cached_tokens"], 0)
        # x_copy: the same content under another name and path: x's entries, and x's output
        hit = self.complete(p2, "x_copy")
        self.assertGreater(hit["usage"]["prompt_tokens_details"]["cached_tokens"], 0)
        self.assertEqual(hit["choices"][0]["text"], self.complete(p2, "x")["choices"][0]["text"])
        # another scale is another namespace
        half = self.complete(p2, extra={"lora": [{"id": 0, "scale": 0.5}]})
        self.assertEqual(half["usage"]["prompt_tokens_details"]["cached_tokens"], 0)

    def test_concurrent_requests_over_adapters_equal_each_alone(self):
        models = ["x", "y", "z", None, "y", None, "x", "z"]
        jobs = list(zip(PROMPTS, models))
        alone = [self.complete(p, m, {"cache_salt": "alone"})["choices"][0]["text"] for p, m in jobs]
        with concurrent.futures.ThreadPoolExecutor(len(jobs)) as ex:
            together = list(ex.map(lambda j: self.complete(j[0], j[1], {"cache_salt": "together"}), jobs))
        self.assertEqual([t["choices"][0]["text"] for t in together], alone)

    def test_lora_adapters_routes(self):
        r = self.srv.request("GET", "/lora-adapters")
        self.assertEqual(r.status, 200, r)
        lst = r.json()
        self.assertEqual([(a["id"], a["path"], a["scale"]) for a in lst],
                         [(0, self.paths["x"], 0.0), (1, self.paths["y"], 0.0), (2, self.paths["z"], 0.0),
                          (3, self.paths["x_copy"], 0.0)])
        self.assertEqual(lst[0]["content_hash"], lst[3]["content_hash"])
        want_x = self.complete(PROMPTS[1], "x")["choices"][0]["text"]
        base = self.complete(PROMPTS[1])["choices"][0]["text"]
        try:
            r = self.srv.post("/lora-adapters", [{"id": 0, "scale": 1.0}])
            self.assertEqual((r.status, r.json()), (200, {"success": True}))
            self.assertEqual([a["scale"] for a in self.srv.request("GET", "/lora-adapters").json()], [1.0, 0, 0, 0])
            # a request that picks nothing now runs with the global scales
            self.assertEqual(self.complete(PROMPTS[1])["choices"][0]["text"], want_x)
            # a request's own list wins over them (an empty list: no adapter)
            self.assertEqual(self.complete(PROMPTS[1], extra={"lora": []})["choices"][0]["text"], base)
        finally:
            self.assertEqual(self.srv.post("/lora-adapters", []).status, 200)
        self.assertEqual(self.complete(PROMPTS[1])["choices"][0]["text"], base)

    def test_bad_input_is_400_naming_the_field(self):
        cases = [
            ({"lora": [{"id": 9, "scale": 1}]}, "unknown adapter id 9"),
            ({"lora": [{"id": -1}]}, "unknown adapter id -1"),
            ({"lora": [{"id": "x"}]}, "id must be an integer"),
            ({"lora": [{"id": 0, "scale": "big"}]}, "scale must be a finite number"),
            ({"lora": [{"id": 0, "scale": 1e30}]}, "scale must be a finite number"),
            ({"lora": {"id": 0}}, "must be an array"),
            ({"lora": [3]}, "must be an object"),
        ]
        for extra, msg in cases:
            with self.subTest(extra=extra):
                r = self.srv.post("/v1/chat/completions", {"model": "x", "messages": [{"role": "user", "content": "hi"}],
                                                           "max_tokens": 2, **extra})
                self.assertEqual(r.status, 400, r)
                self.assertEqual(r.json()["error"]["param"], "lora")
                self.assertIn(msg, r.json()["error"]["message"])
        # with adapters served, `model` must be the served id or a NAME (a typo must not run the base)
        for route, body in [("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
                            ("/v1/completions", {"prompt": "hi"}),
                            ("/v1/messages", {"messages": [{"role": "user", "content": "hi"}]})]:
            with self.subTest(route=route):
                r = self.srv.post(route, {"model": "xx", "max_tokens": 2, **body})
                self.assertEqual(r.status, 400, r)
                self.assertIn("model 'xx' is neither the served model nor one of its --lora adapters", r.body.decode())
        for body, msg in [([{"id": 4, "scale": 1}], "unknown adapter id 4"), ({"id": 0}, "must be an array"),
                          ([{"id": 1, "scale": None}], "scale must be a finite number")]:
            with self.subTest(body=body):
                r = self.srv.post("/lora-adapters", body)
                self.assertEqual(r.status, 400, r)
                self.assertIn(msg, r.json()["error"]["message"])
        # Ollama: an unknown model is 404 as before; an adapter NAME is a model
        r = self.srv.post("/api/generate", {"model": "nope", "prompt": "hi", "stream": False})
        self.assertEqual(r.status, 404, r)
        r = self.srv.post("/api/generate", {"model": "y", "prompt": PROMPTS[0], "stream": False, "raw": True,
                                            "options": {"temperature": 0, "num_predict": N}})
        self.assertEqual(r.status, 200, r)
        self.assertEqual(r.json()["response"], self.complete(PROMPTS[0], "y")["choices"][0]["text"])
        self.assertTrue(self.srv.alive())

    def test_serve_refuses_bad_lora_flags(self):
        for flag, msg in [("noequals", "expected NAME=PATH"), ("a=/nonexistent/adapter", "--lora a"),
                          (f"{self.base_id}={self.paths['x']}", "served model's id")]:
            with self.subTest(flag=flag):
                code, _, err = run_cli("serve", self.model, "--port", str(free_port()), "--lora", flag, timeout=60)
                self.assertNotEqual(code, 0)
                self.assertIn(msg, err)

    def test_cli_eval_and_chat_take_lora(self):
        text = os.path.join(tmp_root(), "lora-eval.txt")
        with open(text, "w") as f:
            f.write(" ".join(PROMPTS * 8))

        def ppl(*extra):
            code, out, err = run_cli("eval", "ppl", self.model, "--text", text, "--ctx", "64", "--json", *extra)
            self.assertEqual(code, 0, err)
            return json.loads(out)["ppl"]
        base, with_x = ppl(), ppl("--lora", self.paths["x"])
        self.assertNotEqual(base, with_x)
        self.assertEqual(ppl("--lora", self.paths["x_copy"] + ":1"), with_x)
        self.assertEqual(ppl("--lora", self.paths["x"] + ":0"), base)  # scale 0: the base
        code, _, err = run_cli("eval", "ppl", self.model, "--text", text, "--lora", "/nonexistent/adapter")
        self.assertNotEqual(code, 0)
        self.assertIn("/nonexistent/adapter", err)
        code, _, err = run_cli("generate", self.model, "-p", "hi", "--lora", self.paths["x"] + ":inf")
        self.assertNotEqual(code, 0)
        self.assertIn("not a finite number", err)


class LoraRestartTest(unittest.TestCase):
    """The KV namespaces across a restart from the SSD tier (issue 45 item 3): the same adapter
    content under another name and path hits what the first server stored; an adapter file that
    changed under the same name misses, and the miss names the namespace that holds the prefix;
    entries never cross namespaces. /stats and /metrics break the store down by namespace."""

    def setUp(self):
        self.root = os.path.join(tmp_root(), "lora-restart")
        shutil.rmtree(self.root, ignore_errors=True)
        self.model = tiny_qwen3.make_qwen3_model(os.path.join(tmp_root(), "lora", "tiny-qwen3"), SHARED)["dir"]
        self.ssd = os.path.join(self.root, "ssd")
        self.x = write_peft(os.path.join(self.root, "x"), 1, list(SHAPES), 8, 32)
        self.c = write_peft(os.path.join(self.root, "c"), 5, ["self_attn.q_proj", "mlp.up_proj"], 4, 8)
        # no two share a first token: a miss is a miss, not a one-token hit in the own namespace
        self.prompts = {k: f"{w} prompt long enough to be cached: " + " ".join(str(i) for i in range(n, n + 30))
                        for k, w, n in (("x", "Seven", 0), ("c", "Purple", 100), ("base", "Quietly", 200))}

    def tearDown(self):
        shutil.rmtree(self.root, ignore_errors=True)

    def serve(self, *loras):
        flags = ["--ctx", "512", "--ssd-cache", self.ssd]
        for name, path in loras:
            flags += ["--lora", f"{name}={path}"]
        srv = Server(self.model, *flags, startup_timeout=120).start()
        for _ in range(200):  # the startup scan publishes the index (else: ssd_scanning)
            if srv.request("GET", "/stats").json()["kv_store"]["ssd"]["ready"]:
                break
            time.sleep(0.05)
        return srv

    def complete(self, srv, prompt, model):
        raw = srv.openai().completions.with_raw_response.create(model=model, prompt=prompt, max_tokens=4,
                                                                  temperature=0)
        cache = dict(kv.strip().split("=", 1) for kv in raw.headers["x-larder-cache"].split(";"))
        return raw.parse(), cache

    def test_renamed_adapter_hits_changed_adapter_misses_after_restart(self):
        srv = self.serve(("x", self.x), ("c", self.c))
        base_id = srv.model_id()
        try:
            for k, model in (("x", "x"), ("c", "c"), ("base", base_id)):
                r, cache = self.complete(srv, self.prompts[k], model)
                self.assertEqual(r.usage.prompt_tokens_details.cached_tokens, 0, cache)
            stats = srv.request("GET", "/stats").json()["kv_store"]["namespaces"]
            labels = {k: v for k, v in stats.items() if k not in ("base", "other")}
            self.assertEqual(sorted(lb.split("@")[0] for lb in labels), ["c", "x"], stats)
            old_c = next(v["id"] for k, v in labels.items() if k.startswith("c@"))
            for lb, v in stats.items():
                if lb != "other":
                    self.assertEqual((v["misses"], v["ram"]["entries"]), (1, 1), (lb, stats))
                    self.assertGreater(v["ram"]["bytes"], 0)
            for lb, v in labels.items():
                self.assertEqual(lb.split("@")[1], v["id"][:8])  # NAME@ the namespace id's first digits
            lookups = dict(srv.metrics()["larder_kv_namespace_lookups_total"])
            self.assertEqual(lookups['{namespace="base",result="miss"}'], 1, lookups)
            self.assertEqual(lookups['{namespace="other",result="miss"}'], 0, lookups)
            # x's prompt (its first part) under another adapter: another namespace, and the miss
            # says whose it is
            r, cache = self.complete(srv, self.prompts["x"][:60], "c")
            self.assertEqual(r.usage.prompt_tokens_details.cached_tokens, 0)
            x_label = next(k for k in labels if k.startswith("x@"))
            self.assertEqual(cache["reason"], "other_namespace:" + x_label)
        finally:
            self.assertEqual(srv.stop(timeout=120), 0, srv.log())  # SIGTERM flushes to the SSD tier

        # Restart: x's file under another name and path; c's file rewritten with other weights.
        renamed = os.path.join(self.root, "renamed-x")
        shutil.copytree(self.x, renamed)
        write_peft(self.c, 6, ["self_attn.q_proj", "mlp.up_proj"], 4, 8)
        srv = self.serve(("renamed", renamed), ("c", self.c))
        try:
            r, cache = self.complete(srv, self.prompts["x"], "renamed")
            self.assertEqual(cache["tier"], "ssd", cache)
            self.assertGreater(r.usage.prompt_tokens_details.cached_tokens, 0)
            r, cache = self.complete(srv, self.prompts["c"], "c")  # changed content: a miss, explained
            self.assertEqual(r.usage.prompt_tokens_details.cached_tokens, 0)
            self.assertEqual(cache["reason"], "other_namespace:unnamed@" + old_c[:8])
            r, cache = self.complete(srv, self.prompts["x"], base_id)  # x's entries never seed the base
            self.assertEqual(r.usage.prompt_tokens_details.cached_tokens, 0)
            self.assertTrue(cache["reason"].startswith("other_namespace:renamed@"), cache)
            r, cache = self.complete(srv, self.prompts["base"], base_id)
            self.assertEqual(cache["tier"], "ssd", cache)
            stats = srv.request("GET", "/stats").json()["kv_store"]["namespaces"]
            self.assertEqual(stats["other"]["namespaces"], 1, stats)  # the old c's, not named any more
            self.assertGreaterEqual(stats["other"]["ssd"]["entries"], 1)
            ren = next(v for k, v in stats.items() if k.startswith("renamed@"))
            self.assertEqual(ren["hits"], 1)
            self.assertGreaterEqual(ren["ssd"]["entries"], 1)
        finally:
            self.assertEqual(srv.stop(timeout=120), 0, srv.log())


if __name__ == "__main__":
    unittest.main()
