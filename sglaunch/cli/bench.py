"""`sglaunch bench`: load-test an OpenAI-compatible endpoint, or compare two configurations.

Progress goes to stderr (a live table on a terminal, one line per event otherwise); the final
tables (or `--json`) go to stdout; the JSON result file and the PNG plot are always written once
measuring has begun, partial results included. Exit codes: 0 every request succeeded, 1 requests
failed or the run stopped early (results marked partial), 2 usage error or malformed workload,
130 interrupted (Ctrl-C), 143 terminated (SIGTERM, as `timeout` or a CI job's cancel sends): either
way the servers bench started are stopped and the results so far written. httpx, rich's live
display and matplotlib are imported only when it runs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from sglaunch.cli.common import JsonOption, funnel, stderr_console, stdout_console
from sglaunch.errors import SglaunchError

EXIT_INTERRUPTED = 130
EXIT_TERMINATED = 143


class Terminated(BaseException):
    """SIGTERM while bench runs: unwinds like Ctrl-C, so the servers it started are stopped.
    NOTE: they run in sessions of their own (a Ctrl-C on the terminal must not reach them before
    bench has written its results), so nothing else stops them: a `timeout` around a bench once
    left both of its servers holding the GPU, and every bench after it failed for memory."""


def _terminate(signum, frame) -> None:
    import signal

    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # NOTE: a second SIGTERM must not cut the servers' stop short
    raise Terminated
DEFAULT_CONCURRENCY = "1,4,16"


def parse_list(text: str, option: str, kind: type) -> list:
    values = []
    for item in (part.strip() for part in text.split(",") if part.strip()):
        try:
            value = kind(item)
        except ValueError:
            value = None
        if value is None or value <= 0:
            raise SglaunchError(f"{option}: {item!r} is not a positive {'integer' if kind is int else 'number'}",
                                f"e.g. {option} {'1,4,16' if kind is int else '1,4,inf'}")
        values.append(value)
    if not values:
        raise SglaunchError(f"{option} is empty", f"e.g. {option} {'1,4,16' if kind is int else '1,4,inf'}")
    return values


def build_levels(concurrency: str | None, request_rate: str | None, max_concurrency: int | None):
    from sglaunch.bench.runner import Level

    levels = []
    if concurrency or not request_rate:
        levels += [Level("concurrency", c) for c in parse_list(concurrency or DEFAULT_CONCURRENCY,
                                                               "--concurrency", int)]
    if request_rate:
        rates = parse_list(request_rate.replace("inf", "Infinity"), "--request-rate", float)
        levels += [Level("rate", r, max_concurrency) for r in rates]
    return levels


def build_targets(url: str | None, launch: str | None, compare: list[str], labels: list[str]):
    from sglaunch.bench.launch import parse_launch_line
    from sglaunch.bench.sweep import Target

    given = [x for x in (url, launch) if x] + list(compare)
    if sum(map(bool, (url, launch, compare))) != 1 or (compare and len(compare) != 2):
        raise SglaunchError("give exactly one of --url URL, --launch LINE, or --compare twice",
                            'e.g. sglaunch bench --compare "sglaunch serve --model-path M" '
                            '--compare "SGLANG_RAGGED_VERIFY_MODE=compact sglaunch serve --model-path M '
                            '--speculative-algorithm DSPARK ..."')
    if labels and len(labels) != len(given):
        raise SglaunchError(f"{len(labels)} --label for {len(given)} configurations", "one --label each")
    labels = labels or (["A", "B"] if compare else ["server"])
    if len(set(labels)) != len(labels):
        raise SglaunchError("the --label values must differ")
    targets = []
    for label, item in zip(labels, given):
        if item == url or (compare and item.startswith(("http://", "https://"))):
            targets.append(Target(label, item.rstrip("/")))
        else:
            line = parse_launch_line(item)
            targets.append(Target(label, line.url, launch=line))
    return targets


@funnel
def bench(
    url: Annotated[Optional[str], typer.Option("--url", help="Base URL of a running server, e.g. "
                                               "http://127.0.0.1:30000.")] = None,
    launch: Annotated[Optional[str], typer.Option("--launch", help="A launch line bench starts and stops, "
                                                  'e.g. "sglaunch serve --model-path M".')] = None,
    compare: Annotated[list[str], typer.Option("--compare", help="Give twice: two URLs or launch lines "
                                               "(env prefix allowed) measured side by side.")] = [],  # noqa: B006
    labels: Annotated[list[str], typer.Option("--label", help="Name of each configuration (default A, B).")] = [],  # noqa: B006
    concurrency: Annotated[Optional[str], typer.Option(
        "--concurrency", help=f"Closed-loop levels: clients in flight (default {DEFAULT_CONCURRENCY}).")] = None,
    request_rate: Annotated[Optional[str], typer.Option(
        "--request-rate", help="Open-loop levels: Poisson arrivals per second, e.g. 1,4,inf.")] = None,
    max_concurrency: Annotated[Optional[int], typer.Option(
        "--max-concurrency", min=1, help="Cap on requests in flight for --request-rate levels.")] = None,
    num_prompts: Annotated[int, typer.Option("--num-prompts", min=1, help="Requests per level.")] = 32,
    rounds: Annotated[int, typer.Option("--rounds", min=1, help="Run every level this many times, the "
                                        "configurations' order alternating; with --compare each ratio is "
                                        "the median of the rounds' ratios.")] = 1,
    restart_servers: Annotated[bool, typer.Option(
        "--restart-servers", help="With --rounds and launch lines: stop and start the servers before each round "
        "after the first (and warm them up again), so the rounds measure different server processes; on a "
        "shared GPU host one process pair's ratio can sit 10% off the next one's.")] = False,
    flush_cache: Annotated[bool, typer.Option(
        "--flush-cache", help="POST /flush_cache to every server before each level (after the warm-up, in every "
        "round), so that no level finds the prompts of the ones before it in the server's prefix cache: every level "
        "runs uncached. Needs a server with /flush_cache (ours, SGLang); unlike --restart-servers it keeps the "
        "server processes and works with URLs.")] = False,
    warmup: Annotated[int, typer.Option("--warmup", min=0, help="Warm-up requests per configuration.")] = 2,
    seed: Annotated[int, typer.Option("--seed", help="Seed of request sampling, lengths and arrivals.")] = 0,
    dataset: Annotated[Optional[Path], typer.Option(
        "--dataset", help="JSONL prompt file or ShareGPT file; synthetic prompts without it.")] = None,
    dataset_format: Annotated[str, typer.Option("--dataset-format", help="auto, jsonl or sharegpt.")] = "auto",
    input_len: Annotated[int, typer.Option("--input-len", min=1, help="Synthetic prompt tokens (max).")] = 128,
    output_len: Annotated[int, typer.Option("--output-len", min=1, help="Output tokens (max) for synthetic "
                                            "requests and file entries without a length.")] = 64,
    range_ratio: Annotated[float, typer.Option("--range-ratio", min=0.0, max=1.0, help="Synthetic lengths "
                                               "drawn in [ratio * len, len].")] = 1.0,
    tokenizer: Annotated[Optional[Path], typer.Option(
        "--tokenizer", help="Local tokenizer (folder with tokenizer.json) for exact token counts.")] = None,
    model: Annotated[Optional[str], typer.Option("--model", help="Model name to send (default: the "
                                                 "first of /v1/models).")] = None,
    api_key: Annotated[Optional[str], typer.Option("--api-key", envvar="SGLAUNCH_BENCH_API_KEY",
                                                   help="Bearer token for the server(s).")] = None,
    temperature: Annotated[float, typer.Option("--temperature", min=0.0)] = 0.0,
    top_p: Annotated[Optional[float], typer.Option(
        "--top-p", min=0.0, max=1.0, help="Nucleus sampling (top_p) sent with every request (default: not sent).")] = None,
    ignore_eos: Annotated[bool, typer.Option("--ignore-eos/--no-ignore-eos", help="Ask for exactly "
                                             "the output length (SGLang/vLLM extension).")] = True,
    timeout: Annotated[float, typer.Option("--timeout", min=0.1, help="Seconds per request.")] = 300.0,
    launch_timeout: Annotated[float, typer.Option("--launch-timeout", min=1.0, help="Seconds a launched "
                                                  "server may take to become healthy.")] = 600.0,
    output: Annotated[Path, typer.Option("--output", "-o", help="JSON result file.")] = Path("sglaunch-bench.json"),
    plot: Annotated[Optional[Path], typer.Option("--plot", help="PNG plot (default: the --output path "
                                                 "with .png).")] = None,
    no_plot: Annotated[bool, typer.Option("--no-plot", help="Write no PNG.")] = False,
    as_json: JsonOption = False,
) -> None:
    """Measure throughput and latency per concurrency level or request rate; compare two configurations."""
    from sglaunch.bench.sweep import BenchRun, BenchSpec
    from sglaunch.bench.workload import SyntheticSpec

    if dataset_format not in ("auto", "jsonl", "sharegpt"):
        raise SglaunchError(f"--dataset-format {dataset_format!r} is not one of auto, jsonl, sharegpt")
    targets = build_targets(url, launch, compare, labels)
    if restart_servers and (rounds < 2 or any(t.launch is None for t in targets)):
        raise SglaunchError("--restart-servers restarts launched servers between rounds: it needs --rounds 2 or "
                            "more and launch lines, not URLs",
                            'e.g. sglaunch bench --compare "sglaunch serve --model-path M" --compare "..." '
                            "--rounds 3 --restart-servers")
    spec = BenchSpec(
        targets=targets,
        levels=build_levels(concurrency, request_rate, max_concurrency), num_prompts=num_prompts,
        warmup=warmup, seed=seed, dataset=dataset, dataset_format=dataset_format,
        synthetic=SyntheticSpec(input_len, output_len, range_ratio), tokenizer=tokenizer, model=model,
        api_key=api_key, temperature=temperature, top_p=top_p, ignore_eos=ignore_eos, timeout=timeout,
        launch_timeout=launch_timeout, rounds=rounds, restart_servers=restart_servers, flush_cache=flush_cache)
    plot_path = None if no_plot else (plot or output.with_suffix(".png"))
    execute(BenchRun(spec), output, plot_path, as_json)


def execute(run, output: Path, plot_path: Path | None, as_json: bool) -> None:
    """Run, then always stop the servers; write the files once measuring has begun; exit code last."""
    import asyncio
    import contextlib

    import signal
    import threading

    from rich.live import Live

    from sglaunch.bench import sweep
    from sglaunch.bench.report import LiveView

    console = stderr_console()
    view = LiveView(console)
    failure, status, measuring = None, "ok", False
    # NOTE: the process's handler is put back afterwards (tests run bench inside pytest's process)
    previous = signal.signal(signal.SIGTERM, _terminate) if threading.current_thread() is threading.main_thread() else None
    try:
        sweep.start_servers(run, output.parent)
        for target in run.spec.targets:
            sweep.preflight(run, target)
        requests = sweep.build_requests(run)
        measuring = True
        live = Live(view, console=console, transient=True, refresh_per_second=4) \
            if console.is_terminal else contextlib.nullcontext()
        with live:
            asyncio.run(sweep.sweep(run, requests, view))
    except SglaunchError as exc:
        failure, status = exc, "aborted"
    except KeyboardInterrupt:
        status = "interrupted"
    except Terminated:
        status = "terminated"
    finally:
        sweep.stop_servers(run.spec.targets)
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    if not measuring:
        if failure:
            raise failure
        raise typer.Exit(EXIT_TERMINATED if status == "terminated" else EXIT_INTERRUPTED)
    finish(run, status, failure)
    publish(run.doc, output, plot_path, as_json)
    raise_outcome(run.doc, failure, output)


def finish(run, status: str, failure: SglaunchError | None) -> None:
    failed = sum(lv.get("errors", 0) for c in run.doc["configs"] for lv in c["levels"])
    if status == "ok" and failed:
        status = "errors"
    message = failure.message if failure else (f"{failed} requests failed" if failed else None)
    stopped = {"interrupted": "interrupted by the user", "terminated": "terminated (SIGTERM)"}
    run.finish(status, stopped.get(status, message))


def publish(doc: dict, output: Path, plot_path: Path | None, as_json: bool) -> None:
    import json

    from sglaunch.bench.report import final_tables, write_json

    write_json(doc, output)
    if plot_path is not None:
        try:
            from sglaunch.bench.plot import write_plot

            write_plot(doc, plot_path)
            doc_files = f"{output} and {plot_path}"
        except ImportError:
            stderr_console().print("Warning: matplotlib is not installed; no plot written "
                                   "(pip install matplotlib)", markup=False)
            doc_files = str(output)
    else:
        doc_files = str(output)
    if as_json:
        print(json.dumps(doc, indent=2))
    else:
        console = stdout_console()
        if not console.is_terminal:
            console.width = 160  # logs and pipes: room for every column
        for table in final_tables(doc):
            console.print(table)
    stderr_console().print(f"Results written to {doc_files}", markup=False)


def raise_outcome(doc: dict, failure: SglaunchError | None, output: Path) -> None:
    if failure:
        hint = "; ".join(h for h in (failure.hint, f"partial results in {output}") if h)
        raise SglaunchError(failure.message, hint, failure.exit_code)
    if doc["status"] == "interrupted":
        raise typer.Exit(EXIT_INTERRUPTED)
    if doc["status"] == "terminated":
        raise typer.Exit(EXIT_TERMINATED)
    if doc["status"] == "errors":
        total = sum(lv.get("num_requests", 0) for c in doc["configs"] for lv in c["levels"])
        samples = {msg for c in doc["configs"] for lv in c["levels"] for msg in lv.get("error_samples", {})}
        raise SglaunchError(f"{doc['message']} of {total} (e.g. {sorted(samples)[0]})",
                            f"levels with errors are marked in {output}; check the server log", 1)

