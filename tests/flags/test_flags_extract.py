"""The extractor over tiny fake wheels built from hand-cut excerpts of real SGLang sources.

`fixtures/old` has the 0.5.15/0.5.16 shape (one `@dataclass ServerArgs` with `A[T, ...]` fields
plus manual `add_argument` calls); `fixtures/new` the 0.5.23 shape (msgspec namespace classes in
`arg_groups/fields/`, choice lists in `arg_groups/choices.py`, registries behind `sys.modules`).
"""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest

from sglaunch.flags import extract

FIXTURES = Path(__file__).parent / "fixtures"


def build_wheel(tmp_path: Path, style: str, version: str = "0.0.1") -> Path:
    root = FIXTURES / style
    wheel = tmp_path / f"sglang-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        for path in sorted(root.rglob("*.py")):
            zf.write(path, path.relative_to(root).as_posix())
    return wheel


@pytest.fixture(scope="module")
def old(tmp_path_factory) -> dict:
    wheel = build_wheel(tmp_path_factory.mktemp("old"), "old")
    data = extract.extract_wheel(extract.Wheel(wheel))
    assert data["warnings"] == []
    return data


@pytest.fixture(scope="module")
def new(tmp_path_factory) -> dict:
    wheel = build_wheel(tmp_path_factory.mktemp("new"), "new")
    data = extract.extract_wheel(extract.Wheel(wheel))
    assert data["warnings"] == []
    return data


def by_name(data: dict) -> dict[str, dict]:
    return {f["name"]: f for f in data["flags"]}


def all_spellings(data: dict) -> list[str]:
    return [s for f in data["flags"] for s in [f["name"], *f["aliases"]]]


# ---- old style (0.5.15 / 0.5.16 shape) --------------------------------------------------------


def test_old_names_and_aliases(old):
    flags = by_name(old)
    assert flags["--model-path"]["aliases"] == ["--model"]
    assert flags["--ep-size"]["aliases"] == ["--expert-parallel-size", "--ep"]
    assert flags["--lora-strict-loading"]["aliases"] == ["--no-lora-strict-loading"]
    assert flags["--fp4-gemm-backend"]["dest"] == "fp4_gemm_runner_backend"  # cli_name
    # no Arg annotation / no_cli=True: not flags; manual add_argument ones are
    assert "--revision" not in flags and "--extra-list" in flags
    assert flags["--stream-output"]["dest"] == "incremental_streaming_output"
    assert {"--config", "--reasoning-parser", "--kv-canary-real-data"} <= set(flags)
    spellings = all_spellings(old)
    assert len(spellings) == len(set(spellings))
    assert [f["name"] for f in old["flags"]] == sorted(f["name"] for f in old["flags"])


def test_old_types_nargs_actions(old):
    f = by_name(old)
    assert (f["--tp-size"]["type"], f["--tp-size"]["nargs"], f["--tp-size"]["default"]) == (
        "int", None, 1)
    assert f["--mem-fraction-static"]["type"] == "float"
    assert (f["--trust-remote-code"]["action"], f["--trust-remote-code"]["type"],
            f["--trust-remote-code"]["nargs"]) == ("store_true", None, 0)
    assert (f["--cuda-graph-bs-decode"]["type"], f["--cuda-graph-bs-decode"]["nargs"]) == (
        "int", "+")  # Optional[List[int]] -> nargs "+"
    assert f["--lora-target-modules"]["nargs"] == "*"
    assert (f["--lora-paths"]["action"], f["--lora-paths"]["nargs"]) == ("LoRAPathAction", "*")
    assert f["--lora-strict-loading"]["action"] == "BooleanOptionalAction"
    assert f["--json-override"]["type"] == "json"
    assert f["--buckets"]["type"] == "json_list_type"  # List + type_parser: one value
    assert f["--buckets"]["nargs"] is None
    assert f["--cuda-graph-config"]["type"] == "parse_cuda_graph_config_arg"
    assert f["--model-path"]["required"] is True
    assert f["--tokenizer-path"]["required"] is False
    assert f["--extra-list"]["default"] == []  # dataclasses.field(default_factory=list)
    assert f["--api-key"]["help"] == "==SUPPRESS=="
    assert "%(default)s" in f["--fp4-gemm-backend"]["help"]


