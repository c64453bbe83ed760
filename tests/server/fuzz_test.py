"""Fuzzes `larder serve` with thousands of seeded random and mutated JSON bodies on the three
generation routes and POST /v1/kv/lookup: every answer must be a 2xx or a 4xx with an error body in the surface's shape
(never a 5xx, never a dropped connection), and the server must still answer correctly at the end.
Generation is kept tiny (max_tokens mostly 2, --ctx 64) so the run stays short."""
import copy
import http.client
import json
import os
import random
import socket
import threading
import time
import unittest

from server_harness import ServerTestCase, chat_model, parse_sse

N_PER_ROUTE = int(os.environ.get("LARDER_FUZZ_N", "800"))
SEED = int(os.environ.get("LARDER_FUZZ_SEED", "20261202"))

SEEDS = {
    "/v1/chat/completions": [
        {"model": "m", "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello there"}],
         "max_tokens": 2, "temperature": 0, "stream": False},
        {"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}, {"type": "text", "text": "again"}]}],
         "max_completion_tokens": 2, "stream": True, "stream_options": {"include_usage": True}, "stop": ["x", "yz"],
         "top_p": 0.9, "top_k": 5, "min_p": 0.1, "seed": 3, "temperature": 0.7},
        {"messages": [{"role": "user", "content": "weather?"},
                      {"role": "assistant", "content": None, "tool_calls": [
                          {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"}}]},
                      {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}],
         "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {
             "type": "object", "properties": {"city": {"type": "string"}}}}}],
         "tool_choice": "auto", "max_tokens": 2, "logprobs": True, "top_logprobs": 2,
         "logit_bias": {"5": 1.5}, "repetition_penalty": 1.1, "presence_penalty": 0.5, "frequency_penalty": 0.2},
        {"messages": [{"role": "developer", "content": "x"}, {"role": "user", "content": "y"}], "max_tokens": 1,
         "response_format": {"type": "json_object"}, "n": 1, "user": "u", "chat_template_kwargs": {"enable_thinking": False},
         "reasoning_effort": "none"},
    ],
    "/v1/completions": [
        {"model": "m", "prompt": "Once upon a time", "max_tokens": 2, "temperature": 0},
        {"prompt": ["The sea"], "max_tokens": 2, "stream": True, "logprobs": 2, "stop": "x", "seed": 9, "temperature": 1.0,
         "stream_options": {"include_usage": True}, "echo": False},
        {"prompt": "abc", "max_tokens": 1, "top_k": 3, "top_p": 0.5, "min_p": 0.05, "best_of": 1, "n": 1},
    ],
    "/v1/messages": [
        {"model": "m", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]},
        {"max_tokens": 2, "system": [{"type": "text", "text": "sys"}], "stream": True, "stop_sequences": ["q"],
         "messages": [{"role": "user", "content": [{"type": "text", "text": "hello"}]},
                      {"role": "assistant", "content": "ok"}, {"role": "user", "content": "more"}],
         "temperature": 0.5, "top_p": 0.9, "top_k": 4, "metadata": {"user_id": "x"}},
        {"max_tokens": 2, "tools": [{"name": "t", "description": "d", "input_schema": {"type": "object"}}],
         "tool_choice": {"type": "auto"}, "thinking": {"type": "disabled"},
         "messages": [{"role": "user", "content": "call it"},
                      {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "t", "input": {}}]},
                      {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "done"}]}]},
    ],
    "/v1/kv/lookup": [
        {"prompt": "Once upon a time", "cache_salt": "s"},
        {"tokens": [1, 2, 3, 4]},
        {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello there"}],
         "tools": [{"type": "function", "function": {"name": "t", "parameters": {"type": "object"}}}]},
    ],
}


def random_string(rng):
    kind = rng.randrange(7)
    if kind == 0:
        return ""
    if kind == 1:
        return "".join(chr(rng.randrange(32, 127)) for _ in range(rng.randrange(1, 40)))
    if kind == 2:
        return "".join(chr(rng.choice([rng.randrange(0x80, 0x800), rng.randrange(0x800, 0xD800),
                                       rng.randrange(0x10000, 0x10FFFF)])) for _ in range(rng.randrange(1, 20)))
    if kind == 3:
        return rng.choice(["<|eot_id|>", "<|begin_of_text|>", "<|start_header_id|>", "{{ raise_exception('x') }}",
                           "<think>", "</think>", "<tool_call>", "\u0000", "\r\n\r\n", "data: [DONE]\n\n"])
    if kind == 4:
        return "z" * rng.choice([1000, 5000, 20000])
    if kind == 5:
        return rng.choice(["system", "user", "assistant", "tool", "developer", "text", "image_url", "function"])
    return rng.choice(["0", "-1", "1e999", "NaN", "true", "null", "[]"])


