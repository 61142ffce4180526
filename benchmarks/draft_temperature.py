"""Does drafting at a temperature other than the request's raise sampled acceptance? (issue 19, T=0.7)

    python benchmarks/draft_temperature.py --target SMOL --drafter sglaunch/hub/drafters/smollm2-135m-instruct \
        --prompts benchmarks/prompt_set/heldout.jsonl --per-kind 8 --temperature 0.7 --scales 0.6,0.7,0.8,0.9,1,1.1

Rejection sampling accepts draft k with probability sum_x min(P_k(x), q_k(x)) whatever q is, so the
draft distribution may be sampled at T * s instead of the request's T without changing the output
distribution. This measures, per block slot, that acceptance rate for each scale s, exactly (no
sampling noise): the target's own responses at T (our engine on the CPU or GPU) are teacher-forced,
every response position is an anchor, and for slot k the drafter's Markov-corrected logits (previous
tokens from the response, which is how an accepted prefix is distributed when drafts match the
target) are compared with the target's distribution at T. It prints, per scale, the per-slot rates
and the expected accept length 1 + sum_k prod_{j<=k} alpha_j (bonus included), a proxy of the
serving figure (the serving drafts' own prefix replaces the response's). Over the drafter's full
vocabulary (serving restricts it to draft_vocab.json's tokens: 99.8% of response tokens).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", required=True)
    parser.add_argument("--drafter", required=True)
    parser.add_argument("--prompts", default="benchmarks/prompt_set/heldout.jsonl")
    parser.add_argument("--per-kind", type=int, default=8)
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--scales", default="0.6,0.7,0.8,0.9,1.0,1.1")
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)

    import torch

    from sglaunch.training import data, model, objective
    from sglaunch.training.target import Target, read_target_config

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from dspark_accept import select_rows, read_rows

    target_path, drafter_path = Path(args.target), Path(args.drafter)
    device = torch.device(args.device)
    torch.manual_seed(args.seed)
    rows = select_rows(read_rows(Path(args.prompts)), 10**9, args.per_kind)
    records = [(i + 1, r) for i, r in enumerate(rows)]
    prompts = data.tokenize_prompts(records, target_path, Path(args.prompts))
    started = time.perf_counter()
    samples = data.generate_responses(target_path, prompts, device=args.device, dtype="bfloat16",
                                      max_new_tokens=args.max_new_tokens, temperatures=[args.temperature], top_p=1.0,
                                      seed=args.seed, max_length=2048, attention_backend="auto")
    print(f"{len(samples)} responses at T={args.temperature} in {time.perf_counter() - started:.1f} s", flush=True)

    cfg = model.init_from_checkpoint(drafter_path, read_target_config(target_path))
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    target = Target(target_path, list(cfg.target_layer_ids), dtype, device)
    drafter = model.build_drafter(cfg, target.embed_tokens, target.lm_head, device, 2048 + cfg.block_size + 1)
    model.load_checkpoint_weights(drafter, drafter_path, cfg)
    drafter.eval()
    G, T = cfg.block_size, args.temperature
    scales = [float(s) for s in args.scales.split(",")]
    num = torch.zeros(len(scales), G, dtype=torch.float64)  # sum over blocks of alpha_k(s)
    den = torch.zeros(G, dtype=torch.float64)
    gen = torch.Generator().manual_seed(args.seed)
    with torch.no_grad():
        for sample in samples:
            batch = objective.collate([sample], 2048)
            seq, anchor, real = objective.sample_anchors(batch, 10**6, gen)  # every response position
            if seq.numel() == 0:
                continue
            blocks = objective.make_blocks(batch, seq, anchor, G, real)
            tout = target.run(batch.ids)
            dbatch = objective.draft_batch(batch.ids, tout.features, blocks, groups=seq.numel())
            out = objective.block_forward(drafter, dbatch, torch.float32)
            logits, _ = objective.teacher_forced_heads(drafter, out, blocks.prev.to(device))  # [N, G, V]
            # the target's distribution at slot k: position a + k (it predicts the label a + k + 1)
            pos = (blocks.anchor[:, None] + torch.arange(G)[None, :]).clamp(max=batch.ids.shape[1] - 1)
            p_t = torch.softmax(target.logits(tout.final_hidden[0, pos.to(device)]) / T, dim=-1)  # [N, G, V]
            valid = blocks.valid.to(device)
            den += valid.sum(0).double().cpu()
            for i, s in enumerate(scales):
                q = torch.softmax(logits.float() / (T * s), dim=-1)
                alpha = torch.minimum(p_t, q).sum(-1)  # [N, G]
                num[i] += (alpha * valid).sum(0).double().cpu()
    result = {"temperature": T, "responses": len(samples), "blocks_per_slot": den.tolist(), "scales": {}}
    print(f"per-slot acceptance sum_x min(P, q) at T={T}, draft sampled at T*s ({int(den[0])} blocks):")
    for i, s in enumerate(scales):
        alpha = (num[i] / den.clamp_min(1)).tolist()
        reach, expected = 1.0, 1.0
        for a in alpha:
            reach *= a
            expected += reach
        result["scales"][str(s)] = {"alpha_per_slot": alpha, "expected_accept_length": expected}
        print(f"  s={s:<4} alpha " + " ".join(f"{a:.3f}" for a in alpha) + f"  expected accept length {expected:.3f}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
