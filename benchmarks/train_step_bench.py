"""Micro-benchmark of one `train-draft` optimizer step (issue 19): steps/s and ms per step of
Trainer.train_step, the exact step the drafter rounds run, for a given target and drafter.

    # the next GPU session (H200; random SmolLM2 weights unless --target; the round's settings)
    python benchmarks/train_step_bench.py --device cuda --impl fused,reference --json OUT/step_bench.json
    python benchmarks/train_step_bench.py --device cuda --impl fused --compile        # + torch.compile
    python benchmarks/train_step_bench.py --device cuda --profile 3                  # + a kernel table
    # the drafter's grouped attention (training/attention.py): reference SDPA, expanded heads, flex
    python benchmarks/train_step_bench.py --device cuda --impl fused --attention sdpa,dense,flex --phases 5
    # CPU smoke (CI-sized: 6 target layers, a 1-layer drafter, 2 sequences, full 49k vocabulary)
    python benchmarks/train_step_bench.py --device cpu --smoke

--impl fused is the step as it is now (the vocabulary side chunked over supervised slots, the
target's distribution once per position, no per-step host sync, fused AdamW on CUDA); reference
is the step before (issue 19's 5.7 steps/s on the H200: benchmarks/drafter_rounds/s11-round5/):
[N, G, V] logits and distributions materialised for every slot, the target run with its padding
mask, metrics read back every step. Both run in one process on the same micro-batches.
--attention (comma list of auto | sdpa | dense | flex, training/attention.py) times each loss
implementation with each attention of the drafter's grouped layout: sdpa is the reference call
(boolean mask + enable_gqa), dense the expanded-heads call, flex compiled flex_attention; each
row reports ms per step, peak memory, the first warm-up step's seconds (flex's compilation) and
its ratio to the first row. On CUDA a probe line first says which SDPA kernels accept the
reference call and the dense one at the run's shapes (forward + backward).

The target is --target DIR (a checkpoint, e.g. /tmp/cache/models/smollm2-135m-instruct on a warm
machine), else random weights with --config DIR's shape (default benchmarks/gpu6/smolcfg, SmolLM2-
135M's config and tokenizer), saved once into --work. The drafter is --init-from DIR (default the
bundled one, as the rounds use), or a fresh one with --num-draft-layers/--markov-rank. The
sequences are real responses (--responses, default s11-round5's, 15k of them) in the seeded order.
Prints one JSON line per implementation; --json FILE writes them all.
"""

from __future__ import annotations

import argparse
import gzip
import json
import shutil
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

DEFAULT_RESPONSES = REPO / "benchmarks/drafter_rounds/s11-round5/responses.jsonl.gz"
DEFAULT_CONFIG = REPO / "benchmarks/gpu6/smolcfg"
BUNDLED = REPO / "sglaunch/hub/drafters/smollm2-135m-instruct"
LOGGED_STEPS_PER_S = 5.73  # s11-round5/logs.txt: "5.73 steps/s since step 500" (batch 32, length 768, 128 anchors)


def random_target(config: Path, work: Path, layers: int | None, dtype: str) -> Path:
    """A checkpoint folder with config's shape (optionally fewer layers) and random weights."""
    import transformers

    cfg = json.loads((config / "config.json").read_text())
    if layers:
        cfg["num_hidden_layers"] = layers
    folder = work / f"target-{cfg['num_hidden_layers']}l"
    if (folder / "config.json").is_file():
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        if (config / name).is_file():
            shutil.copy(config / name, folder / name)
    hf_cfg = transformers.AutoConfig.for_model(**cfg)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(hf_cfg, dtype=getattr(torch, dtype))
    model.save_pretrained(str(folder))
    return folder


