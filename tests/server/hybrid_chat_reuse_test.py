"""Message-boundary checkpoints of recurrent state through the server (issue 40 item 4,
kv-store.md §11.3, §11.6).

A tiny random Qwen3.5 (gated DeltaNet + full attention, tiny_qwen35.py: the Qwen35.* fixture's
layers at the real Qwen3 tokenizer and template) keeps a recurrent state that cannot be cut back:
the store serves it only at the exact point an entry was captured. With thinking off, the Qwen3 /
Qwen3.5 templates open the answer with an empty `<think>\\n\\n</think>\\n\\n` block that the history
no longer renders, so the next turn leaves the previous one right after
`<|im_start|>assistant\\n`: neither the full entry (prompt + answer) nor the prompt-end checkpoint
(len − 1) is a prefix of it. Without checkpoints at the message ends every turn re-prefills the
whole conversation (llama.cpp #20225, LM Studio #1563).

A 10-turn chat, greedy, through the real `openai` client against a live `larder serve`:
  - from turn 2 on, cached_tokens covers every token up to the end of the previous turn's last
    message (all the previous prompt but its generation prompt), from RAM, served by a
    message_end checkpoint (/stats, /metrics count them);
  - every turn's answer equals the same messages on a server with the store off;
  - after a restart on the same SSD cache dir (SIGTERM flushes the store), turn 11 resumes from the
    SSD tier at the end of turn 10's last user message;
  - with thinking on (the answer rendered as generated), each turn resumes after the whole
    previous answer from the full entry."""
import os
import shutil
import tempfile
import unittest

import tiny_qwen35
from server_harness import SHARED, Server, metric_sum

QWEN_TOK = os.path.join(SHARED, "tokenizers/hf/qwen3/tokenizer.json")
TURNS = 10
MAX_TOKENS = 12
TOPICS = ["lighthouses", "bread baking", "the moon", "trains", "volcanoes", "bees", "chess", "rivers",
          "glass", "clocks", "maps"]
NO_THINK = {"chat_template_kwargs": {"enable_thinking": False}}
GEN_PROMPT = "<|im_start|>assistant\n<think>\n\n</think>\n\n"  # the template's, thinking off


def user_message(topic):
    return f"Tell me about {topic}. " + " ".join(
        f"Please include detail number {k} about {topic} and why it matters." for k in range(3))


