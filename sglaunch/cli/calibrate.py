"""`sglaunch fit-sts`: fit DSpark's per-slot confidence temperatures (STS) on recorded blocks.

Input: a JSONL or NPZ file of recorded drafted blocks (raw confidence logits + how many drafts
were accepted and verified; format in sglaunch/speculative/sts.py and docs/dspark.md). Output:
the JSON file `--speculative-dspark-confidence-sts-path` reads. Torch-free (numpy).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer

from sglaunch.cli.common import JsonOption, funnel, stderr_console
from sglaunch.errors import SglaunchError


@funnel
def fit_sts(
    records: Annotated[Path, typer.Argument(help="Recorded blocks: .jsonl (one block per line) or .npz.")],
    output: Annotated[Path, typer.Option("--output", "-o", help="Where to write the STS JSON.")] = Path("sts.json"),
    block_size: Annotated[Optional[int], typer.Option(help="Refuse records whose block size differs.")] = None,
    bins: Annotated[int, typer.Option(help="Equal-width bins of the calibration error.")] = 15,
    as_json: JsonOption = False,
) -> None:
    """Fit per-slot temperatures left to right, minimising the ECE of prefix survival."""
    from sglaunch.speculative import sts

    try:
        logits, accepted, verified = sts.load_records(records)
    except ValueError as exc:
        raise SglaunchError(str(exc), "record blocks as {\"confidence_logits\": [...], \"accepted\": n, "
                            "\"verified\": L} per line (see docs/dspark.md)") from None
    if block_size is not None and logits.shape[1] != block_size:
        raise SglaunchError(f"{records} holds blocks of {logits.shape[1]} slots, not --block-size {block_size}",
                            "record with the drafter you are calibrating")
    fit = sts.fit_sts(logits, accepted, verified, bins=bins)
    sts.save_sts(fit, output)
    summary = {"output": str(output), **fit.to_json()}
    if as_json:
        print(json.dumps(summary))
        return
    console = stderr_console()
    for j, (t, before, after) in enumerate(zip(fit.temperatures, fit.ece_before, fit.ece_after)):
        console.print(f"slot {j}: T = {t:.3f}  survival ECE {before:.4f} -> {after:.4f}")
    print(f"wrote {output} ({fit.num_blocks} blocks, {len(fit.temperatures)} slots)")