def random_value(rng, depth=0):
    kind = rng.randrange(12 if depth < 3 else 8)
    if kind == 0:
        return None
    if kind == 1:
        return rng.choice([True, False])
    if kind == 2:
        return rng.choice([0, 1, 2, -1, 3, 20, 21, 255, 2 ** 31 - 1, 2 ** 31, 2 ** 63 - 1, 2 ** 63, 2 ** 64, -2 ** 63,
                           10 ** 30, 151936, 128256])
    if kind == 3:
        return rng.choice([0.0, 0.5, 1.0, -0.5, 1e-300, 1e308, -1e308, 5.0000001, 2.5, 0.1])
    if kind in (4, 5):
        return random_string(rng)
    if kind == 6:
        return rng.randrange(-10, 10)
    if kind == 7:
        return rng.random()
    if kind in (8, 9):
        return [random_value(rng, depth + 1) for _ in range(rng.randrange(0, 4))]
    return {random_string(rng) if rng.random() < 0.3 else rng.choice(
        ["role", "content", "type", "text", "name", "arguments", "include_usage", "id"]): random_value(rng, depth + 1)
        for _ in range(rng.randrange(0, 4))}


def paths(node, prefix=()):
    yield prefix
    if isinstance(node, dict):
        for k, v in node.items():
            yield from paths(v, prefix + (k,))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from paths(v, prefix + (i,))


def get_parent(root, path):
    node = root
    for p in path[:-1]:
        node = node[p]
    return node


def mutate(rng, body):
    body = copy.deepcopy(body)
    for _ in range(rng.randrange(1, 4)):
        ps = [p for p in paths(body) if p]
        if not ps:
            return random_value(rng)
        path = rng.choice(ps)
        parent = get_parent(body, path)
        key = path[-1]
        op = rng.randrange(6)
        if op in (0, 1):
            parent[key] = random_value(rng)
        elif op == 2:
            del parent[key]
        elif op == 3 and isinstance(parent, dict):
            parent[random_string(rng) if rng.random() < 0.5 else rng.choice(
                ["n", "best_of", "echo", "suffix", "stop", "logprobs", "top_logprobs", "stream", "tools",
                 "response_format", "max_tokens", "seed", "logit_bias", "system", "thinking"])] = random_value(rng)
        elif op == 4:
            parent[key] = [parent[key]] if rng.random() < 0.5 else {"x": parent[key]}
        else:
            v = parent[key]
            if isinstance(v, list) and v:
                parent[key] = v * rng.choice([2, 17, 100])
            elif isinstance(v, str):
                parent[key] = v * rng.choice([2, 50])
            else:
                parent[key] = random_value(rng)
    return body


def tame(rng, body):
    """Keeps generation short: small max_tokens except now and then."""
    if isinstance(body, dict):
        for k in ("max_tokens", "max_completion_tokens"):
            v = body.get(k)
            if isinstance(v, (int, float)) and not isinstance(v, bool) and v > 4 and rng.random() < 0.95:
                body[k] = 2
        if "max_tokens" not in body and "max_completion_tokens" not in body and rng.random() < 0.9:
            body["max_tokens"] = 2
    return body


def serialize(rng, body):
    kind = rng.randrange(20)
    try:
        text = json.dumps(body, ensure_ascii=rng.random() < 0.5)
    except (TypeError, ValueError):
        text = "{}"
    data = text.encode("utf-8", "surrogatepass")
    if kind < 12:
        return data
    if kind == 12:
        return data[:rng.randrange(0, max(1, len(data)))]
    if kind == 13:
        b = bytearray(data)
        for _ in range(rng.randrange(1, 6)):
            if b:
                b[rng.randrange(len(b))] = rng.randrange(256)
        return bytes(b)
    if kind == 14:
        return bytes(rng.randrange(256) for _ in range(rng.randrange(0, 300)))
    if kind == 15:
        depth = rng.choice([100, 1000, 10000, 100000])
        if rng.random() < 0.5:
            return b'{"messages": ' + b"[" * depth + b"]" * depth + b', "max_tokens": 2}'
        return b'{"a":' * depth + b"1" + b"}" * depth
    if kind == 16:
        return text.replace('"max_tokens": 2', '"max_tokens": 2, "max_tokens": 2e400').encode("utf-8", "surrogatepass")
    if kind == 17:
        return data.replace(b'"', b'"\\ud800', 1) if rng.random() < 0.5 else data.replace(b"i", b"\xc3\x28", 1)
    if kind == 18:
        return data.replace(b"2", b"123456789012345678901234567890123456789", 1)
    return data.replace(b"0", b"NaN", 1).replace(b"1", b"-Infinity", 1)


def make_cases(rng):
    cases = []
    for route, seeds in SEEDS.items():
        for i in range(N_PER_ROUTE):
            r = rng.random()
            if r < 0.1:
                body = random_value(rng)
            else:
                body = rng.choice(seeds)
                if r > 0.15:
                    body = mutate(rng, body)
            body = tame(rng, body)
            cases.append((route, serialize(rng, body)))
    rng.shuffle(cases)
    return cases


