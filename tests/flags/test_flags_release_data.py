"""The committed per-release data (sglaunch/flags/sglang/*.json) and the release diff over it."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

import pytest

from sglaunch.flags import release_diff
from sglaunch.flags.release_diff import diff_releases, load_release_data

RELEASES = [f"0.5.{n}" for n in range(15, 24)]
KEYS = {"name", "aliases", "dest", "action", "type", "nargs", "choices", "choices_open",
        "choices_open_reason", "choices_extensible", "default", "help", "deprecated", "const", "required", "group",
        "namespace", "field", "fallback"}


def flags(release: str) -> dict[str, dict]:
    return {s: f for f in load_release_data(release)["flags"] for s in [f["name"], *f["aliases"]]}


def test_every_release_is_packaged():
    assert list(release_diff.available_releases()) == RELEASES


@pytest.mark.parametrize("release", RELEASES)
def test_release_file_shape(release):
    data = load_release_data(release)
    assert data["release"] == release and data["extractor"] == 1
    assert data["wheel"].startswith(f"sglang-{release}-") and len(data["sha256"]) == 64
    names = [f["name"] for f in data["flags"]]
    assert names == sorted(names)
    spellings = [s for f in data["flags"] for s in [f["name"], *f["aliases"]]]
    assert len(spellings) == len(set(spellings)), "an option string appears twice"
    for f in data["flags"]:
        assert set(f) == KEYS, f["name"]
        assert f["name"].startswith("-") and f["dest"]
    env = {e["name"]: e for e in data["env"]}
    assert env["SGLANG_CACHE_DIR"]["type"] == "str"
    if release != "0.5.15":  # DSpark's verify mode arrived in 0.5.16
        assert env["SGLANG_RAGGED_VERIFY_MODE"]["default"] == "static"


def test_counts_match_sglangs_parser():
    """The issue's numbers: 0.5.16 has 433 ServerArgs-field flags and 476 spellings in all."""
    data = load_release_data("0.5.16")
    assert sum(f["field"] for f in data["flags"]) == 433
    assert sum(1 + len(f["aliases"]) for f in data["flags"]) == 476
    # 0.5.15: 410 field flags + 27 manual ones, 14 aliases (see the extractor report: the issue
    # says 450; SGLang 0.5.15's parser registers 451 option strings besides -h/--help).
    data = load_release_data("0.5.15")
    assert sum(1 + len(f["aliases"]) for f in data["flags"]) == 451


@pytest.mark.parametrize("release", ["0.5.15", "0.5.16", "0.5.20", "0.5.23"])
def test_data_rebuilds_a_working_argparse_parser(release):
    """argparse accepts every entry (no conflicting option strings) and parses a launch line."""
    parser = argparse.ArgumentParser(prog="sglang serve")
    for f in load_release_data(release)["flags"]:
        names = [f["name"], *f["aliases"]]
        if f["action"] == "BooleanOptionalAction":
            names = [n for n in names if not n.startswith("--no-")]
            parser.add_argument(*names, action=argparse.BooleanOptionalAction, dest=f["dest"])
        elif f["nargs"] == 0:
            parser.add_argument(*names, action="store_true", dest=f["dest"])
        else:
            parser.add_argument(*names, dest=f["dest"], nargs=f["nargs"])
    args = parser.parse_args(["--model-path", "m", "--tp-size", "2", "--trust-remote-code"])
    assert (args.model_path, args.tp_size, args.trust_remote_code) == ("m", "2", True)


def test_0_5_15_to_0_5_16_flags():
    old, new = flags("0.5.15"), flags("0.5.16")
    assert "--enable-deepep-waterfill" in old and "--optimistic-prefill-retries" in old
    assert "--enable-deepep-waterfill" not in new and "--optimistic-prefill-retries" not in new
    assert "--enable-waterfill" in new and "--optimistic-prefill-attempts" in new
    dspark = {s for s in new if s.startswith("--speculative-dspark-")}
    assert dspark == {"--speculative-dspark-block-size", "--speculative-dspark-sps-table-path",
                      "--speculative-dspark-confidence-sts-path",
                      "--speculative-dspark-align-verify-tokens-to-graph-tier"}
    assert not any(s.startswith("--speculative-dspark-") for s in old)
    assert new["--speculative-dspark-block-size"]["type"] == "int"
    assert new["--optimistic-prefill-attempts"]["default"] == 0


