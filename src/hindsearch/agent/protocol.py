"""The Search-R1 agent protocol, byte-compatible with Search-R1's released code.

- ``make_prompt``: the exact Search-R1 instruction (a ``?`` appended to the question when
  missing), wrapped in the tokenizer's chat template when it has one.
- ``parse_action``: the first ``<(search|answer)>(.*?)</\\1>`` match of a turn (DOTALL),
  content stripped; anything else is an invalid action.
- ``format_docs`` / ``information_block``: ``Doc {i}(Title: {title}) {text}\\n`` per passage,
  wrapped as ``\\n\\n<information>{docs}</information>\\n\\n`` (docs stripped, as Search-R1).
- ``INVALID_NOTICE``: Search-R1's fixed notice for an invalid turn.
- ``extract_answer``: the content of the **last** ``<answer>`` of the completion only
  (never the prompt: the example ``<answer> Beijing </answer>`` in the instruction must
  not count).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
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

STOP_STRINGS = ("</search>", "</answer>")
ACTION_RE = re.compile(r"<(search|answer)>(.*?)</\1>", re.DOTALL)
ANSWER_RE = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


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


def format_docs(passages: Sequence[Passage]) -> str:
    """Search-R1's ``_passages2string``: ``Doc {i}(Title: {title}) {text}\\n`` per passage."""
    out = []
    for i, p in enumerate(passages):
        out.append(f"Doc {i + 1}(Title: {p.title}) {p.text}\n")
    return "".join(out)


def information_block(passages: Sequence[Passage]) -> str:
    """The injected observation: ``\\n\\n<information>{docs}</information>\\n\\n``."""
    return f"\n\n<information>{format_docs(passages).strip()}</information>\n\n"


def encode_prompt(tokenizer: Any, question: str, hint: str | None = None) -> list[int]:
    """Token ids of the prompt, the one rule shared by rollouts, teachers and the warm-up.

    With a chat template the template already holds the special tokens, so none are added;
    without one the tokenizer's own special tokens (e.g. BOS) are added.
    """
    text = make_prompt(tokenizer, question, hint)
    has_template = bool(getattr(tokenizer, "chat_template", None))
    return list(tokenizer(text, add_special_tokens=not has_template)["input_ids"])
