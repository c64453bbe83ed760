"""Greedy agreement with llama.cpp that knows a near-tie from a disagreement.

Two engines that quantize activations differently (larder per 32 elements to int8, llama.cpp Q8_0
/ Q8_K) compute logits a little apart, so wherever llama.cpp's two best tokens are almost equally
likely the greedy paths may part — and after that point the texts have nothing left to compare.
The goldens (scripts/make_llamacpp_goldens.py greedy / chat-steps) hold llama.cpp's greedy
tokens with its own top-5 log-probabilities at every step. A larder continuation passes when

  * it equals llama.cpp's for the first NEED tokens (or for all of them, end of generation
    included, when llama.cpp stopped sooner), or
  * at the first step where they part, llama.cpp's own margin between its #1 and #2 token is at
    most the bound the caller states AND larder's token there is llama.cpp's #2 — a genuine
    near-tie, resolved the other way; or
  * at that step the model itself, computed in exact f32 arithmetic (the goldens' "exact" top-5,
    teacher-forced on llama.cpp's path, which larder shares up to there), puts larder's token
    within the caller's exact bound of its best one — larder made the model's own choice (or one
    the model cannot tell apart from it) where llama.cpp's int8 rounding did not.

Anything else (a wrong token that is not llama.cpp's runner-up, or a runner-up llama.cpp rejects
by more than the bound) is a failure. `by_ids` compares token ids (larder's native /completion
stream and the openai client's logprobs carry them); `by_text` compares the text bytes for clients
that only return text (the anthropic client, an openai stream without logprobs, `larder generate`).
"""
from dataclasses import dataclass
from typing import Optional

NEED = 32  # issue 12 / issue 13: "identical ... for at least the first 32 tokens"


INF = float("inf")


@dataclass
class Verdict:
    agreed: int                      # steps equal before the first difference (or in all)
    diverged: bool
    margin: float = INF              # llama.cpp: its top-1 logprob minus that of larder's token
    larder_is_second: bool = False   # larder's token is llama.cpp's #2
    exact_gap: float = INF           # exact f32 model: its best logprob minus that of larder's token
    detail: str = ""

    def ok(self, bound, exact_bound):
        return (not self.diverged or (self.larder_is_second and self.margin <= bound)
                or self.exact_gap <= exact_bound)

    def explain(self, bound, exact_bound):
        if not self.diverged:
            return f"identical for {self.agreed} tokens"
        if self.larder_is_second and self.margin <= bound:
            kind = "near-tie in llama.cpp"
        elif self.exact_gap <= exact_bound:
            kind = "the exact model's choice" if self.exact_gap == 0 else "near-tie in the exact model"
        else:
            kind = "NOT a near-tie"
        return (f"diverged at step {self.agreed} ({kind}: llama.cpp margin {self.margin:.4f} nats (bound {bound}), "
                f"larder took llama.cpp's #2: {self.larder_is_second}, exact-f32 gap {self.exact_gap:.4f} "
                f"(bound {exact_bound})) {self.detail}")


def _is_eog(top_entry):
    return bool(top_entry.get("eog"))


def judge_step(step, k, cand_id, eog, detail):
    """The verdict on larder choosing token cand_id (None: an end of generation) at step k."""
    top = step["top"]
    def same(entry_id):
        return entry_id == cand_id or (cand_id is None and entry_id in eog)
    lp = next((t["logprob"] for t in top if same(t["id"])), None)
    margin = top[0]["logprob"] - lp if lp is not None else INF
    exact = step.get("exact") or []
    elp = next((t["logprob"] for t in exact if same(t["id"])), None)
    gap = exact[0]["logprob"] - elp if elp is not None else INF
    return Verdict(k, True, margin, same(top[1]["id"]), gap, detail)


def by_ids(steps, got_ids, got_ended, eog_ids, need=NEED):
    """steps: the golden's records; got_ids: larder's completion ids (an end-of-generation token
    may or may not be among them); got_ended: larder stopped on end of generation after them."""
    eog = set(eog_ids)
    got = list(got_ids)
    if got and got[-1] in eog:
        got, got_ended = got[:-1], True
    n = min(len(steps), need)
    for k in range(n):
        ref = steps[k]["id"]
        if k < len(got):
            mine = got[k]
        elif got_ended:
            mine = None
        else:
            return Verdict(k, True, detail=f"larder's answer ends after {len(got)} tokens (its token limit)")
        if mine is None and ref in eog:
            return Verdict(k + 1, False)
        if mine == ref:
            continue
        second = steps[k]["top"][1]
        return judge_step(steps[k], k, mine, eog,
                          f"llama.cpp {ref} {bytes(steps[k]['bytes'])!r}, larder {'end' if mine is None else mine}, "
                          f"llama.cpp's #2 {second['id']} {bytes(second['bytes'])!r}")
    return Verdict(n, False)


def by_text(steps, text, ended, eog_ids, need=NEED, bound=0.05, exact_bound=0.05):
    """text: larder's whole answer (str or bytes); ended: it stopped on end of generation (not
    on its token limit, which must lie beyond `need` tokens). Token identity is not in the text:
    at a divergence, larder's token is taken to be whichever of llama.cpp's top-5 at that step
    its text continues with (the end of generation if the text ends there), the best verdict.
    Where llama.cpp's token and a longer alternative both continue the text ('\n' and '\n\n'),
    larder may have taken either: both readings are judged and the better one counts."""
    eog = set(eog_ids)
    data = text.encode("utf-8") if isinstance(text, str) else bytes(text)
    n = min(len(steps), need)

    def best(verdicts):
        return max(verdicts, key=lambda v: (v.ok(bound, exact_bound), not v.diverged, v.agreed, -min(v.margin, v.exact_gap)))

    def walk(k, pos):
        if k >= n:
            return Verdict(n, False)
        step = steps[k]
        rest = data[pos:]
        piece = bytes(step["bytes"])
        detail = (f"after {data[:pos].decode('utf-8', 'replace')!r}: llama.cpp {piece!r}, larder "
                  f"{rest[:24]!r}{' (end)' if ended and len(rest) <= 24 else ''}")
        alts = [t["id"] for t in step["top"][1:] if t["id"] not in eog and t["bytes"] and rest.startswith(bytes(t["bytes"]))]
        if step["id"] in eog:
            if not rest and ended:
                return Verdict(k + 1, False)
        elif piece and rest.startswith(piece):
            follow = walk(k + 1, pos + len(piece))
            longer = [c for c in alts if len(bytes(next(t["bytes"] for t in step["top"] if t["id"] == c))) > len(piece)]
            if follow.diverged and longer:
                return best([follow] + [judge_step(step, k, c, eog, detail) for c in longer])
            return follow
        cands = ([None] if not rest and ended else []) + alts
        return best([judge_step(step, k, c, eog, detail) for c in cands] or [Verdict(k, True, detail=detail)])

    return walk(0, 0)
