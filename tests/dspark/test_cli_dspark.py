"""`sglaunch profile-sps` writes a table the planner loads; blocks recorded by the engine
(SGLAUNCH_DSPARK_RECORD_PATH) feed `sglaunch fit-sts`, whose output the engine boots with."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from dspark_helpers import GAMMA, engine_config, prompts
from sglaunch.cli.app import app
from sglaunch.engine.interface import SamplingParams
from sglaunch.engine.launch import create_engine, generate_batch
from sglaunch.speculative.sps import load_sps_table
from sglaunch.speculative.sts import load_sts


def test_profile_sps_writes_a_loadable_table(dspark_files, tmp_path):
    out = tmp_path / "sps.json"
    result = CliRunner().invoke(app, ["profile-sps", "--model-path", str(dspark_files["target"]), "--device", "cpu",
                                      "--tokens", "1,4,16", "--window", "5", "--context-len", "32",
                                      "--repeats", "2", "--warmup", "1", "-o", str(out), "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert set(summary["seconds_per_step"]) == {"1", "4", "16"}
    table = load_sps_table(out)
    assert table.tokens == (1, 4, 16) and all(s > 0 for s in table.steps_per_second)
    assert "draft_points" not in json.loads(out.read_text())  # no drafter: no draft stage to price
    bad = CliRunner().invoke(app, ["profile-sps", "--model-path", str(tmp_path), "--tokens", "1,x"])
    assert bad.exit_code == 2 and "Error:" in bad.output


def test_profile_sps_with_a_drafter_prices_the_draft_stage(dspark_files, tmp_path):
    out = tmp_path / "sps.json"
    args = ["profile-sps", "--model-path", str(dspark_files["target"]), "--device", "cpu", "--tokens", "1,4,16",
            "--context-len", "32", "--repeats", "2", "--warmup", "1", "-o", str(out), "--json",
            "--draft-model-path", str(dspark_files["oracle"])]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    # the window defaults to the drafter's block size + 1, so 16 tokens are ceil(16 / 5) = 4 requests
    assert set(summary["draft_seconds_per_step"]) == {"1", "4"}
    table = load_sps_table(out)
    assert table.draft_requests == (1, 4) and 0 < table.draft_seconds(1) <= table.draft_seconds(4)
    assert table.step_seconds(4, 1) == 1 / table.sps(4) + table.draft_seconds(1)
    wrong = CliRunner().invoke(app, [*args, "--window", str(GAMMA + 3)])
    assert wrong.exit_code != 0 and "block size" in wrong.output


def test_recorded_blocks_fit_sts_and_the_engine_uses_it(dspark_files, tmp_path, monkeypatch):
    records = tmp_path / "blocks.jsonl"
    monkeypatch.setenv("SGLAUNCH_DSPARK_RECORD_PATH", str(records))
    params = SamplingParams(max_new_tokens=16, temperature=0.0, ignore_eos=True)
    batch = prompts(6, seed=12)
    generate_batch(engine_config(dspark_files["target"], dspark_files["oracle"], "static"), batch, params)
    monkeypatch.delenv("SGLAUNCH_DSPARK_RECORD_PATH")
    lines = [json.loads(line) for line in records.read_text().splitlines()]
    assert lines and all(len(r["confidence_logits"]) == GAMMA and 0 <= r["accepted"] <= r["verified"] for r in lines)
    sts = tmp_path / "sts.json"
    result = CliRunner().invoke(app, ["fit-sts", str(records), "-o", str(sts), "--block-size", str(GAMMA)])
    assert result.exit_code == 0, result.output
    assert len(load_sts(sts, GAMMA)) == GAMMA
    config = engine_config(dspark_files["target"], dspark_files["oracle"], "compact", sps=dspark_files["sps"], sts=sts)
    expected = generate_batch(engine_config(dspark_files["target"]), batch, params)
    assert generate_batch(config, batch, params) == expected
    engine, cluster = create_engine(config)
    try:
        assert engine.spec.planner.temperatures == load_sts(sts, GAMMA)
    finally:
        cluster.stop(engine)
