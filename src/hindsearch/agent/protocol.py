"""The Search-R1 protocol: every text rule of the agent, byte-compatible with Search-R1's code.

Every other module takes these rules from here; none keeps a copy: the tags (``TAG_RE``), the prompt
(``make_prompt``, ``encode_prompt``), action parsing (``parse_action``, ``extract_answer``: the last
``<answer>`` of the completion only), the stop strings, the observations (``information_block``,
``INVALID_NOTICE``), demo segmentation (``segments_from_text``) and THE token masks
(``query_token_mask``, ``action_mask``, ``decision_mask``). The rules in prose: docs/protocol.md.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from typing import Any

from hindsearch.records import Passage

PROMPT_TEMPLATE = (
    "Answer the given question. You must conduct reasoning inside <think> and </think> "
    "first every time you get new information. After reasoning, if you find you lack some "
    "knowledge, you can call a search engine by <search> query </search> and it will return "
    "the top searched results between <information> and </information>. You can search as "
    "many times as your want. If you find no further external knowledge needed, you can "
    "directly provide the answer inside <answer> and </answer>, without detailed "
    "illustrations. For example, <answer> Beijing </answer>. Question: {question}\n"
)

FEEDBACK_TEMPLATE = "Feedback on a previous attempt: {critique}\n"
"""HindSearch teacher context line, appended to the user message after the question."""

GOLD_HINDSIGHT_TEMPLATE = "(The correct answer is: {answer}.)\n"
"""IGSD teacher context line, appended to the user message after the question."""

INVALID_NOTICE = (
    "\nMy previous action is invalid. If I want to search, I should put the query between "
    "<search> and </search>. If I want to give the final answer, I should put the answer "
    "between <answer> and </answer>. Let me try again.\n"
)

SEARCH_OPEN, SEARCH_CLOSE = "<search>", "</search>"
ANSWER_OPEN, ANSWER_CLOSE = "<answer>", "</answer>"
THINK_OPEN = "<think>"
ACTION_TAGS = (SEARCH_OPEN, ANSWER_OPEN)
"""The opening tags of the two actions: where a turn commits to searching or answering."""
STOP_STRINGS = (SEARCH_CLOSE, ANSWER_CLOSE)
"""A model turn ends right after the first of these (or at EOS, or its budget)."""
TAG_RE = re.compile(r"</?(search|answer|think|information)>")
"""Any Search-R1 tag, opening or closing."""
ACTION_RE = re.compile(r"<(search|answer)>(.*?)</\1>", re.DOTALL)
ANSWER_RE = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


# ---------------------------------------------------------------- prompt
def format_question(question: str) -> str:
    """Strip the question and append ``?`` when it does not end with one (Search-R1)."""
    q = question.strip()
    if not q:
        raise ValueError("empty question")
    if q[-1] != "?":
        q += "?"
    return q


def user_message(question: str, hint: str | None = None) -> str:
    """The Search-R1 user message, with an optional hindsight line appended after it."""
    msg = PROMPT_TEMPLATE.format(question=format_question(question))
    if hint:
        msg += hint
    return msg


def apply_template(tokenizer: Any, message: str) -> str:
    """Wrap a user message in the tokenizer's chat template (generation prompt added).

    Tokenizers without a chat template get the message as it is.
    """
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(
            [{"role": "user", "content": message}], tokenize=False, add_generation_prompt=True
        )
    return message


def make_prompt(tokenizer: Any, question: str, hint: str | None = None) -> str:
    """Full prompt text for a question (optionally with a hindsight line)."""
    return apply_template(tokenizer, user_message(question, hint))


def encode_prompt(tokenizer: Any, question: str, hint: str | None = None) -> list[int]:
    """Token ids of the prompt, the one rule shared by rollouts, teachers and the warm-up.

    With a chat template the template already holds the special tokens, so none are added;
    without one the tokenizer's own special tokens (e.g. BOS) are added.
    """
    text = make_prompt(tokenizer, question, hint)
    has_template = bool(getattr(tokenizer, "chat_template", None))
    return list(tokenizer(text, add_special_tokens=not has_template)["input_ids"])


# ---------------------------------------------------------------- parse, answer
def parse_action(turn_text: str) -> tuple[str | None, str]:
    """Parse one turn: ``("search"|"answer", content)`` or ``(None, "")`` when invalid."""
    m = ACTION_RE.search(turn_text)
    if m is None:
        return None, ""
    return m.group(1), m.group(2).strip()


def extract_answer(completion_text: str) -> str | None:
    """The stripped content of the last ``<answer>...</answer>`` in the completion, or None."""
    matches = ANSWER_RE.findall(completion_text)
    if not matches:
        return None
    return matches[-1].strip()


# ---------------------------------------------------------------- observations
def format_docs(passages: Sequence[Passage]) -> str:
    """Search-R1's ``_passages2string``: ``Doc {i}(Title: {title}) {text}\\n`` per passage."""
    out = []
    for i, p in enumerate(passages):
        out.append(f"Doc {i + 1}(Title: {p.title}) {p.text}\n")
    return "".join(out)