def read_responses(path: Path, limit: int | None) -> list[str]:
    opener = gzip.open if path.suffix == ".gz" else open
    lines = []
    with opener(path, "rt") as handle:
        for line in handle:
            if line.strip():
                lines.append(line if line.endswith("\n") else line + "\n")
                if limit and len(lines) >= limit:
                    break
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default=None, help="bfloat16 on cuda, float32 on cpu (train-draft's defaults)")
    ap.add_argument("--target", type=Path, default=None)
    ap.add_argument("--config", type=Path, default=DEFAULT_CONFIG)
    ap.add_argument("--target-layers", type=int, default=None, help="random target: this many layers")
    ap.add_argument("--init-from", type=Path, default=None, help="default: the bundled drafter ('none': fresh)")
    ap.add_argument("--num-draft-layers", type=int, default=2)
    ap.add_argument("--markov-rank", type=int, default=8)
    ap.add_argument("--responses", type=Path, action="append", default=None)
    ap.add_argument("--max-responses", type=int, default=None)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--max-length", type=int, default=768)
    ap.add_argument("--anchors-per-seq", type=int, default=128)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--steps", type=int, default=40, help="timed steps per implementation")
    ap.add_argument("--warmup", type=int, default=8, help="untimed steps first (allocator, kernels, compile)")
    ap.add_argument("--impl", default="fused,reference", help="comma list of fused | reference")
    ap.add_argument("--attention", default="auto", help="comma list of auto | sdpa | dense | flex (drafter attention)")
    ap.add_argument("--phases", type=int, default=0,
                    help="after timing each row: N more steps synchronised at each phase's end (host, target, "
                         "drafter, loss, backward, optimizer; fused loss), mean ms per phase in the row")
    ap.add_argument("--no-probe", action="store_true", help="skip the SDPA kernel probe (CUDA)")
    ap.add_argument("--compile", action="store_true", help="torch.compile the fused loss's chunk math")
    ap.add_argument("--profile", type=int, default=0, help="after timing: profile N fused steps, print the top kernels")
    ap.add_argument("--work", type=Path, default=Path("/tmp/train_step_bench"))
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--smoke", action="store_true", help="CPU-sized: 6 target layers, fresh 1-layer drafter, 2 x 256 tokens")
    a = ap.parse_args()
    if a.smoke:
        a.target_layers = a.target_layers or 6
        a.init_from = a.init_from or Path("none")
        a.num_draft_layers, a.batch_size, a.max_length, a.anchors_per_seq = 1, 2, 256, 16
        a.steps, a.warmup, a.max_responses = min(a.steps, 3), min(a.warmup, 1), a.max_responses or 64
    dtype = a.dtype or ("bfloat16" if a.device == "cuda" else "float32")

    from sglaunch.training import data
    from sglaunch.training.trainer import TrainArgs, Trainer

    a.work.mkdir(parents=True, exist_ok=True)
    target = a.target or random_target(a.config, a.work, a.target_layers, "bfloat16" if a.device == "cuda" else "float32")
    out = a.work / "run"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    lines = []
    for path in a.responses or [DEFAULT_RESPONSES]:
        lines += read_responses(path, a.max_responses and a.max_responses - len(lines))
    (out / "responses.jsonl").write_text("".join(lines))  # the cache train-draft reuses: no generation
    prompt = a.work / "one_prompt.jsonl"
    prompt.write_text('{"messages": [{"role": "user", "content": "unused: the responses are cached"}]}\n')
    init = None if a.init_from is not None and str(a.init_from) == "none" else (a.init_from or BUNDLED)
    args = TrainArgs(target=target, prompts=prompt, output=out, eval_fraction=0.0, device=a.device, dtype=dtype,
                     init_from=init, num_draft_layers=a.num_draft_layers, markov_rank=a.markov_rank,
                     max_length=a.max_length, batch_size=a.batch_size, anchors_per_seq=a.anchors_per_seq, lr=a.lr,
                     max_steps=10**9, progress=False, compile_loss=a.compile)
    trainer = Trainer(args)
    trainer.setup()
    dev = trainer.device
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    if dev.type == "cuda" and not a.no_probe:
        print(json.dumps(sdpa_probe(trainer, a)), flush=True)
    results = []
    attentions = [x.strip() for x in a.attention.split(",") if x.strip()]
    for attention in attentions:
        resolved = trainer.set_attention(attention)
        for impl in [x.strip() for x in a.impl.split(",") if x.strip()]:
            trainer.args.loss_impl = impl
            first = None
            for i in range(a.warmup):
                t0 = time.perf_counter()
                trainer.train_step()
                if i == 0:
                    sync()
                    first = time.perf_counter() - t0
            sync()
            if dev.type == "cuda":
                torch.cuda.reset_peak_memory_stats(dev)
            host = 0.0
            t0 = time.perf_counter()
            for _ in range(a.steps):
                h0 = time.perf_counter()
                row = trainer.train_step()
                host += time.perf_counter() - h0
            sync()
            wall = time.perf_counter() - t0
            last = Trainer.host_row(row)
            res = {"impl": impl, "attention": resolved, "compile": bool(a.compile and impl == "fused"),
                   "device": str(dev), "gpu": torch.cuda.get_device_name(dev) if dev.type == "cuda" else None,
                   "dtype": dtype, "batch_size": a.batch_size, "max_length": a.max_length,
                   "anchors_per_seq": a.anchors_per_seq, "target": str(target), "drafter": str(init) if init else "fresh",
                   "steps": a.steps, "ms_per_step": round(1000 * wall / a.steps, 2),
                   "steps_per_s": round(a.steps / wall, 3), "host_ms_per_step": round(1000 * host / a.steps, 2),
                   "first_step_s": round(first, 2) if first is not None else None,
                   "peak_mem_gib": round(torch.cuda.max_memory_allocated(dev) / 2**30, 2) if dev.type == "cuda" else None,
                   "loss": round(float(last.get("loss", float("nan"))), 4)}
            if a.phases:
                res["phases_ms"] = time_phases(trainer, a.phases, sync)
            if results:
                res["ms_vs_first_row"] = round(res["ms_per_step"] / results[0]["ms_per_step"], 3)
            if dev.type == "cuda" and a.batch_size == 32 and a.max_length == 768 and a.anchors_per_seq == 128:
                res["vs_logged_5.73_steps_per_s"] = round(res["steps_per_s"] / LOGGED_STEPS_PER_S, 2)
            print(json.dumps(res), flush=True)
            results.append(res)
            if a.json:  # after every row: a run cut short keeps what it measured
                a.json.parent.mkdir(parents=True, exist_ok=True)
                a.json.write_text(json.dumps(results, indent=1) + "\n")
    if a.profile:
        from torch.profiler import ProfilerActivity, profile

        trainer.args.loss_impl = "fused"
        trainer.set_attention(attentions[0])
        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else [])
        with profile(activities=acts) as prof:
            for _ in range(a.profile):
                trainer.train_step()
            sync()
        key = "self_cuda_time_total" if dev.type == "cuda" else "self_cpu_time_total"
        print(prof.key_averages().table(sort_by=key, row_limit=30))
    return 0


