"""The declarative flag schema: every SGLang launch flag of every release we follow, with its history.

`SCHEMA` is the single source of truth for `serve`, `check-config`, `migrate-flags`, the
`--help` text and `docs/flags.md`. It has two layers:

- the facts, generated from SGLang's own released wheels (`sglaunch/flags/sglang/<release>.json`,
  written by `python -m sglaunch.flags.extract`): every flag, alias and deprecated spelling of
  each release, its type, nargs, choices and default, hence when each flag and value came and went;
- `HAND_FLAGS` below: what the data cannot say: how our engine supports a flag, renames without
  alias (the release only shows a flag vanishing), meaning changes, migration notes, value
  replacements, our own defaults. `sglaunch.flags.timeline.merge` lays it over the facts, and
  `tests/flags/test_schema_layers.py` fails where the two disagree.

Declarations only: no logic lives here.
"""

from __future__ import annotations

from sglaunch.flags.spec import EnvVar, Flag, FlagSchema, Kind, Support, ValueChange
from sglaunch.flags.timeline import load_generated, merge
from sglaunch.releases import KNOWN_RELEASES

STR, INT, FLOAT, BOOL, LIST = Kind.STR, Kind.INT, Kind.FLOAT, Kind.BOOL, Kind.LIST
ENGINE, FRONTEND, COMPAT = Support.ENGINE, Support.FRONTEND, Support.COMPAT


def _group(name: str, *flags: Flag) -> tuple[Flag, ...]:
    """Stamp a group name on a run of declarations (keeps each declaration short)."""
    from dataclasses import replace

    return tuple(replace(f, group=name) for f in flags)


QOQ_REMOVED = ValueChange(
    "qoq",
    note="the QServe (QoQ) W4A8 path is gone (#31109) and nothing replaces it; re-quantize the "
    "checkpoint with a supported method (e.g. awq, gptq, fp8) or serve it unquantized",
)

