"""The orchestrator: start servers, build the requests once, warm up, then run every level against
every configuration, interleaved (level i runs A then B, level i+1 runs B then A) so machine drift
hits both alike; --rounds N runs the whole sequence N times, the order flipped each round, and a
ratio is then the median of the rounds' ratios (a shared GPU host's throughput moved 15% between
two runs minutes apart in session 24); --restart-servers also stops and starts the launched servers
before each later round, so the rounds measure different server processes (DSpark / plain at 32
sampled requests read anywhere from 0.90 to 1.10 from one pair of processes to the next, session
41). With --flush-cache every server is asked to empty its prefix cache (POST /flush_cache) before
each level, so no level finds the prompts of the levels before it (or of the warm-up) cached.
Results accumulate in `BenchRun.doc`, so a failure still leaves partial results."""

from __future__ import annotations

import asyncio
import datetime as dt
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import sglaunch
from sglaunch.bench import stats
from sglaunch.bench.client import RequestResult, SamplingSettings, error_message
from sglaunch.bench.launch import LaunchedServer, LaunchLine, local_tokenizer_dir
from sglaunch.bench.runner import Level, run_level, warm_up
from sglaunch.bench.workload import (BenchRequest, SyntheticSpec, load_workload, requests_digest,
                                     sample_requests, synthetic_requests, synthetic_words)
from sglaunch.errors import SglaunchError

SCHEMA = "sglaunch-bench/1"
EXIT_FAILED = 1
CALIBRATION_WORDS = 32
DEFAULT_TOKENS_PER_WORD = 1.3
# --flush-cache: a server busy with requests (answer 400) is asked this many times, this far apart
FLUSH_ATTEMPTS = 10
FLUSH_RETRY_S = 0.5
RATIO_KEYS = {"request_throughput": None, "output_token_throughput": None,
              "ttft_ms": "p50", "itl_ms": "p50", "tpot_ms": "p50", "e2e_ms": "p50"}


@dataclass
class Target:
    """One configuration: an URL, or a launch line whose server bench runs."""

    label: str
    url: str
    launch: LaunchLine | None = None
    server: LaunchedServer | None = None
    model: str | None = None


@dataclass
class BenchSpec:
    targets: list[Target]
    levels: list[Level]
    num_prompts: int = 32
    warmup: int = 2
    seed: int = 0
    dataset: Path | None = None
    dataset_format: str = "auto"
    synthetic: SyntheticSpec = field(default_factory=SyntheticSpec)
    tokenizer: Path | None = None
    model: str | None = None
    api_key: str | None = None
    temperature: float = 0.0
    top_p: float | None = None
    ignore_eos: bool = True
    timeout: float = 300.0
    launch_timeout: float = 600.0
    rounds: int = 1  # every level this many times (--rounds)
    restart_servers: bool = False  # the launched servers stopped and started again before each later round
    flush_cache: bool = False  # POST /flush_cache to every server before each level (--flush-cache)


class Progress(Protocol):
    def level_started(self, label: str, level: Level, total: int) -> None: ...
    def request_done(self, label: str, level: Level, result: RequestResult) -> None: ...
    def level_finished(self, label: str, level: Level, record: dict) -> None: ...
    def note(self, message: str) -> None: ...


class BenchRun:
    """Holds the JSON document while the run fills it in."""

    def __init__(self, spec: BenchSpec):
        self.spec = spec
        self.doc: dict[str, Any] = new_document(spec)
        self.log_dir: Path | None = None  # where the launched servers' logs go (start_servers)

    def config(self, label: str) -> dict:
        return next(c for c in self.doc["configs"] if c["label"] == label)

    def finish(self, status: str, message: str | None = None) -> None:
        self.doc["status"] = status
        self.doc["partial"] = status != "ok"
        self.doc["message"] = message
        self.doc["finished"] = now_iso()
        self.doc["comparison"] = comparison(self.doc["configs"])


