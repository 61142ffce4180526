"""The floor a step made of PyTorch kernels can reach, beside the engine's own step time (issue 15).

    python benchmarks/graph_floor.py --out OUT [--model DIR | --shape smollm2|qwen3-1.7b|qwen3-8b]
        [--context 512] [--attention-backend torch|flashinfer] [--time-budget 150]
    python benchmarks/graph_floor.py --out OUT --device cpu --shape tiny      # smoke mode

One process, one model (a checkpoint folder's config.json and weights via --model, or random
weights of a named shape saved as a safetensors checkpoint in a temporary folder). Both sides load
the SAME safetensors tensors:

- the reference: the model's whole forward written here in plain PyTorch (embedding, RMSNorm,
  rotary, GQA attention over a STATIC KV cache of --context tokens plus the 8 step slots, via
  explicit matmul-softmax (default) or SDPA, SwiGLU MLP, LM head) and greedy argmax, with static input and
  position tensors (the cache length is implied by the positions: key j is visible to a query at
  position p iff j <= p). On CUDA the whole step (forward + argmax) is captured as ONE
  torch.cuda.CUDAGraph and replayed, timed with CUDA events (median of --iters after warm-up):
    floor   torch.compile'd (--compile-mode; eager with a printed note if compile fails)
    eager   the same kernels without torch.compile, in one graph
  for a batch-1 decode step (1 query token at position --context) and an 8-token verify step
  (8 query tokens at --context .. --context+7, causal to the cache and to each other);
- the engine (sglaunch, in-process through create_engine):
    decode  median time of engine.step() per token of a batch-1 greedy generation over a
            --context-token prompt after warm-up (gpu_decode.decode_step_seconds);
    verify  ModelRunner.forward + argmax on a hand-built StepInput of 8 query tokens for one
            request (pages borrowed from the engine's allocator, after a --context-token prefill
            through ModelRunner.forward). It replays the engine's captured verify graph when one
            exists: with --attention-backend flashinfer this script sets
            SGLAUNCH_VERIFY_GRAPH_WINDOW=8 (as `sglaunch profile-sps` does) so the verify tiers are
            captured without a drafter; with the torch backend the step runs eagerly. The JSON
            says which ran (engine.verify.graph_replays).

A correctness check runs first: the reference's greedy tokens (eager, after a prefill of the same
prompt) against the engine's greedy generation, and the 8 verify rows' logits of both sides.

Prints a short table last (floor, one-graph eager kernels, engine, engine / floor) and writes
OUT/graph_floor.json (rewritten after every phase, so a timeout keeps what was measured). The
phases are skipped, and say so, once --time-budget seconds (compile time included) would be
exceeded. On the CPU (--device cpu, float32) there are no CUDA graphs and, unless --compile,
no torch.compile: the "floor" row is then the eager reference, timed with perf_counter.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

VERIFY_TOKENS = 8
CHECK_TOKENS = 8  # greedy tokens compared (the static cache has VERIFY_TOKENS spare slots)
_COMMON = dict(max_position_embeddings=40960, rope_theta=1000000.0, rms_norm_eps=1e-6)
SHAPES = {  # as in gpu_decode.py / engine_vs_hf.py / tp_scaling.py
    "smollm2": dict(arch="LlamaForCausalLM", vocab_size=49152, hidden_size=576, intermediate_size=1536,
                    num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3, head_dim=64,
                    max_position_embeddings=8192, rope_theta=100000.0, tie_word_embeddings=True, rms_norm_eps=1e-5),
    "qwen3-1.7b": dict(arch="Qwen3ForCausalLM", vocab_size=151936, hidden_size=2048, intermediate_size=6144,
                       num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8, head_dim=128,
                       tie_word_embeddings=True, **_COMMON),
    "qwen3-8b": dict(arch="Qwen3ForCausalLM", vocab_size=151936, hidden_size=4096, intermediate_size=12288,
                     num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                     tie_word_embeddings=False, **_COMMON),
    "tiny": dict(arch="Qwen3ForCausalLM", vocab_size=600, hidden_size=64, intermediate_size=128,
                 num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                 max_position_embeddings=2048, rope_theta=10000.0, tie_word_embeddings=False, rms_norm_eps=1e-6),
    "tiny-llama": dict(arch="LlamaForCausalLM", vocab_size=500, hidden_size=48, intermediate_size=96,
                       num_hidden_layers=2, num_attention_heads=6, num_key_value_heads=2, head_dim=8,
                       max_position_embeddings=2048, rope_theta=10000.0, tie_word_embeddings=True, rms_norm_eps=1e-5),
}


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", type=Path, help="checkpoint folder (config.json + *.safetensors)")
    p.add_argument("--shape", default="smollm2", choices=sorted(SHAPES), help="random weights of this shape (no --model)")
    p.add_argument("--out", type=Path, required=True, help="folder for graph_floor.json")
    p.add_argument("--context", type=int, default=512, help="tokens already in the KV cache")
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--dtype", default=None, choices=["bfloat16", "float16", "float32"],
                   help="default bfloat16 on CUDA, float32 on the CPU")
    p.add_argument("--attention", default="matmul", choices=["matmul", "sdpa"],
                   help="the reference's attention (matmul: torch.compile fuses it; SmolLM2 on the H200: "
                        "1.05 ms compiled decode against 1.91 ms with SDPA)")
    p.add_argument("--compile-mode", default="default", help='torch.compile mode ("default", "max-autotune-no-cudagraphs")')
    p.add_argument("--compile", dest="compile", action="store_true", default=None, help="compile on the CPU too")
    p.add_argument("--no-compile", dest="compile", action="store_false")
    p.add_argument("--iters", type=int, default=200, help="timed replays per reference figure")
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--engine-steps", type=int, default=64, help="decode steps timed for the engine")
    p.add_argument("--verify-iters", type=int, default=50, help="timed engine verify forwards")
    p.add_argument("--attention-backend", default=None, help="engine attention backend (default: the engine's)")
    p.add_argument("--cuda-graph-max-bs", type=int, default=8, help="engine graph buckets (small: quick capture)")
    p.add_argument("--disable-cuda-graph", action="store_true", help="engine without CUDA graphs")
    p.add_argument("--skip-engine", action="store_true")
    p.add_argument("--time-budget", type=float, default=150.0, help="seconds for everything, compile included")
    args = p.parse_args(argv)
    args.dtype = args.dtype or ("bfloat16" if args.device == "cuda" else "float32")
    if args.compile is None:
        args.compile = args.device == "cuda"
    return args


# ----------------------------------------------------------------------------- checkpoint


def write_random_checkpoint(folder: Path, shape: dict, dtype, device: str, seed: int = 0) -> Path:
    """config.json + model.safetensors with HF names, random weights made on `device`."""
    import torch
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    cfg = {k: v for k, v in shape.items() if k != "arch"}
    arch = shape["arch"]
    cfg.update(architectures=[arch], model_type="qwen3" if arch.startswith("Qwen3") else "llama",
               hidden_act="silu", torch_dtype=str(dtype).replace("torch.", ""), eos_token_id=2, bos_token_id=1,
               attention_bias=False)
    (folder / "config.json").write_text(json.dumps(cfg, indent=2))
    gen = torch.Generator(device=device).manual_seed(seed)
    h, inter, d = cfg["hidden_size"], cfg["intermediate_size"], cfg["head_dim"]
    heads, kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]

    def rand(*size, std=0.02):
        return (torch.randn(*size, generator=gen, device=device, dtype=torch.float32) * std).to(dtype).cpu()

    def norm(n):
        return (1.0 + torch.randn(n, generator=gen, device=device) * 0.1).to(dtype).cpu()

    t = {"model.embed_tokens.weight": rand(cfg["vocab_size"], h, std=0.5), "model.norm.weight": norm(h)}
    for i in range(cfg["num_hidden_layers"]):
        pre = f"model.layers.{i}."
        t[pre + "input_layernorm.weight"] = norm(h)
        t[pre + "post_attention_layernorm.weight"] = norm(h)
        # NOTE: q/k at 1/sqrt(hidden), so attention is far from uniform and RoPE/masking errors show
        t[pre + "self_attn.q_proj.weight"] = rand(heads * d, h, std=h ** -0.5)
        t[pre + "self_attn.k_proj.weight"] = rand(kv * d, h, std=h ** -0.5)
        t[pre + "self_attn.v_proj.weight"] = rand(kv * d, h)
        t[pre + "self_attn.o_proj.weight"] = rand(h, heads * d)
        if arch.startswith("Qwen3"):
            t[pre + "self_attn.q_norm.weight"] = norm(d)
            t[pre + "self_attn.k_norm.weight"] = norm(d)
        t[pre + "mlp.gate_proj.weight"] = rand(inter, h)
        t[pre + "mlp.up_proj.weight"] = rand(inter, h)
        t[pre + "mlp.down_proj.weight"] = rand(h, inter)
    if not cfg["tie_word_embeddings"]:
        t["lm_head.weight"] = rand(cfg["vocab_size"], h)
    save_file(t, str(folder / "model.safetensors"), metadata={"format": "pt"})
    return folder


def read_weights(folder: Path, dtype, device) -> dict:
    import torch
    from safetensors import safe_open

    from sglaunch.engine.model_spec import find_weight_files

    out = {}
    for file in find_weight_files(str(folder)):
        with safe_open(str(file), framework="pt", device=str(device)) as handle:
            for name in handle.keys():
                out[name] = handle.get_tensor(name).to(dtype)
    torch.cuda.synchronize() if torch.device(device).type == "cuda" else None
    return out


# ----------------------------------------------------------------------------- the reference


class Reference:
    """The model's forward in plain PyTorch over a static KV cache of `max_len` slots per layer."""

    def __init__(self, spec, weights: dict, max_len: int, dtype, device, attention: str):
        import torch

        self.torch, self.dtype, self.device, self.attention = torch, dtype, torch.device(device), attention
        self.heads, self.kv_heads, self.d = spec.num_heads, spec.num_kv_heads, spec.head_dim
        self.group, self.eps, self.qk_norm = spec.num_heads // spec.num_kv_heads, spec.rms_norm_eps, spec.qk_norm
        if spec.rope_type == "llama3":
            raise ValueError("the reference implements default and linear RoPE only")
        w = weights
        self.embed = w["model.embed_tokens.weight"]
        self.final_norm = w["model.norm.weight"]
        self.lm_head = self.embed if spec.tie_word_embeddings else w["lm_head.weight"]
        self.layers = []
        for i in range(spec.num_layers):
            pre = f"model.layers.{i}."
            a, m = pre + "self_attn.", pre + "mlp."
            qkv_b = [w.get(a + f"{n}_proj.bias") for n in "qkv"]
            layer = dict(
                ln1=w[pre + "input_layernorm.weight"], ln2=w[pre + "post_attention_layernorm.weight"],
                wqkv=torch.cat([w[a + "q_proj.weight"], w[a + "k_proj.weight"], w[a + "v_proj.weight"]]).contiguous(),
                bqkv=torch.cat(qkv_b) if qkv_b[0] is not None else None,
                wo=w[a + "o_proj.weight"], bo=w.get(a + "o_proj.bias"),
                wgu=torch.cat([w[m + "gate_proj.weight"], w[m + "up_proj.weight"]]).contiguous(),
                wdown=w[m + "down_proj.weight"],
                qn=w.get(a + "q_norm.weight"), kn=w.get(a + "k_norm.weight"),
                k=torch.zeros(self.kv_heads, max_len, self.d, dtype=dtype, device=device),
                v=torch.zeros(self.kv_heads, max_len, self.d, dtype=dtype, device=device),
            )
            self.layers.append(layer)
        half = torch.arange(0, self.d, 2, dtype=torch.float32) / self.d
        inv_freq = 1.0 / (spec.rope_theta ** half)
        if spec.rope_type == "linear":
            inv_freq = inv_freq / dict(spec.rope_scaling)["factor"]
        angles = torch.arange(max_len, dtype=torch.float32)[:, None] * inv_freq[None, :]
        angles = torch.cat([angles, angles], dim=-1)
        self.cos, self.sin = angles.cos().to(device), angles.sin().to(device)
        self.key_pos = torch.arange(max_len, device=device)
        self.scale = 1.0 / math.sqrt(self.d)

    def _rms(self, x, weight):
        x32 = x.float()
        x32 = x32 * self.torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return weight * x32.to(x.dtype)

    def _rope(self, x, cos, sin):
        half = self.d // 2
        rotated = self.torch.cat([-x[..., half:], x[..., :half]], dim=-1)
        return x * cos + rotated * sin

    def _attend(self, q, layer, visible):
        """q [T, H, d] -> [T, H * d] over the whole static cache; `visible` [T, max_len] bool."""
        torch, F = self.torch, self.torch.nn.functional
        t, kvh, g, d = q.shape[0], self.kv_heads, self.group, self.d
        # GQA without copying K/V: the g query heads of one KV head become g * t query rows
        qg = q.view(t, kvh, g, d).permute(1, 2, 0, 3).reshape(kvh, g * t, d)
        mask = visible.repeat(g, 1)  # row g_i * t + t_i
        if self.attention == "sdpa":
            out = F.scaled_dot_product_attention(qg.unsqueeze(0), layer["k"].unsqueeze(0), layer["v"].unsqueeze(0),
                                                 attn_mask=mask.unsqueeze(0).unsqueeze(0))[0]
        else:
            scores = torch.matmul(qg, layer["k"].transpose(1, 2)).float() * self.scale
            scores = scores.masked_fill(~mask.unsqueeze(0), float("-inf"))
            out = torch.matmul(scores.softmax(-1).to(q.dtype), layer["v"])
        return out.view(kvh, g, t, d).permute(2, 0, 1, 3).reshape(t, kvh * g * d)

    def forward(self, ids, pos):
        """ids, pos [T] int64 -> logits [T, vocab]; writes K/V of the T tokens at their positions."""
        torch, F = self.torch, self.torch.nn.functional
        t, h, kvh, d = ids.shape[0], self.heads, self.kv_heads, self.d
        x = F.embedding(ids, self.embed)
        cos = self.cos[pos].unsqueeze(1).to(x.dtype)  # [T, 1, d]
        sin = self.sin[pos].unsqueeze(1).to(x.dtype)
        visible = self.key_pos.unsqueeze(0) <= pos.unsqueeze(1)  # [T, max_len]
        for layer in self.layers:
            y = self._rms(x, layer["ln1"])
            qkv = F.linear(y, layer["wqkv"], layer["bqkv"])
            q, k, v = qkv.split([h * d, kvh * d, kvh * d], dim=-1)
            q, k, v = q.view(t, h, d), k.view(t, kvh, d), v.view(t, kvh, d)
            if self.qk_norm:
                q, k = self._rms(q, layer["qn"]), self._rms(k, layer["kn"])
            q, k = self._rope(q, cos, sin), self._rope(k, cos, sin)
            layer["k"].index_copy_(1, pos, k.transpose(0, 1))
            layer["v"].index_copy_(1, pos, v.transpose(0, 1))
            x = x + F.linear(self._attend(q, layer, visible), layer["wo"], layer["bo"])
            y = self._rms(x, layer["ln2"])
            gate, up = F.linear(y, layer["wgu"]).chunk(2, dim=-1)
            x = x + F.linear(F.silu(gate) * up, layer["wdown"])
        return F.linear(self._rms(x, self.final_norm), self.lm_head)

    def step(self, ids, pos):
        """The whole step: forward + greedy argmax -> (tokens [T], logits [T, vocab])."""
        logits = self.forward(ids, pos)
        return logits.argmax(dim=-1), logits


