"""Greedy generation of larder vs llama.cpp on the real models, token by token (near_tie.py says
how a divergence is judged), from goldens llama-server produced with its own top-5
log-probabilities at every step (scripts/make_llamacpp_goldens.py greedy / chat-steps).

  * greedy_gemma3.json (issue 13): gemma-3-270m Q4_K_M, plain-text continuations of varied
    prompts (prose, code, a list, arithmetic) — larder serve's native /completion stream (token
    ids) and `larder generate` (text).
  * chat_steps_smollm2.json (issue 12): chat_greedy_test.py, on the same judgement.

Every request is the first of its prompt on a server whose KV store is off (--prompt-cache 0), so
each prompt is prefilled whole as llama-server's cache_prompt=false requests were: reusing a
cached prefix prefills the rest in another chunking, which on these int8-activation models alone
moves logits by up to ~0.2 nats (docs: cached vs cold outputs).

Measured (2026-12-04, larder at cc3ec2c, f32 KV): the server's continuation equals llama-server's
for 32 tokens on 1 of the 6 gemma prompts; on the other 5 they part where llama.cpp's margin is
0.10-0.55 nats. At 4 of those steps larder's token is the exact f32 model's own top-1 and
llama.cpp's 0.05-0.35 nats below it (there larder is the one that follows the model); at the
fifth llama.cpp has the exact top-1 and larder's token is 0.014 nats from it. llama.cpp's
f16-KV and f32-KV runs themselves part on 5 of the 6 prompts.

Skips, naming the folder, when the models were not fetched (LARDER_MODELS_DIR).
"""
import json
import os
import subprocess
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "../server"))
import near_tie  # noqa: E402

BIN = os.environ.get("LARDER_BIN") or os.path.join(HERE, "../../build/bin/larder")
MODELS = os.environ.get("LARDER_MODELS_DIR") or os.path.join(HERE, "../../.cache/models")
# The llama-server configuration larder is held to: llama.cpp's default (f16 KV cache, flash
# attention auto). The goldens also keep its most precise CPU path (f32_kv: f32 KV, no flash
# attention) to show how far llama.cpp agrees with itself: on gemma-3-270m the two part within
# the first 32 tokens on 5 of 6 prompts, at steps where the default run's margin is up to 0.27
# nats — on these int8-activation Q4 models a margin of a few tenths is within rounding.
REFERENCE = "default"
NEAR_TIE_NATS = 0.05   # llama.cpp's own top-1 vs top-2 margin at a divergence where larder took its #2
# Or: the exact f32 model's best logprob minus that of larder's token. llama.cpp's own greedy
# tokens fall up to 0.35 (gemma) / 0.28 (SmolLM2) nats below the exact best in these goldens
# (JudgeCanFail.test_bound_below_llamacpp_own_gap measures it): larder is held to about half of
# that — at a divergence it must be closer to the model than llama.cpp's worst step is.
EXACT_TIE_NATS = 0.15


def load(name):
    with open(os.path.join(HERE, name), encoding="utf-8") as f:
        return json.load(f)


def model_path(golden):
    path = os.path.join(MODELS, golden["model"])
    if not os.path.exists(path):
        raise unittest.SkipTest(f"{path} is absent: run scripts/fetch_models.sh (or set LARDER_MODELS_DIR)")
    return path


class GreedyCase(unittest.TestCase):
    def judge(self, verdict, what, results):
        results.append((what, verdict))
        self.assertTrue(verdict.ok(NEAR_TIE_NATS, EXACT_TIE_NATS), f"{what}: {verdict.explain(NEAR_TIE_NATS, EXACT_TIE_NATS)}")

    def report(self, results):
        for what, v in results:
            print(f"  {what}: {v.explain(NEAR_TIE_NATS, EXACT_TIE_NATS)}", file=sys.stderr)


