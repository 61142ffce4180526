"""What the benchmark sends: prompt files, ShareGPT conversations, synthetic lengths; seeded sampling.

NOTE: everything here is a pure function of (workload file or settings, seed, tokenizer), so the
same seed and workload always give the same requests (`requests_digest` proves it in the JSON).
"""

from __future__ import annotations

import hashlib
import json
import math
import random
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from sglaunch.errors import SglaunchError

OUTPUT_LEN_KEYS = ("output_len", "output_tokens", "max_tokens")
HUMAN_ROLES = {"human", "user"}
MODEL_ROLES = {"gpt", "assistant", "chatgpt", "bard", "model"}
CHAT_ROLES = {"system", "developer", "user", "assistant", "tool"}
# Synthetic prompts are made of these words; each is at least one token for any BPE tokenizer.
WORDS = ("the of and to in is that for it as with was on be by at this from are or have an they "
         "which one you were her all she there would their we him been has when who will more no if "
         "out so said what up its about into than them can only other new some could time these two "
         "may then do first any my now such like our over man me even most made after also did many "
         "before must through back years where much your way well down should because each just "
         "those people how too little state good very make world still own see men work long get "
         "here between both life being under never day same another know while last might us great "
         "old year off come since against go came right used take three").split()
TokenCounter = Callable[[str], int]


@dataclass(frozen=True)
class BenchRequest:
    """One request: `prompt` (text or token ids, for /v1/completions) or `messages` (chat)."""

    prompt: str | list[int] | None
    messages: list[dict[str, Any]] | None
    output_len: int
    input_len: int | None = None  # exact prompt tokens when known before sending

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class SyntheticSpec:
    """Random lengths: input in [range_ratio * input_len, input_len], likewise output."""

    input_len: int = 128
    output_len: int = 64
    range_ratio: float = 1.0


def workload_error(path: Path, where: str, problem: str) -> SglaunchError:
    """`where` is ":LINE" (JSONL), "[INDEX]" (JSON array) or "" (the whole file)."""
    where = f"{path}{where}"
    return SglaunchError(
        f"malformed workload file {where}: {problem}",
        "a prompt file is JSONL with one object per line holding `prompt` (text or token ids) or "
        "`messages` (chat), optionally `output_len`; a ShareGPT file holds objects with "
        "`conversations` ([{\"from\": \"human\", \"value\": ...}, {\"from\": \"gpt\", ...}]); "
        "see docs/benchmarking.md")