def information_block(passages: Sequence[Passage]) -> str:
    """The injected observation: ``\\n\\n<information>{docs}</information>\\n\\n``."""
    return f"\n\n<information>{format_docs(passages).strip()}</information>\n\n"


# ------------------------------------------------------------ stop strings, query completion (IGSD)
def search_close_ids(tokenizer: Any) -> list[int]:
    """Ids of ``</search>`` tokenized on its own (appended to a query completion that never
    closed)."""
    return list(tokenizer(SEARCH_CLOSE, add_special_tokens=False)["input_ids"])


def cut_at_search_close(tokenizer: Any, ids: Sequence[int],
                        lead: Sequence[int] = ()) -> tuple[list[int], bool]:
    """Keep generated ids up to the token that completes ``</search>`` (searched in the text of
    ``lead + ids``, so a ``</search>`` that starts in the proposed token counts); ``(ids,
    closed)``."""
    ids, lead = list(ids), list(lead)
    for j in range(0 if lead else 1, len(ids) + 1):
        if SEARCH_CLOSE in tokenizer.decode(lead + ids[:j]):
            return ids[:j], True
    return ids, False


def query_text(tokenizer: Any, query_ids: Sequence[int]) -> str:
    """The query string of ids that start right after ``<search>`` (text up to ``</search>``,
    stripped)."""
    return (
        tokenizer.decode(list(query_ids), skip_special_tokens=True).split(SEARCH_CLOSE, 1)[0].strip(
            ))


# ---------------------------------------------------------------- demo segmentation
INJECTED_RE = re.compile(r"(\n\n<information>.*?(?:</information>\n\n|$)|"
                         + re.escape(INVALID_NOTICE) + ")", re.DOTALL)
"""An injected segment of a completion's text: an information block (to its end, or to the end of a
cut text) or the invalid-action notice."""


def segments_from_text(completion_text: str) -> list[tuple[str, bool]]:
    """Split a completion into ``(text, generated)`` segments: injected blocks (information
    blocks, the invalid-action notice) are ``generated=False``, everything else True."""
    out: list[tuple[str, bool]] = []
    pos = 0
    for m in INJECTED_RE.finditer(completion_text):
        if m.start() > pos:
            out.append((completion_text[pos : m.start()], True))
        out.append((m.group(0), False))
        pos = m.end()
    if pos < len(completion_text):
        out.append((completion_text[pos:], True))
    return out


# ---------------------------------------------------------------- token masks
def token_char_spans(tokenizer: Any, ids: Sequence[int]) -> list[tuple[int, int]]:
    """Character span of each token in ``decode(ids)`` (incremental decoding; monotone).

    Works on any ids (sampled ones need not be the tokenizer's own encoding of their text). Where a
    character's bytes are split over several tokens (byte-level or byte-fallback vocabularies) the
    spans are approximate: partial bytes decode to replacement characters, so the tokens of that
    character, and those after it, can get shifted spans (``tests/test_protocol.py``: only the first
    of the two byte tokens of ``é`` overlaps it).
    """
    ids = list(ids)
    spans, prev = [], 0
    for i in range(len(ids)):
        end = max(prev, len(tokenizer.decode(ids[: i + 1], skip_special_tokens=False)))
        spans.append((prev, end))
        prev = end
    return spans


