"""The flag schema's own integrity, and the generated docs staying in step with it."""

from __future__ import annotations

import pytest

from sglaunch import docs_gen
from sglaunch.flags.argv import split_argv
from sglaunch.flags.registry import SCHEMA
from sglaunch.flags.spec import Kind, Status
from sglaunch.releases import KNOWN_RELEASES

REQUIRED = """--model-path --model --tokenizer-path --revision --dtype --context-length --served-model-name
--trust-remote-code --host --port --api-key --enable-metrics --log-level --tp-size
--tensor-parallel-size --dp-size --pp-size --nnodes --node-rank --dist-init-addr --nccl-init-addr
--device --mem-fraction-static --max-running-requests --max-total-tokens --chunked-prefill-size
--page-size --disable-radix-cache --kv-cache-dtype --attention-backend --cuda-graph-max-bs-decode
--quantization --fp4-gemm-backend --fp8-gemm-backend --speculative-algorithm
--speculative-draft-model-path --speculative-dspark-block-size --speculative-num-draft-tokens
--speculative-num-steps --speculative-eagle-topk --speculative-dspark-sps-table-path
--speculative-dspark-confidence-sts-path --speculative-dspark-align-verify-tokens-to-graph-tier
--enable-waterfill --optimistic-prefill-attempts --moe-a2a-backend --enable-dp-attention
--enable-dsa-cache-layer-split --enable-prefill-cp --cp-strategy --enable-gdn-replayssm-spec
--linear-replayssm-cache-len""".split()


@pytest.mark.parametrize("spelling", REQUIRED)
def test_required_flags_are_declared_and_valid_in_0_5_16(spelling):
    flag = SCHEMA.lookup(spelling)
    assert flag is not None
    assert flag.status_at("0.5.16") is Status.ACTIVE


@pytest.mark.parametrize("spelling", ["--cuda-graph-max-bs", "--disable-cuda-graph", "--enable-prefill-context-parallel"])
def test_deprecated_spellings_are_still_accepted_in_0_5_16(spelling):
    assert SCHEMA.lookup(spelling).status_at("0.5.16") is Status.DEPRECATED


@pytest.mark.parametrize("release", KNOWN_RELEASES)
@pytest.mark.parametrize("short, flag", [("--tp", "--tp-size"), ("--dp", "--dp-size")])
def test_tp_and_dp_are_abbreviations_argparse_expands_in_every_release(release, short, flag):
    """SGLang declares neither --tp nor --dp: argparse's allow_abbrev expands them, as here."""
    assert SCHEMA.lookup(short) is None
    (occurrence,) = split_argv([short, "2"], SCHEMA, release=release).occurrences
    assert occurrence.flag is SCHEMA.get(flag) and occurrence.abbreviated


def test_defaults_follow_sglang():
    assert SCHEMA.get("--host").default == "127.0.0.1"
    assert SCHEMA.get("--port").default == 30000
    assert SCHEMA.get("--tp-size") is SCHEMA.lookup("--tensor-parallel-size")
    assert SCHEMA.lookup("--nccl-init-addr") is SCHEMA.get("--dist-init-addr")


def test_replacements_exist_when_the_old_flag_goes():
    for flag in SCHEMA.flags:
        if flag.replaced_by is None:
            continue
        target = SCHEMA.get(flag.replaced_by)
        boundary = flag.removed or flag.deprecated
        assert target.status_at(boundary) is Status.ACTIVE, (flag.name, target.name)
        for old, new in flag.value_map:
            if target.choices:
                assert new in target.choices, (flag.name, new)


def test_value_history_refers_to_declared_choices():
    for flag in SCHEMA.flags:
        for change in flag.values:
            assert flag.choices and change.value in flag.choices, (flag.name, change.value)
            if change.replacement:
                assert change.replacement in flag.choices
            if change.alias_of:
                assert change.alias_of in flag.choices


def test_releases_in_history_are_known():
    for flag in SCHEMA.flags:
        for release in (flag.added, flag.deprecated, flag.removed):
            assert release is None or release in KNOWN_RELEASES, (flag.name, release)


@pytest.mark.parametrize("flag", [f for f in SCHEMA.flags if f.removed], ids=lambda f: f.name)
def test_removed_spellings_never_map_onto_another_flag(flag):
    """No prefix abbreviation: each removed spelling parses as itself, never as a survivor."""
    tokens = [flag.name] + ([] if flag.kind is Kind.BOOL else ["1"])
    (occurrence,) = split_argv(tokens, SCHEMA).occurrences
    assert occurrence.flag is flag


def test_generated_docs_are_current():
    for name, render in docs_gen.GENERATED.items():
        assert (docs_gen.DOCS / name).read_text(encoding="utf-8") == render(), \
            f"docs/{name} is stale: run python -m sglaunch.docs_gen"