HAND_FLAGS: tuple[Flag, ...] = (
    *_group(
        "Model and tokenizer",
        Flag("--model-path", STR, "Local checkpoint folder (or hub id) of the target model.",
             aliases=("--model",), metavar="PATH", support=ENGINE),
        Flag("--tokenizer-path", STR, "Tokenizer folder when it differs from --model-path.",
             metavar="PATH", support=ENGINE),
        Flag("--revision", STR, "Hub revision of the model.", metavar="REV", support=COMPAT,
             engine_note="sglaunch loads local checkpoint folders; the revision is not used"),
        Flag("--dtype", STR, "Weight and activation dtype; auto takes the checkpoint's dtype.",
             default="auto",
             support=ENGINE),
        Flag("--context-length", INT, "Maximum context length; default from the model config.",
             support=ENGINE),
        Flag("--served-model-name", STR, "Model name reported by the API; default the model path.",
             support=ENGINE),
        Flag("--trust-remote-code", BOOL, "Allow custom model code from the hub.", default=False,
             support=COMPAT, engine_note="sglaunch runs only its built-in architectures"),
        Flag("--chat-template", STR, "Chat template file or built-in name overriding the tokenizer's.",
             support=ENGINE),
        Flag("--skip-tokenizer-init", BOOL, "Accept and return token ids only.", default=False,
             support=COMPAT),
        Flag("--load-format", STR, "Checkpoint format to load.", default="auto", support=COMPAT),
    ),
    *_group(
        "HTTP server",
        Flag("--host", STR, "Address the HTTP server binds.", default="127.0.0.1", support=ENGINE),
        Flag("--port", INT, "Port of the HTTP server.", default=30000, support=ENGINE),
        Flag("--api-key", STR, "Bearer token required on every route except /health.", support=ENGINE),
        Flag("--max-request-body-mb", FLOAT, "Largest request body in MiB; larger ones get 413 "
             "(sglaunch only).", default=8.0, metavar="MIB", support=ENGINE, sglaunch_only=True),
        Flag("--graceful-shutdown-timeout", FLOAT, "Seconds running requests may finish after SIGTERM "
             "or SIGINT; the rest then end with finish_reason abort (sglaunch only).", default=20.0,
             metavar="SECONDS", support=ENGINE, sglaunch_only=True),
        Flag("--enable-metrics", BOOL, "Expose Prometheus metrics at /metrics.", default=False,
             support=ENGINE),
        Flag("--tokenizer-worker-num", INT, "HTTP worker processes (tokenize, detokenize, stream) in "
             "front of the one engine process, all accepting on the one port; raise it when the "
             "server process, not the engine, limits streamed tokens per second.", default=1,
             metavar="N", support=ENGINE),
        Flag("--stream-interval", INT, "Send a request's output to the HTTP server every N new tokens "
             "(always its first token and its end): fewer, larger stream events, less server work per "
             "token; 1 streams every token as it is decoded.", default=1, metavar="N", support=ENGINE),
        Flag("--log-level", STR, "Log level.", default="info", support=ENGINE),
        Flag("--random-seed", INT, "Seed for sampling.", support=ENGINE),
        Flag("--stream-output", BOOL, "Stream incremental output.", default=False,
             replaced_by="--incremental-streaming-output", support=COMPAT),
        Flag("--incremental-streaming-output", BOOL, "Stream incremental output.", default=False, support=COMPAT),
        Flag("--enable-response-store", BOOL, "Store Responses-API results (opt-in since 0.5.20).",
             default=False, support=COMPAT),
        Flag("--tool-call-parser", STR, "Parser for tool calls in model output.",
             values=(ValueChange("qwen25", alias_of="qwen"), ValueChange("glm45", alias_of="glm")),
             support=COMPAT),
    ),
    *_group(
        "Parallelism",
        Flag("--tp-size", INT, "Tensor-parallel size (total across nodes).", default=1,
             aliases=("--tensor-parallel-size",), support=ENGINE),
        Flag("--dp-size", INT, "Data-parallel size.", default=1, aliases=("--data-parallel-size",),
             support=COMPAT, engine_note="sglaunch runs one data-parallel replica"),
        Flag("--pp-size", INT, "Pipeline-parallel size.", default=1,
             aliases=("--pipeline-parallel-size",), support=COMPAT,
             engine_note="sglaunch runs pipeline-parallel size 1 only"),
        Flag("--ep-size", INT, "Expert-parallel size.", default=1, aliases=("--ep", "--expert-parallel-size"),
             support=COMPAT),
        Flag("--enable-dp-attention", BOOL, "Data-parallel attention with tensor-parallel MoE.",
             default=False, support=COMPAT),
        Flag("--enable-dp-lm-head", BOOL, "Vocab-parallel LM head across the attention-TP group "
             "(required by DSpark with DP attention).", default=False, support=COMPAT),
        Flag("--attn-cp-size", INT, "Attention context-parallel size.", default=1, support=COMPAT),
    ),
    *_group(
        "Multi-node",
        Flag("--nnodes", INT, "Number of nodes; run the same command on each.", default=1, support=ENGINE),
        Flag("--node-rank", INT, "Rank of this node, 0..nnodes-1; node 0 serves HTTP.", default=0,
             support=ENGINE),
        Flag("--dist-init-addr", STR, "host:port of node 0 for torch.distributed rendezvous.",
             aliases=("--nccl-init-addr",), metavar="HOST:PORT", support=ENGINE),
        Flag("--device", STR, "Device type; default cuda when a GPU is visible, else cpu.", support=ENGINE),
        Flag("--base-gpu-id", INT, "First GPU index this node uses.", default=0, support=ENGINE),
    ),
    *_group(
        "Memory and scheduling",
        Flag("--mem-fraction-static", FLOAT, "Fraction of GPU memory for weights and the KV pool.",
             support=ENGINE),
        Flag("--max-running-requests", INT, "Maximum concurrently running requests.", support=ENGINE),
        Flag("--max-total-tokens", INT, "KV pool size in tokens (default: from memory on GPUs, "
             "a fixed pool on CPUs).", support=ENGINE),
        Flag("--chunked-prefill-size", INT, "Maximum prefill tokens per step; -1 disables chunking.",
             support=ENGINE),
        Flag("--page-size", INT, "Tokens per KV-cache page.", default=1,
             default_differs="SGLang leaves it unset and the attention backend picks; sglaunch's "
             "backends use 1 unless told otherwise", support=ENGINE),
        Flag("--disable-radix-cache", BOOL, "Turn off prefix reuse across requests.", default=False,
             support=ENGINE),
        Flag("--kv-cache-dtype", STR, "KV cache dtype; auto follows --dtype.", default="auto",
             sglaunch_values=("fp16", "float16", "fp32", "float32"), support=ENGINE),
        Flag("--schedule-policy", STR, "Scheduling policy for waiting requests.", default="fcfs", support=COMPAT),
        Flag("--optimistic-prefill-retries", INT, "Re-queue attempts for optimistic prefill.",
             default=0, replaced_by="--optimistic-prefill-attempts",
             meaning_changed=True, support=COMPAT,
             note="0.5.16 counts all optimistic forward passes (retries=1 allowed two passes) and "
             "parks a request that runs out instead of requeueing it; N+1 attempts is the closest "
             "value but equivalence is not confirmed upstream (#30951)"),
        Flag("--optimistic-prefill-attempts", INT, "Total optimistic prefill forward passes before "
             "a request is parked.", default=0, support=COMPAT),
    ),
    *_group(
        "Kernels and backends",
        Flag("--attention-backend", STR, "Attention kernels; auto picks flashinfer on CUDA when "
             "installed, else torch.", default="auto", sglaunch_values=("auto", "torch"),
             default_differs="SGLang leaves it unset and picks by platform; sglaunch spells that auto",
             values=(ValueChange("cutlass_mla", replacement="trtllm_mla",
                                 note="the CUTLASS MLA kernels were deleted in 0.5.20"),
                     ValueChange("dual_chunk_flash_attn", replacement="fa3",
                                 note="the dual-chunk flash-attention kernels were deleted in 0.5.20"),
                     ValueChange("compressed", alias_of="dsv4"), ValueChange("nsa", alias_of="dsa")),
             support=ENGINE, engine_note="sglaunch implements torch and flashinfer"),
        Flag("--fp4-gemm-backend", STR, "NVFP4 GEMM backend; auto picks by GPU architecture.",
             default="auto",
             values=(ValueChange("cutlass", replacement="auto",
                                 note="the built-in CUTLASS/JIT NVFP4 GEMM was removed (#30448); "
                                 "auto picks flashinfer_cutedsl on SM100, flashinfer_cutlass on "
                                 "SM120 and marlin on SM80-SM90, or name a FlashInfer backend"),),
             support=COMPAT),
        Flag("--fp8-gemm-backend", STR, "FP8 GEMM backend.", default="auto", support=COMPAT),
        Flag("--enable-flashinfer-allreduce-fusion", BOOL, "Fuse all-reduce with residual RMSNorm.",
             default=False, support=COMPAT),
    ),
    *_group(
        "Quantization",
        Flag("--quantization", STR, "Quantization method of the checkpoint.", values=(QOQ_REMOVED,),
             support=COMPAT, engine_note="sglaunch serves unquantized bf16/fp16/fp32 checkpoints"),
        Flag("--speculative-draft-model-quantization", STR, "Quantization method of the draft model.", values=(QOQ_REMOVED,), support=COMPAT),
        Flag("--enable-w4a4-mxfp4-megamoe", BOOL, "W4A4 (MXFP4) MegaMoE; replaces the "
             "SGLANG_OPT_DEEPGEMM_MEGA_MOE_USE_FP4_ACTS variable.", default=False,
             support=COMPAT),
    ),
    *_group(
        "CUDA graphs",
        Flag("--cuda-graph-max-bs", INT, "Largest decode batch captured in a CUDA graph.", replaced_by="--cuda-graph-max-bs-decode", support=COMPAT),
        Flag("--cuda-graph-max-bs-decode", INT, "Largest decode batch captured in a CUDA graph.", support=ENGINE),
        Flag("--cuda-graph-bs", LIST, "Decode batch sizes to capture.", item_kind=INT,
             replaced_by="--cuda-graph-bs-decode", support=COMPAT),
        Flag("--cuda-graph-bs-decode", LIST, "Decode batch sizes to capture.", item_kind=INT,
             support=COMPAT),
        Flag("--disable-cuda-graph", BOOL, "Run without CUDA graphs.", default=False, support=ENGINE),
        Flag("--enable-breakable-cuda-graph", BOOL, "Breakable CUDA graph for prefill.", default=False, replaced_by="--cuda-graph-backend-prefill", value_map=(("true", "breakable"),),
             support=COMPAT),
        Flag("--disable-piecewise-cuda-graph", BOOL, "Turn off piecewise prefill graphs.", default=False, replaced_by="--cuda-graph-backend-prefill", value_map=(("true", "disabled"),),
             support=COMPAT),
        Flag("--enforce-piecewise-cuda-graph", BOOL, "Force piecewise prefill graphs.", default=False, replaced_by="--cuda-graph-backend-prefill",
             value_map=(("true", "tc_piecewise"),), support=COMPAT),
        Flag("--cuda-graph-backend-prefill", STR, "Prefill CUDA-graph backend.", support=COMPAT),
        Flag("--piecewise-cuda-graph-tokens", LIST, "Prefill token counts to capture.", item_kind=INT,
             replaced_by="--cuda-graph-bs-prefill", support=COMPAT),
        Flag("--cuda-graph-bs-prefill", LIST, "Prefill token counts to capture.", item_kind=INT,
             support=COMPAT),
        Flag("--piecewise-cuda-graph-max-tokens", INT, "Largest prefill captured.",
             replaced_by="--cuda-graph-max-bs-prefill", support=COMPAT),
        Flag("--cuda-graph-max-bs-prefill", INT, "Largest prefill captured.",
             support=COMPAT),
        Flag("--piecewise-cuda-graph-compiler", STR, "Compiler for piecewise graphs.",
             replaced_by="--cuda-graph-tc-compiler", support=COMPAT),
        Flag("--cuda-graph-tc-compiler", STR, "Compiler for piecewise graphs.",
             support=COMPAT),
    ),
    *_group(
        "Speculative decoding",
        Flag("--speculative-algorithm", STR, "Speculative decoding algorithm (upper-cased; NEXTN "
             "means EAGLE).", upper_case=True,
             open_choices=True,
             choices=("EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM", "DFLASH", "DSPARK"),
             values=(ValueChange("DSPARK", added="0.5.16"),),
             metavar="ALGO", support=ENGINE, engine_note="sglaunch implements DSPARK"),
        Flag("--speculative-draft-model-path", STR, "Draft model checkpoint folder.",
             aliases=("--speculative-draft-model",), metavar="PATH", support=ENGINE),
        Flag("--speculative-draft-model-revision", STR, "Hub revision of the draft model.",
             support=COMPAT),
        Flag("--speculative-num-steps", INT, "Draft steps per round (DSpark forces 1).", support=ENGINE),
        Flag("--speculative-eagle-topk", INT, "Branching factor of the draft tree (DSpark forces 1).",
             support=ENGINE),
        Flag("--speculative-num-draft-tokens", INT, "Tokens per verify window (DSpark: block size + 1).",
             support=ENGINE),
        Flag("--speculative-moe-a2a-backend", STR, "All-to-all backend of the draft model's MoE.",
             support=COMPAT),
        Flag("--speculative-dflash-block-size", INT, "DFlash block size (must equal "
             "--speculative-num-draft-tokens).", support=COMPAT),
        Flag("--speculative-dflash-draft-window-size", INT, "DFlash draft window.",
             replaced_by="--speculative-draft-window-size", support=COMPAT),
        Flag("--speculative-draft-window-size", INT, "Draft window of block drafters.",
             support=COMPAT),
    ),
    *_group(
        "DSpark",
        Flag("--speculative-dspark-block-size", INT, "Drafted tokens per round (gamma); the verify "
             "window is gamma + 1. Default: the draft checkpoint's block_size.",
             support=ENGINE),
        Flag("--speculative-dspark-sps-table-path", STR, "JSON table of step costs used by the "
             "compact verify scheduler.", metavar="PATH", support=ENGINE),
        Flag("--speculative-dspark-confidence-sts-path", STR, "Per-position temperature scaling "
             "(JSON, one entry per block position) for the confidence head.",
             metavar="PATH", support=ENGINE),
        Flag("--speculative-dspark-align-verify-tokens-to-graph-tier", BOOL, "Round the compact "
             "verify token count up to a captured CUDA-graph tier.", default=False,
             support=ENGINE),
    ),
    *_group(
        "Mixture of experts",
        Flag("--moe-a2a-backend", STR, "All-to-all backend for expert parallelism.", default="none", support=COMPAT),
        Flag("--moe-runner-backend", STR, "MoE kernel backend.", default="auto", support=COMPAT),
        Flag("--enable-deepep-waterfill", BOOL, "Waterfill load balancing for DeepEP (also forced "
             "--moe-a2a-backend deepep).", default=False,
             replaced_by="--enable-waterfill", support=COMPAT,
             note="the old flag also switched --moe-a2a-backend to deepep; --enable-waterfill does "
             "not, so set --moe-a2a-backend deepep (or megamoe) yourself (#27350)"),
        Flag("--enable-waterfill", BOOL, "Waterfill load balancing for the DeepEP and MegaMoE "
             "all-to-all backends (DeepSeek-V3/R1-style models, EP >= 2).", default=False, support=COMPAT),
        Flag("--enable-expert-distribution-metrics", BOOL, "Log expert balancedness.", default=False, replaced_by="--expert-balancedness-report-mode", support=COMPAT),
        Flag("--expert-balancedness-report-mode", STR, "How expert balancedness is reported.", support=COMPAT),
    ),
    *_group(
        "Context parallel and sparse attention",
        Flag("--enable-prefill-cp", BOOL, "Context parallelism for prefill.", default=False, support=COMPAT),
        Flag("--enable-prefill-context-parallel", BOOL, "Old spelling of --enable-prefill-cp.",
             default=False, replaced_by="--enable-prefill-cp",
             support=COMPAT),
        Flag("--enable-nsa-prefill-context-parallel", BOOL, "Old spelling of --enable-prefill-cp.",
             default=False, replaced_by="--enable-prefill-cp",
             support=COMPAT),
        Flag("--cp-strategy", STR, "How prefill tokens are split across context-parallel ranks.", support=COMPAT),
        Flag("--nsa-prefill-cp-mode", STR, "Old spelling of --cp-strategy.",
             replaced_by="--cp-strategy",
             value_map=(("in-seq-split", "zigzag"), ("round-robin-split", "interleave")), support=COMPAT),
        Flag("--enable-dsa-cache-layer-split", BOOL, "Split the DSA KV cache by layer across "
             "context-parallel ranks (needs --enable-prefill-cp --cp-strategy interleave).",
             default=False, support=COMPAT),
        Flag("--disaggregation-transfer-backend", STR, "KV transfer backend for PD disaggregation.",
             default="mooncake", support=COMPAT),
        Flag("--nsa-prefill-backend", STR, "Sparse-attention prefill kernels.",
             replaced_by="--dsa-prefill-backend", support=COMPAT),
        Flag("--nsa-decode-backend", STR, "Sparse-attention decode kernels.",
             replaced_by="--dsa-decode-backend", support=COMPAT),
        Flag("--dsa-prefill-backend", STR, "Sparse-attention prefill kernels.",
             support=COMPAT),
        Flag("--dsa-decode-backend", STR, "Sparse-attention decode kernels.",
             support=COMPAT),
    ),
    *_group(
        "Hybrid and linear-attention models",
        Flag("--enable-gdn-replayssm-spec", BOOL, "ReplaySSM ring spec-verify for GDN hybrid models.",
             default=False,
             replaced_by="--enable-linear-replayssm-spec", support=COMPAT),
        Flag("--enable-linear-replayssm-spec", BOOL, "ReplaySSM ring spec-verify for linear-attention "
             "hybrid models.", default=False, support=COMPAT),
        Flag("--enable-linear-replayssm", BOOL, "Decode-only ReplaySSM.", default=False, support=COMPAT),
        Flag("--linear-replayssm-cache-len", INT, "Ring length of the ReplaySSM cache.", default=16, support=COMPAT),
        Flag("--mamba-scheduler-strategy", STR, "Radix-cache strategy for Mamba models.", replaced_by="--mamba-radix-cache-strategy", support=COMPAT),
        Flag("--mamba-radix-cache-strategy", STR, "Radix-cache strategy for Mamba models.", support=COMPAT),
    ),
    *_group(
        "Deprecated and removed",
        Flag("--prefill-round-robin-balance", BOOL, "Round-robin prefill balancing.", default=False, support=COMPAT, note="removed without replacement in 0.5.20 (#38375)"),
        Flag("--collect-tokens-histogram", BOOL, "Token-count histograms in metrics.", default=False, support=COMPAT, note="removed without replacement in 0.5.20 (#38375)"),
    ),
    *_group(
        "Configuration",
        Flag("--config", STR, "YAML file of flags (kebab-case keys); flags on the command line win.",
             metavar="FILE", support=FRONTEND),
    ),
)