def query_token_mask(tokenizer: Any, ids: Sequence[int], text: str) -> list[int]:
    """THE query mask of one model turn: 1 on the tokens of ``ids`` whose character span
    (``token_char_spans``) overlaps the stripped query of the first action of ``text``
    (``decode(ids)``) when that action is a search; all 0 otherwise, and for an empty query. Rollout
    turns and warm-up demo segments both use it."""
    m = ACTION_RE.search(text)
    if m is None or m.group(1) != "search":
        return [0] * len(ids)
    qs, qe = m.span(2)
    raw = text[qs:qe]
    qs, qe = qs + (len(raw) - len(raw.lstrip())), qe - (len(raw) - len(raw.rstrip()))
    if qe <= qs:
        return [0] * len(ids)
    return [1 if s < qe and e > qs else 0 for s, e in token_char_spans(tokenizer, ids)]


def post_information_turns(traj: Any, n: int,
                           actions: tuple[str, ...] | None = None) -> Iterator[tuple[int, int]]:
    """``(start, end)`` completion spans (cut to ``n``) of the turns that follow a search turn with
    an injected block (only those whose own action is in ``actions``, when given); empty spans are
    skipped."""
    turns = list(traj.turns)
    for prev, turn in zip(turns, turns[1:]):
        if prev.action != "search" or prev.inject_span[1] <= prev.inject_span[0]:
            continue
        if actions is not None and turn.action not in actions:
            continue
        s, e = turn.gen_span[0], min(turn.gen_span[1], n)
        if e > s:
            yield s, e


def action_mask(traj: Any, tokenizer: Any) -> list[int]:
    """1 on the tokens where a turn after an information block chooses its action, else 0.

    For every turn that follows a search turn with an injected block: the turn's first content token
    (the first token after a leading ``<think>`` tag, else the first generated token: where a
    reasoning opener already commits to searching again or answering) and the tokens overlapping its
    first ``<search>`` or ``<answer>`` opening tag. Length = ``len(completion_ids)``.
    """
    n = len(traj.completion_ids)
    out = [0] * n
    for s, e in post_information_turns(traj, n):
        ids = traj.completion_ids[s:e]
        ends = [e for _, e in token_char_spans(tokenizer, ids)]
        text = tokenizer.decode(ids)
        lead = len(text) - len(text.lstrip())
        if text[lead:].startswith(THINK_OPEN):
            lead += len(THINK_OPEN)
            lead += len(text[lead:]) - len(text[lead:].lstrip())
        first = next((j for j, end in enumerate(ends) if end > lead), 0)
        out[s + first] = 1
        hits = [(text.find(tag), tag) for tag in ACTION_TAGS if tag in text]
        if not hits:
            continue
        c0, tag = min(hits)
        c1 = c0 + len(tag)
        prev_end = 0
        for j, end in enumerate(ends):
            if end > c0 and prev_end < c1:
                out[s + j] = 1
            prev_end = end
    return out


def decision_mask(traj: Any, tokenizer: Any, actions: tuple[str, ...] | None = None) -> list[int]:
    """1 on every token of the search-again-or-answer decision, else 0.

    For every turn that follows a search turn with an injected block: the turn's tokens from its
    first generated token through the tokens overlapping its first ``<search>`` or ``<answer>``
    opening tag (the whole turn when it opens neither). Unlike ``action_mask`` (the first content
    token and the tag), this covers a decision the tokenizer spreads over several tokens (``" I"`` /
    ``" The"`` then ``" am"`` / ``" should"`` on micro). ``actions``: only the turns that took one
    of these actions (``("answer",)``: the decisions to answer now). Length =
    ``len(completion_ids)``.
    """
    n = len(traj.completion_ids)
    out = [0] * n
    for s, e in post_information_turns(traj, n, actions):
        ids = traj.completion_ids[s:e]
        text = tokenizer.decode(ids)
        hits = [text.find(tag) + len(tag) for tag in ACTION_TAGS if tag in text]
        stop = min(hits) if hits else len(text)
        prev_end = 0
        for j in range(len(ids)):
            if prev_end >= stop:
                break
            out[s + j] = 1
            prev_end = len(tokenizer.decode(ids[: j + 1]))
    return out
