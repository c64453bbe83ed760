"""Batch-invariant serving (issue 41, LARDER_BATCH_INVARIANT=1) on a real quantized model.

With the AVX-512 integer formats decoding in the prefill GEMM's arithmetic (kernels/cpu/avx512
gemm16_avx512.h Gemv16), a token's logits do not depend on the batch it was computed in, so:
- a prompt whose prefix comes from the KV store (the suffix prefilled or decoded alone) gives the
  same tokens and log-probabilities, bit for bit, as the cold run;
- eight requests decoded together as one batch give what each gives alone.
Without the flag SmolLM2-135M Q4_1 moved cached-vs-cold log-probabilities by up to 1.6 nats and
changed the greedy text (docs/server-api.md). Runs on SmolLM2 Q4_1 and on Qwen2.5-Coder 0.5B
Q4_K_M (its ffn_down in Q4_K and Q6_K: the decode kernels that follow the GEMM's super-block and
half-block arithmetic, session 37; the rest Q5_0 and Q8_0) from LARDER_MODELS_DIR (skips when
absent) and only on CPUs with the AVX-512 tier (the flag covers that tier's kernels).
"""
import concurrent.futures
import os
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from server_harness import Server  # noqa: E402

MODELS = os.environ.get("LARDER_MODELS_DIR") or os.path.join(HERE, "../../.cache/models")
SMOL = os.path.join(MODELS, "SmolLM2-135M-Instruct.Q4_1.gguf")
QWEN_Q4KM = os.path.join(MODELS, "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf")

PROMPTS = [
    "Lily and Ben went to the park. They saw a big dog and a small cat. The dog",
    "Once upon a time there was a little girl named Sue. She liked to play with her ball",
    "The sun was hot and the sky was blue. Tom wanted to swim in the lake with his friend",
    "In a small town by the sea lived an old fisherman who",
    "The recipe for a good soup starts with",
    "My favourite thing about winter is",
    "The robot looked at the broken clock and",
    "Write a short note to a friend about the weekend:",
]


def avx512_tier():
    # The tier's CPUID set (core/cpuid.h has_avx512_tier): F, BW, VL, DQ, VNNI, BF16.
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    except OSError:
        return False
    return all(x in flags for x in ("avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni", "avx512_bf16"))


class BatchInvariantServeTest(unittest.TestCase):
    server = None
    MODEL = SMOL

    @classmethod
    def setUpClass(cls):
        if not os.path.exists(cls.MODEL):
            raise unittest.SkipTest(f"{cls.MODEL} is absent: run scripts/fetch_models.sh (or set LARDER_MODELS_DIR)")
        if not avx512_tier() or os.environ.get("LARDER_ISA") in ("avx2", "ref"):
            raise unittest.SkipTest("LARDER_BATCH_INVARIANT covers the AVX-512 tier's kernels; this CPU runs AVX2")
        cls.server = Server(cls.MODEL, "--parallel", "8", env={"LARDER_BATCH_INVARIANT": "1"}).start()

    @classmethod
    def tearDownClass(cls):
        if cls.server is not None:
            cls.server.stop()

    def complete(self, prompt, n=24):
        r = self.server.post("/v1/completions", {"prompt": prompt, "max_tokens": n, "temperature": 0, "logprobs": 3})
        self.assertEqual(r.status, 200, r)
        return r.json()

    def test_cached_equals_cold(self):
        for i, prompt in enumerate(PROMPTS[:3]):
            prompt = f"Story number {i + 11}. {prompt}"  # a start no other test's prompt shares
            cold = self.complete(prompt)
            warm = self.complete(prompt)
            cached = cold["usage"]["prompt_tokens_details"]["cached_tokens"]
            self.assertGreater(warm["usage"]["prompt_tokens_details"]["cached_tokens"], cached + 8, warm["usage"])
            a, b = cold["choices"][0], warm["choices"][0]
            self.assertEqual(a["text"], b["text"])
            self.assertEqual(a["logprobs"]["token_logprobs"], b["logprobs"]["token_logprobs"], prompt)
            self.assertEqual(a["logprobs"]["top_logprobs"], b["logprobs"]["top_logprobs"], prompt)

    def test_batched_equals_alone(self):
        # Distinct suffixes, so no request is served from another's cached prefix mid-test.
        prompts = [p + f" ({i})" for i, p in enumerate(PROMPTS)]
        alone = [self.complete(p)["choices"][0] for p in prompts]
        with concurrent.futures.ThreadPoolExecutor(len(prompts)) as ex:
            together = [j["choices"][0] for j in ex.map(self.complete, prompts)]
        for p, a, b in zip(prompts, alone, together):
            self.assertEqual(a["text"], b["text"], p)
            self.assertEqual(a["logprobs"]["token_logprobs"], b["logprobs"]["token_logprobs"], p)



class BatchInvariantQ4KMServeTest(BatchInvariantServeTest):
    """The same on a Q4_K_M file. Qwen2.5-Coder 0.5B's (gguf-py's count of its 291 tensors): Q4_K ×12
    and Q6_K ×12 (ffn_down, rows of 4864), Q5_0 ×133 and Q8_0 ×13 (rows of 896, no whole number of
    256-element super-blocks: llama.cpp's fallback), F32 ×121 — so the K-quants' batch-invariant
    decode kernels run beside Q5_0's and Q8_0's."""
    MODEL = QWEN_Q4KM


if __name__ == "__main__":
    unittest.main()