class StaticStep:
    """One step shape (T query tokens) with static ids/positions; on CUDA captured as ONE graph."""

    def __init__(self, fn, ids: list[int], positions: list[int], device, use_graph: bool):
        import torch

        self.torch, self.fn, self.graph = torch, fn, None
        self.ids = torch.tensor(ids, dtype=torch.int64, device=device)
        self.pos = torch.tensor(positions, dtype=torch.int64, device=device)
        with torch.inference_mode():
            for _ in range(3):  # warm-up: compile, autotune, cuBLAS handles, outside the capture
                self.out = fn(self.ids, self.pos)
            if use_graph:
                torch.cuda.synchronize()
                side = torch.cuda.Stream()
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    self.out = fn(self.ids, self.pos)
                torch.cuda.current_stream().wait_stream(side)
                torch.cuda.synchronize()
                self.graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(self.graph):
                    self.out = fn(self.ids, self.pos)
                torch.cuda.synchronize()

    def __call__(self):
        if self.graph is not None:
            self.graph.replay()
        else:
            with self.torch.inference_mode():
                self.out = self.fn(self.ids, self.pos)
        return self.out


def time_calls(fn, iters: int, warmup: int, cuda: bool) -> dict:
    """Median (min, p90) seconds of fn(); CUDA events around each call on a GPU."""
    import torch

    for _ in range(warmup):
        fn()
    times = []
    if cuda:
        torch.cuda.synchronize()
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(iters)]
        for start, end in events:
            start.record()
            fn()
            end.record()
        torch.cuda.synchronize()
        times = [s.elapsed_time(e) / 1e3 for s, e in events]
    else:
        for _ in range(iters):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    times.sort()
    return {"median_s": statistics.median(times), "min_s": times[0], "p90_s": times[int(0.9 * (len(times) - 1))],
            "n": len(times)}


