"""Prompts for train-draft from the license-clean corpus of `shared/tools/build_corpus.sh`.

    python -m sglaunch.training.corpus CORPUS_DIR --train prompts.jsonl --heldout heldout.jsonl

Prompt types (the `type` field; the evaluation reports accept length per type):
  prose       raw continuation of a literary excerpt (Shakespeare, Milton, Austen, KJV): `prompt`
  chat-prose  chat instructions about an excerpt: continue / summarise / modernise / explain
  chat-code   chat instructions about a Python stdlib excerpt: explain / document / review
  chat-docs   chat instructions about a Python docs paragraph: explain simply / give an example
  chat-qa     short questions built from the Python docs' section titles
Held-out prompts come only from the last `--heldout-fraction` of every corpus file, so no
held-out text is ever trained on. `--train-text FILE` also writes plain text for train-draft's
`--extra-text`: windows drawn from the training part of every file only, in equal shares per file
(`--train-text-chars` in all). Torch-free, deterministic for a seed.
"""

from __future__ import annotations

import argparse
import gzip
import json
import random
import re
from pathlib import Path

LITERARY = ("shakespeare.txt", "milton.txt", "austen.txt", "kjv.txt")
PROSE_ASKS = ("Continue this passage in the same style:", "Summarize the following passage in two sentences:",
              "Rewrite this passage in plain modern English:", "What is happening in this passage? Explain briefly.")
CODE_ASKS = ("Explain what this Python code does:", "Write a short docstring for this Python code:",
             "Review this Python code and point out one possible improvement:")
DOC_ASKS = ("Explain this in simple terms:", "Give a short Python example that illustrates this:",
            "Summarize this documentation paragraph:")
QA_TEMPLATES = ("What is {t} in Python?", "Explain {t} with a short example.", "When should I use {t}?",
                "Write a short tutorial introduction to {t}.")


def split_text(text: str, fraction: float) -> tuple[str, str]:
    cut = int(len(text) * (1 - fraction))
    cut = text.find("\n", cut) + 1 or cut
    return text[:cut], text[cut:]


def excerpt(text: str, rng: random.Random, chars: int) -> str:
    if len(text) <= chars:
        return text.strip()
    start = text.find("\n", rng.randrange(0, len(text) - chars)) + 1
    piece = text[start: start + chars]
    return piece[: piece.rfind("\n")].strip() if "\n" in piece else piece.strip()


def code_excerpt(text: str, rng: random.Random, chars: int) -> str:
    starts = [m.start() for m in re.finditer(r"^(def|class) ", text, re.M)]
    if not starts:
        return excerpt(text, rng, chars)
    start = rng.choice(starts)
    piece = text[start: start + chars]
    return piece[: piece.rfind("\n")].rstrip() if "\n" in piece else piece


def titles(text: str) -> list[str]:
    """reST section titles (a line followed by ==== / ---- of the same length)."""
    lines = text.splitlines()
    found = {a.strip() for a, b in zip(lines, lines[1:])
             if a.strip() and len(a.strip()) < 50 and re.fullmatch(r"[=\-~^]{3,}", b.strip() or "x")
             and not a.strip()[0] in ":.*" and len(b.strip()) >= len(a.strip())}
    return sorted(t for t in found if re.search("[A-Za-z]", t))