def test_old_choices_resolved_statically(old):
    f = by_name(old)
    assert f["--quantization"]["choices"] == ["awq", "fp8", "qoq", "gguf"]  # incl. .extend()
    # the same list object, through a module-level alias
    assert f["--speculative-draft-model-quantization"]["choices"] == ["awq", "fp8", "qoq", "gguf"]
    assert f["--attention-backend"]["choices"] == ["triton", "flashinfer", "fa3"]  # list + list
    # a constant imported from another module of the wheel
    assert f["--lora-target-modules"]["choices"] == ["q_proj", "k_proj", "v_proj", "all"]
    assert f["--kv-cache-dtype"]["choices"] == ["auto", "fp8_e4m3", "bf16"]  # Literal
    assert f["--cuda-graph-backend-prefill"]["choices"] == ["full", "breakable", "disabled"]
    assert f["--kv-canary-real-data"]["choices"] == ["none", "partial", "all"]  # enum names
    assert f["--max-lora-chunk-size"]["choices"] == [16, 32, 64]
    assert f["--reasoning-parser"]["choices"] == ["auto", "deepseek-r1", "qwen3"]
    assert "['deepseek-r1', 'qwen3']" in f["--reasoning-parser"]["help"]  # f-string help
    for name in ("--quantization", "--kv-cache-dtype", "--lora-target-modules"):
        assert f[name]["choices_open"] is False
    # def add_quantization_method_choices(choices): QUANTIZATION_CHOICES.extend(choices)
    assert f["--quantization"]["choices_extensible"] is True
    assert f["--speculative-draft-model-quantization"]["choices_extensible"] is True
    assert f["--attention-backend"]["choices_extensible"] is False


def test_old_open_and_unresolved(old):
    f = by_name(old)
    assert f["--reasoning-parser"]["choices_open"] is True  # class-level registry dict
    sampling = f["--sampling-backend"]
    assert sampling["choices"] == ["flashinfer", "pytorch"]  # a set, sorted; env default False
    assert sampling["choices_open"] is True
    assert "SGLANG_KV_CANARY_ENABLE_TOKEN_ORACLE" in sampling["choices_open_reason"]
    device = f["--device"]
    assert device["choices"] == ["cuda", "cpu", {"expr": "get_device()"}]
    assert device["choices_open"] is True
    assert device["default"] == {"expr": "get_device()"}


def test_old_deprecated_spellings(old):
    f = by_name(old)
    stream = f["--stream-output"]
    assert stream["action"] == "DeprecatedStoreTrueAction"
    assert (stream["nargs"], stream["type"], stream["default"], stream["const"]) == (0, None,
                                                                                    False, True)
    assert stream["deprecated"]["replaced_by"] == "--incremental-streaming-output"
    const = f["--disable-piecewise-cuda-graph"]
    assert const["const"] == "disabled"  # Backend.DISABLED
    assert const["deprecated"]["replaced_by"] == "--cuda-graph-backend-prefill"
    assert const["deprecated"]["new_flag"] == "--cuda-graph-backend-prefill=disabled"
    alias = f["--cuda-graph-bs"]
    assert (alias["action"], alias["type"], alias["nargs"]) == ("DeprecatedAliasStoreAction",
                                                                 "int", "+")
    nsa = f["--nsa-prefill-backend"]
    assert nsa["default"] == "==SUPPRESS==" and nsa["choices"] == ["triton", "flashinfer", "fa3"]
    gone = f["--prefill-round-robin-balance"]["deprecated"]
    assert gone["replaced_by"] is None and gone["error"] is False
    fusion = f["--enable-flashinfer-allreduce-fusion"]  # plain store_true, deprecated by its help
    assert fusion["deprecated"]["replaced_by"] == "--flashinfer-allreduce-fusion-backend"
    assert f["--tp-size"]["deprecated"] is None


