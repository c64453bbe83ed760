"""gpt-oss's chat convention (OpenAI "harmony") in `larder generate --chat` and `larder chat`, on
tests/server/tiny_harmony.py's scripted model (gpt-oss's template and harmony's marker tokens over
a tiny Qwen3 whose greedy output is `<|channel|>commentary to=functions.get_weather <|constrain|>json
<|message|>{"city": "Oslo"}<|call|>`; a logit bias on `analysis` or `final` turns the channel):

  * the final channel is the answer, the analysis channel is shown as reasoning the way a Qwen3
    `<think>` block is (inline, between <think> and </think>), and no marker or channel name
    reaches the terminal;
  * generation stops at <|call|> (harmony's stop set: the tokenizer's EOS is Qwen's);
  * `--stop` strings match message bodies only: never a marker, a header (`final`) or across them;
  * `larder chat` keeps the answer's final text as the assistant turn: the next turn's prompt
    renders it as the template expects, so the KV store reuses the whole first exchange.
"""
import os
import re
import shutil
import sys
import tempfile
import unittest

from cli_models import SHARED, run

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "../server"))
import tiny_harmony  # noqa: E402

QWEN_TOK = os.path.join(SHARED, "tokenizers/hf/qwen3/tokenizer.json")
ASK = "Weather in Oslo?"
ANSWER = tiny_harmony.ARGS_TEXT


@unittest.skipUnless(os.path.exists(QWEN_TOK), f"{QWEN_TOK} absent")
class Harmony(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="larder_cli_harmony_")
        cls.info = tiny_harmony.make_harmony_model(os.path.join(cls.tmp, "tiny-harmony"), SHARED)
        cls.model = cls.info["dir"]
        # A biased channel's output: <|channel|> CHANNEL <|message|> and the chain's body (what
        # follows its <|message|>, before <|call|>); <|call|> ends it (Qwen's EOS never comes).
        chain = cls.info["chain"]
        cls.body_tokens = len(chain) - 2 - chain.index(cls.info["markers"]["<|message|>"])
        cls.answer_tokens = 3 + cls.body_tokens

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def bias(self, which):
        return f"{self.info[which + '_id']}+{2 * tiny_harmony.BRANCH_GAP:g}"

    def generate(self, which):
        code, out, err = run("generate", self.model, "--chat", "-p", ASK, "--temp", "0", "-n", "64",
                             "-l", self.bias(which))
        self.assertEqual(code, 0, err)
        m = re.search(r"generated (\d+) tokens", err)
        self.assertTrue(m, err)
        self.assertEqual(int(m.group(1)), self.answer_tokens, f"<|call|> ends the answer: {err}")
        return out

    def test_final_channel_is_the_answer(self):
        out = self.generate("final")
        self.assertEqual(out.strip(), ANSWER)

    def test_analysis_channel_is_shown_as_reasoning(self):
        out = self.generate("analysis")
        self.assertNotIn("<|", out)
        self.assertNotIn("analysis", out)
        self.assertEqual(out.strip(), f"<think>\n{ANSWER}\n</think>")

    def test_stop_strings_match_message_bodies_only(self):
        # The output is <|channel|>final<|message|>{"city": "Oslo"}<|call|>: none of these stops
        # is in the body, each is in the raw text (a header, a marker, or across both; the last
        # holds the body's `}` back until the end releases it).
        code, out, err = run("generate", self.model, "--chat", "-p", ASK, "--temp", "0", "-n", "64",
                             "-l", self.bias("final"), "--stop", "final", "--stop", "<|message|>",
                             "--stop", 'final<|message|>{"', "--stop", "<|", "--stop", "}<|call|>")
        self.assertEqual(code, 0, err)
        self.assertEqual(out.strip(), ANSWER)
        self.assertIn(f"generated {self.answer_tokens} tokens", err)
        # One in the body stops it there, holding nothing of the stop string back.
        code, out, err = run("generate", self.model, "--chat", "-p", ASK, "--temp", "0", "-n", "64",
                             "-l", self.bias("final"), "--stop", "Oslo")
        self.assertEqual(code, 0, err)
        self.assertEqual(out.strip(), ANSWER[:ANSWER.index("Oslo")].strip())
        self.assertNotIn(f"generated {self.answer_tokens} tokens", err)

    def test_chat_keeps_the_final_text_as_the_assistant_turn(self):
        code, out, err = run("chat", self.model, "--temp", "0", "-n", "64", "-v", "-l", self.bias("final"),
                             input=f"{ASK}\nAnd tomorrow?\n")
        self.assertEqual(code, 0, err)
        self.assertEqual([line for line in out.splitlines() if line], [ANSWER, ANSWER], out)
        turns = [(int(a), int(b)) for a, b in re.findall(r"reused (\d+) of (\d+) prompt tokens", err)]
        self.assertEqual(len(turns), 2, err)
        self.assertNotIn("generated 64 tokens", err, "<|call|> ends each answer")
        # The second prompt holds the first exchange as the template renders it: the first prompt
        # plus the answer as the model wrote it (all but its final <|call|>, which the rendered
        # turn ends with <|end|> instead). Had the turn kept raw or marker-less text, the prefix
        # would part right after the first prompt.
        first_total = turns[0][1]
        self.assertGreaterEqual(turns[1][0], first_total + self.answer_tokens, err)


if __name__ == "__main__":
    unittest.main()
