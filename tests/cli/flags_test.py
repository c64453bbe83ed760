"""The command line as a person types it (issue 17, item 8 and the llama.cpp habits): --help shows
defaults, range errors are one short readable line, a mistyped flag gets "did you mean", a
llama.cpp-only flag gets the larder equivalent, an unknown verb gets the nearest verb."""
import json
import re
import unittest

from cli_models import STORIES, run


class FlagsTest(unittest.TestCase):
    def help(self, *verb):
        code, out, err = run(*verb, "--help")
        self.assertEqual(code, 0, err)
        return out

    def assertDefault(self, text, flag, value):
        line = re.search(rf"^\s+(?:-\S+,)*{re.escape(flag)}\b[^\n]*", text, re.M)
        self.assertIsNotNone(line, f"{flag} missing from the help:\n{text}")
        self.assertRegex(line.group(0), rf"={re.escape(value)}\b", f"the help shows {flag}'s default {value}")

    def test_help_shows_defaults(self):
        serve = self.help("serve")
        self.assertDefault(serve, "--port", "8080")
        self.assertDefault(serve, "--parallel", "4")
        self.assertDefault(serve, "--max-tokens", "2048")
        self.assertDefault(serve, "--ctx-size", "4096")
        self.assertDefault(serve, "--queue-max", "64")
        self.assertDefault(serve, "--host", "127.0.0.1")
        gen = self.help("generate")
        self.assertDefault(gen, "--n-predict", "2048")
        self.assertDefault(gen, "--seed", "0")
        self.assertIn("--temp", gen)
        self.assertIn("generation_config", gen, "--temp says where its default comes from")
        self.assertDefault(self.help("chat"), "--max-tokens", "2048")
        self.assertDefault(self.help("bench"), "--repeats", "3")
        for verb in ("serve", "generate", "chat", "bench"):
            self.assertDefault(self.help(verb), "--kv-dtype", "f16")

    def test_range_errors_are_readable(self):
        for args, needle in ((["generate", STORIES, "-p", "x", "--top-k", "-5"], "--top-k"),
                             (["generate", STORIES, "-p", "x", "--temp", "-5"], "--temp"),
                             (["serve", "--parallel", "0"], "--parallel"),
                             (["serve", "--prompt-cache", "-1"], "--prompt-cache"),
                             (["generate", STORIES, "-n", "0"], "-n"),
                             (["bench", STORIES, "-p", "0", "-n", "0"], "no test left"),
                             # a repetition penalty of 0 divided every seen token's logit by 0
                             (["generate", STORIES, "-p", "x", "--repeat-penalty", "0"], "greater than 0"),
                             (["serve", STORIES, "--repeat-penalty", "0"], "greater than 0"),
                             (["generate", STORIES, "-p", "x", "--repeat-last-n", "-2"], "--repeat-last-n")):
            code, out, err = run(*args, timeout=30)
            self.assertEqual(code, 2, f"{args}: {err}")
            self.assertIn(needle, err)
            self.assertNotIn("1797693", err, "no DBL_MAX in a message")
            self.assertNotIn("000000", err, "no %f noise in a message")
            self.assertLess(len(err.splitlines()[0]), 120, f"one short line: {err}")

    def test_bench_skips_either_test(self):
        # llama-bench's -p 0 / -n 0: a prefill-only or decode-only run (bench/llamacpp_compare.sh).
        for p, n in (("8", "0"), ("0", "4")):
            code, out, err = run("bench", STORIES, "-p", p, "-n", n, "-r", "1", "--no-roofline", "--json", timeout=60)
            self.assertEqual(code, 0, err)
            j = json.loads(out)
            self.assertEqual(j["pp"]["tok_s"] > 0, p != "0", out)
            self.assertEqual(j["tg"]["tok_s"] > 0, n != "0", out)
        code, out, err = run("bench", STORIES, "-p", "8", "-n", "0", "-r", "1", "--no-roofline", timeout=60)
        self.assertEqual(code, 0, err)
        self.assertIn("pp8", out)
        self.assertNotIn("tg0", out)

    def test_bench_sets_each_decode_run_against_the_probe_beside_it(self):
        # The read probe runs before every timed tg run and after the last; each run's share is
        # its GB/s over the mean of the two probes around it, and the headline is their median.
        code, out, err = run("bench", STORIES, "-p", "0", "-n", "8", "-r", "3", "--json", timeout=120)
        self.assertEqual(code, 0, err)
        tg = json.loads(out)["tg"]
        probes, runs = tg["probe_gbs_beside_runs"], tg["pct_bandwidth_runs"]
        self.assertEqual(len(probes), 4, tg)
        self.assertEqual(len(runs), 3, tg)
        self.assertTrue(all(p > 0 for p in probes), tg)
        self.assertAlmostEqual(tg["pct_bandwidth"], sorted(runs)[1], places=6)
        # A run's share follows from its own speed and the probes on either side of it: the speed
        # it implies is one of the runs' (within their min..max).
        per_token = tg["gbs"] / tg["tok_s"]  # GB per token (weights + KV read)
        for i, pct in enumerate(runs):
            implied = pct / 100 * 0.5 * (probes[i] + probes[i + 1]) / per_token
            self.assertGreaterEqual(implied, tg["tok_s_min"] * (1 - 1e-6), tg)
            self.assertLessEqual(implied, tg["tok_s_max"] * (1 + 1e-6), tg)
        code, out, err = run("bench", STORIES, "-p", "0", "-n", "8", "-r", "2", timeout=120)
        self.assertEqual(code, 0, err)
        self.assertIn("tg vs the read probe beside each run", out)

    def test_bench_runs_past_the_trained_context(self):
        # stories260K is trained to 2048 positions; llama-bench measures past n_ctx_train with a
        # warning, and so does larder bench (issue 14's -d 16384 on a model trained to 8192).
        code, out, err = run("bench", STORIES, "-p", "0", "-n", "2", "-d", "2100", "-r", "1", "--no-roofline",
                             "--json", timeout=120)
        self.assertEqual(code, 0, err)
        self.assertIn("trained context of 2048", err)
        self.assertGreater(json.loads(out)["tg"]["tok_s"], 0)

    def test_did_you_mean(self):
        code, out, err = run("generate", STORIES, "--prompt", "x", "--tempurature", "1")
        self.assertEqual(code, 2, err)
        self.assertIn("did you mean --temperature?", err)
        code, out, err = run("serve", "--prot", "8081")
        self.assertEqual(code, 2, err)
        self.assertIn("did you mean --port?", err)
        code, out, err = run("generate", STORIES, "-p", "x", "--max-tok", "3")
        self.assertIn("did you mean --max-tokens?", err)
        code, out, err = run("info", STORIES, "--port", "1")
        self.assertIn("larder serve", err, "a flag of another verb names that verb")
        code, out, err = run("generat", STORIES)
        self.assertEqual(code, 2)
        self.assertIn("did you mean 'generate'?", err)
        self.assertEqual(out, "")

    def test_llamacpp_only_flags_name_the_larder_way(self):
        cases = [(["serve", "-fa"], "flash"),
                 (["generate", STORIES, "-cnv"], "larder chat"),
                 (["generate", STORIES, "--interactive"], "larder chat"),
                 (["serve", "--mlock"], "mmap"),
                 (["serve", "-tb", "4"], "--threads"),
                 (["generate", STORIES, "--reverse-prompt", "User:"], "--stop"),
                 (["serve", "--slot-save-path", "/tmp/x"], "--ssd-cache"),
                 (["serve", "-hff", "x.gguf"], "-hf ORG/NAME:"),
                 (["serve", "--list-devices"], "CPU"),
                 # generate and chat have them; serve takes them per request
                 (["serve", "--grammar", "root ::= \"a\""], "`grammar` and `json_schema` fields"),
                 (["serve", "-jf", "s.json"], "`json_schema`"),
                 (["serve", "--repeat-last-n", "64"], "repetition_context_size"),
                 (["serve", "--logit-bias", "15+1"], "logit_bias per request")]
        for args, needle in cases:
            code, out, err = run(*args, timeout=30)
            self.assertEqual(code, 2, f"{args}: {err}")
            self.assertIn("llama.cpp", err, args)
            self.assertIn(needle, err, args)
            self.assertEqual(out, "", f"{args} must not print the help")

    def test_kv_dtype_flags(self):
        # llama.cpp's -ctk/-ctv are --kv-dtype when they agree; larder keeps K and V in one type,
        # so a mixed pair is refused naming both, and so is a type the model's heads cannot hold.
        code, out, err = run("generate", STORIES, "-p", "x", "-n", "2", "-ctk", "f32", "-ctv", "f32")
        self.assertEqual(code, 0, err)
        code, out, err = run("generate", STORIES, "-p", "x", "-n", "2", "-ctk", "f16", "-ctv", "f32")
        self.assertNotEqual(code, 0)
        self.assertIn("--cache-type-v f32 disagrees with f16", err)
        self.assertEqual(out, "")
        code, out, err = run("generate", STORIES, "-p", "x", "-n", "2", "--kv-dtype", "f32", "-ctk", "q8_0")
        self.assertIn("disagrees", err)
        code, out, err = run("generate", STORIES, "-p", "x", "-n", "2", "-ctk", "q4_0")
        self.assertNotEqual(code, 0)
        self.assertIn("f32, f16 and q8_0", err)
        code, out, err = run("generate", STORIES, "-p", "x", "-n", "2", "--kv-dtype", "q8_0")
        self.assertNotEqual(code, 0)
        self.assertIn("multiple of 32", err, "stories260K's head_dim 8 cannot hold q8_0 blocks")

    def test_structured_output_and_sampling_flags_of_llamacpp_are_taken(self):
        # They were refused ("grammars are not supported yet") before generate and serve shared
        # one decode step (issue 41 item 3).
        code, out, err = run("generate", STORIES, "-p", "Once", "-n", "8", "--temp", "0", "--grammar", 'root ::= "Lily"')
        self.assertEqual((code, out), (0, "Lily\n"), err)
        code, out, err = run("generate", STORIES, "-p", "Once", "-n", "4", "--repeat-last-n", "-1", "-l", "2-inf",
                             "--repeat-penalty", "1.2")
        self.assertEqual(code, 0, err)
        # Repeatable flags take one value each: MODEL after them is MODEL, not another value.
        code, out, err = run("generate", "-l", "2-inf", "-l", "13+1", "--stop", "xyz", "--stop", " ", STORIES,
                             "-p", "Once", "-n", "30", "--temp", "0")
        self.assertEqual(code, 0, err)
        self.assertIn("stop: stop string", err)

    def test_llamacpp_single_dash_flags_that_larder_has(self):
        # -np is --parallel, -sys is --system: accepted, not read as clusters of short flags.
        code, out, err = run("generate", STORIES, "--chat", "-sys", "You are terse.", "-p", "hi")
        self.assertNotIn("Usage", out)
        self.assertIn("chat template", err, "-sys was taken as --system (stories has no template)")
        code, out, err = run("serve", "-np", "0")
        self.assertEqual(code, 2)
        self.assertIn("--parallel", err)


if __name__ == "__main__":
    unittest.main()
