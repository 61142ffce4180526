"""Where served blocks start, and what that costs the drafter (issue 19's diagnostic).

    python benchmarks/anchor_bias.py --target DIR --drafter DIR --prompts heldout.jsonl \
        [--per-kind 8] [--max-new-tokens 96] [--json OUT.json]

At T=0 the served accept length of a block anchored at position a is the number of leading block
slots whose drafter argmax (Markov head fed the true previous tokens, which on the accepted prefix
are the drafted ones) equals the target's greedy next token. So one teacher-forced drafter forward
with an anchor at EVERY response position of the target's greedy continuation gives, per anchor,
the run length the server would see there. From it this prints:

- the marginal top-1 agreement per block slot over all anchors (what training's `top1@k` logs);
- the served walk (first anchor at the first generated token, next anchor = a + run + 1): mean
  accept length and conditional rate per slot, which should match `dspark_accept.py` in static
  mode with the full vocabulary (a check that the server feeds the drafter as training does);
- slot 0's agreement at the served anchors against all anchors, and at anchors after a rejection
  against anchors after a full block: the selection the walk makes;
- after a rejection, how often the target's token is slot 0's first, second or third choice, and how
  well the confidence head's slot-0 probability separates hits from misses (AUC).

The target is transformers' model (fp32 by default), the drafter the training forward
(`sglaunch.training.objective`) over the whole vocabulary.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from dspark_accept import load_prompts  # noqa: E402


def block_hits(drafter, target, prompt: list[int], response: list[int], objective, torch):
    """-> (hits [N, G] bool, valid [N, G] bool, slot0) of a block anchored at each response position
    but the last: slot k's drafter argmax equals the target's greedy token (valid: inside the
    response); slot0: the rank (1-3, else 99) of the target's token among slot 0's drafter logits and
    the confidence head's slot-0 probability."""
    G = drafter.config.block_size
    ids = torch.tensor([prompt + response])
    T = ids.shape[1]
    out = target.run(ids)
    start = len(prompt)
    anchors = torch.arange(start, T - 1)
    batch = objective.SeqBatch(ids, torch.zeros(1, T, dtype=torch.bool), torch.ones(1, T, dtype=torch.int64))
    batch.loss_mask[0, start:] = True
    blocks = objective.make_blocks(batch, torch.zeros(len(anchors), dtype=torch.int64), anchors, G)
    with torch.no_grad():
        bout = objective.block_forward(drafter, objective.draft_batch(ids, out.features.float(), blocks), torch.float32)
        logits, conf = objective.teacher_forced_heads(drafter, bout, blocks.prev)
    label0 = blocks.labels[:, 0]
    top3 = logits[:, 0].topk(3, dim=-1).indices
    slot0 = {"rank": torch.where(top3 == label0[:, None], torch.arange(1, 4)[None, :], 99).min(-1).values,
             "conf": torch.sigmoid(conf[:, 0]) if conf is not None else None}
    return (logits.argmax(-1) == blocks.labels) & blocks.valid, blocks.valid, slot0


def auc(pos: list[float], neg: list[float]) -> float:
    """P(a random hit's score > a random miss's), ties counting half (Mann-Whitney)."""
    if not pos or not neg:
        return float("nan")
    scored = sorted([(v, 1) for v in pos] + [(v, 0) for v in neg])
    rank_sum, i = 0.0, 0
    while i < len(scored):
        j = i
        while j < len(scored) and scored[j][0] == scored[i][0]:
            j += 1
        mid = (i + 1 + j) / 2  # average 1-based rank of the tied run
        rank_sum += mid * sum(1 for _, p in scored[i:j] if p)
        i = j
    return (rank_sum - len(pos) * (len(pos) + 1) / 2) / (len(pos) * len(neg))