class FuzzTest(ServerTestCase):
    FLAGS = ("--ctx", "64", "--parallel", "4")

    @classmethod
    def server_model(cls):
        return chat_model()["dir"]

    def probe(self):
        r = self.server.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "probe"}],
                                                      "max_tokens": 6, "temperature": 0})
        self.assertEqual(r.status, 200, r)
        return r.json()["choices"][0]["message"]["content"]

    def check(self, route, body):
        """Returns None when the answer is acceptable, else a description."""
        conn = http.client.HTTPConnection("127.0.0.1", self.server.port, timeout=120)
        try:
            conn.request("POST", route, body=body, headers={"Content-Type": "application/json"})
            r = conn.getresponse()
            data = r.read()
        except Exception as e:  # noqa: BLE001 - a dropped connection is the failure we look for
            return f"{route}: connection failed ({e!r})"
        finally:
            conn.close()
        st = r.status
        if not (200 <= st < 300 or 400 <= st < 500):
            return f"{route}: status {st} {data[:300]!r}"
        ctype = r.getheader("Content-Type", "")
        if 400 <= st < 500:
            try:
                obj = json.loads(data)
            except ValueError:
                return f"{route}: {st} body is not JSON: {data[:200]!r}"
            if route == "/v1/messages":
                if not (obj.get("type") == "error" and isinstance(obj.get("error"), dict) and "message" in obj["error"]):
                    return f"{route}: {st} body is not Anthropic-shaped: {obj}"
            elif not (isinstance(obj.get("error"), dict) and "message" in obj["error"]):
                return f"{route}: {st} body is not OpenAI-shaped: {obj}"
        elif ctype.startswith("text/event-stream"):
            try:
                events = parse_sse(data)
            except Exception as e:  # noqa: BLE001
                return f"{route}: bad SSE framing: {e}"
            datas = [e.data for e in events if e.data_lines]
            if route != "/v1/messages" and (not datas or datas[-1] != "[DONE]"):
                return f"{route}: stream does not end with [DONE]: {data[-200:]!r}"
            for d in (datas[:-1] if route != "/v1/messages" else datas):
                try:
                    json.loads(d)
                except ValueError:
                    return f"{route}: non-JSON data line {d!r}"
        else:
            try:
                json.loads(data)
            except ValueError:
                return f"{route}: 2xx body is not JSON: {data[:200]!r}"
        return None

    def test_fuzz_bodies(self):
        before = self.probe()
        cases = make_cases(random.Random(SEED))
        failures, lock = [], threading.Lock()
        it = iter(enumerate(cases))
        t0 = time.monotonic()

        def worker():
            while True:
                with lock:
                    nxt = next(it, None)
                if nxt is None:
                    return
                i, (route, body) = nxt
                bad = self.check(route, body)
                if bad:
                    with lock:
                        failures.append(f"case {i}: {bad}; body {body[:300]!r}")
                    if not self.server.alive():
                        return

        threads = [threading.Thread(target=worker) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(900)
        self.assertTrue(self.server.alive(), f"the server died while fuzzed; output:\n{self.server.log()}")
        if failures:
            self.fail(f"{len(failures)} of {len(cases)} fuzz cases got a bad answer (seed {SEED}, "
                      f"{time.monotonic() - t0:.0f}s); first ones:\n" + "\n".join(failures[:15]))
        self.assertHealthy()
        self.assertEqual(self.probe(), before, "after the fuzz run the same greedy request gives the same text")

    def test_malformed_http(self):
        port = self.server.port
        raws = [b"GARBAGE\r\n\r\n", b"GET / HTTP/9.9\r\n\r\n",
                b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 100\r\n\r\n{\"mess",
                b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: -5\r\n\r\n{}",
                b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 99999999999999999999\r\n\r\n{}",
                b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n\r\n",
                b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: " + b"a" * 200000 + b"\r\n\r\n",
                b"POST /v1/messages HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
                b"\x00\x01\x02\x03" * 100]
        for raw in raws:
            s = socket.create_connection(("127.0.0.1", port), timeout=10)
            try:
                try:
                    s.sendall(raw)
                    s.shutdown(socket.SHUT_WR)
                    resp = s.recv(200)
                except (ConnectionResetError, BrokenPipeError, socket.timeout):
                    resp = b""
            finally:
                s.close()
            if resp.startswith(b"HTTP/"):
                status = int(resp.split(b" ", 2)[1])
                if b"HTTP/9.9" in raw:  # 505 HTTP Version Not Supported is the right answer here
                    self.assertIn(status // 100, (4, 5), f"{raw[:60]!r}: {resp!r}")
                else:
                    self.assertLess(status, 500, f"malformed HTTP {raw[:60]!r} must not give a 5xx: {resp!r}")
            self.assertHealthy()


if __name__ == "__main__":
    unittest.main()
