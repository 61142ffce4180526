"""Held-out evaluation by simulated DSpark decoding against the target.

Per prompt: the target prefills and samples the first token; then each round the drafter
proposes a full block (its own sampling loop, `sample_block`), the target verifies
[anchor, x_0 .. x_{G-1}] and `accept_draft` (the serving accept rule) decides; the committed
tokens and the features of verify rows 0..n extend the context, exactly as in serving (§3.1).
The target is recomputed over the whole sequence each round (no KV cache: simple, exact, and
cheap at evaluation sizes). Records are STS records (`sglaunch fit-sts` format).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from sglaunch.speculative.accept import accept_draft
from sglaunch.training import objective


def target_probs(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    return logits.float() if temperature < 1e-5 else torch.softmax(logits.float() / temperature, dim=-1)


@torch.no_grad()
def simulate_prompt(target, drafter, prompt: list[int], temperature: float, max_new_tokens: int,
                    eos_ids: set[int], gen: torch.Generator, autocast) -> list[dict[str, Any]]:
    """One prompt -> one record per drafted block."""
    G, dev = drafter.config.block_size, target.device
    tokens = list(prompt)
    out = target.run(torch.tensor([tokens]))
    first = _sample(target.logits(out.final_hidden[0, -1:]), temperature, gen)
    features, tokens = out.features[0].float(), tokens + [first]
    records, generated = [], 1
    greedy = torch.tensor([temperature < 1e-5], device=dev)
    while generated < max_new_tokens and tokens[-1] not in eos_ids:
        p = len(tokens) - 1  # anchor position
        blocks = _single_block(tokens, p, G)
        with autocast():
            bout = objective.block_forward(drafter, objective.draft_batch(torch.tensor([tokens]), features[None], blocks),
                                           torch.float32)
        block = drafter.sample_block(bout, torch.tensor([tokens[p]], device=dev), torch.tensor([temperature], device=dev),
                                     uniforms=torch.rand(1, G, generator=gen).to(dev),
                                     return_probs=temperature >= 1e-5)
        drafts = block.tokens[0].tolist()
        vout = target.run(torch.tensor([tokens + drafts]))
        P = target_probs(target.logits(vout.final_hidden[0, p: p + G + 1]), temperature)  # [G + 1, V]
        res = accept_draft(block.tokens, block.probs, P, torch.tensor([0], device=dev), torch.tensor([G], device=dev),
                           greedy, torch.rand(1, G, generator=gen).to(dev), torch.rand(1, generator=gen).to(dev))
        n = int(res.num_accepted[0])
        records.append({"confidence_logits": block.conf_logits[0].tolist() if block.conf_logits is not None else [],
                        "accepted": n, "verified": G})
        commit = drafts[:n] + [int(res.next_token[0])]
        features = torch.cat([features[:p], vout.features[0, p: p + n + 1].float()])
        for tok in commit:
            tokens.append(tok)
            generated += 1
            if tok in eos_ids or generated >= max_new_tokens:
                break
    return records


def _single_block(tokens: list[int], p: int, G: int) -> objective.Blocks:
    zeros = torch.zeros(1, G, dtype=torch.int64)
    return objective.Blocks(torch.tensor([0]), torch.tensor([p]), zeros, zeros, zeros.bool(), zeros.float())


def _sample(logits: torch.Tensor, temperature: float, gen: torch.Generator) -> int:
    if temperature < 1e-5:
        return int(logits[-1].argmax())
    probs = torch.softmax(logits[-1].float() / temperature, -1).cpu()
    return int(torch.multinomial(probs, 1, generator=gen))


def summarize(records: list[dict[str, Any]], block_size: int) -> dict[str, Any]:
    """Mean accept length (bonus included), its histogram, conditional acceptance per slot,
    and the confidence head's calibration (ECE of per-slot and of prefix-survival predictions)."""
    import numpy as np

    from sglaunch.speculative import sts

    if not records:
        return {"blocks": 0}
    n = np.array([r["accepted"] for r in records])
    reached = np.array([[a >= k for k in range(block_size)] for a in n])
    accepted = np.array([[a > k for k in range(block_size)] for a in n])
    out: dict[str, Any] = {
        "blocks": len(records), "mean_accept_length": float((n + 1).mean()),
        "accept_length_histogram": np.bincount(n + 1, minlength=block_size + 2)[1:].tolist(),
        "accept_rate_per_position": [float(accepted[:, k].sum() / max(1, reached[:, k].sum())) for k in range(block_size)],
        "reach_rate_per_position": [float(reached[:, k].mean()) for k in range(block_size)],
    }
    if records[0]["confidence_logits"]:
        logits = np.array([r["confidence_logits"] for r in records], dtype=np.float64)
        conf = sts.sigmoid(logits)
        out["confidence_ece"] = sts.ece(conf[reached], accepted[reached])
        out["confidence_mean"] = [float(conf[reached[:, k], k].mean()) if reached[:, k].any() else None
                                  for k in range(block_size)]
        fit = sts.fit_sts(logits, n, np.full(len(n), block_size))
        out["survival_ece_per_position"] = fit.ece_before
        out["survival_ece_per_position_after_sts"] = fit.ece_after
    return out


def evaluate(target, drafter, heldout, *, temperatures, max_new_tokens: int, max_prompts: int, eos_ids: set[int],
             seed: int, autocast, progress: bool, out_dir: Path) -> dict[str, Any]:
    """Run every (temperature, prompt) and write eval.json + records_T*.jsonl into out_dir."""
    from rich.progress import Progress

    drafter.eval()
    prompts = heldout[:max_prompts]
    result: dict[str, Any] = {"prompts": len(prompts), "block_size": drafter.config.block_size,
                              "max_new_tokens": max_new_tokens, "temperatures": {}}
    all_records = []
    with Progress(disable=not progress) as bars:
        for temp in temperatures:
            task = bars.add_task(f"evaluating at temperature {temp}", total=len(prompts))
            per_type: dict[str, list] = {}
            records = []
            for i, p in enumerate(prompts):
                gen = torch.Generator().manual_seed(seed * 7 + i)
                recs = simulate_prompt(target, drafter, p.ids, temp, max_new_tokens, eos_ids, gen, autocast)
                records += recs
                per_type.setdefault(p.type, []).extend(recs)
                bars.update(task, advance=1)
            summary = summarize(records, drafter.config.block_size)
            summary["per_type"] = {k: summarize(v, drafter.config.block_size)["mean_accept_length"]
                                   for k, v in sorted(per_type.items()) if v}
            result["temperatures"][str(temp)] = summary
            with open(out_dir / f"records_T{temp}.jsonl", "w") as handle:
                handle.writelines(json.dumps(r) + "\n" for r in records)
            all_records += records
    (out_dir / "eval.json").write_text(json.dumps(result, indent=2) + "\n")
    result["_records"] = all_records
    return result