def now_iso() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def new_document(spec: BenchSpec) -> dict[str, Any]:
    return {
        "schema": SCHEMA, "sglaunch_version": sglaunch.__version__, "started": now_iso(),
        "finished": None, "status": "running", "partial": True, "message": None,
        "settings": {
            "seed": spec.seed, "num_prompts": spec.num_prompts, "warmup": spec.warmup, "rounds": spec.rounds,
            "restart_servers": spec.restart_servers, "flush_cache": spec.flush_cache,
            "levels": [{"kind": lv.kind, "value": lv.json_value(), "max_concurrency": lv.max_concurrency}
                       for lv in spec.levels],
            "temperature": spec.temperature, "top_p": spec.top_p, "ignore_eos": spec.ignore_eos,
            "timeout_s": spec.timeout,
            "workload": workload_settings(spec),
        },
        "requests": None,
        "configs": [{"label": t.label, "url": t.url, "launch": t.launch.text if t.launch else None,
                     "log": None, "model": None, "levels": []} for t in spec.targets],
        "comparison": None,
    }


def workload_settings(spec: BenchSpec) -> dict[str, Any]:
    if spec.dataset:
        return {"kind": "file", "path": str(spec.dataset), "format": spec.dataset_format,
                "default_output_len": spec.synthetic.output_len}
    s = spec.synthetic
    return {"kind": "synthetic", "input_len": s.input_len, "output_len": s.output_len,
            "range_ratio": s.range_ratio}


# ---- the synchronous part: servers, preflight, requests ---------------------------------------

def start_servers(run: BenchRun, log_dir: Path, round_: int = 1) -> None:
    """Start the launch-line servers one after another, each healthy before the next starts; each
    logs to bench-server-LABEL.log (bench-server-LABEL-roundN.log when restarted for round N).

    NOTE: not all at once: what a server measures while it starts (DSpark's compact mode times
    the machine's step costs at start-up) must not share the machine with another server's
    loading. Started together on a 2-core CPU, a start-up profile read 1.3 s for a 20 ms step.
    """
    run.log_dir, started = log_dir, 0
    for target in run.spec.targets:
        if target.launch:
            suffix = "" if round_ == 1 else f"-round{round_}"
            target.server = LaunchedServer(target.launch, log_dir / f"bench-server-{target.label}{suffix}.log")
            run.config(target.label)["log"] = str(target.server.log_path)
            target.server.start()
            target.server.wait_ready(run.spec.launch_timeout, beside=started)
            started += 1


def restart_servers(run: BenchRun, round_: int) -> None:
    """Stop every launched server, then start them again for round `round_` (--restart-servers)."""
    stop_servers(run.spec.targets)
    start_servers(run, run.log_dir, round_)


def stop_servers(targets: list[Target]) -> None:
    """Ask every server to stop at once, then wait for each (a SIGKILL after STOP_TIMEOUT_S): one
    wait for all, not one per server, since whoever stops bench may not wait long."""
    servers = [t.server for t in targets if t.server]
    for server in servers:
        server.interrupt()
    for server in servers:
        server.stop()


def headers(spec: BenchSpec) -> dict[str, str]:
    return {"Authorization": f"Bearer {spec.api_key}"} if spec.api_key else {}


def preflight(run: BenchRun, target: Target) -> None:
    """Reach the server and learn the model name; a clear error when it cannot be reached."""
    import httpx

    try:
        response = httpx.get(f"{target.url}/v1/models", headers=headers(run.spec), timeout=10)
    except httpx.HTTPError as exc:
        raise SglaunchError(f"cannot reach {target.url} ({type(exc).__name__}: {exc})",
                            "start the server first (sglaunch serve --model-path ...), check the URL "
                            "and port, or give a launch line to --launch/--compare", EXIT_FAILED) from None
    if response.status_code == 401:
        raise SglaunchError(f"{target.url} refused the request (401)", "pass the key with --api-key",
                            EXIT_FAILED)
    models = []
    if response.status_code == 200:
        try:
            models = [m["id"] for m in response.json().get("data", [])]
        except (ValueError, KeyError, TypeError, AttributeError):
            models = []
    target.model = run.spec.model or (models[0] if models else None)
    if target.model is None:
        raise SglaunchError(f"{target.url}/v1/models answered {response.status_code} without a model",
                            "name the model with --model", EXIT_FAILED)
    run.config(target.label)["model"] = target.model


def tokenizer_encoder(path: Path):
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise SglaunchError("--tokenizer needs the `tokenizers` package",
                            "pip install tokenizers (or sglaunch[engine])") from None
    file = path / "tokenizer.json" if path.is_dir() else path
    try:
        tokenizer = Tokenizer.from_file(str(file))
    except Exception as exc:  # noqa: BLE001 - tokenizers raises its own Exception type
        raise SglaunchError(f"cannot load tokenizer {file}: {exc}",
                            "--tokenizer takes a folder with tokenizer.json or the file itself") from None
    return lambda text: tokenizer.encode(text, add_special_tokens=False).ids


