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

`--second-chain N` also estimates what a second chain of N drafts adds at T under recursive rejection
sampling without replacement (docs/dspark.md, "A second chain"): where slot 0's draft x0 is rejected
(probability 1 - alpha_0, x distributed as max(q0 - P0, 0)), chain 2's first draft y0 is drawn from q0
with x0 removed and accepted against the residual R0 = norm(max(P0 - q0, 0)) with probability
sum_y min(R0(y), q0'(y)) (beta; computed exactly per anchor over the `--rejected-top` most likely
rejected x0, the rest of their mass counted as beta 0, so beta is a lower bound; `--second-scales` draws
y0 from q0 at other temperatures instead, x0 removed). An accepted y0 adds
1 + alpha_1 + alpha_1 alpha_2 + ... (N - 1 terms: the chain's later drafts, taken to be accepted at
chain 1's rates) to the step.
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
    parser.add_argument("--second-chain", default="", help="comma-separated chain lengths N to estimate (scale 1)")
    parser.add_argument("--rejected-top", type=int, default=8)
    parser.add_argument("--second-scales", default="1.0",
                        help="comma-separated temperature scales of y0's proposal (q0 at T * s, x0 removed)")
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
    second_scales = [float(s) for s in args.second_scales.split(",")]
    beta_sum = [0.0] * len(second_scales)  # per y0 scale, the sum over blocks of (1 - alpha_0) * beta
    beta_covered = 0.0  # the rejected mass examined
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
            if args.second_chain:
                q0 = torch.softmax(logits[:, 0].float() / T, dim=-1)
                for i, s in enumerate(second_scales):
                    r0 = q0 if s == 1.0 else torch.softmax(logits[:, 0].float() / (T * s), dim=-1)
                    b, c = second_draft_acceptance(p_t[:, 0].float(), q0, r0, valid[:, 0], args.rejected_top)
                    beta_sum[i] += b
                beta_covered += c
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
    if args.second_chain:
        first = result["scales"][str(scales[-1])]  # NOTE: pass --scales 1.0 for the request's own q
        alpha, rejected = first["alpha_per_slot"], 1 - first["alpha_per_slot"][0]
        result["second_chain"] = {"p_x0_rejected": rejected, "rejected_mass_examined": beta_covered / float(den[0]),
                                  "y0_scales": {}}
        print(f"second chain at T={T} (chain 1 drafted at T*{scales[-1]}): x0 rejected {rejected:.3f} "
              f"(rejected mass examined {beta_covered / float(den[0]):.3f})")
        for s, total in zip(second_scales, beta_sum):
            y0 = total / float(den[0])  # P(x0 rejected and y0 accepted)
            entry = {"p_y0_accepted": y0, "beta": y0 / max(rejected, 1e-12), "lengths": {}}
            for n in [int(x) for x in args.second_chain.split(",")]:
                later, reach = 1.0, 1.0
                for a in alpha[1:n]:
                    reach *= a
                    later += reach
                entry["lengths"][str(n)] = {"gain": y0 * later,
                                            "expected_accept_length": first["expected_accept_length"] + y0 * later}
            result["second_chain"]["y0_scales"][str(s)] = entry
            print(f"  y0 from q0 at T*{s}: accepted in {y0:.3f} of all blocks (beta {entry['beta']:.3f}); "
                  + ", ".join(f"N={n}: +{e['gain']:.3f} -> {e['expected_accept_length']:.3f}"
                              for n, e in entry["lengths"].items()))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0


def second_draft_acceptance(p, q, r, valid, top: int):
    """(sum over valid rows of P(x0 rejected and y0 accepted), sum of the rejected mass examined) for target
    rows p [N, V], draft rows q [N, V] and y0's proposal rows r [N, V] at slot 0: x0 ~ q is rejected with
    probability max(q - p, 0)(x0) / q(x0), y0 ~ r with x0 removed (r') is then accepted with probability
    sum_y min(R(y), r'(y)), R = norm(max(p - q, 0))."""
    import torch

    w = (q - p).clamp_min(0)  # [N, V]: P(x0 = x and rejected)
    residual = (p - q).clamp_min(0)
    residual = residual / residual.sum(-1, keepdim=True).clamp_min(1e-12)
    wk, xk = w.topk(top, dim=-1)  # the most likely rejected x0
    total, covered = 0.0, 0.0
    for j in range(top):
        x = xk[:, j:j + 1]
        rx = r.gather(-1, x)  # [N, 1]
        qp = r.scatter(-1, x, 0.0) / (1 - rx).clamp_min(1e-12)
        beta = torch.minimum(residual, qp).sum(-1)  # [N]
        total += float((wk[:, j] * beta * valid).sum())
        covered += float((wk[:, j] * valid).sum())
    return total, covered


if __name__ == "__main__":
    sys.exit(main())