ENV_VARS: tuple[EnvVar, ...] = (
    EnvVar("SGLANG_RAGGED_VERIFY_MODE", "DSpark verify mode: static verifies the whole block, "
           "cap-accept caps acceptance (a lossless test harness), compact packs only planned tokens "
           "(the fast path).", choices=("static", "cap-accept", "compact"), default="static",
           added="0.5.16"),
    EnvVar("SGLANG_DSPARK_CONFIDENCE_RELAY_LAG_STEPS", "DSpark: how many steps old the confidences are "
           "that size a step's verify budget.", default="2", added="0.5.16"),
    EnvVar("SGLANG_DSPARK_RAGGED_CAPTURE_TOKEN_BUCKETS", "DSpark: extra total-token tiers of the captured "
           "ragged verify graphs, comma-separated (e.g. 12,20,48).", added="0.5.16"),
    EnvVar("SGLANG_ENABLE_UNIFIED_RADIX_TREE", "Opt into UnifiedRadixTree (default for SWA, Mamba "
           "and DSA models since 0.5.16, for all models since 0.5.19).", noop_since="0.5.19",
           removed="0.5.21"),
    EnvVar("SGLANG_ENABLE_LOGPROB_CHUNK", "Chunked input-logprob computation (on by default since "
           "0.5.16, which renamed it from SGLANG_ENABLE_LOGITS_PROCESSER_CHUNK).", default="true",
           added="0.5.16"),
    EnvVar("SGLANG_CACHE_DIR", "Root of the JIT and compile caches (all of them since 0.5.18)."),
    EnvVar("SGLANG_ENABLE_MOE_DEFERRED_FINALIZE", "Deferred MoE finalize (on by default in later "
           "releases)."),
    EnvVar("SGLANG_OPT_UNIFIED_CACHE_FREE_OUT_OF_WINDOW_SLOTS", "Free SWA slots out of the window."),
    EnvVar("SGLANG_OPT_DEEPGEMM_MEGA_MOE_USE_FP4_ACTS", "FP4 activations for MegaMoE.", removed="0.5.19",
           replaced_by_flag="--enable-w4a4-mxfp4-megamoe"),
    EnvVar("SGLANG_OPT_DEEPGEMM_MEGA_MOE_USE_MXF4_KIND", "MXF4 kind for MegaMoE.", removed="0.5.19",
           replaced_by_flag="--enable-w4a4-mxfp4-megamoe"),
    EnvVar("SGLANG_USE_SGL_XPU", "XPU kernels from sgl-kernel.", removed="0.5.19"),
    EnvVar("SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION", "Make /health run a generation."),
    EnvVar("CUDA_VISIBLE_DEVICES", "GPUs this process may use."),
    # read once at start-up by sglaunch's own engine (no effect on SGLang)
    EnvVar("SGLAUNCH_DRAFT_CUDA_GRAPH", "CUDA graphs of the DSpark drafter and of the draft-context write "
           "inside the target graphs; on unless 0.", choices=("0", "1"), sglaunch_only=True),
    EnvVar("SGLAUNCH_DRAFT_SAMPLED_GRAPH", "DSpark: a drafting step with a sampled row (T > 0) replays a drafter "
           "CUDA graph that also draws the block (each row's temperature and uniforms as graph inputs), for the "
           "batch sizes whose draft probabilities fit in 64 MiB; on unless 0 (0: the block is drawn eagerly after the "
           "forward's graph).", choices=("0", "1"), sglaunch_only=True),
    EnvVar("SGLAUNCH_DSPARK_STEP_ASIDE", "DSpark decodes plainly at steps where drafting would not pay "
           "(step-cost table and lagged confidences); on unless 0.", choices=("0", "1"), sglaunch_only=True),
    EnvVar("SGLAUNCH_DSPARK_SECOND_CHAIN", "DSpark at T=0: a drafting step of up to 4 requests also verifies a "
           "second chain of N drafts in a window of its own when every row it samples is greedy: the block's "
           "runner-up chain (slot 0's second choice, then greedy), kept where it commits more (a burst verifies a "
           "chain of gamma drafts). Unset: 3 on CUDA, 0 (off) on the CPU. Needs --page-size 1.", sglaunch_only=True,
           at_least=0),
    EnvVar("SGLAUNCH_DSPARK_SAMPLED_CHAIN", "DSpark at T>0: a drafting step of up to 4 requests with a sampled row "
           "also verifies a second chain of N drafts, drawn without the block's first draft and judged by recursive "
           "rejection sampling (the output distribution unchanged); 0 (default) off: with the sampled step eager the "
           "chain measured slower, and drawn inside the drafter's sampled graphs still 0.79x one chain at c=1 (H100, "
           "T=0.7). Needs --page-size 1.", sglaunch_only=True, at_least=0),
    EnvVar("SGLAUNCH_DSPARK_PRICE_GREEDY_CHAIN", "DSpark: the planner's step-aside decision and modelled step time "
           "also count an all-greedy step's second chain (its verify rows and the tokens its wins add, as measured), "
           "as they always do for the sampled chain; off unless 1 (the greedy chain's default was measured without "
           "it).", choices=("0", "1"), sglaunch_only=True),
    EnvVar("SGLAUNCH_DSPARK_BURST", "DSpark bursts: an all-greedy decode batch runs up to N drafting steps "
           "back to back on the device, read back once, when the start-up profile says that beats plain "
           "decoding: 0 off, N iterations at most, auto (default) on CUDA with graphs (8 iterations at most, 4 above "
           "4 requests), off elsewhere.",
           sglaunch_only=True),
    EnvVar("SGLAUNCH_DSPARK_BURST_CHAIN", "DSpark bursts: launch a batch's next burst as soon as this one is "
           "committed, before its outputs are built and sent (when nothing waits and every running request "
           "decodes), so the device does not idle through the host's tail: on unless 0.",
           choices=("0", "1"), sglaunch_only=True),
    EnvVar("SGLAUNCH_DSPARK_SAMPLED_BURST", "DSpark bursts: let a decode batch of up to 8 requests whose sampled "
           "rows set a temperature alone (no top-k, top-p or min-p) burst too, through sampled iterations that draw, "
           "verify and run the accept rule on the device: on unless 0 (wherever bursts are on).",
           choices=("0", "1"), sglaunch_only=True),
    EnvVar("SGLAUNCH_DSPARK_FILTERED_BURST", "DSpark sampled bursts: also take a batch whose sampled rows set "
           "top-k, top-p or min-p, through filtered iterations of their own that filter the target's distributions "
           "in the graph as the usual step does (a sort of each verified row): on unless 0 (wherever sampled bursts "
           "are on).",
           choices=("0", "1"), sglaunch_only=True),
    EnvVar("SGLAUNCH_DSPARK_BURST_EARLY_STOP", "DSpark bursts on one rank: queue a burst two "
           "iterations ahead of the device instead of all at once, and end it early when a request arrives and "
           "admitting it sooner is worth another burst's fixed cost (the start-up profile): on unless 0 on a "
           "GPU, off unless 1 on a CPU.",
           choices=("0", "1"), sglaunch_only=True),
    EnvVar("SGLAUNCH_DSPARK_SKIP_CONTEXT", "DSpark at load (experimental): once the planner has stepped aside 16 "
           "steps in a row, a plain decode step of more requests than a burst holds writes no draft context "
           "(its requests decode plainly from then on; requests admitted later draft as before), and so does "
           "one of fewer once the drafter is failing or bursts have been declined 256 steps in a row: on unless 0 "
           "(on an H200 it served 1.13x of the same server without it at 64 concurrent requests).",
           choices=("0", "1"), sglaunch_only=True),
    EnvVar("SGLAUNCH_DSPARK_BURST_COMBINE", "DSpark bursts: how the verify attention's split-K partials are "
           "merged: separate (default) runs a combine kernel after the split kernel, fold merges them in the "
           "split kernel (its last program per request and KV head, counted with atomic tickets), one launch "
           "fewer a layer.", choices=("separate", "fold"), default="separate", sglaunch_only=True, refused=True),
    EnvVar("SGLAUNCH_MIXED_GRAPHS", "A step that mixes a prefill chunk of at most 256 tokens into a decode "
           "batch replays a ragged CUDA graph (the graphs DSpark verifies with; captured for engines without "
           "DSpark too) instead of running eagerly: 1 (default) or 0.", choices=("0", "1"), sglaunch_only=True),
    EnvVar("SGLAUNCH_MIXED_MAX_QUERY", "The longest prefill chunk (tokens) a step mixing it with decodes may "
           "hold and still replay a ragged CUDA graph (it must also fit the largest tier with the rest of the "
           "step); longer chunks run eagerly. Unset or 0 (default): no limit but the largest tier.",
           sglaunch_only=True, at_least=0),
    EnvVar("SGLAUNCH_DSPARK_PROFILE_SPS", "compact mode without --speculative-dspark-sps-table-path "
           "profiles the step costs at start-up; on unless 0.", choices=("0", "1"), sglaunch_only=True),
    EnvVar("SGLAUNCH_LAYER_KERNELS", "The decoder's fused Triton kernels (RMSNorm with the residual add, "
           "rotary embedding, SiLU-and-multiply; the DSpark drafter's greedy add + argmax): auto (on GPUs), "
           "torch, or triton.",
           choices=("auto", "torch", "triton"), sglaunch_only=True, refused=True),
    EnvVar("SGLAUNCH_OVERLAP", "Overlap the host with the device: launch each decode step before reading "
           "the last one back (greedy tokens reach the next step on the device, stops are learnt a step "
           "late): 1 on, 0 off, auto (default) on for CUDA devices and off on CPUs.", choices=("0", "1", "auto"),
           sglaunch_only=True, refused=True),
    EnvVar("SGLAUNCH_FUSED_SAMPLING", "Sample a step whose rows are greedy or set a temperature alone in one Triton "
           "kernel (softmax at each row's temperature, the inverse-CDF draw at the row's uniform, the log-probability) "
           "instead of about thirty small operators: on by default on CUDA with Triton (plain decoding at T=0.7 1.30-1.36x on "
           "an H100), 0 off, 1 also where SGLAUNCH_DSPARK_KERNELS=triton runs the kernels on a CPU.",
           choices=("0", "1"), sglaunch_only=True),
    EnvVar("SGLAUNCH_FILTER_KERNEL", "Apply top-k, top-p and min-p by a threshold found in one Triton program per "
           "row instead of sorting the row (the usual step's filter, and DSpark's filtered bursts'; with fused "
           "sampling a plain step samples such rows in its one kernel). Unset: on for CUDA devices with Triton "
           "(1.2-1.46x plain decoding at top-p 0.9 on an H100); 1 also where SGLAUNCH_DSPARK_KERNELS=triton runs "
           "the kernels elsewhere; 0 off (the sort). Ties at the boundary are all kept.",
           choices=("0", "1"), sglaunch_only=True),
    EnvVar("SGLAUNCH_ADMIT_WAIT_STEPS", "Admission grouping (experimental; engines without a drafter): while a "
           "batch decodes, hold a new request up to N steps so that one step admits several (a step that admits "
           "prompts costs a fixed extra beside the decode); 0 (default) admits at once.", sglaunch_only=True,
           at_least=0),
    EnvVar("SGLAUNCH_GRAPH_SIZED_STEPS", "Graph-sized steps (engines with CUDA graphs; a DSpark engine also "
           "reads SGLAUNCH_DSPARK_GRAPH_SIZED_STEPS): "
           "a step's rows (decodes and prompt chunks together) are capped at the largest ragged CUDA graph, so a "
           "wave of arrivals is admitted over several graph replays instead of one eager step: on unless 0.",
           choices=("0", "1"),
           sglaunch_only=True),
    EnvVar("SGLAUNCH_DSPARK_GRAPH_SIZED_STEPS", "Graph-sized steps for a DSpark engine too: its steps' "
           "decodes and prompt chunks are capped at the largest ragged CUDA graph as SGLAUNCH_GRAPH_SIZED_STEPS "
           "does without a drafter (each decode one row): on unless 0 (0 leaves them uncapped).",
           choices=("0", "1"), sglaunch_only=True),
    EnvVar("SGLAUNCH_ADMIT_GROUP", "Admission grouping: admit the held requests as soon as this many wait "
           "(or as many as the batch has room for); default 8.", sglaunch_only=True, at_least=1),
    EnvVar("SGLAUNCH_FLASHINFER_PREFILL_BACKEND", "FlashInfer's kernel family for steps that use its prefill "
           "kernel (prefill chunks, steps mixing them with decodes, DSpark verify windows), eager and in CUDA "
           "graphs: fa2 (default), fa3, or auto (FlashInfer's choice: FA3 on Hopper).",
           choices=("auto", "fa2", "fa3"), sglaunch_only=True),
    EnvVar("SGLAUNCH_VERIFY_GRAPH_WINDOW", "Without a drafter, capture verify graphs for this window "
           "(set by `sglaunch profile-sps`).", sglaunch_only=True),
    EnvVar("SGLAUNCH_DEBUG_ENGINE_START_DELAY_S", "Debugging aid: seconds the engine waits before "
           "loading the model (exercises stops that arrive during start-up).", sglaunch_only=True),
    EnvVar("SGLAUNCH_NO_PROGRESS", "Hide progress bars (1).", sglaunch_only=True),
    EnvVar("SGLAUNCH_BENCH_API_KEY", "`sglaunch bench`: the API key sent to the server.", sglaunch_only=True),
    EnvVar("SGLAUNCH_DSPARK_KERNELS", "DSpark's device kernels (a burst's verify attention among them): "
           "Triton, the torch references, or auto (Triton on GPUs).", choices=("auto", "torch", "triton"), sglaunch_only=True),
    EnvVar("SGLAUNCH_DSPARK_RECORD_PATH", "Record drafted blocks to this JSONL file for `sglaunch fit-sts`.",
           sglaunch_only=True),
    EnvVar("SGLAUNCH_CACHE_DIR", "Where sglaunch keeps the converted default model and its caches.",
           sglaunch_only=True),
)

GENERATED_FLAGS: tuple[Flag, ...] = load_generated(KNOWN_RELEASES)
FLAGS: tuple[Flag, ...] = merge(HAND_FLAGS, GENERATED_FLAGS)
SCHEMA = FlagSchema(FLAGS, ENV_VARS)