def server_encoder(run: BenchRun, target: Target):
    """The server's /tokenize (SGLang and vLLM have it; ours does not), or None."""
    import httpx

    def encode(text: str) -> list[int]:
        response = httpx.post(f"{target.url}/tokenize", headers=headers(run.spec), timeout=30,
                              json={"model": target.model, "prompt": text, "add_special_tokens": False})
        response.raise_for_status()
        return [int(t) for t in response.json()["tokens"]]

    try:
        encode("hello world")
    except (httpx.HTTPError, ValueError, KeyError, TypeError):
        return None
    return encode


def calibrate_tokens_per_word(run: BenchRun, target: Target) -> float | None:
    """Prompt tokens per synthetic word, from one request's `usage.prompt_tokens`."""
    import httpx

    text = " ".join(synthetic_words(CALIBRATION_WORDS, -1, run.spec.seed))
    try:
        response = httpx.post(f"{target.url}/v1/completions", headers=headers(run.spec), timeout=60,
                              json={"model": target.model, "prompt": text, "max_tokens": 1})
        return response.json()["usage"]["prompt_tokens"] / CALIBRATION_WORDS
    except (httpx.HTTPError, ValueError, KeyError, TypeError, ZeroDivisionError):
        return None


def choose_tokenizer(run: BenchRun) -> Path | None:
    if run.spec.tokenizer:
        return run.spec.tokenizer
    for target in run.spec.targets:
        folder = local_tokenizer_dir(target.launch) if target.launch else None
        if folder:
            return folder
    return None


def build_requests(run: BenchRun) -> list[BenchRequest]:
    """The request list every level and configuration sends (same seed + workload -> same list)."""
    spec, first = run.spec, run.spec.targets[0]
    folder = choose_tokenizer(run)
    encode, accuracy = None, None
    if folder is not None:
        encode, accuracy = tokenizer_encoder(folder), f"exact (local tokenizer {folder})"
    if spec.dataset:
        count = (lambda text: len(encode(text))) if encode else None
        pool = load_workload(spec.dataset, spec.dataset_format, spec.synthetic.output_len, count)
        accuracy = "as given; prompt tokens counted from the responses' usage"
    else:
        pool, accuracy = synthetic_pool(run, first, encode, accuracy)
    requests = sample_requests(pool, spec.num_prompts, spec.seed)
    run.doc["requests"] = {
        "count": len(requests), "sha256": requests_digest(requests), "token_accuracy": accuracy,
        "planned_output_tokens_mean": sum(r.output_len for r in requests) / len(requests),
        "planned_input_tokens_mean": mean_or_none([r.input_len for r in requests]),
    }
    return requests


def synthetic_pool(run: BenchRun, target: Target, encode, accuracy):
    spec = run.spec
    if encode is None:
        encode = server_encoder(run, target)
        accuracy = "exact (server /tokenize)" if encode else None
    if encode is not None:
        return synthetic_requests(spec.synthetic, spec.num_prompts, spec.seed, encode=encode), accuracy
    ratio = calibrate_tokens_per_word(run, target)
    note = f"calibrated {ratio:.3f} tokens/word from usage" if ratio else \
        f"assumed {DEFAULT_TOKENS_PER_WORD} tokens/word (calibration failed)"
    return (synthetic_requests(spec.synthetic, spec.num_prompts, spec.seed,
                               tokens_per_word=ratio or DEFAULT_TOKENS_PER_WORD),
            f"approximate ({note}); actual prompt tokens counted from the responses' usage")


def mean_or_none(values: list[int | None]) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) / len(known) if known and len(known) == len(values) else None


# ---- the asynchronous part: warm-up and levels ------------------------------------------------

