"""Issue 47 item 13 end to end: a Gemma 3 text checkpoint whose tokenizer (the real one, 262,145
entries) is one id larger than its embedding (vocab_size 262144) — the fixture gemma3_realtok of
tests/ref/gemma3_reference.py. `larder serve` and `larder generate` load it; a prompt whose text
holds the special <image_soft_token> (id 262144, which the model cannot embed) is a 400 naming
the id and the token on every surface (the openai and anthropic clients, raw /completion with
token ids), never a crash or a failed batch; ordinary prompts still generate.
"""
import os
import unittest

import server_harness as h

DATA = os.environ.get("LARDER_TEST_DATA_DIR", "")
MODEL = os.path.join(DATA, "models", "gemma3_realtok")
IMAGE = "<image_soft_token>"


@unittest.skipUnless(os.path.exists(os.path.join(MODEL, "tokenizer.json")),
                     "no gemma3_realtok fixture (shared/tokenizers/hf/gemma3 absent)")
class ExtraVocab(h.ServerTestCase):
    FLAGS = ("--ctx", "256")

    @classmethod
    def server_model(cls):
        return MODEL

    def assertNamesToken(self, message):
        self.assertIn("262144", message)
        self.assertIn(IMAGE, message)

    def test_chat_with_image_token_is_400(self):
        import openai
        client = self.server.openai()
        with self.assertRaises(openai.BadRequestError) as cm:
            client.chat.completions.create(model=self.server.model_id(), max_tokens=4,
                                           messages=[{"role": "user", "content": f"look {IMAGE} here"}])
        self.assertNamesToken(str(cm.exception))
        # An ordinary prompt on the same server still answers.
        r = client.chat.completions.create(model=self.server.model_id(), max_tokens=4, temperature=0,
                                           messages=[{"role": "user", "content": "hello"}])
        self.assertTrue(r.choices[0].finish_reason in ("stop", "length"))
        self.assertHealthy()

    def test_completions_text_and_ids_are_400(self):
        r = self.server.post("/v1/completions", {"prompt": f"a {IMAGE} b", "max_tokens": 4})
        err = self.assertOpenAIError(r, 400, field="prompt")
        self.assertNamesToken(err["message"])
        r = self.server.post("/completion", {"prompt": [2, 818, 262144], "n_predict": 4})
        self.assertEqual(r.status, 400, r)
        self.assertIn("262144", r.body.decode())
        r = self.server.post("/v1/completions", {"prompt": "The quick brown", "max_tokens": 3, "temperature": 0})
        self.assertEqual(r.status, 200, r)
        self.assertHealthy()

    def test_messages_is_400(self):
        import anthropic
        client = self.server.anthropic()
        with self.assertRaises(anthropic.BadRequestError) as cm:
            client.messages.create(model=self.server.model_id(), max_tokens=4,
                                   messages=[{"role": "user", "content": IMAGE}])
        self.assertNamesToken(str(cm.exception))
        self.assertHealthy()

    def test_sampling_stays_in_the_model_vocabulary(self):
        # Every sampled id indexes the model's logits row; a bias on the tokenizer-only id is refused.
        r = self.server.post("/v1/completions", {"prompt": "The", "max_tokens": 16, "temperature": 1.5, "seed": 7,
                                                 "logprobs": 5})
        self.assertEqual(r.status, 200, r)
        r = self.server.post("/v1/completions", {"prompt": "The", "max_tokens": 2, "logit_bias": {"262144": 100}})
        self.assertOpenAIError(r, 400, field="logit_bias")


@unittest.skipUnless(os.path.exists(os.path.join(MODEL, "tokenizer.json")), "no gemma3_realtok fixture")
class ExtraVocabCli(unittest.TestCase):
    def test_generate(self):
        code, out, err = h.run_cli("generate", MODEL, "--prompt", f"see {IMAGE}", "-n", "2", "--temp", "0")
        self.assertNotEqual(code, 0, out)
        self.assertIn("262144", err)
        self.assertIn(IMAGE, err)
        code, out, err = h.run_cli("generate", MODEL, "--prompt", "The quick brown", "-n", "3", "--temp", "0")
        self.assertEqual(code, 0, err)


if __name__ == "__main__":
    unittest.main()
