"""Plain decoding on one GPU: the sglaunch engine against transformers `generate`, bf16.

    python benchmarks/gpu_decode.py --model SMOLLM2_DIR --out OUT [--batch-sizes 1,8,64]
        [--attention-backend torch|flashinfer] [--disable-cuda-graph] [--cuda-graph-max-bs N]

Two models, each in its own process (a CUDA failure in one cannot poison the other):
  smollm2-135m  the checkpoint given by --model
  qwen3-1.7b    random weights of Qwen3-1.7B's shape (hidden 2048, 28 layers, 16/8 heads,
                head_dim 128, intermediate 6144, vocab 151936, tied), built on the GPU and saved
                in bf16 with a small tokenizer into a temporary folder
For each: tokens/s of both sides at every batch size (random 64-token prompts, --new-tokens
tokens each, EOS ignored, greedy; median of --repeats after a warm-up, CUDA events; the
functions are those of engine_vs_hf.py), and for the 1.7B model the batch-1 decode step time
of the engine against its memory-bandwidth floor: weight bytes / the device-to-device copy
bandwidth measured in the same run (a 2 GiB torch copy, (read + write bytes) / time).
Writes OUT/gpu_decode.json and prints a short table last. Exit 1 if any part failed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
MODELS = ("smollm2-135m", "qwen3-1.7b")
QWEN3_1P7B_SHAPE = dict(
    vocab_size=151936, hidden_size=2048, intermediate_size=6144, num_hidden_layers=28,
    num_attention_heads=16, num_key_value_heads=8, head_dim=128, max_position_embeddings=40960,
    rope_theta=1000000.0, tie_word_embeddings=True, rms_norm_eps=1e-6,
)
TINY_QWEN3 = dict(vocab_size=600, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=16, max_position_embeddings=512, tie_word_embeddings=True)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, help="SmolLM2-135M checkpoint folder (skipped without it)")
    parser.add_argument("--models", default=",".join(MODELS), help=f"which of {', '.join(MODELS)} to run")
    parser.add_argument("--out", type=Path, required=True, help="folder for gpu_decode.json")
    parser.add_argument("--batch-sizes", default="1,8,64")
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--step-tokens", type=int, default=48, help="decode steps timed for the batch-1 step time")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--attention-backend", default=None,
                        help="engine attention backend (default: flashinfer on cuda, as `serve` resolves it; "
                             "EngineConfig's own default, torch, runs eagerly there)")
    parser.add_argument("--disable-cuda-graph", action="store_true")
    parser.add_argument("--cuda-graph-max-bs", type=int, default=None)
    parser.add_argument("--time-budget", type=float, default=170.0, help="seconds for all models together")
    parser.add_argument("--tiny-qwen3", action="store_true", help=argparse.SUPPRESS)  # CPU smoke tests
    parser.add_argument("--copy-bytes", type=int, default=2 << 30, help=argparse.SUPPRESS)
    parser.add_argument("--result-file", type=Path, help=argparse.SUPPRESS)  # child mode: one model's JSON
    args = parser.parse_args(argv)
    args.models = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = sorted(set(args.models) - set(MODELS))
    if unknown:
        parser.error(f"unknown model(s) {unknown}; choose from {', '.join(MODELS)}")
    args.batch_list = [int(b) for b in args.batch_sizes.split(",") if b.strip()]
    if args.attention_backend is None and args.device == "cuda":
        # NOTE: session 20 ran this without the flag and timed the torch backend's eager steps
        args.attention_backend = "flashinfer"
    return args


def engine_options(args) -> dict:
    """EngineConfig fields passed through (only those given, so the engine's defaults stay)."""
    options = {}
    if args.attention_backend:
        options["attention_backend"] = args.attention_backend
    if args.disable_cuda_graph:
        options["disable_cuda_graph"] = True
    if args.cuda_graph_max_bs is not None:
        options["cuda_graph_max_bs"] = args.cuda_graph_max_bs
    return options


# ----------------------------------------------------------------------------- on the GPU (child)


def build_qwen3_1p7b(folder: Path, dtype, device: str, shape: dict | None = None):
    """Random Qwen3-1.7B-shaped weights created on the device, saved in `dtype` with a tokenizer."""
    import importlib.util

    import torch
    import transformers

    spec = importlib.util.spec_from_file_location("gpu_checkpoints", ROOT / "tests/server/checkpoints.py")
    checkpoints = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(checkpoints)
    checkpoints.build_tokenizer(folder)  # byte-level BPE; ids < 512, enough for the engine's folder
    config = transformers.Qwen3Config(**(shape or QWEN3_1P7B_SHAPE), eos_token_id=2, bos_token_id=None, pad_token_id=0)
    torch.manual_seed(0)
    with torch.device(device):  # NOTE: initialising 1.7B parameters on the host would take minutes
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=dtype)
    model = model.to(device).eval()
    model.save_pretrained(folder)
    return model