async def sweep(run: BenchRun, requests: list[BenchRequest], ui: Progress) -> None:
    """Warm up each configuration, then every level, interleaved; stops early when a server is gone."""
    import httpx

    spec = run.spec
    most = max((int(lv.value) if lv.kind == "concurrency" else lv.max_concurrency or len(requests))
               for lv in spec.levels)
    limits = httpx.Limits(max_connections=most + 8, max_keepalive_connections=most + 8)
    timeout = httpx.Timeout(spec.timeout, connect=10)
    def new_clients() -> dict:
        return {t.label: httpx.AsyncClient(base_url=t.url, headers=headers(spec), timeout=timeout, limits=limits)
                for t in spec.targets}

    clients = new_clients()
    try:
        for target in spec.targets:
            await warm_target(run, target, clients[target.label], requests, ui)
        order = 0
        for round_ in range(1, spec.rounds + 1):
            if round_ > 1 and spec.restart_servers:
                # NOTE: fresh server processes for this round (a process's throughput can sit 10% off
                # the next one's on a shared host); the old connections die with them
                await asyncio.gather(*(c.aclose() for c in clients.values()))
                ui.note(f"round {round_}: restarting the servers")
                await asyncio.to_thread(restart_servers, run, round_)
                clients = new_clients()
                for target in spec.targets:
                    await warm_target(run, target, clients[target.label], requests, ui)
            for index, level in enumerate(spec.levels):
                # NOTE: A B at level 0 of round 1, then flipped at each level and each round
                for target in (spec.targets if (index + round_ - 1) % 2 == 0 else spec.targets[::-1]):
                    order += 1
                    if spec.flush_cache:
                        try:
                            await flush_cache(target, clients[target.label])
                        except SglaunchError:
                            mark_skipped(run, round_, index)
                            raise
                    record = await measure(run, target, clients[target.label], requests, level, ui, round_)
                    record["run_order"] = order
                    reason = await gone_reason(target, clients[target.label], record)
                    if reason:
                        record["status"] = "aborted"
                        mark_skipped(run, round_, index)
                        raise SglaunchError(reason, "see the server log; the results so far are in the "
                                                    "JSON file, marked partial", EXIT_FAILED)
    finally:
        await asyncio.gather(*(c.aclose() for c in clients.values()))


async def flush_cache(target: Target, client) -> None:
    """--flush-cache: empty the server's prefix cache before a level (POST /flush_cache, SGLang's
    route). A server busy with requests answers 400 (it flushes only when idle): asked again up to
    FLUSH_ATTEMPTS times, FLUSH_RETRY_S apart. SglaunchError when it has no such route (404, 405),
    stays busy, or fails otherwise."""
    import httpx

    url, detail = f"{target.url}/flush_cache", ""
    for attempt in range(1, FLUSH_ATTEMPTS + 1):
        try:
            response = await client.post("/flush_cache", timeout=30)
        except httpx.HTTPError as exc:
            raise SglaunchError(f"--flush-cache: cannot reach {url} ({type(exc).__name__}: {exc})",
                                "check that the server still runs; see its log", EXIT_FAILED) from None
        status = response.status_code
        if status == 200:
            return
        detail = error_message(status, response.content)
        if status in (404, 405):
            raise SglaunchError(f"--flush-cache: {url} answered {status}: the server has no /flush_cache, so "
                                "its prefix cache cannot be emptied between levels",
                                "drop --flush-cache, or measure fresh server processes instead with launch lines, "
                                "--rounds N and --restart-servers", EXIT_FAILED)
        if status == 401:
            raise SglaunchError(f"--flush-cache: {url} refused the request (401)", "pass the key with --api-key",
                                EXIT_FAILED)
        if status != 400:
            raise SglaunchError(f"--flush-cache: {url} failed ({detail})", "see the server log", EXIT_FAILED)
        if attempt < FLUSH_ATTEMPTS:
            await asyncio.sleep(FLUSH_RETRY_S)
    raise SglaunchError(f"--flush-cache: {url} still refused to flush after {FLUSH_ATTEMPTS} tries over "
                        f"{(FLUSH_ATTEMPTS - 1) * FLUSH_RETRY_S:g} s ({detail})",
                        "the server flushes only while no request runs or waits: is another client "
                        "sending it requests? Measure it alone, or drop --flush-cache", EXIT_FAILED)


def settings_for(run: BenchRun, target: Target) -> SamplingSettings:
    return SamplingSettings(model=target.model, temperature=run.spec.temperature, top_p=run.spec.top_p,
                            ignore_eos=run.spec.ignore_eos)