def measure(target_dir: Path, drafter_dir: Path, prompts: list[tuple[str, list[int]]], max_new_tokens: int) -> dict:
    """The figures above for (kind, prompt ids) pairs; "walks" holds each prompt's served run lengths
    (accepted drafts per block, in order), which a static-mode engine at T=0 reports as run + 1."""
    import torch

    from sglaunch.training import model, objective
    from sglaunch.training import target as target_mod

    cfg = model.init_from_checkpoint(drafter_dir, json.loads((target_dir / "config.json").read_text()))
    target = target_mod.Target(target_dir, list(cfg.target_layer_ids), torch.float32, torch.device("cpu"))
    drafter = model.build_drafter(cfg, target.embed_tokens, target.lm_head, torch.device("cpu"), max_new_tokens + 4096)
    model.load_checkpoint_weights(drafter, drafter_dir, cfg)
    drafter.eval()
    G = cfg.block_size
    eos_cfg = target.model.generation_config.eos_token_id
    eos = {int(t) for t in ([eos_cfg] if isinstance(eos_cfg, int) else eos_cfg or [])}

    top1 = [[0, 0] for _ in range(G)]  # slot k over every anchor: [hits, counts], earlier slots ignored
    marginal = [[0, 0] for _ in range(G)]  # slot k over every anchor whose slots < k all hit
    served, slot0_by = defaultdict(list), defaultdict(lambda: [0, 0])
    ranks, confs = [], []  # slot 0 of the walk's blocks that start after a rejection
    walks, per_prompt = [], []
    for kind, prompt in prompts:
        with torch.no_grad():
            gen = target.model.generate(torch.tensor([prompt]), max_new_tokens=max_new_tokens, do_sample=False,
                                        pad_token_id=next(iter(eos), 0))
        response = gen[0, len(prompt):].tolist()
        walks.append([])
        if len(response) < 2:
            continue
        hits, valid, slot0 = block_hits(drafter, target, prompt, response, objective, torch)
        runs = hits.int().cumprod(-1).sum(-1).tolist()
        # a second (third) chain whose slot 0 is slot 0's second (third) choice: its later slots differ from the
        # first chain's only through the Markov head's previous token, so where that choice IS the target's
        # token its run is 1 + the teacher-forced leading hits of slots 1.. (the Markov head fed the truth)
        lead1 = (1 + hits[:, 1:].int().cumprod(-1).sum(-1)).tolist()
        rank0 = slot0["rank"].tolist()
        conf0 = slot0["conf"].tolist() if slot0["conf"] is not None else [0.0] * len(runs)
        per_prompt.append((kind, response, runs, lead1, rank0, conf0))
        for k in range(G):
            top1[k][0] += int(hits[:, k].sum())
            top1[k][1] += int(valid[:, k].sum())
        for n in runs:
            for k in range(G):
                if n >= k:
                    marginal[k][1] += 1
                    marginal[k][0] += n > k
        # the walk: anchor at response index i (position len(prompt) + i); the block's drafts cover
        # tokens i+1 .. i+G, so a run n commits n + 1 tokens and the next anchor is i + n + 1
        i, after = 0, "first"
        while i < len(runs):
            n = min(runs[i], len(response) - 1 - i)
            served[kind].append(n)
            walks[-1].append(n)
            slot0_by[after][1] += 1
            slot0_by[after][0] += n > 0
            if after == "rejection":
                ranks.append(int(slot0["rank"][i]))
                if slot0["conf"] is not None:
                    confs.append(float(slot0["conf"][i]))
            after = "full block" if n == G else "rejection"
            i += n + 1
    every = [n for v in served.values() for n in v]
    result = {"drafter": str(drafter_dir), "prompts": len(prompts), "max_new_tokens": max_new_tokens}
    # slot k's agreement over all anchors, unconditional (training's top1@k) and conditional on slots < k
    result["all_anchors_top1_per_slot"] = [round(h / max(c, 1), 4) for h, c in top1]
    result["all_anchors_conditional_rate_per_slot"] = [round(h / max(c, 1), 4) for h, c in marginal]
    result["served_mean_accept_length"] = round(sum(n + 1 for n in every) / max(len(every), 1), 4)
    result["served_per_kind"] = {k: round(sum(n + 1 for n in v) / len(v), 3) for k, v in sorted(served.items())}
    at_least = [sum(1 for n in every if n >= k) for k in range(G + 1)]
    result["served_conditional_rate_per_slot"] = [round(at_least[k + 1] / max(at_least[k], 1), 4) for k in range(G)]
    result["served_blocks"] = len(every)
    result["all_anchors"] = marginal[0][1]
    result["slot0_rate_all_anchors"] = round(marginal[0][0] / max(marginal[0][1], 1), 4)
    result["slot0_rate_served"] = round(sum(1 for n in every if n > 0) / max(len(every), 1), 4)
    result["slot0_rate_by_previous_block"] = {k: [round(h / max(c, 1), 4), c] for k, (h, c) in sorted(slot0_by.items())}
    # after a rejection: how often the target's token is slot 0's 2nd or 3rd choice (what verifying a second
    # candidate there could recover), and how well the confidence head tells slot 0's hits from its misses
    m = max(len(ranks), 1)
    result["after_rejection_slot0"] = {
        "blocks": len(ranks), "top1": round(sum(r == 1 for r in ranks) / m, 4),
        "top2": round(sum(r <= 2 for r in ranks) / m, 4), "top3": round(sum(r <= 3 for r in ranks) / m, 4)}
    if confs:
        hit = [c for c, r in zip(confs, ranks) if r == 1]
        miss = [c for c, r in zip(confs, ranks) if r != 1]
        result["after_rejection_slot0"].update({
            "confidence_mean_hit": round(sum(hit) / max(len(hit), 1), 4),
            "confidence_mean_miss": round(sum(miss) / max(len(miss), 1), 4),
            "confidence_auc": round(auc(hit, miss), 4)})
    result["branches"] = branch_walks(per_prompt, G)
    result["walks"] = walks
    return result