def reference_greedy(ref: Reference, prompt: list[int], new_tokens: int, device) -> tuple[list[int], object]:
    """Eager prefill of `prompt`, then greedy decode; -> (new tokens, prefill logits of the last row)."""
    import torch

    with torch.inference_mode():
        ids = torch.tensor(prompt, dtype=torch.int64, device=device)
        tokens, logits = ref.step(ids, torch.arange(len(prompt), device=device))
        out, last = [int(tokens[-1])], logits[-1].float().cpu()
        for i in range(new_tokens - 1):
            pos = torch.tensor([len(prompt) + i], device=device)
            tokens, _ = ref.step(torch.tensor([out[-1]], device=device), pos)
            out.append(int(tokens[0]))
    return out, last


# ----------------------------------------------------------------------------- the engine


def engine_config(path: Path, args):
    from sglaunch.config import EngineConfig

    options = {}
    if args.attention_backend:
        options["attention_backend"] = args.attention_backend
    if args.disable_cuda_graph:
        options["disable_cuda_graph"] = True
    if args.device == "cuda":
        options["cuda_graph_max_bs"] = args.cuda_graph_max_bs
    # NOTE: a small pool cap: on a GPU the KV pool would otherwise take 85% of the memory
    tokens = max(4096, 4 * (args.context + 64))
    return EngineConfig(model_path=str(path), tokenizer_path=str(path), served_model_name="graph-floor",
                        dtype=args.dtype, kv_cache_dtype=args.dtype, context_length=None, max_total_tokens=tokens,
                        disable_radix_cache=True, device=args.device, **options)


