"""Exact-boundary KV reuse through the server on a sliding-window model (issue 13 item 4,
kv-store.md §11.3, §11.6, §12 "Hybrid / sliding window").

gemma-3-270m (Q4_K_M GGUF, its own chat template) keeps a 512-token ring on 15 of its 18 layers;
a ring that has wrapped cannot be trimmed back, so an entry of a long conversation only serves
prompts it matches whole. A 10-turn chat whose context passes the window three times, greedy,
through the real `openai` client against a live `larder serve` on loopback:

  - store on: from turn 2 on, every turn reuses the whole previous conversation (the previous
    prompt and the answer's tokens as forwarded) from RAM, and the output equals the store off;
  - restart from the SSD tier (SIGTERM flushes the store): the same conversation replayed on a
    fresh process reuses each prompt's boundary checkpoint (len − 1) from SSD, output unchanged;
  - a turn whose earlier answer was edited cannot use the untrimmable full entry: it falls back to
    that turn's prompt checkpoint and the miss of the longer prefix is explained
    (reason untrimmable_tail), never a silent 0.

Skips, naming the file, when the model was not fetched (scripts/fetch_models.sh or
LARDER_MODELS_DIR)."""
import os
import shutil
import tempfile
import unittest

from server_harness import Server

HERE = os.path.dirname(os.path.abspath(__file__))
MODELS = os.environ.get("LARDER_MODELS_DIR") or os.path.join(HERE, "../../.cache/models")
GEMMA = os.path.join(MODELS, "gemma-3-270m-q4_k_m.gguf")
WINDOW = 512
TURNS = 10
MAX_TOKENS = 32
TOPICS = ["lighthouses", "bread baking", "the moon", "trains", "volcanoes", "bees", "chess", "rivers",
          "glass", "clocks"]


def user_message(topic):
    # ~140 tokens per user turn: ten turns pass the 512-token window three times.
    return f"Tell me about {topic}. " + " ".join(
        f"Please include detail number {k} about {topic} and explain why it matters to people who care about {topic}."
        for k in range(5))


class GemmaChatReuse(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        if not os.path.exists(GEMMA):
            raise unittest.SkipTest(f"{GEMMA} is absent: run scripts/fetch_models.sh (or set LARDER_MODELS_DIR)")
        cls.tmp = tempfile.mkdtemp(prefix="larder_gemma_reuse_")

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def server(self, *flags):
        return Server(GEMMA, "--ctx", "4096", "--parallel", "1", *flags, startup_timeout=180).start()

    def turn(self, client, messages):
        r = client.chat.completions.create(model="gemma", messages=messages, max_tokens=MAX_TOKENS, temperature=0)
        u = r.usage.model_dump()
        return {"content": r.choices[0].message.content, "prompt": u["prompt_tokens"],
                "completion": u["completion_tokens"], "cached": u["prompt_tokens_details"]["cached_tokens"],
                "tier": u["larder"]["cache"]["tier"], "reason": u["larder"]["cache"]["reason"]}

    def chat(self, srv, replies=None):
        """Ten turns; with `replies`, those answers are fed back instead of the server's own (so a
        replay sends exactly the prompts of the first run)."""
        client = srv.openai(timeout=600)
        messages, out = [], []
        for i, topic in enumerate(TOPICS[:TURNS]):
            messages.append({"role": "user", "content": user_message(topic)})
            t = self.turn(client, messages)
            out.append(t)
            messages.append({"role": "assistant", "content": replies[i] if replies else t["content"]})
        return out, messages

    def test_ten_turns_store_on_off_and_ssd_restart(self):
        ssd = os.path.join(self.tmp, "ssd")
        srv = self.server("--ssd-cache", ssd)
        try:
            on, messages = self.chat(srv)
            # An edited earlier answer: the full entry of turn 5 (untrimmable: its rings wrapped)
            # no longer matches, turn 5's prompt checkpoint does; the longer miss is explained.
            edited = [dict(m) for m in messages[:10]]
            edited[9]["content"] = "Something else entirely."
            edited.append({"role": "user", "content": user_message("maps")})
            ed = self.turn(srv.openai(timeout=600), edited)
        finally:
            self.assertEqual(srv.stop(timeout=180), 0, srv.log())  # SIGTERM: flush to the SSD tier
        replies = [t["content"] for t in on]
        self.assertGreater(on[-1]["prompt"], 3 * WINDOW, "the chat must pass the window several times")

        self.assertEqual(on[0]["cached"], 0)
        self.assertEqual(on[0]["reason"], "empty_namespace")
        for k in range(1, TURNS):
            prev, cur = on[k - 1], on[k]
            # Everything the previous turn forwarded: its prompt and its answer (the last sampled
            # token is never forwarded when the length limit ends it; EOS never is).
            whole = prev["prompt"] + prev["completion"] - (1 if prev["completion"] == MAX_TOKENS else 0)
            self.assertGreaterEqual(cur["cached"], whole, f"turn {k + 1}: {cur}")
            self.assertEqual(cur["tier"], "ram", f"turn {k + 1}: {cur}")
            self.assertEqual(cur["reason"], "hit", f"turn {k + 1}: {cur}")

        self.assertGreater(on[4]["prompt"], WINDOW, "turn 5's rings have wrapped")
        self.assertGreaterEqual(ed["cached"], on[4]["prompt"] - 1, ed)
        self.assertLess(ed["cached"], on[4]["prompt"] + on[4]["completion"] - 1, ed)
        self.assertEqual(ed["reason"], "untrimmable_tail", ed)

        off_srv = self.server("--prompt-cache", "0")
        try:
            off, _ = self.chat(off_srv)
        finally:
            self.assertEqual(off_srv.stop(), 0)
        for k in range(TURNS):
            self.assertEqual(off[k]["cached"], 0)
            self.assertEqual(off[k]["prompt"], on[k]["prompt"], f"turn {k + 1}")
            self.assertEqual(off[k]["content"], on[k]["content"], f"turn {k + 1}: store on differs from off")

        srv = self.server("--ssd-cache", ssd)
        try:
            again, _ = self.chat(srv, replies)
        finally:
            self.assertEqual(srv.stop(timeout=180), 0, srv.log())
        for k in range(TURNS):
            t = again[k]
            self.assertEqual(t["content"], on[k]["content"], f"turn {k + 1} after the restart")
            # Each prompt's own boundary checkpoint (len − 1) is on disk: strictly longer than
            # anything this process put in RAM, so it is restored from SSD.
            self.assertEqual(t["cached"], t["prompt"] - 1, f"turn {k + 1} after the restart: {t}")
            self.assertEqual(t["tier"], "ssd", f"turn {k + 1} after the restart: {t}")


if __name__ == "__main__":
    unittest.main()