def test_0_5_15_to_0_5_16_choices():
    old, new = flags("0.5.15"), flags("0.5.16")
    assert "qoq" in old["--quantization"]["choices"]
    assert "qoq" not in new["--quantization"]["choices"]
    assert "qoq" not in new["--speculative-draft-model-quantization"]["choices"]
    assert "cutlass" in old["--fp4-gemm-backend"]["choices"]
    assert "cutlass" not in new["--fp4-gemm-backend"]["choices"]
    assert new["--fp4-gemm-backend"]["choices"] == [
        "auto", "flashinfer_cudnn", "flashinfer_cutedsl", "flashinfer_cutlass",
        "flashinfer_trtllm", "marlin"]  # the list the research note quotes from argparse
    # plugin extension points: a stock install accepts exactly `choices`
    assert new["--quantization"]["choices_extensible"] is True
    assert new["--quantization"]["choices_open"] is False
    assert new["--tp-size"]["choices_extensible"] is False


def test_diff_0_5_15_to_0_5_16():
    d = diff_releases(load_release_data("0.5.15"), load_release_data("0.5.16"))
    assert {"--enable-deepep-waterfill", "--optimistic-prefill-retries"} <= set(d.removed_flags)
    assert {"--enable-waterfill", "--optimistic-prefill-attempts",
            "--speculative-dspark-block-size"} <= set(d.added_flags)
    assert "qoq" in d.removed_choices["--quantization"]
    assert d.removed_choices["--fp4-gemm-backend"] == ["cutlass"]
    assert "humming" in d.added_choices["--quantization"]
    # --grpc-http-sidecar-port became an alias of the new --smg-http-sidecar-port
    assert "--smg-http-sidecar-port" in d.added_aliases
    assert "--grpc-http-sidecar-port" not in d.removed_flags
    assert "--grpc-mode" in {x.flag for x in d.newly_deprecated}
    assert d.renamed_env["SGLANG_ENABLE_LOGITS_PROCESSER_CHUNK"] == "SGLANG_ENABLE_LOGPROB_CHUNK"
    assert "SGLANG_RAGGED_VERIFY_MODE" in d.added_env


def test_diff_0_5_16_to_0_5_17_deprecates_gdn_replayssm():
    d = diff_releases(load_release_data("0.5.16"), load_release_data("0.5.17"))
    dep = {x.flag: x for x in d.newly_deprecated}
    assert dep["--enable-gdn-replayssm-spec"].replaced_by == "--enable-linear-replayssm-spec"
    assert any(c.flag == "--enable-gdn-replayssm-spec" and c.new == "DeprecatedStoreTrueAction"
               for c in d.changed_actions)


# The 0.5.20 rows of shared/docs/sglang-0.5.16.md §3 (#38375 dropped the deprecated aliases).
REMOVED_IN_0_5_20 = {
    "--disable-piecewise-cuda-graph": "--cuda-graph-backend-prefill",
    "--enforce-piecewise-cuda-graph": "--cuda-graph-backend-prefill",
    "--enable-breakable-cuda-graph": "--cuda-graph-backend-prefill",
    "--cuda-graph-max-bs": "--cuda-graph-max-bs-decode",
    "--cuda-graph-bs": "--cuda-graph-bs-decode",
    "--piecewise-cuda-graph-tokens": "--cuda-graph-bs-prefill",
    "--piecewise-cuda-graph-max-tokens": "--cuda-graph-max-bs-prefill",
    "--piecewise-cuda-graph-compiler": "--cuda-graph-tc-compiler",
    "--stream-output": "--incremental-streaming-output",
    "--nsa-prefill-backend": "--dsa-prefill-backend",
    "--nsa-decode-backend": "--dsa-decode-backend",
    "--mamba-scheduler-strategy": "--mamba-radix-cache-strategy",
    "--speculative-dflash-draft-window-size": "--speculative-draft-window-size",
    "--enable-gdn-replayssm-spec": "--enable-linear-replayssm-spec",
    "--enable-nsa-prefill-context-parallel": "--enable-prefill-cp",
    "--enable-prefill-context-parallel": "--enable-prefill-cp",
    "--nsa-prefill-cp-mode": "--cp-strategy",
    "--enable-expert-distribution-metrics": "--expert-balancedness-report-mode",
    "--prefill-round-robin-balance": None,
    "--collect-tokens-histogram": None,
}