def read_records(path: Path) -> list[tuple[str, Any]]:
    """(location, object) pairs from a JSON array file or a JSONL file."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise SglaunchError(f"cannot read workload file {path}: {exc}",
                            "check the path given to --dataset") from None
    stripped = text.lstrip()
    if not stripped:
        raise workload_error(path, "", "the file is empty")
    if stripped.startswith("["):
        try:
            records = json.loads(text)
        except json.JSONDecodeError as exc:
            raise workload_error(path, f":{exc.lineno}", f"invalid JSON ({exc.msg})") from None
        return [(f"[{index}]", record) for index, record in enumerate(records)]
    rows = []
    for number, line in enumerate(text.splitlines(), start=1):
        if line.strip():
            try:
                rows.append((f":{number}", json.loads(line)))
            except json.JSONDecodeError as exc:
                raise workload_error(path, f":{number}", f"invalid JSON ({exc.msg})") from None
    return rows


def detect_format(rows: list[tuple[str, Any]]) -> str:
    first = rows[0][1] if rows else None
    if isinstance(first, dict) and "conversations" in first:
        return "sharegpt"
    return "jsonl"


def load_workload(path: Path, fmt: str = "auto", default_output_len: int = 64,
                  count_tokens: TokenCounter | None = None) -> list[BenchRequest]:
    """Parse a prompt file or a ShareGPT file into requests (file order)."""
    rows = read_records(path)
    fmt = detect_format(rows) if fmt == "auto" else fmt
    if fmt == "sharegpt":
        requests = [r for r in (sharegpt_request(path, n, row, default_output_len, count_tokens)
                                for n, row in rows) if r is not None]
        if not requests:
            raise workload_error(path, "", "no conversation starts with a human turn followed by a reply")
        return requests
    return [prompt_request(path, number, row, default_output_len) for number, row in rows]


def prompt_request(path: Path, line: str, row: Any, default_output_len: int) -> BenchRequest:
    if not isinstance(row, dict):
        raise workload_error(path, line, f"expected a JSON object, got {type(row).__name__}")
    output_len = output_len_of(path, line, row, default_output_len)
    if "messages" in row:
        return BenchRequest(None, checked_messages(path, line, row["messages"]), output_len)
    prompt = row.get("prompt")
    if isinstance(prompt, str) and prompt:
        return BenchRequest(prompt, None, output_len)
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) and t >= 0 for t in prompt):
        return BenchRequest(list(prompt), None, output_len, input_len=len(prompt))
    if prompt is None:
        raise workload_error(path, line, "the object has neither `prompt` nor `messages`")
    raise workload_error(path, line, "`prompt` must be a non-empty string or a list of token ids")


def output_len_of(path: Path, line: str, row: dict, default: int) -> int:
    key = next((k for k in OUTPUT_LEN_KEYS if k in row), None)
    if key is None:
        return default
    value = row[key]
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise workload_error(path, line, f"`{key}` must be a positive integer, got {value!r}")
    return value


def checked_messages(path: Path, line: str, messages: Any) -> list[dict[str, Any]]:
    if not isinstance(messages, list) or not messages:
        raise workload_error(path, line, "`messages` must be a non-empty list")
    for message in messages:
        if (not isinstance(message, dict) or message.get("role") not in CHAT_ROLES
                or not isinstance(message.get("content"), str)):
            raise workload_error(path, line, "each message needs a `role` (system, user, assistant, "
                                             f"...) and string `content`; got {message!r:.80}")
    return messages


def sharegpt_request(path: Path, line: str, row: Any, default_output_len: int,
                     count_tokens: TokenCounter | None) -> BenchRequest | None:
    """The first human turn as the prompt; the reply after it sets the output length."""
    turns = row.get("conversations") if isinstance(row, dict) else None
    if not isinstance(turns, list):
        raise workload_error(path, line, "each ShareGPT entry needs a `conversations` list")
    for turn in turns:
        if not isinstance(turn, dict) or not isinstance(turn.get("value"), str):
            raise workload_error(path, line, "each turn needs `from` and a string `value`")
    if len(turns) < 2 or turns[0].get("from") not in HUMAN_ROLES or turns[1].get("from") not in MODEL_ROLES:
        return None
    prompt, reply = turns[0]["value"], turns[1]["value"]
    if not prompt.strip():
        return None
    output_len = default_output_len
    if reply.strip():
        output_len = count_tokens(reply) if count_tokens else estimate_tokens(reply)
    return BenchRequest(None, [{"role": "user", "content": prompt}], max(1, output_len))


def estimate_tokens(text: str) -> int:
    """Without a tokenizer: about four characters per token (English BPE)."""
    return max(1, math.ceil(len(text) / 4))


def synthetic_lengths(spec: SyntheticSpec, count: int, seed: int) -> list[tuple[int, int]]:
    """(input, output) lengths drawn uniformly in [range_ratio * len, len]."""
    rng = random.Random(f"lengths-{seed}")

    def draw(length: int) -> int:
        return rng.randint(max(1, int(length * spec.range_ratio)), length)

    return [(draw(spec.input_len), draw(spec.output_len)) for _ in range(count)]


def synthetic_words(count: int, index: int, seed: int) -> list[str]:
    rng = random.Random(f"words-{seed}-{index}")
    return [rng.choice(WORDS) for _ in range(count)]


def synthetic_requests(spec: SyntheticSpec, count: int, seed: int,
                       encode: Callable[[str], list[int]] | None = None,
                       tokens_per_word: float = 1.0) -> list[BenchRequest]:
    """Exact input lengths with `encode` (token ids, truncated); else text scaled by tokens_per_word."""
    requests = []
    for index, (input_len, output_len) in enumerate(synthetic_lengths(spec, count, seed)):
        if encode is not None:
            words = synthetic_words(input_len, index, seed)  # >= input_len tokens
            ids = encode(" ".join(words))[:input_len]
            requests.append(BenchRequest(ids, None, output_len, input_len=len(ids)))
        else:
            words = synthetic_words(max(1, round(input_len / tokens_per_word)), index, seed)
            requests.append(BenchRequest(" ".join(words), None, output_len))
    return requests


def sample_requests(pool: Sequence[BenchRequest], count: int, seed: int) -> list[BenchRequest]:
    """`count` requests drawn from the pool: without replacement, then reshuffled passes."""
    if not pool:
        raise SglaunchError("the workload holds no requests", "check --dataset")
    rng = random.Random(f"sample-{seed}")
    chosen: list[BenchRequest] = []
    while len(chosen) < count:
        order = list(range(len(pool)))
        rng.shuffle(order)
        chosen.extend(pool[i] for i in order[:count - len(chosen)])
    return chosen


def poisson_offsets(count: int, rate: float, seed: int) -> list[float]:
    """Arrival times (s from the level's start) of a Poisson process; all zero for rate=inf."""
    if math.isinf(rate):
        return [0.0] * count
    rng = random.Random(f"arrivals-{seed}-{rate}")
    offsets, now = [], 0.0
    for _ in range(count):
        offsets.append(now)
        now += rng.expovariate(rate)
    return offsets


def requests_digest(requests: Sequence[BenchRequest]) -> str:
    payload = json.dumps([r.to_dict() for r in requests], sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(payload.encode()).hexdigest()