BRANCH_THRESHOLDS = (0.4, 0.5, 0.6, 0.7, 0.8, 1.01)
SHORT_CHAINS = (1, 2, 3, 4)


def branch_walk(per_prompt, width: int, threshold: float, chain_len: int) -> dict:
    """One served walk at T=0 whose blocks also verify chains 2..width (slot 0's next choices), each of
    chain_len drafts, where the confidence head's slot-0 probability is below threshold."""
    lengths, extra, by_kind = [], 0, defaultdict(list)
    for kind, response, runs, lead1, rank0, conf0 in per_prompt:
        i = 0
        while i < len(runs):
            n = runs[i]
            if conf0[i] < threshold:
                extra += 1
                if 2 <= rank0[i] <= width:
                    n = max(n, min(lead1[i], chain_len))
            n = min(n, len(response) - 1 - i)
            lengths.append(n + 1)
            by_kind[kind].append(n + 1)
            i += n + 1
    return {"mean_accept_length": round(sum(lengths) / max(len(lengths), 1), 4),
            "extra_chain_share": round(extra / max(len(lengths), 1), 4), "blocks": len(lengths),
            "per_kind": {k: round(sum(v) / len(v), 3) for k, v in sorted(by_kind.items())}}


def branch_walks(per_prompt, G: int) -> dict:
    """Served walks at T=0 when a block also verifies a second (or second and third) chain starting from
    slot 0's next choices, always or only where the confidence head's slot-0 probability is below a
    threshold: mean accept length and the share of blocks that carried the extra chain(s), whose rows a
    verify step would pay for (G each); and with shorter extra chains (`top2_len{L}_always`: L drafts,
    L + 1 verify rows with the anchor)."""
    out = {}
    for width in (2, 3):
        for th in BRANCH_THRESHOLDS:
            key = f"top{width}_conf_below_{th:g}" if th <= 1 else f"top{width}_always"
            out[key] = branch_walk(per_prompt, width, th, G)
    for length in SHORT_CHAINS:
        out[f"top2_len{length}_always"] = branch_walk(per_prompt, 2, BRANCH_THRESHOLDS[-1], length)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", type=Path, required=True)
    parser.add_argument("--drafter", type=Path, required=True)
    parser.add_argument("--prompts", type=Path, required=True)
    parser.add_argument("--per-kind", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    from sglaunch.server.tokenizer import load_tokenizer

    prompts = load_prompts(args.prompts, load_tokenizer(args.target), 10**9, args.per_kind)
    result = measure(args.target, args.drafter, prompts, args.max_new_tokens)
    result.pop("walks")
    result["prompts_per_kind"] = args.per_kind
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