def engine_greedy(engine, prompt: list[int], new_tokens: int) -> list[int]:
    from sglaunch.engine.interface import GenerateRequest, SamplingParams
    from sglaunch.engine.launch import run_requests

    sampling = SamplingParams(max_new_tokens=new_tokens, temperature=0.0, ignore_eos=True)
    done = run_requests(engine, [GenerateRequest(f"check-{time.monotonic_ns()}", tuple(prompt), sampling)])
    return list(done.values())[0].token_ids


def engine_verify(engine, context: list[int], verify: list[int], iters: int, warmup: int, cuda: bool) -> dict:
    """ModelRunner.forward (+ argmax) on a hand-built 8-token verify StepInput for one request,
    after a prefill of `context` through ModelRunner.forward; pages borrowed from the allocator."""
    import torch

    from sglaunch.engine.step import StepInput

    runner, page = engine.runner, engine.config.page_size
    c, n = len(context), len(verify)
    pages = engine.allocator.alloc(math.ceil((c + n) / page))
    if pages is None:
        raise ValueError("the engine's KV pool has no room for the verify probe")
    try:
        prefill = StepInput(list(context), list(range(c)), [c], [c], [pages[: math.ceil(c / page)]], [c - 1])
        runner.forward(prefill)
        step = StepInput(list(verify), list(range(c, c + n)), [n], [c + n], [pages], list(range(n)))
        before = dict(runner.graphs.replays) if runner.graphs is not None else None
        logits = runner.forward(step)
        first = logits.float().cpu()

        def call():
            return runner.forward(step).argmax(dim=-1)

        timing = time_calls(call, iters, warmup, cuda)
        replays = runner.graphs.replays["verify"] - before["verify"] if before is not None else 0
        timing.update(graph_replays=replays, graph=replays > 0,
                      how="ModelRunner.forward + argmax on a hand-built StepInput (8 query tokens, one request) "
                          f"after a {c}-token prefill through ModelRunner.forward; "
                          + ("replays the engine's verify CUDA graph" if replays else "eager (no verify graph)"))
        return {"timing": timing, "logits": first}
    finally:
        engine.allocator.free(pages)
        if cuda:
            torch.cuda.synchronize()