class JudgeCanFail(GreedyCase):
    """The judgement rejects what it must, on the committed goldens themselves: at each of the
    first steps, choosing a llama.cpp top-5 token that is neither its near-tie #2 nor within the
    exact bound of the exact model's best is a failure; choosing llama.cpp's own token is not."""

    def test_bound_below_llamacpp_own_gap(self):
        for name in ("greedy_gemma3.json", "chat_steps_smollm2.json"):
            own = 0.0
            for case in load(name)["runs"][REFERENCE]:
                for st in case["steps"]:
                    lp = next((e["logprob"] for e in st["exact"] if e["id"] == st["id"]), None)
                    own = max(own, st["exact"][0]["logprob"] - lp if lp is not None else float("inf"))
            self.assertLessEqual(EXACT_TIE_NATS, 0.6 * own, f"{name}: llama.cpp's own tokens are at most {own:.3f} nats "
                                                            "below the exact model's best; the bound must stay well under it")

    def test_text_that_continues_with_a_longer_alternative(self):
        """llama.cpp took '\n' then 'Q'; larder's text '\n\nA' reads as llama.cpp's '\n' followed
        by a mismatch, or as its near-tie #2 '\n\n': the second reading is the right one, and a
        longer alternative that is no near-tie still fails."""
        def tok(i, b, lp):
            return {"id": i, "bytes": list(b), "logprob": lp}
        def steps(second_lp):
            top0 = [tok(1, b"\n", -0.50), tok(2, b"\n\n", second_lp), tok(3, b"x", -5.0)]
            return [{"id": 1, "bytes": list(b"\n"), "top": top0, "exact": top0},
                    {"id": 4, "bytes": list(b"Q"), "top": [tok(4, b"Q", -0.1), tok(5, b"A", -3.0)],
                     "exact": [tok(4, b"Q", -0.1), tok(5, b"A", -3.0)]}]
        near = near_tie.by_text(steps(-0.52), "\n\nA", False, [], need=2, bound=NEAR_TIE_NATS, exact_bound=EXACT_TIE_NATS)
        self.assertTrue(near.ok(NEAR_TIE_NATS, EXACT_TIE_NATS), near.explain(NEAR_TIE_NATS, EXACT_TIE_NATS))
        far = near_tie.by_text(steps(-2.5), "\n\nA", False, [], need=2, bound=NEAR_TIE_NATS, exact_bound=EXACT_TIE_NATS)
        self.assertFalse(far.ok(NEAR_TIE_NATS, EXACT_TIE_NATS), far.explain(NEAR_TIE_NATS, EXACT_TIE_NATS))

    def test_wrong_choices_fail(self):
        golden = load("greedy_gemma3.json")
        eog = golden["eog_ids"]
        rejected = 0
        for case in golden["runs"][REFERENCE]:
            steps = case["steps"]
            self.assertTrue(all("exact" in st for st in steps), "regenerate with make_llamacpp_goldens.py exact")
            self.assertTrue(near_tie.by_ids(steps, [st["id"] for st in steps], False, eog).ok(NEAR_TIE_NATS, EXACT_TIE_NATS))
            for k in range(4):
                best = steps[k]["exact"][0]["logprob"]
                for alt in steps[k]["top"][1:]:
                    ex = next((e["logprob"] for e in steps[k]["exact"] if e["id"] == alt["id"]), None)
                    far = ex is None or best - ex > EXACT_TIE_NATS
                    tie = alt is steps[k]["top"][1] and steps[k]["top"][0]["logprob"] - alt["logprob"] <= NEAR_TIE_NATS
                    got = [st["id"] for st in steps[:k]] + [alt["id"]]
                    v = near_tie.by_ids(steps, got, False, eog)
                    self.assertEqual(v.ok(NEAR_TIE_NATS, EXACT_TIE_NATS), not far or tie, v.explain(NEAR_TIE_NATS, EXACT_TIE_NATS))
                    text = b"".join(bytes(st["bytes"]) for st in steps[:k]) + bytes(alt["bytes"]) + b" zzz"
                    if not (far and not tie) or alt["id"] in eog or not alt["bytes"]:
                        continue
                    rejected += 1
                    self.assertFalse(near_tie.by_text(steps, text, False, eog, bound=NEAR_TIE_NATS,
                                                      exact_bound=EXACT_TIE_NATS).ok(NEAR_TIE_NATS, EXACT_TIE_NATS))
        self.assertGreater(rejected, 20)


class GemmaGreedyVsLlamaCpp(GreedyCase):
    """gemma-3-270m: larder's greedy continuation vs llama-server's (issue 13)."""

    @classmethod
    def setUpClass(cls):
        cls.golden = load("greedy_gemma3.json")
        cls.model = model_path(cls.golden)
        cls.cases = cls.golden["runs"][REFERENCE]

    def test_server_token_ids(self):
        from server_harness import Server
        srv = Server(self.model, "--parallel", "1", "--prompt-cache", "0", "--kv-dtype", "f32").start()
        self.addCleanup(srv.kill)
        self.addCleanup(srv.stop)
        results = []
        self.addCleanup(self.report, results)
        self.assertGreaterEqual(len(self.cases), 5)
        for case in self.cases:
            with self.subTest(prompt=case["prompt"][:40]):
                n = len(case["steps"])
                r, events = srv.stream("/completion", {"prompt": case["prompt"], "n_predict": n, "temperature": 0,
                                                       "stream": True}, timeout=300)
                self.assertEqual(r.status, 200, r)
                ids, ended = [], False
                for e in events:
                    if not e.data or e.data == "[DONE]":
                        continue
                    obj = json.loads(e.data)
                    ids += obj.get("tokens", [])
                    if obj.get("stop"):
                        ended = obj.get("stop_type") == "eos"
                        self.assertEqual(obj.get("tokens_evaluated"), case["prompt_tokens"],
                                         "prompt size (BOS included) as llama-server's")
                self.judge(near_tie.by_ids(case["steps"], ids, ended, self.golden["eog_ids"]),
                           f"serve /completion {case['prompt'][:30]!r}", results)

    def test_generate_text(self):
        results = []
        self.addCleanup(self.report, results)
        for case in self.cases:
            with self.subTest(prompt=case["prompt"][:40]):
                n = len(case["steps"])
                p = subprocess.run([BIN, "generate", self.model, "--prompt", case["prompt"], "-n", str(n), "--temp", "0", "--kv-dtype", "f32"],
                                   capture_output=True, timeout=300)
                self.assertEqual(p.returncode, 0, p.stderr.decode(errors="replace"))
                out = p.stdout
                self.assertTrue(out.endswith(b"\n"), out[-40:])
                # `larder generate` ends on EOS or on -n; a shorter answer than llama.cpp's whole
                # one is an early end of generation, which by_text judges like any other token.
                self.judge(near_tie.by_text(case["steps"], out[:-1], True, self.golden["eog_ids"], bound=NEAR_TIE_NATS,
                                            exact_bound=EXACT_TIE_NATS),
                           f"larder generate {case['prompt'][:30]!r}", results)


if __name__ == "__main__":
    unittest.main()
