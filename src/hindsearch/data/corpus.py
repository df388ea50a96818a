"""Read and write retrieval corpora in wiki-18 format (one ``Passage`` per row).

Reads ``.jsonl`` (streamed), ``.json`` (a list of rows, or HotpotQA's title -> sentences object) and
their gzipped forms. A bad row, or an id an earlier row already has, raises ``CorpusError`` naming
the file and line, or with ``skip_bad=True`` is skipped and counted in ``CorpusStats``; blank lines
are ignored. Ids are unique, since evidence recall and the paired results are keyed by passage id.
The fields read per format: docs/data.md, "Formats read".
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hindsearch.fsutil import BadJsonl, BadLine, iter_jsonl, json_problem
from hindsearch.records import Passage, make_contents

ID_KEYS = ("id", "_id", "docid")
# a .json object with one of them is a row, not a title map
ROW_KEYS = {"contents", "text", "title", *ID_KEYS}


class CorpusError(ValueError):
    """A malformed corpus row; the message names the file and line (or list position)."""


@dataclass
class RowStats:
    """Counts filled while reading rows (corpus or QA): kept, skipped and the first skip reasons."""

    rows: int = 0
    skipped: int = 0
    errors: list[str] = field(default_factory=list)

    def skip(self, msg: str) -> None:
        self.skipped += 1
        if len(self.errors) < 20:
            self.errors.append(msg)


CorpusStats = RowStats


def row_to_passage(obj: Any, default_id: str) -> Passage:
    """Normalise one parsed row to a ``Passage``; raises ``ValueError`` with the reason."""
    if not isinstance(obj, dict):
        raise ValueError(f"expected a JSON object, got {type(obj).__name__}")
    pid: Any = default_id
    for key in ID_KEYS:
        if key in obj and obj[key] is not None:
            pid = obj[key]
            if isinstance(pid, bool) or not isinstance(pid, (str, int)):
                raise ValueError(f"field {key!r} must be a string or integer, "
                                 f"got {type(pid).__name__}")
            break
    if "contents" in obj:
        contents = obj["contents"]
        if not isinstance(contents, str):
            raise ValueError(f"field 'contents' must be a string, got {type(contents).__name__}")
    elif "text" in obj:
        text, title = obj["text"], obj.get("title")
        if not isinstance(text, str):
            raise ValueError(f"field 'text' must be a string, got {type(text).__name__}")
        if title is not None and not isinstance(title, str):
            raise ValueError(f"field 'title' must be a string, got {type(title).__name__}")
        contents = make_contents(title, text) if title else text
    else:
        raise ValueError("no text: expected a 'contents' or 'text' field")
    if not contents.strip():
        raise ValueError("no text: 'contents'/'text' is empty")
    return Passage(id=str(pid), contents=contents)


def _is_json_list(path: Path) -> bool:
    return path.name.endswith((".json", ".json.gz"))


def _open_text(path: Path) -> Any:
    """A ``.json`` corpus as UTF-8 text, decompressing ``.gz`` on the fly; a byte-order mark at its
    start is read past."""
    if path.suffix == ".gz":
        import gzip

        return gzip.open(path, "rt", encoding="utf-8-sig")
    return path.open("r", encoding="utf-8-sig")


def _rows(path: Path) -> Iterator[tuple[int, str | None, Any]]:
    """Yield (line-or-position, parse error or None, parsed object)."""
    try:
        yield from _rows_of(path)
    except UnicodeDecodeError as e:
        raise CorpusError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start}); "
                          f"a corpus is UTF-8 JSON lines") from None
    except BadJsonl as e:  # the file itself: a FIFO or a device
        raise CorpusError(str(e)) from None
    except (OSError, EOFError) as e:  # a truncated or corrupt .gz
        if isinstance(e, (FileNotFoundError, PermissionError, IsADirectoryError)):
            raise
        raise CorpusError(f"{path}: cannot read it: {e}") from None


def _rows_of(path: Path) -> Iterator[tuple[int, str | None, Any]]:
    if _is_json_list(path):
        try:
            with _open_text(path) as f:
                data = json.loads(f.read())
        except json.JSONDecodeError as e:
            raise CorpusError(f"{path}:{e.lineno}: invalid JSON: {e.msg}") from e
        # an integer past Python's 4,300-digit limit, deep nesting
        except (ValueError, RecursionError) as e:
            raise CorpusError(f"{path}: {json_problem(e)}") from None
        if isinstance(data, dict) and ROW_KEYS & set(data):
            raise CorpusError(f"{path}: a .json corpus must be a list of objects or an object "
                              f"mapping titles to sentences; this object looks like a single row "
                              f"(keys {sorted(data)[:5]})")
        if isinstance(data, dict):  # {title: [sentences] or text}
            for i, (title, value) in enumerate(data.items(), 1):
                err, obj = _title_entry(title, value)
                yield i, err, obj
            return
        if not isinstance(data, list):
            raise CorpusError(f"{path}: a .json corpus must be a list of objects or an object "
                              f"mapping titles to sentences, got {type(data).__name__}")
        for i, obj in enumerate(data, 1):
            yield i, None, obj
        return
    for i, obj in iter_jsonl(path, "yield-bad", objects=False):
        yield (i, obj.reason, None) if isinstance(obj, BadLine) else (i, None, obj)


def _title_entry(title: str, value: Any) -> tuple[str | None, Any]:
    """One ``title -> sentences`` entry as a ``{title, text}`` row, or the reason it is bad."""
    if isinstance(value, list) and all(isinstance(x, str) for x in value):
        return None, {"title": title, "text": "".join(value).strip()}
    if isinstance(value, str):
        return None, {"title": title, "text": value.strip()}
    return (f"title {title!r}: expected a list of sentences (strings) or a string, got "
            f"{type(value).__name__} (a .json corpus object maps titles to sentences)"), None


class SeenIds:
    """The passage ids read so far, small for wiki-18's 21M: canonical decimal ids (``"1"``,
    ``"21015324"``) below ``2**28`` are bits of a bitmap (32 MiB at most), any other id is kept in a
    dict with its row."""

    BITMAP_LIMIT = 1 << 28

    def __init__(self) -> None:
        self.bits = bytearray()
        self.other: dict[str, int] = {}

    def add(self, pid: str, row: int) -> int | None:
        """Record ``pid`` (read at ``row``); returns the row that had it first (0 when that row is
        not kept: a bitmap id), or None when it is new."""
        if pid.isascii() and pid.isdigit() and (pid == "0" or pid[0] != "0") and len(pid) <= 9 \
                and int(pid) < self.BITMAP_LIMIT:
            k = int(pid)
            byte, bit = k >> 3, 1 << (k & 7)
            if byte >= len(self.bits):
                self.bits.extend(bytes(max(byte + 1 - len(self.bits), len(self.bits))))
            if self.bits[byte] & bit:
                return 0
            self.bits[byte] |= bit
            return None
        first = self.other.setdefault(pid, row)
        return None if first == row else first


def iter_corpus(path: str | Path, skip_bad: bool = False,
                stats: CorpusStats | None = None) -> Iterator[Passage]:
    """Stream the passages of a ``.jsonl`` (or ``.json`` list) corpus; a repeated id is bad."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"corpus not found: {path}")
    where = "item" if _is_json_list(path) else "line"
    seen = SeenIds()
    for n, err, obj in _rows(path):
        try:
            if err is not None:
                raise ValueError(err)
            p = row_to_passage(obj, default_id=str(n))
            first = seen.add(p.id, n)
            if first is not None:
                earlier = f"{where} {first}" if first else f"an earlier {where}"
                raise ValueError(f"duplicate passage id {p.id[:80]!r} ({earlier} has it); "
                                 "ids must be unique, evidence recall is keyed by id")
        except ValueError as e:
            msg = f"{path}:{n}: bad corpus {where}: {e}"
            if not skip_bad:
                hint = " (use --skip-bad / skip_bad=True to skip bad rows)"
                raise CorpusError(msg + hint) from None
            if stats is not None:
                stats.skip(msg)
            continue
        if stats is not None:
            stats.rows += 1
        yield p


def read_corpus(path: str | Path, skip_bad: bool = False,
                stats: CorpusStats | None = None) -> list[Passage]:
    """All passages of a corpus file, in file order."""
    return list(iter_corpus(path, skip_bad=skip_bad, stats=stats))


def write_corpus(path: str | Path, passages: Iterable[Passage]) -> int:
    """Write passages as wiki-18 jsonl (``{"id", "contents"}``); returns the row count."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    n = 0
    with path.open("w", encoding="utf-8") as f:
        for p in passages:
            f.write(json.dumps(p.to_search_r1(), ensure_ascii=False) + "\n")
            n += 1
    return n


def file_sha256(path: str | Path, chunk: int = 1 << 20) -> str:
    """Hex SHA-256 of a file's bytes (streamed)."""
    h = hashlib.sha256()
    with Path(path).open("rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()
