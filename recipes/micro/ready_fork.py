"""What HindSearch's frozen teacher does at the micro model's search-again fork, read from a run's samples.

On micro the decision after an information block is one token of the thought: the warm-up demos write
``<think> The passages point to X. Now I need ...`` before a second search and ``<think> The passages say
the answer is ...`` before an answer. For every distilled failed rollout in ``RUN/samples.jsonl`` this
reads, at each fork token the student took (`` point`` or `` say`` after `` passages``), the teacher's
probability of it under the critique and its log-ratio to the neutral prompt, grouped by the critique's
kind (``ready``: the retrieved text held the gold, "read them again and answer from them"; ``missing``:
"the searches never retrieved the passage about ..."), and by a window of steps.

``--model DIR`` (repeatable) also rescores the ready forks where the student searched again: the model's
probability of `` point`` (search again) there under each prompt a teacher could read (none, the neutral
line, HindSearch's ready critique, the oracle's own critique, IGSD's answer line), the prompt that a
candidate ``ready_states`` setting would give the teacher.

    python recipes/micro/ready_fork.py runs/cmpA/hindsearch-ready-s0 [more run folders] [--split 50] \
        [--model .hindsearch/cache/warmup/warmup-93ca5a81a463cac2]
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from pathlib import Path

KINDS = {"ready": "answer from them", "missing": "never retrieved"}
"""Critique kind -> a phrase the oracle judge's critique of that kind contains."""
FORK = {" point": "search again", " say": "answer"}
"""The fork token after `` passages`` -> the action it starts (the micro warm-up's wording)."""


def read_samples(samples: Path) -> list[dict]:
    """The rows of a run's ``samples.jsonl`` (the package's strict reader: a bad line stops, naming file:line)."""
    from hindsearch.fsutil import BadJsonl, read_jsonl

    try:
        return read_jsonl(samples)
    except BadJsonl as e:
        sys.exit(str(e))


def fork_rows(rows: list[dict]) -> list[dict]:
    """One dict per fork token the student took in a distilled rollout: step, kind, token, p_teacher,
    teacher_minus_neutral (nats)."""
    out = []
    for row in rows:
        hind = row.get("hind") or {}
        toks, lt, dn = hind.get("distill_tokens"), hind.get("lT"), hind.get("lT_minus_neutral")
        kind = next((k for k, p in KINDS.items() if p in (hind.get("critique") or "")), None)
        if not toks or lt is None or dn is None or kind is None:
            continue
        for i in range(1, len(toks)):
            if toks[i] in FORK and toks[i - 1] == " passages":
                out.append({"step": row["step"], "kind": kind, "token": toks[i],
                            "p_teacher": math.exp(lt[i]), "teacher_minus_neutral": dn[i]})
    return out


def table(rows: list[dict], split: int) -> str:
    """A markdown table: per critique kind, step window and fork token, the count, the teacher's mean
    probability of the student's token and its mean log-ratio to the neutral prompt."""
    from hindsearch.tables import markdown_table

    body = []
    for kind in KINDS:
        for window, keep in ((f"1-{split}", lambda s: s <= split), (f"{split + 1}-", lambda s: s > split)):
            for tok, action in FORK.items():
                sel = [r for r in rows if r["kind"] == kind and r["token"] == tok and keep(r["step"])]
                if sel:
                    p = statistics.mean(r["p_teacher"] for r in sel)
                    d = statistics.mean(r["teacher_minus_neutral"] for r in sel)
                    body.append([kind, window, f"`{tok.strip()}` ({action})", len(sel), f"{p:.3f}", f"{d:+.3f}"])
    return markdown_table(["critique", "steps", "student's token", "n", "teacher P(token)",
                           "teacher - neutral (nats)"], body)


PROMPTS = ("student (no line)", "neutral", "ready critique", "oracle critique", "answer line")
"""The hint lines ``rescore`` compares, in its table's order."""


def ready_prefixes(rows: list[dict]) -> list[dict]:
    """The ready rollouts whose first post-information thought took `` point``: question, golds, the oracle's
    critique and the completion text through `` The passages`` of that thought (the fork comes next)."""
    out = []
    for row in rows:
        crit = (row.get("hind") or {}).get("critique") or ""
        if KINDS["ready"] not in crit:
            continue
        text = row["completion"]
        info = text.find("</information>")
        fork = text.find(" passages", info) if info >= 0 else -1
        if fork < 0 or not text.startswith(" point", fork + len(" passages")):
            continue
        out.append({"question": row["question"], "golds": row["golden_answers"], "critique": crit,
                    "prefix": text[: fork + len(" passages")]})
    return out


def rescore(model_dir: str, rows: list[dict]) -> dict[str, float]:
    """Mean probability of `` point`` as the next token at each ready fork, per prompt in ``PROMPTS`` (the teachers'
    batched scorer, ``teacher_token_logprobs``, on the completion through the fork plus `` point``)."""
    import torch  # the table above needs no torch; the rescoring does

    from hindsearch.agent import protocol
    from hindsearch.hindsight.teacher import NEUTRAL_CRITIQUE, READY_CRITIQUE, teacher_token_logprobs
    from hindsearch.models import load_tokenizer_from
    from transformers import AutoModelForCausalLM

    tok = load_tokenizer_from(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    point = tok.encode(" point", add_special_tokens=False)
    if len(point) != 1:
        sys.exit(f"{model_dir}: ' point' is {len(point)} tokens here; the fork reading needs the micro tokenizer")
    fb = protocol.FEEDBACK_TEMPLATE.format
    comps = [tok.encode(r["prefix"], add_special_tokens=False) + point for r in rows]  # tokenised once per fork
    hints = {"student (no line)": lambda r: None, "neutral": lambda r: fb(critique=NEUTRAL_CRITIQUE),
             "ready critique": lambda r: fb(critique=READY_CRITIQUE),
             "oracle critique": lambda r: fb(critique=r["critique"]),
             "answer line": lambda r: protocol.GOLD_HINDSIGHT_TEMPLATE.format(answer=r["golds"][0])}
    out = {}
    with torch.no_grad():
        for name in PROMPTS:
            prompts = [protocol.encode_prompt(tok, r["question"], hints[name](r)) for r in rows]
            lp, _, _ = teacher_token_logprobs(model, prompts, comps)
            out[name] = statistics.mean(math.exp(lp[i, len(c) - 1].item()) for i, c in enumerate(comps))
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", type=Path, help="HindSearch run folders (each holds samples.jsonl)")
    ap.add_argument("--split", type=int, default=50, help="last step of the first window (default 50)")
    ap.add_argument("--model", action="append", default=[], help="model folder to rescore the ready forks with")
    args = ap.parse_args(argv)
    samples = []
    for run in args.runs:
        path = run / "samples.jsonl"
        if not path.is_file():
            sys.exit(f"{path}: no such file (a HindSearch run folder holds samples.jsonl)")
        samples += read_samples(path)
    rows = fork_rows(samples)
    if not rows:
        sys.exit("no distilled fork tokens found (a HindSearch run on the micro model with the oracle judge?)")
    print(table(rows, args.split))
    if args.model:
        ready = ready_prefixes(samples)
        print(f"\nP(' point', search again) at {len(ready)} ready forks where the student searched again:\n")
        from hindsearch.tables import markdown_table

        body = []
        for m in args.model:
            got = rescore(m, ready)
            body.append([m, *(f"{got[k]:.3f}" for k in PROMPTS)])
        print(markdown_table(["model", *PROMPTS], body))


if __name__ == "__main__":
    main()
