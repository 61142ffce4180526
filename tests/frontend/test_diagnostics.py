"""Every diagnostic code, firing and not firing, through `sglaunch check-config --json`.

Each case gives the arguments that must produce the code and a close neighbour that must
not. `{model}` / `{draft}` in arguments are replaced by checkpoint folders made for the case.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import pytest

from fe_util import codes, invoke
from sglaunch.checks.diagnostics import CODES

COMPACT = {"SGLANG_RAGGED_VERIFY_MODE": "compact"}
DSPARK = ("--speculative-algorithm", "DSPARK", "--speculative-draft-model-path", "hub-org/draft",
          "--speculative-dspark-block-size", "4")
DPA = ("--enable-dp-attention",)


@dataclass
class Case:
    code: str
    fire: tuple[str, ...]
    quiet: tuple[str, ...]
    env: dict = field(default_factory=dict)  # both sides
    quiet_env: dict | None = None  # overrides `env` for the quiet side
    model: dict | None = None  # config.json overrides of {model} on the firing side
    quiet_model: dict | None = None
    machine: tuple | None = None  # fake GPUs (name, MiB, compute capability)
    flashinfer: str | None = None  # fake installed FlashInfer version on the quiet side
    id: str = ""


CASES = [
    Case("FLAG002", ("--release", "0.5.20", "--prefill-round-robin-balance"),
         ("--release", "0.5.16", "--prefill-round-robin-balance")),
    Case("FLAG003", ("--enable-deepep-waterfill",), ("--enable-waterfill",), id="waterfill"),
    Case("FLAG003", ("--optimistic-prefill-retries", "1"), ("--optimistic-prefill-attempts", "2"), id="optimistic"),
    Case("FLAG003", ("--release", "0.5.20", "--cuda-graph-max-bs", "8"),
         ("--release", "0.5.20", "--cuda-graph-max-bs-decode", "8"), id="0.5.20-rename"),
    Case("FLAG004", ("--release", "0.5.15", "--enable-waterfill"), ("--release", "0.5.16", "--enable-waterfill")),
    Case("FLAG005", ("--enable-prefill-context-parallel",), ("--enable-prefill-cp",)),
    Case("FLAG006", ("--fp4-gemm-backend", "cutlass"), ("--fp4-gemm-backend", "auto"), id="fp4-cutlass"),
    Case("FLAG006", ("--quantization", "qoq"), ("--quantization", "fp8"), id="qoq"),
    Case("FLAG006", ("--speculative-draft-model-quantization", "qoq"),
         ("--speculative-draft-model-quantization", "awq"), id="draft-qoq"),
    Case("FLAG007", ("--attention-backend", "nsa"), ("--attention-backend", "dsa")),
    Case("FLAG008", ("--tool-call-parser", "my_plugin_parser"), ("--tool-call-parser", "qwen")),
    Case("FLAG009", ("--release", "0.5.15", "--speculative-algorithm", "dspark"),
         ("--release", "0.5.15", "--speculative-algorithm", "eagle")),
    Case("FLAG010", ("--tp", "2", "--tp-size", "4"), ("--tp", "2", "--tp-size", "2")),
    Case("FLAG011", ("--port", "70000"), ("--port", "8000"), id="port"),
    Case("FLAG011", ("--mem-fraction-static", "1.5"), ("--mem-fraction-static", "0.8"), id="fraction"),
    Case("FLAG012", ("--cuda-graph-max-bs", "8"), ("--page-size", "8")),
    Case("FLAG013", ("--disable-cuda-graph", "--cuda-graph-max-bs", "8"), ("--cuda-graph-max-bs", "8")),
    Case("FLAG015", ("--tp", "2"), ("--tp-size", "2")),
    # --optimistic-prefill abbreviated --optimistic-prefill-retries up to 0.5.15; 0.5.16 reads it as
    # --optimistic-prefill-attempts, whose meaning differs
    Case("FLAG016", ("--optimistic-prefill", "1"), ("--optimistic-prefill-attempts", "2")),
    Case("FLAG017", ("--attention-backend", "torch"), ("--attention-backend", "flashinfer")),
    Case("ENV001", ("--release", "0.5.19"), ("--release", "0.5.16"), env={"SGLANG_ENABLE_UNIFIED_RADIX_TREE": "1"}),
    Case("ENV002", (), (), env={"SGLANG_RAGGED_VERIFY_MODEE": "compact"},
         quiet_env={"SGLANG_RAGGED_VERIFY_MODE": "compact"}, id="typo"),
    Case("ENV002", ("--release", "0.5.23"), ("--release", "0.5.21"), env={"SGLANG_DSPARK_FAST_SAMPLING": "1"},
         id="removed"),
    Case("ENV004", (), (), env={"SGLAUNCH_DSPARK_STEP_ASIDE": "off"}, quiet_env={"SGLAUNCH_DSPARK_STEP_ASIDE": "0"}),
    Case("ENV005", (), (), env={"SGLAUNCH_OVERLAP": "yes"}, quiet_env={"SGLAUNCH_OVERLAP": "auto"}),
    Case("ENV005", (), (), env={"SGLAUNCH_LAYER_KERNELS": "fused"}, quiet_env={"SGLAUNCH_LAYER_KERNELS": "torch"},
         id="layer-kernels"),
    # a whole number the engine reads with config.env_int, which refuses anything else at start-up
    Case("ENV005", (), (), env={"SGLAUNCH_DSPARK_SECOND_CHAIN": "-1"}, quiet_env={"SGLAUNCH_DSPARK_SECOND_CHAIN": "3"},
         id="second-chain"),
    Case("ENV005", (), (), env={"SGLAUNCH_ADMIT_GROUP": "0"}, quiet_env={"SGLAUNCH_ADMIT_GROUP": " 4 "},
         id="admit-group"),
    Case("ENV005", (), (), env={"SGLAUNCH_MIXED_MAX_QUERY": "256 tokens"}, quiet_env={"SGLAUNCH_MIXED_MAX_QUERY": ""},
         id="mixed-max-query"),
    Case("ENV003", ("--release", "0.5.16"), ("--release", "0.5.16"), env={"SGLANG_ENABLE_LOGITS_PROCESSER_CHUNK": "0"},
         quiet_env={"SGLANG_ENABLE_LOGPROB_CHUNK": "0"}),
    Case("ENV001", ("--release", "0.5.19"), ("--release", "0.5.18"),
         env={"SGLANG_OPT_DEEPGEMM_MEGA_MOE_USE_FP4_ACTS": "1"}, id="megamoe-env"),
    Case("QUANT001", ("--model-path", "{model}"), ("--model-path", "{model}"),
         model={"quantization_config": {"quant_method": "fbgemm_fp8"}}, quiet_model={}, id="fbgemm"),
    Case("QUANT001", ("--model-path", "{model}"), ("--model-path", "{model}"),
         model={"quantization_config": {"quant_method": "qoq"}}, quiet_model={}, id="qoq-ckpt"),
    Case("QUANT002", ("--model-path", "{model}"), ("--model-path", "{model}"),
         model={"quantization_config": {"quant_method": "modelopt_fp4"}},
         quiet_model={"quantization_config": {"quant_method": "modelopt_fp4"}}, flashinfer="0.6.14", id="nvfp4"),
    Case("QUANT002", ("--quantization", "modelopt_fp4"), ("--quantization", "modelopt_fp4"),
         flashinfer="0.6.15", id="modelopt-flag"),
    Case("MODEL001", ("--model-path", "./no/such/folder"), ("--model-path", "{model}"), quiet_model={}),
    Case("MODEL002", ("--model-path", "."), ("--model-path", "{model}"), quiet_model={}),
    Case("MODEL003", ("--model-path", "{model}"), ("--model-path", "{model}"), model={"truncated": True},
         quiet_model={}),
    Case("SPEC001", (*DSPARK, "--speculative-dspark-block-size", "0"), DSPARK, env=COMPACT),
    Case("SPEC002", (*DSPARK, "--speculative-num-draft-tokens", "6"),
         (*DSPARK, "--speculative-num-draft-tokens", "5"), env=COMPACT),
    Case("SPEC003", ("--speculative-algorithm", "DSPARK", "--model-path", "org/other-model"), DSPARK,
         env=COMPACT),
    # the built-in default model has a bundled drafter (sglaunch/hub/drafters/)
    Case("SPEC003", ("--speculative-algorithm", "DSPARK", "--model-path", "org/other-model"),
         ("--speculative-algorithm", "DSPARK"), env=COMPACT, id="default-model"),
    Case("SPEC003", ("--speculative-algorithm", "DSPARK", "--model-path", "{model}"),
         ("--speculative-algorithm", "DSPARK", "--model-path", "{model}"), env=COMPACT, model={},
         quiet_model={"dspark_block_size": 5}, id="bundled-draft"),
    Case("SPEC004", (*DSPARK, "--pp-size", "2"), (*DSPARK, "--pp-size", "1"), env=COMPACT),
    Case("SPEC005", (*DSPARK, "--speculative-num-steps", "3"), (*DSPARK, "--speculative-num-steps", "1"),
         env=COMPACT),
    Case("SPEC005", (*DSPARK, "--speculative-eagle-topk", "4"), DSPARK, env=COMPACT, id="topk"),
    Case("SPEC006", (*DSPARK, *DPA, "--dp-size", "2"), (*DSPARK, *DPA, "--dp-size", "2", "--enable-dp-lm-head"),
         env=COMPACT),
    Case("SPEC007", (*DSPARK, *DPA, "--moe-a2a-backend", "deepep"), (*DSPARK, *DPA, "--moe-a2a-backend", "none"),
         env=COMPACT),
    Case("SPEC008", (*DSPARK, *DPA, "--attn-cp-size", "2"), (*DSPARK, *DPA), env=COMPACT),
    Case("SPEC009", (*DSPARK, *DPA, "--speculative-moe-a2a-backend", "deepep"),
         (*DSPARK, *DPA, "--speculative-moe-a2a-backend", "none"), env=COMPACT),
    Case("SPEC010", ("--speculative-algorithm", "DSPARK", "--speculative-draft-model-path", "hub-org/d"),
         ("--speculative-algorithm", "DSPARK", "--speculative-draft-model-path", "{model}"),
         env=COMPACT, quiet_model={"block_size": 7}),
    Case("SPEC011", ("--speculative-dspark-block-size", "4"), DSPARK, env=COMPACT),
    Case("SPEC012", (*DSPARK, "--speculative-num-draft-tokens", "1"), DSPARK, env=COMPACT),
    Case("SPEC013", (*DSPARK, "--speculative-dspark-confidence-sts-path", "missing.json"),
         (*DSPARK, "--speculative-dspark-confidence-sts-path", "sts4.json"), env=COMPACT),
    Case("SPEC013", (*DSPARK, "--speculative-dspark-confidence-sts-path", "sts3.json"),
         (*DSPARK, "--speculative-dspark-confidence-sts-path", "sts4.json"), env=COMPACT, id="sts-length"),
    Case("RAGGED001", DSPARK, DSPARK, quiet_env=COMPACT),
    Case("RAGGED002", DSPARK, DSPARK, env={"SGLANG_RAGGED_VERIFY_MODE": "static"}, quiet_env=COMPACT),
    Case("RAGGED002", DSPARK, DSPARK, env={"SGLANG_RAGGED_VERIFY_MODE": "cap-accept"}, quiet_env=COMPACT,
         id="cap-accept"),
    Case("RAGGED003", (), (), env={"SGLANG_RAGGED_VERIFY_MODE": "Compact"}, quiet_env=COMPACT),
    Case("RAGGED004", (*DSPARK, "--speculative-dspark-align-verify-tokens-to-graph-tier"),
         (*DSPARK, "--speculative-dspark-align-verify-tokens-to-graph-tier"),
         env={"SGLANG_RAGGED_VERIFY_MODE": "static"}, quiet_env=COMPACT),
    Case("RAGGED005", (*DSPARK, "--speculative-dspark-sps-table-path", "sps.json"),
         (*DSPARK, "--speculative-dspark-sps-table-path", "sps.json"),
         env={"SGLANG_RAGGED_VERIFY_MODE": "static"}, quiet_env=COMPACT),
    Case("RAGGED006", DSPARK, (*DSPARK, "--speculative-dspark-sps-table-path", "sps.json"), env=COMPACT),
    Case("PAR001", ("--tp", "3", "--nnodes", "2", "--dist-init-addr", "node0:5000"),
         ("--tp", "4", "--nnodes", "2", "--dist-init-addr", "node0:5000")),
    Case("PAR002", ("--nnodes", "2", "--node-rank", "2", "--tp", "2", "--dist-init-addr", "node0:5000"),
         ("--nnodes", "2", "--node-rank", "1", "--tp", "2", "--dist-init-addr", "node0:5000")),
    Case("PAR003", ("--nnodes", "2", "--tp", "2"), ("--nnodes", "2", "--tp", "2", "--nccl-init-addr", "h:1")),
    Case("PAR004", ("--dist-init-addr", "10.0.0.1"), ("--dist-init-addr", "10.0.0.1:5000")),
    Case("PAR005", ("--model-path", "{model}", "--tp", "3"), ("--model-path", "{model}", "--tp", "2"),
         model={}, quiet_model={}),
    Case("PAR006", ("--tp", "2"), ("--tp", "1"), machine=(("NVIDIA H200", 143771, "9.0"),)),
    Case("NOTE001", ("--model-path", "{model}"), ("--model-path", "{model}"),
         model={"layer_types": ["sliding_attention", "full_attention"]}, quiet_model={}),
    Case("NOTE001", ("--model-path", "{model}"), ("--model-path", "{model}", "--disable-radix-cache"),
         model={"model_type": "deepseek_v32", "index_topk": 2048},
         quiet_model={"model_type": "deepseek_v32", "index_topk": 2048}, id="dsa"),
    Case("NOTE002", (*DPA, "--enable-breakable-cuda-graph"), DPA),
    Case("NOTE002", ("--release", "0.5.17", *DPA), ("--release", "0.5.17"), id="0.5.17-default"),
    Case("NOTE003", ("--enable-gdn-replayssm-spec", "--speculative-eagle-topk", "2"),
         ("--enable-gdn-replayssm-spec",)),
    Case("NOTE003", ("--enable-gdn-replayssm-spec", "--enable-linear-replayssm"), ("--enable-linear-replayssm",),
         id="with-decode-only"),
    Case("NOTE003", ("--enable-gdn-replayssm-spec", "--model-path", "{model}"),
         ("--enable-gdn-replayssm-spec", "--model-path", "{model}"),
         model={}, quiet_model={"model_type": "qwen3_next", "layer_types": ["linear_attention"]}, id="not-gdn"),
    Case("NOTE004", ("--enable-dsa-cache-layer-split",),
         ("--enable-dsa-cache-layer-split", "--enable-prefill-cp", "--cp-strategy", "interleave")),
    Case("NOTE004", ("--enable-dsa-cache-layer-split", "--enable-prefill-cp", "--cp-strategy", "interleave",
                     "--disaggregation-transfer-backend", "nixl"),
         ("--enable-dsa-cache-layer-split", "--enable-prefill-cp", "--cp-strategy", "interleave",
          "--disaggregation-transfer-backend", "mooncake_tcp"), id="transfer-backend"),
    Case("ENG001", ("--revision", "main"), ("--port", "8000")),
    Case("ENG004", ("--tokenizer-worker-num", "4096"), ("--tokenizer-worker-num", "1"), id="tokenizer-workers"),
    Case("FLAG011", ("--tokenizer-worker-num", "0"), ("--tokenizer-worker-num", "1"), id="tokenizer-workers-zero"),
    Case("ENG002", ("--pp-size", "2"), ("--tp-size", "2"), id="pp"),
    Case("ENG002", ("--model-path", "{model}"), ("--model-path", "{model}"),
         model={"architectures": ["MixtralForCausalLM"]}, quiet_model={"architectures": ["Qwen3ForCausalLM"]},
         id="architecture"),
    Case("MEM001", ("--model-path", "{model}", "--tp", "1"), ("--model-path", "{model}", "--tp", "1"),
         machine=(("Small GPU", 2048, "9.0"),), model={"weights_gib": 4}, quiet_model={"weights_gib": 1}),
    Case("MEM002", ("--model-path", "{model}", "--max-total-tokens", "1000"),
         ("--model-path", "{model}", "--max-total-tokens", "4096"), model={}, quiet_model={}),
]


def _ids(case: Case) -> str:
    return f"{case.code}-{case.id}" if case.id else case.code


def _materialise(args, overrides, make_checkpoint, tmp_path, side):
    (tmp_path / "sts4.json").write_text(json.dumps([1.0, 1.1, 1.2, 1.3]))
    (tmp_path / "sts3.json").write_text(json.dumps([1.0, 1.1, 1.2]))
    (tmp_path / "sps.json").write_text(json.dumps(
        {"points": [{"tokens": 1, "steps_per_second": 50.0}, {"tokens": 64, "steps_per_second": 20.0}]}))
    if overrides is None:
        return args
    overrides = dict(overrides)
    weights = None
    if "weights_gib" in overrides:
        gib = overrides.pop("weights_gib")
        weights = {"w": ("BF16", [gib * 1024, 1024, 512])}
    truncated = overrides.pop("truncated", False)
    folder = make_checkpoint(side, weights=weights, fill=weights is None, **overrides)
    if truncated:  # half of the weights file, as an interrupted download leaves it
        weights_file = folder / "model.safetensors"
        with open(weights_file, "r+b") as fh:
            fh.truncate(weights_file.stat().st_size // 2)
    return tuple(a.replace("{model}", str(folder)) for a in args)


@pytest.mark.parametrize("case", CASES, ids=_ids)
def test_fires_and_stays_quiet(case: Case, make_checkpoint, fake_gpus, fake_flashinfer, tmp_path):
    if case.machine:
        fake_gpus(*case.machine)
    fire_args = _materialise(case.fire, case.model, make_checkpoint, tmp_path, "fire")
    assert case.code in codes(*fire_args, env=case.env, machine=bool(case.machine))
    if case.flashinfer:
        fake_flashinfer(case.flashinfer)
    quiet_env = case.env if case.quiet_env is None else case.quiet_env
    quiet_args = _materialise(case.quiet, case.quiet_model, make_checkpoint, tmp_path, "quiet")
    assert case.code not in codes(*quiet_args, env=quiet_env, machine=bool(case.machine))


def test_tokenizer_worker_num_is_honoured_not_ignored():
    assert not {"ENG001", "ENG004", "FLAG011"} & set(codes("--tokenizer-worker-num", "2", machine=False))


CPU_DSPARK = ("--device", "cpu", *DSPARK)
X86_NO_BF16 = "fpu vme sse sse2 ssse3 fma avx avx2 sha_ni"  # session 26's AMD EPYC, shortened


@pytest.mark.parametrize("cpuinfo, args, fires", [
    (f"flags\t\t: {X86_NO_BF16}", (*CPU_DSPARK, "--dtype", "bfloat16"), True),
    (f"flags\t\t: {X86_NO_BF16}", CPU_DSPARK, True),  # auto: the built-in model is bf16
    (f"flags\t\t: {X86_NO_BF16} avx512f avx512_bf16", (*CPU_DSPARK, "--dtype", "bfloat16"), False),
    (f"flags\t\t: {X86_NO_BF16} amx_bf16 amx_tile", (*CPU_DSPARK, "--dtype", "bfloat16"), False),
    ("Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 bf16 i8mm", (*CPU_DSPARK, "--dtype", "bfloat16"), False),
    (f"flags\t\t: {X86_NO_BF16}", (*CPU_DSPARK, "--dtype", "float32"), False),
    (f"flags\t\t: {X86_NO_BF16}", ("--device", "cpu", "--dtype", "bfloat16"), False),
    (None, (*CPU_DSPARK, "--dtype", "bfloat16"), False),  # /proc/cpuinfo unreadable (another OS): unknown
], ids=["no-bf16", "built-in-model-auto", "avx512-bf16", "amx", "arm-bf16", "fp32", "no-dspark", "unreadable"])
def test_dspark_on_a_cpu_without_bf16_matrix_instructions(cpuinfo, args, fires, tmp_path, monkeypatch):
    """ENG005 (info) from the machine's /proc/cpuinfo: DSpark in bf16 on a CPU that would run bf16
    matmuls emulated, where the planner steps aside on most steps."""
    from sglaunch.probe import environment

    path = tmp_path / "cpuinfo"
    if cpuinfo is not None:
        path.write_text(f"processor\t: 0\nvendor_id\t: AuthenticAMD\n{cpuinfo}\n\nprocessor\t: 1\n")
    monkeypatch.setattr(environment, "CPUINFO", str(path))
    assert ("ENG005" in codes(*args, env=COMPACT, machine=True)) is fires
    # --no-machine probes no hardware: never from the launch alone
    assert "ENG005" not in codes(*args, env=COMPACT, machine=False)
    shown = invoke("check-config", *args, env=COMPACT).stdout  # the Environment table says what was found
    assert ("no bf16 matrix instructions" in shown) is (cpuinfo is not None and "bf16 " not in cpuinfo + " ")


def test_cpu_bf16_probe_reads_the_first_flags_line(tmp_path):
    from sglaunch.probe.environment import cpu_native_bf16

    info = tmp_path / "cpuinfo"
    info.write_text(f"processor\t: 0\nflags\t\t: {X86_NO_BF16}\n\nprocessor\t: 1\nflags\t\t: avx512_bf16\n")
    assert cpu_native_bf16(str(info)) is False
    info.write_text("processor\t: 0\nflags\t\t: avx2 avx512_bf16x\n")  # whole words only
    assert cpu_native_bf16(str(info)) is False
    info.write_text("processor\t: 0\nflags\t\t: avx2 avx512_bf16\n")
    assert cpu_native_bf16(str(info)) is True
    info.write_text("processor\t: 0\n")  # no flags line at all
    assert cpu_native_bf16(str(info)) is None
    assert cpu_native_bf16(str(tmp_path / "missing")) is None


def test_every_code_is_exercised():
    """The catalogue and this table cannot drift apart (ENG003 is serve-only: tested in test_serve)."""
    # FLAG014 (shell text in a script) is tested in test_script, CFG004 in test_config_file, ENG005 (the
    # machine's CPU flags) in test_dspark_on_a_cpu_without_bf16_matrix_instructions
    covered = {case.code for case in CASES} | {"CFG001", "CFG002", "CFG003", "CFG004", "ENG003", "ENG005", "FLAG014"}
    assert covered == set(CODES)
