"""STS fitting reduces the survival ECE of miscalibrated confidences; record/STS file formats;
the fit-sts command; statistics."""

from __future__ import annotations

import json

import numpy as np
import pytest
import typer
from typer.testing import CliRunner

from sglaunch.cli.calibrate import fit_sts as fit_sts_command
from sglaunch.speculative import sts
from sglaunch.speculative.stats import SpecStats

G = 5


def synthetic(n: int = 6000, seed: int = 0, overconfidence: float = 3.0):
    """True conditional acceptance sigmoid(z_j); the head reports overconfidence * z_j."""
    rng = np.random.default_rng(seed)
    z = rng.normal(1.0, 1.2, size=(n, G)) - 0.2 * np.arange(G)
    accepted_each = rng.random((n, G)) < sts.sigmoid(z)
    accepted = np.where(accepted_each.all(1), G, np.argmin(accepted_each, axis=1))
    verified = rng.integers(1, G + 1, size=n)  # censored: only the first `verified` slots are observed
    return z * overconfidence, np.minimum(accepted, verified), verified


def test_fit_reduces_survival_ece_and_preserves_ranking():
    logits, accepted, verified = synthetic()
    fit = sts.fit_sts(logits, accepted, verified)
    assert all(t > 1.5 for t in fit.temperatures)  # over-confident heads get T > 1
    assert sum(fit.ece_after) < 0.5 * sum(fit.ece_before)
    assert max(fit.ece_after) < 0.03
    before, after = sts.survival(logits, np.ones(G)), sts.survival(logits, fit.temperatures)
    assert (np.argsort(before[:, 0]) == np.argsort(after[:, 0])).all()
    # held-out data from the same process: still better
    lo2, ac2, ve2 = synthetic(seed=1)
    obs = ve2 > 0
    assert sts.ece(sts.survival(lo2, fit.temperatures)[obs, 0], (ac2 > 0)[obs]) < sts.ece(
        sts.survival(lo2, np.ones(G))[obs, 0], (ac2 > 0)[obs])


def test_calibrated_data_keeps_temperature_near_one():
    logits, accepted, verified = synthetic(overconfidence=1.0)
    assert all(0.7 < t < 1.4 for t in sts.fit_sts(logits, accepted, verified).temperatures)


def test_record_files_and_sts_file(tmp_path):
    logits, accepted, verified = synthetic(n=50)
    with (tmp_path / "r.jsonl").open("w") as f:
        for l, a, v in zip(logits, accepted, verified):
            f.write(json.dumps({"confidence_logits": l.tolist(), "accepted": int(a), "verified": int(v)}) + "\n")
    np.savez(tmp_path / "r.npz", confidence_logits=logits, accepted=accepted, verified=verified)
    for name in ("r.jsonl", "r.npz"):
        lo, ac, ve = sts.load_records(tmp_path / name)
        assert lo.shape == (50, G) and (ac == accepted).all() and (ve == verified).all()
    (tmp_path / "bad.jsonl").write_text('{"confidence_logits": [1, 2], "accepted": 3}\n')
    with pytest.raises(ValueError, match="accepted <= verified"):
        sts.load_records(tmp_path / "bad.jsonl")
    (tmp_path / "bad2.jsonl").write_text('{"logits": [1]}\n')
    with pytest.raises(ValueError, match="bad2.jsonl:1"):
        sts.load_records(tmp_path / "bad2.jsonl")
    fit = sts.fit_sts(logits, accepted, verified)
    sts.save_sts(fit, tmp_path / "sts.json")
    assert sts.load_sts(tmp_path / "sts.json", G) == fit.temperatures
    with pytest.raises(ValueError, match="block size is 7"):
        sts.load_sts(tmp_path / "sts.json", 7)
    (tmp_path / "trt.json").write_text(json.dumps({"sts_temperatures": [1.0] * G}))
    assert sts.load_sts(tmp_path / "trt.json", G) == [1.0] * G


def test_fit_sts_command(tmp_path):
    logits, accepted, verified = synthetic(n=2000)
    np.savez(tmp_path / "r.npz", confidence_logits=logits, accepted=accepted, verified=verified)
    app = typer.Typer()
    app.command()(fit_sts_command)
    out = tmp_path / "sts.json"
    result = CliRunner().invoke(app, [str(tmp_path / "r.npz"), "-o", str(out), "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["output"] == str(out) and len(json.loads(out.read_text())["temperatures"]) == G
    bad = CliRunner().invoke(app, [str(tmp_path / "missing.jsonl")])
    assert bad.exit_code == 2 and "Error:" in bad.output
    wrong = CliRunner().invoke(app, [str(tmp_path / "r.npz"), "--block-size", "7"])
    assert wrong.exit_code == 2


def test_stats():
    stats = SpecStats(block_size=3)
    stats.record_step([1, 4, 2], verify_tokens=9, draft_seconds=0.01, verify_seconds=0.02)
    stats.record_step([3], verify_tokens=3)
    d = stats.to_dict()
    assert d["mean_accept_length"] == pytest.approx(2.5) and d["verify_tokens_per_step"] == 6.0
    assert d["accept_length_histogram"] == {"1": 1, "2": 1, "3": 1, "4": 1}
    assert d["draft_acceptance_rate"] == pytest.approx((10 - 4) / 12)
    rows = {(name, tuple(labels.items())): value for name, _, _, value, labels in stats.prometheus_samples()}
    assert rows[("sglaunch_spec_accept_length_bucket", (("le", "2"),))] == 2
    assert rows[("sglaunch_spec_accept_length_count", ())] == 4
    assert "accept len 2.50" in stats.log_line()
