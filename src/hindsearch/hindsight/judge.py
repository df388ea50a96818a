"""Judges that write a short critique of a failed rollout (HindSearch).

``build_judge_prompt`` fills the judge template with the question, one line per search, the
predicted answer and, iff ``sees_gold``, the gold answers. ``LMJudge`` is a frozen causal LM that
writes critiques greedily on the model core's decode loop; ``OracleJudge`` is a rule-based judge for
the fictional world, labelled ``judge_kind = oracle``. ``redact`` hides gold-answer strings and
``is_degenerate`` flags critiques that cannot guide anything. A degenerate critique or a judge
exception means *no distillation for that rollout*; the term counts both. The judges in detail:
docs/methods.md, "The judges".
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from hindsearch.agent import protocol
from hindsearch.core.decode import decode
from hindsearch.core.sampling import GREEDY, Stop, repetition_penalty, stop_token_ids
from hindsearch.records import Trajectory, bare_title, title_key

PLACEHOLDER = "[ANSWER]"
SNIPPET_CHARS = 100
MIN_CRITIQUE_CHARS = 8


@dataclass
class Critique:
    """One judge output: the cleaned (and redacted) text, or a fallback reason."""

    text: str
    raw: str = ""
    redactions: int = 0
    degenerate: bool = False
    error: str | None = None
    prompt_tokens: int = 0
    truncation: list[str] = field(default_factory=list)

    @property
    def usable(self) -> bool:
        return not self.degenerate and self.error is None


def _search_lines(traj: Trajectory, snippets: bool, skip: int) -> str:
    lines = []
    searches = [t for t in traj.turns if t.action == "search"]
    if skip:
        lines.append(f"({skip} earlier search{'es' if skip > 1 else ''} omitted)")
    for n, turn in enumerate(searches[skip:], start=skip + 1):
        docs = []
        for i, title in enumerate(turn.doc_titles):
            doc = bare_title(title)
            if snippets and i < len(turn.doc_snippets) and turn.doc_snippets[i]:
                snip = " ".join(turn.doc_snippets[i].split())
                doc += f": {snip[:SNIPPET_CHARS]}{'...' if len(snip) > SNIPPET_CHARS else ''}"
            docs.append(f"[{doc}]")
        lines.append(f"{n}. query: {turn.content!r} -> "
                     + ("; ".join(docs) if docs else "(nothing retrieved)"))
    if not searches:
        lines.append("(no search was made)")
    return "\n".join(lines)


def _fill(template: str, traj: Trajectory, sees_gold: bool, question: str, searches: str) -> str:
    gold_line = f"Correct answer: {' | '.join(traj.golden_answers)}\n" if sees_gold else ""
    pred = traj.answer if traj.answer else "(no answer given)"
    return template.format(question=question, gold_line=gold_line, searches=searches,
                           prediction=pred)


def build_judge_prompt(traj: Trajectory, template: str, sees_gold: bool, max_prompt_tokens: int,
                       tokenizer: Any) -> str:
    """The judge's user message for one rollout (see ``judge_prompt_with_steps`` for the budget
    rule)."""
    return judge_prompt_with_steps(traj, template, sees_gold, max_prompt_tokens, tokenizer)[0]


def judge_prompt_with_steps(
    traj: Trajectory, template: str, sees_gold: bool, max_prompt_tokens: int, tokenizer: Any
) -> tuple[str, list[str]]:
    """The judge's user message for one rollout, and the truncation steps applied.

    Budget: the chat-templated message must fit ``max_prompt_tokens``. Truncation rule, in order,
    until it fits: (1) drop every retrieved snippet (titles stay); (2) drop the oldest searches one
    at a time (a line says how many were omitted); (3) cut the question to its first tokens. The
    gold line, the prediction and the template's instructions are never cut. Returns
    ``(message, steps)`` with ``steps`` naming what was dropped (empty when nothing was).
    """

    def n_tokens(msg: str) -> int:
        text = protocol.apply_template(tokenizer, msg)
        return len(tokenizer(text, add_special_tokens=False)["input_ids"])

    n_search = sum(1 for t in traj.turns if t.action == "search")
    question, steps = traj.question, []
    msg = _fill(template, traj, sees_gold, question, _search_lines(traj, True, 0))
    if n_tokens(msg) <= max_prompt_tokens:
        return msg, steps
    steps.append("snippets")
    for skip in range(0, n_search + 1):
        msg = _fill(template, traj, sees_gold, question, _search_lines(traj, False, skip))
        if n_tokens(msg) <= max_prompt_tokens:
            if skip:
                steps.append(f"oldest_searches:{skip}")
            return msg, steps
    steps.append(f"oldest_searches:{n_search}")
    q_ids = tokenizer(question, add_special_tokens=False)["input_ids"]
    lo, hi = 0, len(q_ids)  # binary search the longest question prefix that fits
    while lo < hi:
        mid = (lo + hi + 1) // 2
        cand = _fill(template, traj, sees_gold, tokenizer.decode(q_ids[:mid]) + " ...",
                     _search_lines(traj, False, n_search))
        if n_tokens(cand) <= max_prompt_tokens:
            lo = mid
        else:
            hi = mid - 1
    steps.append("question")
    return _fill(template, traj, sees_gold, tokenizer.decode(q_ids[:lo]) + " ...",
                 _search_lines(traj, False, n_search)), steps


def redact(critique: str, golds: Sequence[str]) -> tuple[str, int]:
    """Replace every case-insensitive occurrence of a gold string (as a whole word run) with
    ``[ANSWER]``.

    Longer golds are replaced first; empty golds are ignored. Returns ``(text, n_redactions)``.
    """
    n = 0
    for g in sorted({g.strip() for g in golds if g and g.strip()}, key=len, reverse=True):
        pat = re.compile(r"(?<!\w)" + re.escape(g) + r"(?!\w)", re.IGNORECASE)
        critique, k = pat.subn(PLACEHOLDER, critique)
        n += k
    return critique, n


def clean_critique(text: str, max_sentences: int = 2) -> str:
    """Cut raw judge output at the first blank line and keep at most ``max_sentences`` sentences."""
    text = re.split(r"\n\s*\n", text.strip(), maxsplit=1)[0]
    parts = re.split(r"(?<=[.!?])\s+", " ".join(text.split()))
    return " ".join(parts[:max_sentences]).strip()


def is_degenerate(critique: str, template: str | None = None) -> bool:
    """True for critiques that cannot guide: empty/whitespace, fewer than 8 letters or digits or
    fewer than 2 words, punctuation only, an agent action instead of a critique (any Search-R1 tag:
    a judge that is itself a protocol-tuned policy tends to answer the question as the agent would),
    or an echo of the judge template (the critique is part of the template, or contains one of its
    fixed lines)."""
    c = critique.strip()
    if sum(ch.isalnum() for ch in c) < MIN_CRITIQUE_CHARS or len(c.split()) < 2:
        return True
    if protocol.TAG_RE.search(c):
        return True
    if template:
        norm = lambda s: " ".join(s.lower().split())  # noqa: E731
        if norm(c) in norm(template):
            return True
        for line in template.splitlines():
            fixed = re.sub(r"\{[^}]*\}", "", line).strip()
            if len(fixed) >= 12 and norm(fixed) in norm(c):
                return True
    return False


def finish(raw: str, golds: Sequence[str], template: str, do_redact: bool) -> Critique:
    """Clean, redact and check one raw critique."""
    text = clean_critique(raw)
    n = 0
    if do_redact:
        text, n = redact(text, golds)
    return Critique(text=text, raw=raw, redactions=n, degenerate=is_degenerate(text, template))


class LMJudge:
    """A frozen causal LM that writes critiques greedily, in batches, with no grad."""

    kind = "lm"

    def __init__(self, model: Any, tokenizer: Any, cfg: Any, batch_size: int = 16):
        self.model, self.tokenizer, self.cfg, self.batch_size = model, tokenizer, cfg, batch_size
        self.errors = 0
        self.seconds = 0.0

    def critique(self, trajs: Sequence[Trajectory]) -> list[Critique]:
        """One ``Critique`` per trajectory (decoded ``batch_size`` at a time); a generation failure
        yields ``error`` critiques (counted)."""
        t0 = time.perf_counter()
        cfg, tok = self.cfg, self.tokenizer
        prompts, steps = [], []
        for tr in trajs:
            msg, st = judge_prompt_with_steps(tr, cfg.judge_template, cfg.judge_sees_gold,
                                              cfg.judge_max_prompt_tokens, tok)
            prompts.append(
                list(tok(protocol.apply_template(tok, msg), add_special_tokens=False)["input_ids"]))
            steps.append(st)
        try:
            texts = self._generate(prompts)
        # the judge failing must not stop training: no distillation for these rollouts
        except Exception as e:
            self.errors += len(trajs)
            self.seconds += time.perf_counter() - t0
            return [Critique(text="", error=f"{type(e).__name__}: {e}", prompt_tokens=len(p))
                    for p in prompts]
        res = []
        for tr, p, st, raw in zip(trajs, prompts, steps, texts):
            c = finish(raw, tr.golden_answers, cfg.judge_template, cfg.redact_gold_in_critique)
            c.prompt_tokens, c.truncation = len(p), st
            res.append(c)
        self.seconds += time.perf_counter() - t0
        return res

    def _generate(self, prompts: list[list[int]]) -> list[str]:
        """Greedy critiques (``core.decode``, ``batch_size`` rows at a time; EOS ids of the
        tokenizer and the generation config, the generation config's ``repetition_penalty`` if any),
        special tokens dropped."""
        tok, model = self.tokenizer, self.model
        penalty = getattr(getattr(model, "generation_config", None), "repetition_penalty", None)
        outs = decode(model, prompts, Stop(tok, stop_token_ids(tok, model)), GREEDY,
                      [self.cfg.critique_max_tokens] * len(prompts),
                      logits_hook=repetition_penalty(prompts, penalty),
                      max_rows=self.batch_size)
        return [tok.decode(o.ids, skip_special_tokens=True) for o in outs]


class OracleJudge:
    """Rule-based critiques from the recorded evidence (fictional world only; ``judge_kind =
    oracle``).

    With gold: names the evidence passages that no search retrieved (by bare title, compared
    case-insensitively with the retrieved titles) and, for a two-hop question, the bridge entity
    (``traj.extra['bridge']`` or ``traj.extra['metadata']['bridge']``). Without gold it knows
    nothing privileged and can only say the answer was not found.
    """

    kind = "oracle"

    def __init__(self, sees_gold: bool, template: str = "", do_redact: bool = True):
        self.sees_gold, self.template, self.do_redact = sees_gold, template, do_redact
        self.errors = 0
        self.seconds = 0.0

    def raw(self, traj: Trajectory) -> str:
        queries = traj.queries
        if not self.sees_gold:
            if not queries:
                return ("No search was made, so the answer was never found. Search for the entity "
                        "the question asks about.")
            return ("The searches did not find the answer. Try a query that names the entity the "
                    "question asks about.")
        got = traj.retrieved_keys()
        missed = [e for e in traj.evidence if title_key(e) not in got]
        meta = traj.extra.get("metadata", {}) if isinstance(traj.extra.get("metadata"), dict) else {
            }
        bridge = traj.extra.get("bridge") or meta.get("bridge")
        if missed:
            msg = (f"The searches never retrieved the passage about {' and '.join(missed)}; search "
                   f"for {missed[0]} directly.")
            if bridge and (traj.hops or 0) >= 2:
                msg += (f" This question needs two hops: first find {bridge}, then search about "
                        f"{bridge}.")
            return msg
        if traj.evidence:
            return (f"The passages about {' and '.join(traj.evidence)} were retrieved; read them "
                    "again and answer from them.")
        return ("The searches did not find the answer. Try a query that names the entity the "
                "question asks about.")

    def critique(self, trajs: Sequence[Trajectory]) -> list[Critique]:
        t0 = time.perf_counter()
        out = [finish(self.raw(tr), tr.golden_answers, self.template, self.do_redact)
               for tr in trajs]
        self.seconds += time.perf_counter() - t0
        return out
