"""llama-server drop-in, issue 47 items 15-17: `serve --seed`, /completion's n_probs
(completion_probabilities, streamed too, post_sampling_probs), lists of prompts answered as a JSON
array, logit_bias with text keys, and /completions answering llama-server's native shape (as
llama-server routes it). Shapes from llama.cpp's tools/server (server-task.cpp
probs_vector_to_json, server-common.cpp tokenize_input_prompts, server.cpp's route table) and
docs/server-api.md."""
import json
import math
import unittest

from server_harness import STORIES, STORIES_PROMPT, STORIES_PROMPT_IDS, Server, ServerTestCase, parse_sse

ENTRY_KEYS = ["id", "token", "bytes", "logprob", "top_logprobs"]
ALT_KEYS = ["id", "token", "bytes", "logprob"]
POST_ENTRY_KEYS = ["id", "token", "bytes", "prob", "top_probs"]
POST_ALT_KEYS = ["id", "token", "bytes", "prob"]


def stream_events(r):
    assert r.status == 200, r
    events = [e.data for e in parse_sse(r.body) if e.data]
    assert "[DONE]" not in events, "llama-server's native stream has no [DONE]"
    return [json.loads(d) for d in events]


class NativeCompletionTest(ServerTestCase):
    FLAGS = ("--prompt-cache", "0")  # logprobs compared across requests: no cached prefixes

    def complete(self, path="/completion", **body):
        r = self.server.post(path, {"prompt": STORIES_PROMPT, "n_predict": 8, "temperature": 0, **body})
        self.assertEqual(r.status, 200, r)
        return r.json()

    def check_entry(self, e, post=False):
        self.assertEqual(list(e), POST_ENTRY_KEYS if post else ENTRY_KEYS, e)
        alts = e["top_probs" if post else "top_logprobs"]
        for a in alts:
            self.assertEqual(list(a), POST_ALT_KEYS if post else ALT_KEYS, a)
        for x in [e, *alts]:
            self.assertIsInstance(x["id"], int)
            raw = bytes(x["bytes"])
            self.assertTrue(raw.decode("utf-8", "replace").startswith(x["token"]) or x["token"] == "", x)
        key = "prob" if post else "logprob"
        vals = [a[key] for a in alts]
        self.assertEqual(vals, sorted(vals, reverse=True), f"alternatives most likely first: {alts}")
        if post:
            self.assertTrue(all(0 < v <= 1 for v in vals), vals)
            self.assertLessEqual(sum(vals), 1 + 1e-5, "probabilities after the sampler sum to at most 1")
        else:
            self.assertTrue(all(v <= 0 for v in vals + [e[key]]), vals)
        return alts

    def test_n_probs_shape_and_consistency(self):
        j = self.complete(n_probs=5)
        probs = j["completion_probabilities"]
        self.assertEqual(len(probs), j["tokens_predicted"], "one entry per generated token")
        self.assertEqual(j["generation_settings"]["n_probs"], 5)
        for e in probs:
            alts = self.check_entry(e)
            self.assertEqual(len(alts), 5)
            # Greedy: the sampled token is the most likely one, with the top entry's log-probability.
            self.assertEqual(e["id"], alts[0]["id"])
            self.assertEqual(e["logprob"], alts[0]["logprob"])
            self.assertLessEqual(sum(math.exp(a["logprob"]) for a in alts), 1 + 1e-5)
        self.assertEqual(b"".join(bytes(e["bytes"]) for e in probs), j["content"].encode(), "the pieces make the text")
        # The same distribution as the OpenAI route reports when nothing alters the logits.
        oa = self.server.post("/v1/completions", {"prompt": STORIES_PROMPT, "max_tokens": 8, "temperature": 0,
                                                  "logprobs": 5}).json()["choices"][0]["logprobs"]
        for e, lp in zip(probs, oa["token_logprobs"]):
            self.assertAlmostEqual(e["logprob"], lp, delta=1e-5)
        # No n_probs (or 0): no completion_probabilities, as llama-server.
        self.assertNotIn("completion_probabilities", self.complete())
        self.assertNotIn("completion_probabilities", self.complete(n_probs=0))
        # OpenAI's logprobs stands in for an absent n_probs.
        self.assertEqual(len(self.complete(logprobs=2)["completion_probabilities"][0]["top_logprobs"]), 2)
        for bad in (-1, 1001, "5", 1.5):
            r = self.server.post("/completion", {"prompt": STORIES_PROMPT, "n_predict": 2, "n_probs": bad})
            self.assertEqual(r.status, 400, f"n_probs {bad!r}: {r}")
            self.assertIn("n_probs", r.json()["error"]["message"])

    def test_n_probs_are_the_models_own_distribution(self):
        # llama-server reports the raw logits' softmax: a token forced by logit_bias keeps its
        # natural log-probability (the /v1 routes report the processed one, which would be ~0).
        first = self.complete(n_predict=1, n_probs=1000)["completion_probabilities"][0]
        natural = {a["id"]: a["logprob"] for a in first["top_logprobs"]}
        self.assertEqual(len(natural), 512, "every token of stories260K's vocabulary")
        forced = sorted(natural, key=natural.get)[len(natural) // 2]  # a middling token
        e = self.complete(n_predict=1, n_probs=3, logit_bias=[[forced, 100]])["completion_probabilities"][0]
        self.assertEqual(e["id"], forced)
        self.assertAlmostEqual(e["logprob"], natural[forced], delta=1e-5)
        self.assertLess(e["logprob"], -1)
        self.assertEqual(e["top_logprobs"][0]["id"], first["id"], "alternatives ignore the bias")

    def test_post_sampling_probs(self):
        j = self.complete(n_probs=5, post_sampling_probs=True)
        self.assertIs(j["generation_settings"]["post_sampling_probs"], True)
        for e in j["completion_probabilities"]:
            alts = self.check_entry(e, post=True)
            # Greedy: the chosen token alone, certain (zero-probability candidates are left out).
            self.assertEqual(alts, [{k: e[k] for k in POST_ALT_KEYS}])
            self.assertEqual(e["prob"], 1.0)
        j = self.complete(n_predict=12, n_probs=10, post_sampling_probs=True, temperature=1.0, top_k=3, seed=5)
        for e in j["completion_probabilities"]:
            alts = self.check_entry(e, post=True)
            self.assertLessEqual(len(alts), 3, "top_k 3 leaves three candidates")
            self.assertAlmostEqual(sum(a["prob"] for a in alts), 1.0, delta=1e-5, msg="all candidates shown")
            self.assertIn(e["id"], [a["id"] for a in alts])
            self.assertEqual(e["prob"], next(a["prob"] for a in alts if a["id"] == e["id"]))
        j = self.complete(n_predict=12, n_probs=4, post_sampling_probs=True, temperature=0.8, seed=2)
        for e in j["completion_probabilities"]:
            alts = self.check_entry(e, post=True)
            self.assertEqual(len(alts), 4)
            self.assertTrue(0 < e["prob"] <= 1)

    def test_n_probs_streamed(self):
        for post in (False, True):
            body = {"n_probs": 3, "post_sampling_probs": post}
            whole = self.complete(**body)
            r = self.server.post("/completion", {"prompt": STORIES_PROMPT, "n_predict": 8, "temperature": 0,
                                                 "stream": True, **body})
            events = stream_events(r)
            self.assertIs(events[-1]["stop"], True)
            self.assertNotIn("completion_probabilities", events[-1], "streamed, the entries travel in the events")
            got = [e for ev in events[:-1] for e in ev.get("completion_probabilities", [])]
            self.assertEqual(got, whole["completion_probabilities"])
            for ev in events[:-1]:
                self.assertEqual(ev["index"], 0)
                self.assertEqual(len(ev["completion_probabilities"]), len(ev["tokens"]))
            self.assertEqual([ev["tokens_predicted"] for ev in events[:-1]][-1], 8)

    def test_prompt_list_answers_an_array(self):
        prompts = ["Once upon a time", "The cat sat", STORIES_PROMPT_IDS[:3], {"prompt_string": "Lily liked"}]
        single = [self.complete(prompt=p, n_probs=2) for p in prompts]
        r = self.server.post("/completion", {"prompt": prompts, "n_predict": 8, "temperature": 0, "n_probs": 2})
        self.assertEqual(r.status, 200, r)
        arr = r.json()
        self.assertIsInstance(arr, list, "a list of prompts answers a JSON array")
        self.assertEqual(len(arr), len(prompts))
        for i, (got, want) in enumerate(zip(arr, single)):
            self.assertEqual(got["index"], i)
            for k in ("content", "tokens_predicted", "tokens_evaluated", "stop_type"):
                self.assertEqual(got[k], want[k], f"prompt {i}: {k}")
            # Decoded in one batch: the same tokens, log-probabilities equal up to float rounding.
            ga, wa = got["completion_probabilities"], want["completion_probabilities"]
            self.assertEqual([e["id"] for e in ga], [e["id"] for e in wa])
            self.assertEqual([[a["id"] for a in e["top_logprobs"]] for e in ga], [[a["id"] for a in e["top_logprobs"]] for e in wa])
            for x, y in zip(ga, wa):
                self.assertAlmostEqual(x["logprob"], y["logprob"], delta=1e-4)
        # A list of one answers the object itself (llama-server: a single result is not wrapped).
        one = self.server.post("/completion", {"prompt": ["The cat sat"], "n_predict": 8, "temperature": 0}).json()
        self.assertIsInstance(one, dict)
        self.assertEqual(one["content"], single[1]["content"])
        # Ids mixed with text are one prompt: the string is tokenized where it stands, BOS only
        # when a string leads.
        head = self.server.post("/tokenize", {"content": "Once upon", "add_special": True}).json()["tokens"]
        self.assertEqual(head, STORIES_PROMPT_IDS[:3])
        mixed = self.complete(prompt=["Once upon", *STORIES_PROMPT_IDS[3:]])
        self.assertEqual((mixed["tokens_evaluated"], mixed["content"]), (5, single[0]["content"]))
        mixed = self.complete(prompt=[*STORIES_PROMPT_IDS[:3], " a time"])
        self.assertEqual(mixed["tokens_evaluated"], 3 + len(self.server.post(
            "/tokenize", {"content": " a time", "add_special": False}).json()["tokens"]))
        for bad in ([], [[]], [1, None], [{"prompt_string": "x", "multimodal_data": ["AAAA"]}], [1.5]):
            r = self.server.post("/completion", {"prompt": bad, "n_predict": 2})
            self.assertEqual(r.status, 400, f"prompt {bad!r}: {r}")
            self.assertIn("prompt", r.json()["error"]["message"] + str(r.json()["error"].get("param")))

    def test_prompt_list_streamed(self):
        prompts = ["Once upon a time", "The cat sat", "Lily liked"]
        single = [self.complete(prompt=p)["content"] for p in prompts]
        r = self.server.post("/completion", {"prompt": prompts, "n_predict": 8, "temperature": 0, "stream": True})
        events = stream_events(r)
        texts, finals = {}, {}
        for ev in events:
            self.assertNotIn(ev["index"], finals, "nothing follows a result's final object")
            if ev["stop"]:
                finals[ev["index"]] = ev
            else:
                texts[ev["index"]] = texts.get(ev["index"], "") + ev["content"]
        self.assertEqual(sorted(finals), [0, 1, 2], "every result ends with its own object")
        self.assertEqual([texts[i] for i in range(3)], single)
        self.assertTrue(all(f["tokens_predicted"] == 8 for f in finals.values()))

    def test_logit_bias_text_keys(self):
        # llama-server's {"text": bias}: a key that is not an integer stands for every token of its
        # encoding; false bans. Greedy output must then avoid those tokens.
        base = self.complete()
        lp = self.server.post("/v1/completions", {"prompt": STORIES_PROMPT, "max_tokens": 8, "temperature": 0,
                                                  "logprobs": 1}).json()["choices"][0]["logprobs"]
        word = lp["tokens"][0]  # the first greedy token's text
        ids = self.server.post("/tokenize", {"content": word, "add_special": False}).json()["tokens"]
        self.assertTrue(ids, word)
        for bias in (-100, False):
            for path in ("/completion", "/completions"):
                r = self.server.post(path, {"prompt": STORIES_PROMPT, "n_predict": 8, "temperature": 0,
                                            "logit_bias": {word: bias}, "n_probs": 1})
                self.assertEqual(r.status, 200, f"{path} logit_bias {{{word!r}: {bias}}}: {r}")
                j = r.json()
                got = [e["id"] for e in j["completion_probabilities"]]
                self.assertNotEqual(j["content"], base["content"], "the banned token changes the greedy output")
                self.assertFalse(set(got) & set(ids), f"{word!r} {ids} banned, got {got}")
        # The OpenAI routes keep OpenAI's rule: keys are token ids.
        r = self.server.post("/v1/completions", {"prompt": STORIES_PROMPT, "max_tokens": 2, "logit_bias": {word: -100}})
        self.assertEqual(r.status, 400, r)
        self.assertIn("logit_bias must be a dict of int to float", r.json()["error"]["message"])
        # Integer keys still mean ids; a key with no tokens is refused.
        forced = self.complete(n_predict=3, logit_bias={str(STORIES_PROMPT_IDS[1]): 100}, n_probs=1)
        self.assertEqual([e["id"] for e in forced["completion_probabilities"]], [STORIES_PROMPT_IDS[1]] * 3)
        r = self.server.post("/completion", {"prompt": STORIES_PROMPT, "n_predict": 2, "logit_bias": {"": -100}})
        self.assertEqual(r.status, 400, r)
        self.assertIn("logit_bias", r.json()["error"]["message"])
        r = self.server.post("/completion", {"prompt": STORIES_PROMPT, "n_predict": 2, "logit_bias": {word: "x"}})
        self.assertEqual(r.status, 400, r)

    def test_completions_without_v1_is_native(self):
        # llama-server routes POST /completions to the native handler, /v1/completions to OpenAI's.
        native = self.complete()
        j = self.complete("/completions")
        self.assertNotIn("choices", j)
        for k in ("content", "stop", "stop_type", "tokens_predicted", "tokens_evaluated"):
            self.assertEqual(j[k], native[k], k)
        self.assertEqual(j["stop"], True)
        r = self.server.post("/completions", {"prompt": STORIES_PROMPT, "n_predict": 8, "temperature": 0, "stream": True})
        events = stream_events(r)
        self.assertEqual("".join(e["content"] for e in events), native["content"])
        oa = self.server.post("/v1/completions", {"prompt": STORIES_PROMPT, "max_tokens": 8, "temperature": 0}).json()
        self.assertEqual(oa["object"], "text_completion")
        self.assertEqual(oa["choices"][0]["text"], native["content"])


class ServerSeedTest(unittest.TestCase):
    """`serve --seed N` (llama-server's -s): requests without a seed sample with N."""

    REQUESTS = [("/v1/completions", {"prompt": "Once upon a time", "max_tokens": 16}),
                ("/completion", {"prompt": "The cat sat", "n_predict": 16}),
                ("/v1/completions", {"prompt": "Once upon a time", "max_tokens": 16}),
                ("/api/generate", {"model": "stories260K", "prompt": "Lily liked", "raw": True, "stream": False,
                                   "options": {"num_predict": 16}})]

    def answers(self, seed):
        s = Server(STORIES, "--prompt-cache", "0", *(["--seed", str(seed)] if seed is not None else [])).start()
        try:
            out = []
            for path, body in self.REQUESTS:
                if path == "/api/generate":
                    body = {**body, "options": {**body["options"], "temperature": 1.0}}
                else:
                    body = {**body, "temperature": 1.0}
                r = s.post(path, body)
                self.assertEqual(r.status, 200, r)
                j = r.json()
                out.append(j["choices"][0]["text"] if "choices" in j else j.get("content", j.get("response")))
            explicit = s.post("/v1/completions", {"prompt": "The dog", "max_tokens": 16, "temperature": 1.0,
                                                  "seed": 7}).json()["choices"][0]["text"]
            props = s.request("GET", "/props").json()["default_generation_settings"]["params"]
            return out, explicit, props["seed"]
        finally:
            s.stop()

    def test_seed_makes_seedless_requests_repeat(self):
        a, a7, a_seed = self.answers(42)
        b, b7, _ = self.answers(42)
        c, c7, _ = self.answers(43)
        self.assertEqual(a_seed, 42)
        self.assertEqual(a, b, "the same --seed answers the same request sequence identically")
        self.assertNotEqual(a, c, "another --seed samples differently")
        self.assertEqual(a[0], a[2], "the server seed is every seedless request's seed (llama-server)")
        self.assertEqual(a7, b7)
        self.assertEqual(a7, c7, "a request's own seed wins over --seed")
        _, _, none_seed = self.answers(None)
        self.assertEqual(none_seed, -1)

    def test_bad_seed_flag(self):
        for bad in ("-2", "x"):
            s = Server(STORIES, "--seed", bad)
            with self.assertRaises(AssertionError):
                s.start()
            s.kill()


if __name__ == "__main__":
    unittest.main()