def copy_bandwidth(device: str, nbytes: int = 2 << 30, repeats: int = 20) -> float:
    """Device-to-device copy bandwidth in bytes/s, counting read + write (median after warm-up;
    CUDA events on a GPU)."""
    import torch

    sys.path.insert(0, str(HERE))
    from engine_vs_hf import Stopwatch

    src = torch.empty(nbytes, dtype=torch.uint8, device=device).random_()
    dst = torch.empty_like(src)
    times = []
    for i in range(repeats + 3):
        with Stopwatch(device) as watch:
            dst.copy_(src)
        if i >= 3:
            times.append(watch.seconds)
    del src, dst
    if torch.device(device).type == "cuda":
        torch.cuda.empty_cache()
    return 2 * nbytes / sorted(times)[len(times) // 2]


def decode_step_seconds(engine, prompt: list[int], steps: int) -> dict:
    """Batch-1 decode: time of each engine.step() after the prefill (CUDA events on a GPU);
    median, min and p90 over the steps after the first two decode steps."""
    sys.path.insert(0, str(HERE))
    from engine_vs_hf import Stopwatch

    from sglaunch.engine.interface import GenerateRequest, SamplingParams

    sampling = SamplingParams(max_new_tokens=steps + 3, temperature=0.0, ignore_eos=True)
    engine.add_request(GenerateRequest("step-probe", tuple(prompt), sampling))
    times = []
    while engine.has_work:
        with Stopwatch(engine.runner.device) as watch:
            engine.step()
        times.append(watch.seconds)
    times = sorted(times[3:])  # the prefill, then two decode steps that may still warm caches up
    return {"median_s": times[len(times) // 2], "min_s": times[0], "p90_s": times[int(0.9 * (len(times) - 1))],
            "steps": len(times)}


def run_model(name: str, args, save=lambda result: None) -> dict:
    """One model in this process: load/build both sides, time every batch size (the 1.7B
    model's bandwidth floor first); `save(result)` after each figure, so a timeout keeps them."""
    import torch
    import transformers

    sys.path.insert(0, str(HERE))
    import engine_vs_hf as evh
    from sglaunch.engine.launch import create_engine

    dtype = getattr(torch, args.dtype)
    result = {"model": name, "dtype": args.dtype, "engine_options": engine_options(args), "rows": []}
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        if name == "qwen3-1.7b":
            path = Path(tmp) / "qwen3-1.7b"
            hf = build_qwen3_1p7b(path, dtype, args.device, TINY_QWEN3 if args.tiny_qwen3 else None)
        else:
            if args.model is None:
                raise ValueError("no --model given for smollm2-135m")
            path = args.model
            hf = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=dtype).eval().to(args.device)
        params = sum(p.numel() for p in hf.parameters())  # tied weights counted once
        result.update(path=str(path), parameters=params,
                      weight_bytes=sum(p.numel() * p.element_size() for p in hf.parameters()))
        max_tokens = max(args.batch_list) * (args.prompt_len + args.new_tokens + 8) + 4096
        engine, cluster = create_engine(evh.engine_config(path, args.dtype, args.device, max_total_tokens=max_tokens,
                                                          **engine_options(args)))
        result["setup_s"] = time.perf_counter() - start
        log(f"{name}: {params / 1e6:.1f}M parameters, both sides ready in {result['setup_s']:.1f} s")
        try:
            if name == "qwen3-1.7b":
                evh.time_engine(engine, evh.make_prompts(1, args.prompt_len, hf.config.vocab_size), 4, "warm")
                result["step"] = bandwidth_floor(engine, hf, args, result["weight_bytes"])
                save(result)
            for batch in args.batch_list:
                row = evh.compare_batch(hf, engine, batch, args.prompt_len, args.new_tokens, args.repeats, "median")
                result["rows"].append(row)
                save(result)
                log(f"{name} batch {batch}: transformers {row['hf_tok_s']:.1f} tok/s, sglaunch "
                    f"{row['engine_tok_s']:.1f} tok/s, ratio {row['ratio']:.2f}x")
        finally:
            cluster.stop(engine)
    return result


def bandwidth_floor(engine, hf, args, weight_bytes: int) -> dict:
    sys.path.insert(0, str(HERE))
    import engine_vs_hf as evh

    prompt = evh.make_prompts(1, args.prompt_len, hf.config.vocab_size)[0]
    step = decode_step_seconds(engine, prompt, args.step_tokens)
    bandwidth = copy_bandwidth(args.device, args.copy_bytes)
    floor = weight_bytes / bandwidth
    step.update(copy_bandwidth_Bps=bandwidth, floor_s=floor, ratio_to_floor=step["median_s"] / floor)
    log(f"batch-1 decode step {1e3 * step['median_s']:.2f} ms; floor {1e3 * floor:.3f} ms "
        f"({weight_bytes / 1e9:.2f} GB at {bandwidth / 1e12:.2f} TB/s); {step['ratio_to_floor']:.1f}x the floor")
    return step


def machine_card() -> dict:
    import platform

    import torch

    card = {"python": platform.python_version(), "torch": torch.__version__}
    for name in ("transformers", "triton", "flashinfer"):
        try:
            card[name] = __import__(name).__version__
        except Exception:  # noqa: BLE001 - absent or broken: say so
            card[name] = None
    if torch.cuda.is_available():
        card["gpu"] = torch.cuda.get_device_name()
    return card


def child_main(args) -> int:
    name = args.models[0]

    def save(partial: dict) -> None:
        args.result_file.write_text(json.dumps({**partial, "partial": True}, indent=2))

    try:
        result = run_model(name, args, save)
        result["card"] = machine_card()
    except Exception as exc:  # noqa: BLE001 - recorded, the parent reports it
        import traceback

        traceback.print_exc()
        result = {"model": name, "error": f"{type(exc).__name__}: {exc}"}
    args.result_file.write_text(json.dumps(result, indent=2))
    return 0 if "error" not in result else 1


# ----------------------------------------------------------------------------- orchestration (parent)


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def child_argv(args, name: str, result_file: Path) -> list[str]:
    argv = [sys.executable, str(Path(__file__).resolve()), "--models", name, "--out", str(args.out),
            "--batch-sizes", args.batch_sizes, "--prompt-len", str(args.prompt_len),
            "--new-tokens", str(args.new_tokens), "--repeats", str(args.repeats),
            "--step-tokens", str(args.step_tokens), "--dtype", args.dtype, "--device", args.device,
            "--copy-bytes", str(args.copy_bytes), "--result-file", str(result_file)]
    if args.model is not None:
        argv += ["--model", str(args.model)]
    if args.attention_backend:
        argv += ["--attention-backend", args.attention_backend]
    if args.disable_cuda_graph:
        argv.append("--disable-cuda-graph")
    if args.cuda_graph_max_bs is not None:
        argv += ["--cuda-graph-max-bs", str(args.cuda_graph_max_bs)]
    if args.tiny_qwen3:
        argv.append("--tiny-qwen3")
    return argv


def run_children(args) -> list[dict]:
    """Each model in a child process with its share of the remaining time budget."""
    results, deadline = [], time.monotonic() + args.time_budget
    with tempfile.TemporaryDirectory() as tmp:
        for index, name in enumerate(args.models):
            if name == "smollm2-135m" and args.model is None:
                results.append({"model": name, "error": "skipped: no --model given"})
                continue
            remaining = deadline - time.monotonic()
            limit = remaining / (len(args.models) - index) if name == "smollm2-135m" else remaining
            result_file = Path(tmp) / f"{name}.json"
            start = time.monotonic()
            try:
                subprocess.run(child_argv(args, name, result_file), timeout=max(5.0, limit), check=False)
                result = json.loads(result_file.read_text()) if result_file.exists() else \
                    {"model": name, "error": "the child wrote no result (see the log above)"}
            except subprocess.TimeoutExpired:
                result = json.loads(result_file.read_text()) if result_file.exists() else {"model": name}
                partial = " (partial figures)" if result.get("rows") or result.get("step") else ""
                result["error"] = f"timed out after {limit:.0f} s{partial}"
            result["wall_s"] = time.monotonic() - start
            results.append(result)
    return results


def table_lines(results: list[dict]) -> list[str]:
    """The short table printed last (and stored in the JSON)."""
    lines = [f"{'model':14s} {'batch':>5s} {'transformers tok/s':>19s} {'sglaunch tok/s':>15s} {'ratio':>7s}"]
    for result in results:
        if "error" in result:
            lines.append(f"{result['model']:14s} ERROR {result['error']}")
        for row in result.get("rows", []):
            lines.append(f"{result['model']:14s} {row['batch']:5d} {row['hf_tok_s']:19.1f} "
                         f"{row['engine_tok_s']:15.1f} {row['ratio']:6.2f}x")
        step = result.get("step")
        if step:
            lines.append(f"{result['model']} batch-1 decode step {1e3 * step['median_s']:.2f} ms vs floor "
                         f"{1e3 * step['floor_s']:.3f} ms ({result['weight_bytes'] / 1e9:.2f} GB / "
                         f"{step['copy_bandwidth_Bps'] / 1e12:.2f} TB/s copy): {step['ratio_to_floor']:.1f}x the floor")
    return lines


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.result_file is not None:
        return child_main(args)
    args.out.mkdir(parents=True, exist_ok=True)
    results = run_children(args)
    lines = table_lines(results)
    doc = {"script": "benchmarks/gpu_decode.py", "argv": sys.argv[1:], "date": time.strftime("%Y-%m-%d %H:%M"),
           "card": next((r["card"] for r in results if "card" in r), None), "models": results, "table": lines}
    (args.out / "gpu_decode.json").write_text(json.dumps(doc, indent=2))
    print("\n".join(lines), flush=True)
    return 1 if any("error" in r for r in results) else 0


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main())