@unittest.skipUnless(os.path.exists(QWEN_TOK), f"{QWEN_TOK} absent")
class HybridChatReuse(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="larder_hybrid_reuse_")
        cls.model = tiny_qwen35.make_qwen35_model(os.path.join(cls.tmp, "tiny-qwen35"), SHARED)["dir"]

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def server(self, *flags):
        return Server(self.model, "--ctx", "4096", "--parallel", "1", *flags, startup_timeout=120).start()

    def turn(self, client, messages, extra=NO_THINK):
        r = client.chat.completions.create(model="q", messages=messages, max_tokens=MAX_TOKENS, temperature=0,
                                           extra_body=extra)
        u = r.usage.model_dump()
        return {"content": r.choices[0].message.content, "prompt": u["prompt_tokens"],
                "completion": u["completion_tokens"], "cached": u["prompt_tokens_details"]["cached_tokens"],
                "tier": u["larder"]["cache"]["tier"], "reason": u["larder"]["cache"]["reason"]}

    def chat(self, srv, replies=None, turns=TURNS):
        client = srv.openai(timeout=300)
        messages, out = [], []
        for i in range(turns):
            messages.append({"role": "user", "content": user_message(TOPICS[i])})
            t = self.turn(client, messages)
            out.append(t)
            messages.append({"role": "assistant", "content": replies[i] if replies else t["content"]})
        return out, messages

    def test_ten_turns_cold_equal_and_ssd_restart(self):
        ssd = os.path.join(self.tmp, "ssd")
        srv = self.server("--ssd-cache", ssd)
        try:
            gen = len(srv.post("/tokenize", {"content": GEN_PROMPT}).json()["tokens"])
            on, messages = self.chat(srv)
            stats = srv.request("GET", "/stats").json()["kv_store"]
            metrics = srv.metrics()
        finally:
            self.assertEqual(srv.stop(timeout=120), 0, srv.log())  # SIGTERM: flush to the SSD tier
        self.assertEqual(gen, 7, "the generation prompt's tokens")
        print(f"\ncached_tokens per turn: {[t['cached'] for t in on]}; prompt tokens: {[t['prompt'] for t in on]}; "
              f"reasons: {[t['reason'] for t in on]}", flush=True)
        self.assertEqual(on[0]["cached"], 0)
        saved = 0
        for k in range(1, TURNS):
            prev, cur = on[k - 1], on[k]
            self.assertEqual(cur["completion"], MAX_TOKENS, f"turn {k + 1}: {cur}")
            # Everything before the previous turn's generation prompt: its messages, whole.
            self.assertGreaterEqual(cur["cached"], prev["prompt"] - gen, f"turn {k + 1}: {cur}")
            self.assertEqual(cur["tier"], "ram", f"turn {k + 1}: {cur}")
            saved += cur["cached"]
        print(f"saved {saved} of {sum(t['prompt'] for t in on)} prompt tokens", flush=True)
        self.assertGreaterEqual(stats["checkpoints"]["hits"].get("message_end", 0), TURNS - 1, stats)
        self.assertGreaterEqual(stats["checkpoints"]["stored"].get("message_end", 0), TURNS - 1, stats)
        self.assertGreaterEqual(metric_sum(metrics, "larder_kv_checkpoint_hits_total"), TURNS - 1)

        off_srv = self.server("--prompt-cache", "0")
        try:
            off, _ = self.chat(off_srv, [t["content"] for t in on])
        finally:
            self.assertEqual(off_srv.stop(), 0)
        for k in range(TURNS):
            self.assertEqual(off[k]["cached"], 0)
            self.assertEqual(off[k]["prompt"], on[k]["prompt"], f"turn {k + 1}")
            self.assertEqual(off[k]["content"], on[k]["content"], f"turn {k + 1}: store on differs from off")

        # Turn 11 on a fresh process over the same SSD dir: turn 10's message_end checkpoint.
        srv = self.server("--ssd-cache", ssd)
        try:
            messages.append({"role": "user", "content": user_message(TOPICS[TURNS])})
            t11 = self.turn(srv.openai(timeout=300), messages)
        finally:
            self.assertEqual(srv.stop(timeout=120), 0, srv.log())
        self.assertEqual(t11["tier"], "ssd", t11)
        self.assertGreaterEqual(t11["cached"], on[-1]["prompt"] - gen, t11)
        off_srv = self.server("--prompt-cache", "0")
        try:
            cold = self.turn(off_srv.openai(timeout=300), messages)
        finally:
            self.assertEqual(off_srv.stop(), 0)
        self.assertEqual(t11["content"], cold["content"], "turn 11 from SSD differs from a cold run")


    def test_thinking_on_resumes_after_the_whole_answer(self):
        """Thinking on, the Qwen3 template renders the answer as generated: the full entry (prompt +
        answer as forwarded) is a prefix of the next turn and serves it whole, untrimmed."""
        srv = self.server()
        try:
            client = srv.openai(timeout=300)
            messages, out = [], []
            for i in range(4):
                messages.append({"role": "user", "content": user_message(TOPICS[i])})
                out.append(self.turn(client, messages, extra={}))
                messages.append({"role": "assistant", "content": out[-1]["content"]})
        finally:
            self.assertEqual(srv.stop(), 0, srv.log())
        print(f"\nthinking on: cached_tokens {[t['cached'] for t in out]}, prompt tokens {[t['prompt'] for t in out]}",
              flush=True)
        for k in range(1, 4):
            prev, cur = out[k - 1], out[k]
            # The last sampled token is never forwarded when the length limit ends the answer.
            self.assertGreaterEqual(cur["cached"], prev["prompt"] + prev["completion"] - 1, f"turn {k + 1}: {cur}")
            self.assertEqual(cur["reason"], "hit", f"turn {k + 1}: {cur}")

if __name__ == "__main__":
    unittest.main()
