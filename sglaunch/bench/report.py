"""What people and machines see: a live rich table while it runs, the final tables, the JSON file."""

from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any

from sglaunch.bench.client import RequestResult
from sglaunch.bench.runner import Level
from sglaunch.bench.stats import distribution_ms

COLUMNS = ("config", "level", "progress", "errors", "req/s", "out tok/s", "TTFT p50", "ITL p50",
           "TPOT p50", "E2E p50", "accept", "verify/step")
KINDS_COLUMN = "aside/burst/drafted %"  # the final table's, when a server reported DSpark step kinds
CACHED_COLUMN = "cached in %"  # the final table's, when a server reported prompt tokens served from its prefix cache


def fmt(value: float | None, digits: int = 1) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    return f"{value:,.{digits}f}"


def record_cells(record: dict, kinds: bool = False, cached: bool = False) -> list[str]:
    """The metric cells of a finished level record (and its step kinds' cell when `kinds`, its cached
    share's when `cached`)."""
    if record.get("status") == "skipped":
        return ["-"] * (9 + kinds + cached)
    return [str(record["errors"]), fmt(record["request_throughput"], 2),
            fmt(record["output_token_throughput"]), fmt(record["ttft_ms"]["p50"]),
            fmt(record["itl_ms"]["p50"]), fmt(record["tpot_ms"]["p50"]), fmt(record["e2e_ms"]["p50"]),
            fmt(record["accept_length"], 2), fmt(record["verify_tokens_per_step"], 2)] + (
            [kinds_cell(record.get("step_kinds"))] if kinds else []) + ([cached_cell(record)] if cached else [])


def cached_cell(record: dict) -> str:
    """The share of a level's prompt tokens its server answered from the prefix cache, in whole
    percent (--flush-cache levels start from an empty cache); n/a where either count is missing."""
    cached, prompt = record.get("total_cached_tokens"), record.get("total_input_tokens")
    if cached is None or not prompt:
        return "n/a"
    return f"{100 * cached / prompt:.0f}"


def kinds_cell(kinds: dict | None) -> str:
    """A DSpark level's step kinds as whole percentages, "aside/burst/drafted"; n/a without them."""
    if not kinds:
        return "n/a"
    return "/".join(f"{100 * kinds[k]:.0f}" for k in ("aside", "burst", "drafted"))


class LiveView:
    """Rows per (config, level): progress while running, metrics when done. Renders via __rich__."""

    def __init__(self, console):
        self.console = console
        self.rows: dict[tuple[str, str], dict[str, Any]] = {}
        self.notes: list[str] = []

    def level_started(self, label: str, level: Level, total: int) -> None:
        self.rows[(label, level.label)] = {"total": total, "results": [], "record": None}
        self.plain(f"{label} {level.label}: running {total} requests")

    def request_done(self, label: str, level: Level, result: RequestResult) -> None:
        self.rows[(label, level.label)]["results"].append(result)

    def level_finished(self, label: str, level: Level, record: dict) -> None:
        self.rows[(label, level.label)]["record"] = record
        self.plain(f"{label} {level.label}: {record['completed']} ok, {record['errors']} errors, "
                   f"{fmt(record['output_token_throughput'])} out tok/s")

    def note(self, message: str) -> None:
        self.notes = (self.notes + [message])[-3:]
        self.plain(message)

    def plain(self, message: str) -> None:
        """Without a terminal the live table does not render; one line per event instead."""
        if not self.console.is_terminal:
            self.console.print(message, markup=False)

    def __rich__(self):
        from rich.console import Group
        from rich.table import Table

        table = Table(title="sglaunch bench", title_justify="left")
        for column in COLUMNS:
            table.add_column(column, justify="left" if column in ("config", "level") else "right")
        for (label, level), row in self.rows.items():
            done = len(row["results"])
            progress = f"{done}/{row['total']}"
            if row["record"] is not None:
                table.add_row(label, level, progress, *record_cells(row["record"]))
            else:
                errors = sum(not r.ok for r in row["results"])
                ttft = distribution_ms(r.ttft for r in row["results"] if r.ok)["p50"]
                table.add_row(label, level, f"[cyan]{progress}[/]", str(errors), "", "", fmt(ttft),
                              *[""] * 5)
        return Group(table, *self.notes[-1:])


def final_tables(doc: dict):
    """One table of every level and, for --compare, one of the ratios."""
    from rich.table import Table

    status = doc["status"] + (" (partial results)" if doc["partial"] else "")
    table = Table(title=f"sglaunch bench: {status}", title_justify="left")
    kinds = any(record.get("step_kinds") for config in doc["configs"] for record in config["levels"])
    cached = any(record.get("total_cached_tokens") is not None for config in doc["configs"]
                 for record in config["levels"])
    for column in COLUMNS + ((KINDS_COLUMN,) if kinds else ()) + ((CACHED_COLUMN,) if cached else ()):
        if column != "progress":
            table.add_column(column, justify="left" if column in ("config", "level") else "right")
    for config in doc["configs"]:
        for record in config["levels"]:
            level = record["label"] + ("" if record.get("status") in ("ok", None) else f" [{record['status']}]")
            table.add_row(config["label"], level, *record_cells(record, kinds, cached))
    tables = [table]
    if doc.get("comparison"):
        ratios = Table(title=f"ratios {doc['comparison'][0]['ratio']}", title_justify="left",
                       caption="throughput: above 1 is better; latency: below 1 is better",
                       caption_justify="left")
        several = any(len(row.get("rounds") or ()) > 1 for row in doc["comparison"])
        if several:
            ratios.caption += "; the median of the rounds (out tok/s of each round at the right)"
        for column in ("level", "req/s", "out tok/s", "TTFT p50", "ITL p50", "TPOT p50", "E2E p50") + (
                ("rounds",) if several else ()):
            ratios.add_column(column, justify="left" if column == "level" else "right")
        for row in doc["comparison"]:
            cells = [fmt(row[k], 3) for k in (
                "request_throughput", "output_token_throughput", "ttft_ms", "itl_ms", "tpot_ms", "e2e_ms")]
            if several:
                cells.append(" ".join(fmt(v, 3) for v in row.get("rounds") or ()))
            ratios.add_row(row["label"], *cells)
        tables.append(ratios)
    return tables


def write_json(doc: dict, path: Path) -> None:
    """Atomic write (temp file + rename), so a crash never leaves half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    with os.fdopen(fd, "w") as handle:
        json.dump(doc, handle, indent=2)
        handle.write("\n")
    os.replace(tmp, path)