def make_prompts(texts: dict[str, str], count: int, rng: random.Random) -> list[dict]:
    out = []
    literary = [texts[n] for n in LITERARY if texts.get(n)]
    code, docs = texts.get("pystdlib.txt", ""), texts.get("pydocs.txt", "")
    topics = titles(docs)
    kinds = ["prose", "chat-prose"] * bool(literary) + ["chat-code"] * bool(code) + ["chat-docs"] * bool(docs) \
        + ["chat-qa"] * bool(topics)
    if not kinds:
        raise SystemExit("no corpus files found (expected shakespeare.txt, kjv.txt, pystdlib.txt, pydocs.txt, ...)")
    for i in range(count):
        kind = kinds[i % len(kinds)]
        if kind == "prose":
            out.append({"prompt": excerpt(rng.choice(literary), rng, rng.randint(200, 800)), "type": kind})
        elif kind == "chat-prose":
            ask, body = rng.choice(PROSE_ASKS), excerpt(rng.choice(literary), rng, rng.randint(200, 700))
            out.append({"messages": [{"role": "user", "content": f"{ask}\n\n{body}"}], "type": kind})
        elif kind == "chat-code":
            ask, body = rng.choice(CODE_ASKS), code_excerpt(code, rng, rng.randint(300, 900))
            out.append({"messages": [{"role": "user", "content": f"{ask}\n\n```python\n{body}\n```"}], "type": kind})
        elif kind == "chat-docs":
            ask, body = rng.choice(DOC_ASKS), excerpt(docs, rng, rng.randint(200, 700))
            out.append({"messages": [{"role": "user", "content": f"{ask}\n\n{body}"}], "type": kind})
        else:
            question = rng.choice(QA_TEMPLATES).format(t=rng.choice(topics))
            out.append({"messages": [{"role": "user", "content": question}], "type": kind})
    return out


def build(corpus: Path, train_count: int, heldout_count: int, fraction: float, seed: int) -> tuple[list, list]:
    train_texts, held_texts = {}, {}
    for file in sorted(corpus.glob("*.txt")):
        train_texts[file.name], held_texts[file.name] = split_text(file.read_text(encoding="utf-8", errors="replace"),
                                                                   fraction)
    return (make_prompts(train_texts, train_count, random.Random(seed)),
            make_prompts(held_texts, heldout_count, random.Random(seed + 1)))


def train_text(corpus: Path, chars: int, fraction: float, seed: int, window: int = 4000) -> str:
    """About `chars` characters of plain text from the training part of every corpus file, in
    equal shares: non-overlapping windows of `window` characters cut at line ends, in file order."""
    files = sorted(corpus.glob("*.txt"))
    if not files:
        raise SystemExit(f"no corpus files (*.txt) in {corpus}")
    rng, share, parts = random.Random(seed), chars // len(files), []
    for file in files:
        text, _ = split_text(file.read_text(encoding="utf-8", errors="replace"), fraction)
        slots = max(1, len(text) // window)
        for slot in sorted(rng.sample(range(slots), min(slots, max(1, share // window)))):
            piece = text[slot * window: (slot + 1) * window]
            start = piece.find("\n") + 1 if slot else 0
            end = piece.rfind("\n")
            parts.append(piece[start: end if end > start else None].strip())
    return "\n\n".join(p for p in parts if p) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("corpus", type=Path, help="folder written by build_corpus.sh")
    parser.add_argument("--train", type=Path, required=True, help="training prompts (JSONL) to write")
    parser.add_argument("--heldout", type=Path, required=True, help="held-out prompts (JSONL) to write")
    parser.add_argument("--count", type=int, default=20000, help="training prompts")
    parser.add_argument("--heldout-count", type=int, default=250, help="held-out prompts")
    parser.add_argument("--heldout-fraction", type=float, default=0.05, help="tail of each file kept for held-out")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--train-text", type=Path, help="also write plain text for train-draft --extra-text "
                                                        "(.gz: compressed)")
    parser.add_argument("--train-text-chars", type=int, default=12_000_000, help="characters of --train-text")
    args = parser.parse_args(argv)
    train, held = build(args.corpus, args.count, args.heldout_count, args.heldout_fraction, args.seed)
    for path, rows in ((args.train, train), (args.heldout, held)):
        path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
        print(f"wrote {len(rows)} prompts to {path}")
    if args.train_text:
        text = train_text(args.corpus, args.train_text_chars, args.heldout_fraction, args.seed)
        raw = text.encode("utf-8")
        args.train_text.write_bytes(gzip.compress(raw, 9, mtime=0) if args.train_text.suffix == ".gz" else raw)
        print(f"wrote {len(text)} characters of training text to {args.train_text}")


if __name__ == "__main__":
    main()