def test_old_groups_and_env(old):
    f = by_name(old)
    assert f["--model-path"]["group"] == "Model and tokenizer"
    assert f["--quantization"]["group"] == "Quantization and data type"
    assert f["--stream-output"]["group"] == "Deprecated argument registrations"
    assert f["--model-path"]["field"] is True and f["--config"]["field"] is False
    env = {e["name"]: e for e in old["env"]}
    assert env["SGLANG_RAGGED_VERIFY_MODE"] == {"name": "SGLANG_RAGGED_VERIFY_MODE",
                                                 "type": "str", "default": "static",
                                                 "deprecated_name": None}
    assert env["SGLANG_DSA_FUSE_TOPK"]["type"] == "bool"
    assert env["SGLANG_DSA_FUSE_TOPK"]["deprecated_name"] == "SGLANG_NSA_FUSE_TOPK"
    assert env["SGLANG_CACHE_DIR"]["default"] == {"expr": "os.path.expanduser('~/.cache/sglang')"}
    assert env["SGLANG_DP_USE_REDUCE_SCATTER"]["default"] == {"expr": "_default_hip"}
    assert env["SGLANG_TEST_MAX_RETRY"] == {"name": "SGLANG_TEST_MAX_RETRY", "type": "int",
                                             "default": None, "deprecated_name": None}


# ---- new style (0.5.23 shape) -----------------------------------------------------------------


def test_new_fields_from_namespace_classes(new):
    f = by_name(new)
    assert f["--tp-size"]["namespace"] == "parallel"
    assert f["--tp-size"]["aliases"] == ["--tensor-parallel-size"]
    assert f["--model-path"]["required"] is True and f["--model-path"]["namespace"] == "model"
    assert "--attn-tp-size" not in f  # a Derived declaration, not a field
    assert "SI suffixes" not in f["--tp-size"]["help"]
    assert "--enable-dp-attention" in f and f["--enable-dp-attention"]["field"] is False
    hicache = f["--enable-hierarchical-cache"]
    assert hicache["aliases"] == ["--no-enable-hierarchical-cache", "--enable-hicache",
                                  "--no-enable-hicache"]
    assert hicache["fallback"] is False and hicache["default"] is None
    assert f["--swa-full-tokens-ratio"]["fallback"] == 0.8
    assert (f["--cuda-graph-bs-prefill"]["type"], f["--cuda-graph-bs-prefill"]["nargs"]) == (
        "int", "+")  # list[int] | None
    assert f["--dist-init-addr"]["type"] == "str"  # str | None
    assert f["--json-model-override-args"]["type"] == "json"
    assert f["--cuda-graph-backend-prefill"]["group"] == "Cuda graphs"


def test_new_choices(new):
    f = by_name(new)
    assert f["--quantization"]["choices"] == ["awq", "fp8", "humming"]  # from choices.py
    assert f["--fp4-gemm-backend"]["choices"] == ["auto", "flashinfer_cutlass", "marlin"]
    assert f["--kv-cache-dtype"]["choices"] == ["auto", "fp8_e4m3", "mxfp8"]
    assert f["--cuda-graph-backend-prefill"]["choices"] == ["full", "breakable", "disabled"]
    assert f["--kv-canary-real-data"]["choices"] == ["none", "partial", "all"]
    assert f["--kv-canary-real-data"]["default"] == "none"  # _declared_default(...)
    rp = f["--reasoning-parser"]
    assert rp["choices"] == ["auto", "deepseek-r1", "qwen3", "kimi_k3"]
    assert rp["choices_open"] is True and "registry" in rp["choices_open_reason"]
    assert f["--tool-call-parser"]["choices"] == ["auto", "qwen", "glm", "spark25"]
    sampling = f["--sampling-backend"]
    assert sampling["choices"] == ["ascend", "flashinfer", "pytorch"]
    assert "SGLANG_KV_CANARY_ENABLE_TOKEN_ORACLE" in sampling["choices_open_reason"]
    assert f["--quantization"]["choices_open"] is False
    # add_quantization_method_choices = QUANTIZATION_CHOICES.extend (in choices.py)
    assert f["--quantization"]["choices_extensible"] is True
    assert f["--fp4-gemm-backend"]["choices_extensible"] is True
    assert f["--moe-runner-backend"]["choices_extensible"] is False