def test_0_5_20_renames():
    before, after = flags("0.5.19"), flags("0.5.20")
    for old, new in REMOVED_IN_0_5_20.items():
        assert old in before and before[old]["deprecated"], old
        assert old not in after, old
        assert before[old]["deprecated"]["replaced_by"] == new, old
        if new:
            assert new in after, new
    # the replacement flag itself is old: it already existed in 0.5.15
    assert "--cuda-graph-backend-prefill" in flags("0.5.15")
    assert set(after["--cuda-graph-backend-prefill"]["choices"]) >= {"disabled", "tc_piecewise",
                                                                      "breakable"}
    # still accepted on 0.5.20 (and later), deprecated
    for still in ("--disable-cuda-graph", "--enable-flashinfer-allreduce-fusion"):
        assert after[still]["deprecated"] and still in flags("0.5.23")


def test_diff_0_5_19_to_0_5_20():
    d = diff_releases(load_release_data("0.5.19"), load_release_data("0.5.20"))
    assert set(REMOVED_IN_0_5_20) <= set(d.removed_flags)
    assert d.removed_replacements["--disable-piecewise-cuda-graph"] == \
        "--cuda-graph-backend-prefill"
    assert {"cutlass_mla", "dual_chunk_flash_attn"} <= set(d.removed_choices["--attention-backend"])
    assert "--enable-response-store" in d.added_flags and "--sampling-mask-max-tokens" in \
        d.added_flags
    assert "flashinfer_megamoe" in d.added_choices["--moe-runner-backend"]


def test_defaults_moved_to_fallback_are_not_changes():
    d = diff_releases(load_release_data("0.5.19"), load_release_data("0.5.20"))
    changed = {c.flag: (c.old, c.new) for c in d.changed_defaults}
    assert "--swa-full-tokens-ratio" not in changed  # 0.8 -> None with fallback 0.8
    assert changed["--dcp-comm-backend"] == ("ag_rs", None)


def test_diff_of_a_release_with_itself_is_empty():
    data = load_release_data("0.5.23")
    assert diff_releases(data, data).is_empty()


def test_diff_reports_type_nargs_default_changes():
    old = {"release": "a", "flags": [
        {"name": "--x", "aliases": ["--ex"], "type": "int", "nargs": None, "action": "store",
         "default": 1, "choices": ["a", "b"], "deprecated": None}], "env": []}
    new = {"release": "b", "flags": [
        {"name": "--x", "aliases": [], "type": "str", "nargs": "+", "action": "append",
         "default": 2, "choices": ["b", "c"],
         "deprecated": {"replaced_by": "--y", "new_flag": "--y", "message": None,
                        "error": False}}], "env": []}
    d = diff_releases(old, new)
    assert d.removed_aliases == ["--ex"] and not d.removed_flags
    assert (d.removed_choices, d.added_choices) == ({"--x": ["a"]}, {"--x": ["c"]})
    assert [(c.old, c.new) for c in d.changed_types] == [("int", "str")]
    assert [(c.old, c.new) for c in d.changed_nargs] == [(None, "+")]
    assert [(c.old, c.new) for c in d.changed_actions] == [("store", "append")]
    assert [(c.old, c.new) for c in d.changed_defaults] == [(1, 2)]
    assert d.newly_deprecated[0].replaced_by == "--y"


def test_load_is_cached_fast_and_post_releases_fall_back():
    load_release_data.cache_clear()
    t = time.perf_counter()
    data = load_release_data("0.5.23")
    assert time.perf_counter() - t < 0.25
    assert load_release_data("0.5.23") is data
    assert load_release_data("0.5.15.post1") is load_release_data("0.5.15")
    with pytest.raises(KeyError):
        load_release_data("0.4.0")


def test_cli_report_and_json():
    cmd = [sys.executable, "-m", "sglaunch.flags.release_diff", "0.5.15", "0.5.16"]
    text = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    assert "--enable-deepep-waterfill" in text and "--quantization: qoq" in text
    as_json = json.loads(subprocess.run(cmd + ["--json"], capture_output=True, text=True,
                                        check=True).stdout)
    assert "cutlass" in as_json["removed_choices"]["--fp4-gemm-backend"]
    bad = subprocess.run([sys.executable, "-m", "sglaunch.flags.release_diff", "0.5.15", "9.9"],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "Error:" in bad.stderr