async def warm_target(run: BenchRun, target: Target, client, requests, ui: Progress) -> None:
    if run.spec.warmup <= 0:
        return
    ui.note(f"{target.label}: warm-up ({run.spec.warmup} requests)")
    results = await warm_up(client, requests, run.spec.warmup, settings_for(run, target))
    if not any(r.ok for r in results):
        raise SglaunchError(f"every warm-up request to {target.label} ({target.url}) failed: "
                            f"{results[0].error}",
                            "check the model name (--model), the workload lengths against the "
                            "context length, and the server log", EXIT_FAILED)


async def measure(run: BenchRun, target: Target, client, requests, level: Level, ui: Progress,
                  round_: int = 1) -> dict:
    ui.level_started(target.label, level, len(requests))
    before = await stats.snapshot(client)
    results, duration = await run_level(client, requests, level, settings_for(run, target), run.spec.seed,
                                        lambda r: ui.request_done(target.label, level, r))
    after = await stats.snapshot(client)
    record = {"kind": level.kind, "value": level.json_value(),
              "label": round_label(level.label, round_, run.spec.rounds), "round": round_,
              "server_run": round_ if run.spec.restart_servers else 1,
              **stats.summarize_level(results, duration), **stats.spec_stats(before, after)}
    record["status"] = "ok" if record["errors"] == 0 else "errors"
    run.config(target.label)["levels"].append(record)
    ui.level_finished(target.label, level, record)
    return record


async def gone_reason(target: Target, client, record: dict) -> str | None:
    """Why the run cannot go on (server exited or unreachable), or None."""
    import httpx

    if target.server and not target.server.alive():
        return (f"the server of {target.label} exited with {target.server.process.returncode} during "
                f"{record['label']}; log: {target.server.log_path}")
    if record["errors"] == 0:
        return None
    try:
        await client.get("/v1/models", timeout=5)
    except httpx.HTTPError as exc:
        return f"{target.label} ({target.url}) stopped answering during {record['label']}: {exc!r}"
    return None


def round_label(label: str, round_: int, rounds: int) -> str:
    return label if rounds == 1 else f"{label} #{round_}"


def mark_skipped(run: BenchRun, round_: int, level_index: int) -> None:
    """Record the levels that will not run (this round's from level_index on, then every later
    round's), so the JSON shows what is missing."""
    spec = run.spec
    for config in run.doc["configs"]:
        done = {(lv["kind"], lv["value"], lv.get("round", 1)) for lv in config["levels"]}
        for r in range(round_, spec.rounds + 1):
            for level in spec.levels[level_index if r == round_ else 0:]:
                if (level.kind, level.json_value(), r) not in done:
                    config["levels"].append({"kind": level.kind, "value": level.json_value(), "round": r,
                                             "label": round_label(level.label, r, spec.rounds),
                                             "status": "skipped"})


def comparison(configs: list[dict]) -> list[dict] | None:
    """B / A for throughput and p50 latencies at each level both configurations finished: per round
    (the two runs of a level in the same round), then the median over the rounds; `rounds` lists each
    round's output-token-throughput ratio."""
    if len(configs) != 2:
        return None
    base, other = configs
    rows, seen = [], set()
    for first in base["levels"]:
        key_ = (first["kind"], first["value"])
        if key_ in seen:
            continue
        seen.add(key_)
        pairs = []
        for a in base["levels"]:
            if (a["kind"], a["value"]) != key_ or "completed" not in a:
                continue
            b = next((lv for lv in other["levels"] if (lv["kind"], lv["value"]) == key_
                      and lv.get("round", 1) == a.get("round", 1)), None)
            if b is not None and "completed" in b:
                pairs.append((a, b))
        if not pairs:
            continue
        per_round = {key: [ratio(pick(b, key, sub), pick(a, key, sub)) for a, b in pairs]
                     for key, sub in RATIO_KEYS.items()}
        ratios = {key: median_or_none(values) for key, values in per_round.items()}
        label = first["label"].split(" #")[0]
        rows.append({"kind": first["kind"], "value": first["value"], "label": label,
                     "ratio": f"{other['label']}/{base['label']}", **ratios,
                     "rounds": per_round["output_token_throughput"]})
    return rows


def median_or_none(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def pick(record: dict, key: str, sub: str | None) -> float | None:
    value = record.get(key)
    return value.get(sub) if sub and isinstance(value, dict) else value


def ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b == 0 or math.isnan(b):
        return None
    return a / b