def test_new_deprecated(new):
    f = by_name(new)
    mono = f["--monokernel-backend"]
    assert (mono["action"], mono["nargs"], mono["choices"], mono["const"]) == (
        "DeprecatedStoreConstAction", None, ["amd"], True)
    assert mono["dest"] == "enable_amd_monokernel"
    assert mono["deprecated"]["replaced_by"] == "--enable-amd-monokernel"
    dp = f["--enable-dp-attention"]["deprecated"]
    assert dp["replaced_by"] == "--attn-dp-size" and dp["new_flag"] == "--attn-dp-size <dp-size>"
    cg = f["--disable-cuda-graph"]["deprecated"]
    assert cg["replaced_by"] is None  # names two flags
    assert cg["new_flag"] == "--cuda-graph-backend-{decode,prefill}=disabled"


def test_new_every_spelling_once(new):
    spellings = all_spellings(new)
    assert len(spellings) == len(set(spellings)) == 31  # 24 actions + 7 aliases


# ---- the command line -------------------------------------------------------------------------


def test_cli_writes_one_file_per_release(tmp_path, capsys):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    build_wheel(wheels, "old", "9.9.1")
    build_wheel(wheels, "new", "9.9.2")
    out = tmp_path / "out"
    rc = extract.main(["--releases", "9.9.1,9.9.2", "--wheel-dir", str(wheels), "--out",
                       str(out), "--no-download"])
    assert rc == 0
    assert "9.9.2:" in capsys.readouterr().out
    data = json.loads((out / "9.9.1.json").read_text())
    assert data["release"] == "9.9.1" and data["extractor"] == extract.EXTRACTOR_VERSION
    assert data["wheel"] == "sglang-9.9.1-py3-none-any.whl" and len(data["sha256"]) == 64
    assert set(data) == {"release", "wheel", "sha256", "extractor", "config_loader", "flags", "env"}
    assert data["config_loader"] is None  # the fake wheels carry no --config loader
    text = (out / "9.9.2.json").read_text()
    assert text.count("\n") > len(json.loads(text)["flags"])  # one flag per line: diffable
    assert extract.dumps(json.loads(text)) == text  # stable


def test_cli_without_wheel_and_no_download_fails(tmp_path):
    with pytest.raises(SystemExit):
        extract.main(["--releases", "9.9.9", "--wheel-dir", str(tmp_path), "--out",
                      str(tmp_path / "o"), "--no-download"])


def test_unknown_derivation_is_reported(tmp_path):
    files = {p.relative_to(FIXTURES / "old").as_posix(): p.read_text()
             for p in (FIXTURES / "old").rglob("*.py")}
    key = "sglang/srt/arg_groups/arg_utils.py"
    files[key] = files[key].replace('nargs = arg_meta.nargs or "+"', 'nargs = arg_meta.nargs or "*"')
    data = extract.extract_wheel(extract.Wheel(files=files))
    assert any("unknown shape" in w for w in data["warnings"])


def test_missing_wheel_is_downloaded_with_pip(tmp_path, monkeypatch):
    calls = []

    def fake_run(cmd, check=False, **_):
        calls.append(cmd)
        build_wheel(tmp_path, "old", "9.9.3")

        class Done:
            returncode = 0
        return Done()

    monkeypatch.setattr(extract.subprocess, "run", fake_run)
    wheel = extract.find_wheel("9.9.3", tmp_path)
    assert wheel.name == "sglang-9.9.3-py3-none-any.whl"
    assert calls[0][1:4] == ["-m", "pip", "download"]
    assert "--no-deps" in calls[0] and "sglang==9.9.3" in calls[0]
    assert extract.find_wheel("9.9.3", tmp_path) == wheel and len(calls) == 1  # cached now


REAL_WHEELS = Path("/tmp/sgwheels")


@pytest.mark.skipif(not any(REAL_WHEELS.glob("sglang-0.5.16-*.whl")),
                    reason="needs the real sglang 0.5.16 wheel (CI uses the committed data)")
def test_committed_data_is_what_the_extractor_writes(tmp_path):
    out = tmp_path / "out"
    extract.main(["--releases", "0.5.16", "--wheel-dir", str(REAL_WHEELS), "--out", str(out),
                  "--no-download"])
    committed = Path(extract.__file__).parent / "sglang" / "0.5.16.json"
    assert (out / "0.5.16.json").read_text() == committed.read_text()
