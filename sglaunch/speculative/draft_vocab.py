"""A drafter's vocabulary: the target tokens it may draft, when not all of them.

The drafter's LM head is the target's (V rows); drafting over the K most frequent tokens of the
target's own responses costs K/V of it. Drafts remain target token ids and a token outside the
set is never drafted (its draft probability is 0), so verification stays exact: what changes is
only how often a draft can be right. For SmolLM2 (V = 49,152) the 16,384 most frequent tokens
cover 99.8% of the training responses' tokens.

File `draft_vocab.json` in the drafter folder (read by the engine at start-up, TP 1 only):

    {"version": 1, "token_ids": [...], "source": "how it was made"}

Build one from train-draft's responses (`responses.jsonl`, optionally gzipped):

    python -m sglaunch.speculative.draft_vocab RESPONSES.jsonl[.gz] ... --size 16384 -o DRAFTER/draft_vocab.json

Torch-free.
"""

from __future__ import annotations

import argparse
import collections
import gzip
import json
from pathlib import Path
from typing import Iterable, Sequence

FILE_NAME = "draft_vocab.json"


def frequent_tokens(sequences: Iterable[Sequence[int]], size: int) -> tuple[list[int], float]:
    """The `size` most frequent token ids (ties: the smaller id first), sorted by id, and the
    share of all counted tokens they cover."""
    if size < 1:
        raise ValueError(f"a draft vocabulary needs at least 1 token, got {size}")
    counts: collections.Counter[int] = collections.Counter()
    for seq in sequences:
        counts.update(int(t) for t in seq)
    if not counts:
        raise ValueError("no tokens to count: the responses are empty")
    ranked = sorted(counts.items(), key=lambda item: (-item[1], item[0]))[:size]
    covered = sum(n for _, n in ranked) / sum(counts.values())
    return sorted(t for t, _ in ranked), covered


def load_draft_vocab(path: str | Path, vocab_size: int) -> list[int]:
    """Token ids from a draft_vocab.json; ValueError naming the problem."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path} is not valid JSON ({exc})") from None
    ids = data.get("token_ids") if isinstance(data, dict) else None
    if not isinstance(ids, list) or not ids or not all(isinstance(t, int) for t in ids):
        raise ValueError(f"{path}: expected {{\"token_ids\": [int, ...]}} with at least one id")
    bad = [t for t in ids if not 0 <= t < vocab_size]
    if bad:
        raise ValueError(f"{path}: token ids outside the target's vocabulary of {vocab_size}, e.g. {bad[:3]}")
    if len(set(ids)) != len(ids):
        raise ValueError(f"{path}: token ids repeat")
    return sorted(ids)


def save_draft_vocab(path: str | Path, token_ids: Sequence[int], source: str) -> None:
    path = Path(path)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"version": 1, "token_ids": sorted(int(t) for t in token_ids), "source": source}) + "\n")
    tmp.replace(path)


def read_responses(paths: Sequence[Path]) -> Iterable[list[int]]:
    """The response token ids of train-draft's responses.jsonl files (.gz too)."""
    for path in paths:
        opener = gzip.open if str(path).endswith(".gz") else open
        with opener(path, "rt", encoding="utf-8") as handle:
            for line in handle:
                if line.strip():
                    yield json.loads(line)["response_ids"]


def source_names(paths: Sequence[Path]) -> list[str]:
    """The files' names for the vocabulary's `source`; with their folders when names repeat (every
    drafter round writes its own responses.jsonl.gz)."""
    names = [p.name for p in paths]
    if len(set(names)) < len(names):
        names = [f"{p.parent.name}/{p.name}" if p.parent.name else p.name for p in paths]
    return names


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Write a drafter's draft_vocab.json from train-draft responses.")
    parser.add_argument("responses", nargs="+", type=Path, help="responses.jsonl files (.gz too)")
    parser.add_argument("--size", type=int, required=True, help="tokens to keep (the most frequent)")
    parser.add_argument("-o", "--output", type=Path, required=True, help="draft_vocab.json to write")
    args = parser.parse_args(argv)
    ids, covered = frequent_tokens(read_responses(args.responses), args.size)
    source = (f"the {len(ids)} most frequent response tokens of {', '.join(source_names(args.responses))} "
              f"(cover {covered:.4%} of them)")
    save_draft_vocab(args.output, ids, source)
    print(f"wrote {args.output}: {source}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