# ----------------------------------------------------------------------------- main


def table_lines(result: dict) -> list[str]:
    def ms(entry):
        return f"{1e3 * entry['median_s']:8.3f}" if entry and "median_s" in entry else f"{'-':>8s}"

    lines = [f"{result['model']} ({result['dtype']}, context {result['context']}, {result['device']})",
             f"{'step':8s} {'floor ms':>8s} {'eager-1g':>8s} {'engine':>8s} {'eng/floor':>9s} {'eng/eager':>9s}"]
    for kind in ("decode", "verify"):
        floor, eager = result["floor"].get(kind), result["eager_graph"].get(kind)
        engine = result["engine"].get(kind)
        ratio = lambda a, b: f"{a['median_s'] / b['median_s']:8.2f}x" if a and b and "median_s" in a and "median_s" in b else f"{'-':>9s}"  # noqa: E731
        lines.append(f"{kind:8s} {ms(floor)} {ms(eager)} {ms(engine)} {ratio(engine, floor)} {ratio(engine, eager)}")
    notes = result.get("notes", [])
    return lines + [f"note: {n}" for n in notes]


def main(argv=None) -> int:
    args = parse_args(argv)
    start = time.monotonic()
    deadline = start + args.time_budget

    def left() -> float:
        return deadline - time.monotonic()

    import torch

    from sglaunch.engine.model_spec import load_model_spec

    cuda = args.device == "cuda"
    if cuda and not torch.cuda.is_available():
        log("no CUDA device: use --device cpu")
        return 2
    if cuda:
        if args.attention_backend == "flashinfer" and not args.disable_cuda_graph:
            # NOTE: no drafter here; this makes the engine capture verify graphs of window 8
            os.environ.setdefault("SGLAUNCH_VERIFY_GRAPH_WINDOW", str(VERIFY_TOKENS))
    dtype = getattr(torch, args.dtype)
    args.out.mkdir(parents=True, exist_ok=True)
    out_file = args.out / "graph_floor.json"
    result = {"model": str(args.model) if args.model else f"random {args.shape}", "device": args.device,
              "dtype": args.dtype, "context": args.context, "verify_tokens": VERIFY_TOKENS,
              "attention": args.attention, "compile_mode": args.compile_mode if args.compile else None,
              "engine_options": {"attention_backend": args.attention_backend, "disable_cuda_graph": args.disable_cuda_graph,
                                 "verify_graph_window": os.environ.get("SGLAUNCH_VERIFY_GRAPH_WINDOW")},
              "torch": torch.__version__, "gpu": torch.cuda.get_device_name() if cuda else None,
              "floor": {}, "eager_graph": {}, "engine": {}, "check": {}, "notes": [], "errors": []}

    def save() -> None:
        result["wall_s"] = time.monotonic() - start
        out_file.write_text(json.dumps(result, indent=2))

    def skip(what: str, need: float) -> bool:
        if left() >= need:
            return False
        result["notes"].append(f"{what} skipped: {left():.0f} s of the time budget left")
        log(result["notes"][-1])
        return True

    tmp = tempfile.TemporaryDirectory()
    engine = cluster = None
    try:
        folder = args.model
        if folder is None:
            folder = write_random_checkpoint(Path(tmp.name) / args.shape, SHAPES[args.shape], dtype, args.device)
        spec = load_model_spec(str(folder))
        result["shape"] = {k: getattr(spec, k) for k in ("family", "vocab_size", "hidden_size", "intermediate_size",
                                                         "num_layers", "num_heads", "num_kv_heads", "head_dim")}
        weights = read_weights(folder, dtype, args.device)
        result["parameters"] = sum(t.numel() for t in weights.values())
        # NOTE: slots past context + 8 stay masked; a multiple of 16 keeps SDPA's mask rows aligned
        max_len = -(-(args.context + VERIFY_TOKENS) // 16) * 16
        result["cache_slots"] = max_len
        ref = Reference(spec, weights, max_len, dtype, args.device, args.attention)
        del weights
        gen = torch.Generator().manual_seed(1)
        context = torch.randint(3, spec.vocab_size, (args.context,), generator=gen).tolist()
        verify = torch.randint(3, spec.vocab_size, (VERIFY_TOKENS,), generator=gen).tolist()
        log(f"{result['model']}: {result['parameters'] / 1e6:.1f}M parameters ready after {time.monotonic() - start:.1f} s")

        # -- the correctness check (eager reference), then the reference's KV cache holds `context`
        ref_tokens, ref_last = reference_greedy(ref, context, CHECK_TOKENS, args.device)
        with torch.inference_mode():
            ref.step(torch.tensor(context, device=args.device), torch.arange(args.context, device=args.device))
            vpos = torch.arange(args.context, args.context + VERIFY_TOKENS, device=args.device)
            ref_verify = ref.step(torch.tensor(verify, device=args.device), vpos)[1].float().cpu()
        result["check"]["reference_tokens"] = ref_tokens

        # -- the engine
        if not args.skip_engine and not skip("engine", 30):
            try:
                from gpu_decode import decode_step_seconds  # noqa: E402 (benchmarks/ on sys.path)
            except ImportError:
                sys.path.insert(0, str(HERE))
                from gpu_decode import decode_step_seconds
            from sglaunch.engine.launch import create_engine

            t0, threads = time.monotonic(), torch.get_num_threads()
            engine, cluster = create_engine(engine_config(folder, args))
            result["engine"]["setup_s"] = time.monotonic() - t0
            log(f"engine ready in {result['engine']['setup_s']:.1f} s")
            eng_tokens = engine_greedy(engine, context, CHECK_TOKENS)  # also the warm-up
            same = next((i for i, (a, b) in enumerate(zip(eng_tokens, ref_tokens)) if a != b), len(ref_tokens))
            result["check"].update(engine_tokens=eng_tokens, greedy_tokens_equal=eng_tokens == ref_tokens,
                                   greedy_matching_prefix=same)
            dec = decode_step_seconds(engine, context, args.engine_steps)
            dec["how"] = f"median engine.step() of a batch-1 greedy generation over a {args.context}-token prompt"
            result["engine"]["decode"] = dec
            save()
            ver = engine_verify(engine, context, verify, args.verify_iters, min(args.warmup, 10), cuda)
            result["engine"]["verify"] = ver["timing"]
            diff = (ver["logits"] - ref_verify).abs().max().item()
            result["check"].update(verify_max_abs_logit_diff=diff,
                                   verify_logit_scale=ref_verify.abs().max().item(),
                                   verify_argmax_equal=(ver["logits"].argmax(-1) == ref_verify.argmax(-1)).tolist())
            log(f"engine: decode {1e3 * dec['median_s']:.3f} ms, verify {1e3 * ver['timing']['median_s']:.3f} ms; "
                f"check: greedy {same}/{len(ref_tokens)} equal, verify logits max |diff| {diff:.3g}")
            save()
            cluster.stop(engine)
            engine = cluster = None
            torch.set_num_threads(threads)  # NOTE: a CPU engine sets the thread count of this thread
            if cuda:
                torch.cuda.empty_cache()

        # -- the reference, one graph per step shape: eager kernels, then torch.compile'd
        shapes = {"decode": ([verify[0]], [args.context]),
                  "verify": (verify, list(range(args.context, args.context + VERIFY_TOKENS)))}
        variants = [("eager_graph", False)] + ([("floor", True)] if args.compile else [])
        if not args.compile:
            result["notes"].append("no torch.compile: the floor row is the eager reference"
                                   + (" (CPU: no CUDA graph)" if not cuda else ""))
        for key, compiled in variants:
            fn, label = ref.step, "eager"
            if compiled:
                if skip("torch.compile", 25):
                    break
                try:
                    import torch._dynamo

                    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 16)
                    fn = torch.compile(ref.step, mode=None if args.compile_mode == "default" else args.compile_mode,
                                       dynamic=False, fullgraph=False)
                    label = f"torch.compile {args.compile_mode}"
                except Exception as exc:  # noqa: BLE001
                    result["notes"].append(f"torch.compile unavailable ({exc!r}): eager kernels")
                    log(result["notes"][-1])
            for kind, (ids, positions) in shapes.items():
                if skip(f"{key} {kind}", 10):
                    continue
                t0 = time.monotonic()
                try:
                    static = StaticStep(fn, ids, positions, args.device, use_graph=cuda)
                except Exception as exc:  # noqa: BLE001 - compile or capture failed: eager, said so
                    if fn is ref.step:
                        raise
                    traceback.print_exc()
                    result["notes"].append(f"{key} {kind}: {label} failed ({type(exc).__name__}: {exc}); eager kernels")
                    log(result["notes"][-1])
                    fn, label = ref.step, "eager (compile failed)"
                    static = StaticStep(fn, ids, positions, args.device, use_graph=cuda)
                build_s = time.monotonic() - t0
                timing = time_calls(static, args.iters, args.warmup, cuda)
                tokens, logits = static()
                if kind == "verify":
                    timing["argmax_equal_eager"] = (logits.float().cpu().argmax(-1) == ref_verify.argmax(-1)).tolist()
                timing.update(build_s=build_s, kernels=label, one_cuda_graph=static.graph is not None)
                result[key][kind] = timing
                log(f"{key} {kind}: {1e3 * timing['median_s']:.3f} ms ({label}, "
                    f"{'one CUDA graph' if static.graph is not None else 'no graph'}; built in {build_s:.1f} s)")
                save()
                del static
        if not args.compile:
            result["floor"] = dict(result["eager_graph"])
    except Exception as exc:  # noqa: BLE001 - recorded; the table shows what was measured
        traceback.print_exc()
        result["errors"].append(f"{type(exc).__name__}: {exc}")
    finally:
        if cluster is not None:
            cluster.stop(engine)
        tmp.cleanup()
    result["table"] = table_lines(result)
    save()
    print("\n".join(result["table"]))
    return 1 if result["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
