"""What the speculation server tests (spec_test.py, draft_spec_test.py) share: a server without
speculation and one with it on the same model, a greedy chat helper, and the check that a batch of
requests on the speculating server answers exactly what the plain server answers one at a time,
with drafted/accepted tokens in the timings and /metrics.

The speculating server runs with LARDER_SPEC_FORCE=1: it drafts at the cap every step whatever the
measured costs say (runtime/speculative.h), so the verify path is exercised on every request —
exactness must hold however much is drafted."""
import concurrent.futures
import unittest

from server_harness import Server, metric_sum


class SpecPairTest(unittest.TestCase):
    MODEL = None        # the target
    FLAGS = ()          # both servers'
    SPEC_FLAGS = ()     # the speculating server's
    ENV = {}            # both servers'
    STARTUP = 60        # seconds
    N = 96              # max_tokens of a chat
    TIMEOUT = 120       # seconds per request

    @classmethod
    def setUpClass(cls):
        cls.plain = Server(cls.MODEL, *cls.FLAGS, "--spec", "none", env=cls.ENV, startup_timeout=cls.STARTUP).start()
        try:
            cls.spec = Server(cls.MODEL, *cls.FLAGS, *cls.SPEC_FLAGS, env={**cls.ENV, "LARDER_SPEC_FORCE": "1"},
                              startup_timeout=cls.STARTUP).start()
        except BaseException:
            cls.plain.stop()
            raise

    @classmethod
    def tearDownClass(cls):
        cls.plain.stop()
        cls.spec.stop()

    def chat(self, srv, prompt, extra=None, n=None):
        """(content, finish_reason, usage) of a greedy chat completion."""
        r = srv.post("/v1/chat/completions", {"messages": [{"role": "user", "content": prompt}], "temperature": 0,
                                              "max_tokens": n or self.N, **(extra or {})}, timeout=self.TIMEOUT)
        self.assertEqual(r.status, 200, r)
        j = r.json()
        return j["choices"][0]["message"]["content"], j["choices"][0]["finish_reason"], j["usage"]

    def assert_batch_is_plain_decoding(self, prompts, min_accepted):
        """The prompts together on the speculating server (one batch) answer what they answer one at
        a time on the plain one; drafted/accepted reach the timings and /metrics."""
        want = [self.chat(self.plain, p)[:2] for p in prompts]
        with concurrent.futures.ThreadPoolExecutor(len(prompts)) as ex:
            got = list(ex.map(lambda p: self.chat(self.spec, p), prompts))
        drafted = accepted = 0
        for p, w, g in zip(prompts, want, got):
            with self.subTest(prompt=p[:30]):
                self.assertEqual(g[:2], w)
                t = g[2]["larder"]["timings"]
                self.assertLessEqual(t["accepted_tokens"], t["drafted_tokens"])
                drafted += t["drafted_tokens"]
                accepted += t["accepted_tokens"]
        self.assertGreater(accepted, min_accepted)
        m = self.spec.metrics()
        self.assertGreaterEqual(metric_sum(m, "larder_spec_drafted_tokens_total"), drafted)
        self.assertGreaterEqual(metric_sum(m, "larder_spec_accepted_tokens_total"), accepted)
