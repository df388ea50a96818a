"""What HindSearch's frozen teacher does at the micro model's search-again fork, read from a run's samples.

On micro the decision after an information block is one token of the thought: the warm-up demos write
``<think> The passages point to X. Now I need ...`` before a second search and ``<think> The passages say
the answer is ...`` before an answer. For every distilled failed rollout in ``RUN/samples.jsonl`` this
reads, at each fork token the student took (`` point`` or `` say`` after `` passages``), the teacher's
probability of it under the critique and its log-ratio to the neutral prompt, grouped by the critique's
kind (``ready``: the retrieved text held the gold, "read them again and answer from them"; ``missing``:
"the searches never retrieved the passage about ..."), and by a window of steps.

    python recipes/micro/ready_fork.py runs/cmpA/hindsearch-ready-s0 [more run folders] [--split 50]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

KINDS = {"ready": "answer from them", "missing": "never retrieved"}
"""Critique kind -> a phrase the oracle judge's critique of that kind contains."""
FORK = {" point": "search again", " say": "answer"}
"""The fork token after `` passages`` -> the action it starts (the micro warm-up's wording)."""


def fork_rows(samples: Path) -> list[dict]:
    """One dict per fork token the student took in a distilled rollout: step, kind, token, p_teacher,
    teacher_minus_neutral (nats). A line that is not JSON stops with its file and line number."""
    out = []
    with samples.open(encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                sys.exit(f"{samples}:{n}: not a JSON line ({e.msg})")
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
    lines = ["| critique | steps | student's token | n | teacher P(token) | teacher - neutral (nats) |",
             "|---|---|---|---|---|---|"]
    for kind in KINDS:
        for window, keep in ((f"1-{split}", lambda s: s <= split), (f"{split + 1}-", lambda s: s > split)):
            for tok, action in FORK.items():
                sel = [r for r in rows if r["kind"] == kind and r["token"] == tok and keep(r["step"])]
                if not sel:
                    continue
                p = statistics.mean(r["p_teacher"] for r in sel)
                d = statistics.mean(r["teacher_minus_neutral"] for r in sel)
                lines.append(f"| {kind} | {window} | `{tok.strip()}` ({action}) | {len(sel)} | {p:.3f} | {d:+.3f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", type=Path, help="HindSearch run folders (each holds samples.jsonl)")
    ap.add_argument("--split", type=int, default=50, help="last step of the first window (default 50)")
    args = ap.parse_args(argv)
    rows = []
    for run in args.runs:
        path = run / "samples.jsonl"
        if not path.is_file():
            sys.exit(f"{path}: no such file (a HindSearch run folder holds samples.jsonl)")
        rows += fork_rows(path)
    if not rows:
        sys.exit("no distilled fork tokens found (a HindSearch run on the micro model with the oracle judge?)")
    print(table(rows, args.split))


if __name__ == "__main__":
    main()