def time_phases(trainer, steps: int, sync) -> dict:
    """Mean ms per phase of `steps` steps, the device synchronised at every phase's end (so the
    phases do not overlap: their sum exceeds a free-running step; the split is what it says)."""
    totals: dict[str, float] = {}
    last = [0.0]

    def hook(name: str) -> None:
        sync()
        now = time.perf_counter()
        totals[name] = totals.get(name, 0.0) + now - last[0]
        last[0] = now

    trainer.phase_hook = hook
    try:
        for _ in range(steps):
            sync()
            last[0] = time.perf_counter()
            trainer.train_step()
    finally:
        trainer.phase_hook = None
    return {k: round(1000 * v / steps, 2) for k, v in totals.items()}


def sdpa_probe(trainer, a) -> dict:
    """Which SDPA kernels take the drafter's reference call (boolean mask + enable_gqa) and the
    dense one (expanded heads + additive mask) at this run's shapes, forward and backward."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from sglaunch.training import attention as att

    c, dev = trainer.dcfg, trainer.device
    S, A, G, T = a.batch_size, a.anchors_per_seq, c.block_size, a.max_length
    dt = torch.bfloat16 if trainer.dtype != torch.float32 else torch.float32
    lens = torch.randint(0, T, (S, A), generator=torch.Generator().manual_seed(0)).sort(-1).values.to(dev)
    visible = att.visibility(lens, T, G)
    out = {"probe": "sdpa_kernels", "shape": {"S": S, "heads": c.num_heads, "kv_heads": c.num_kv_heads,
                                              "queries": A * G, "keys": T + A * G, "head_dim": c.head_dim}}
    forms = {"sdpa": lambda q, k, v: att.attend_sdpa(q, k, v, visible, c.head_dim ** -0.5),
             "dense": lambda q, k, v: att.attend_dense(q, k, v, att.additive_mask(visible, dt), c.head_dim ** -0.5)}
    for form, fn in forms.items():
        row = {}
        for name in ("FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION", "MATH"):
            backend = getattr(SDPBackend, name, None)
            if backend is None:
                continue
            q = torch.randn(S, c.num_heads, A * G, c.head_dim, device=dev, dtype=dt, requires_grad=True)
            k = torch.randn(S, c.num_kv_heads, T + A * G, c.head_dim, device=dev, dtype=dt, requires_grad=True)
            v = torch.randn_like(k, requires_grad=True)
            try:
                with sdpa_kernel([backend]):
                    fn(q, k, v).sum().backward()
                torch.cuda.synchronize(dev)
                row[name.lower()] = "ok"
            except Exception as exc:  # noqa: BLE001 - the probe reports why a kernel refused
                row[name.lower()] = f"refused: {str(exc).splitlines()[0][:120]}"
            del q, k, v
        out[form] = row
    torch.cuda.empty_cache()
    return out


if __name__ == "__main__":
    raise SystemExit(main())
