"""train-draft --grow-markov-rank R: the --init-from drafter's vanilla Markov head widened to rank
R, the same function at step 0 (W2's new columns and the confidence head's new columns at zero);
it trains (the new directions learn), writes a drafter the serving loader loads, resumes, and
refuses bad options. --markov-lr-scale gives the Markov head its own learning rate."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from sglaunch.errors import SglaunchError
from sglaunch.speculative.checkpoint import init_drafter_state, load_drafter, save_drafter
from sglaunch.training import model
from test_grow import cli_error, fast_args, forward, serve, started
from test_train_draft import hf_as_engine_target, invoke

RANK = 4


@pytest.fixture(scope="module")
def vanilla(tiny_target, prompt_file, tmp_path_factory) -> tuple[Path, Path]:
    """(a 2-layer drafter checkpoint with a vanilla rank-RANK Markov head and non-trivial random
    weights, a responses.jsonl generated once)."""
    root = tmp_path_factory.mktemp("grow_rank")
    trainer = model_trainer(tiny_target, prompt_file, root / "gen", markov_rank=RANK)
    cfg = trainer.drafter_config()
    assert cfg.markov_head_type == "vanilla" and cfg.markov_rank == RANK and cfg.uses_markov_in_confidence
    state = init_drafter_state(cfg, seed=4, with_embed=False, with_lm_head=False, scale=0.1)
    folder = save_drafter(root / "base", cfg, state, trainer.target_cfg)
    trainer.prepare_data()
    return folder, root / "gen" / "responses.jsonl"


def model_trainer(target, prompts, out, **kw):
    from sglaunch.training.trainer import Trainer

    return Trainer(fast_args(target, prompts, out, **kw))


def test_widened_head_computes_the_checkpoints_function_at_step_0(tiny_target, prompt_file, vanilla, tmp_path):
    folder, responses = vanilla
    base = started(fast_args(tiny_target, prompt_file, tmp_path / "base", init_from=folder), responses)
    wide = started(fast_args(tiny_target, prompt_file, tmp_path / "wide", init_from=folder, grow_markov_rank=12),
                   responses)
    assert base.dcfg.markov_rank == RANK and wide.dcfg.markov_rank == 12
    assert wide.dcfg == model.grown_rank_config(base.dcfg, 12)
    assert wide.drafter.markov_head.markov_w1.weight.shape[1] == 12

    b, w = model.export_state(base.drafter), model.export_state(wide.drafter)
    d = base.dcfg.hidden_size
    for name, tensor in b.items():
        if name == "markov_head.markov_w1.weight":
            torch.testing.assert_close(w[name][:, :RANK], tensor, rtol=0, atol=0)
            new = w[name][:, RANK:]
            # the new W1 columns are drawn at the checkpoint's W1 scale (not zero: W2's new columns need them)
            assert 0.5 < float(new.pow(2).mean().sqrt() / tensor.pow(2).mean().sqrt()) < 2.0
        elif name == "markov_head.markov_w2.weight":
            torch.testing.assert_close(w[name][:, :RANK], tensor, rtol=0, atol=0)
            assert not w[name][:, RANK:].any()
        elif name == "confidence_head.proj.weight":
            torch.testing.assert_close(w[name][:, : d + RANK], tensor, rtol=0, atol=0)
            assert not w[name][:, d + RANK:].any()
        else:
            torch.testing.assert_close(w[name], tensor, rtol=0, atol=0, msg=name)

    # the same function: training forward, teacher-forced Markov logits and confidences, the loss, serving
    samples = base.samples[:3]
    for x, y in zip(forward(base, samples), forward(wide, samples)):
        assert torch.allclose(x, y, rtol=0, atol=1e-5), (x - y).abs().max()
    with torch.no_grad():
        loss_base, _ = base.compute_loss(samples, torch.Generator().manual_seed(5))
        loss_wide, _ = wide.compute_loss(samples, torch.Generator().manual_seed(5))
    assert torch.allclose(loss_base, loss_wide, rtol=0, atol=1e-5), (loss_base, loss_wide)
    assert torch.allclose(serve(base.drafter, base).logits, serve(wide.drafter, wide).logits, rtol=0, atol=1e-5)

    # ... and the comparison can fail: a nonzero new W2 column changes the Markov-corrected logits
    with torch.no_grad():
        wide.drafter.markov_head.markov_w2.weight[:, RANK:].normal_(0, 0.5)
    assert not torch.allclose(forward(base, samples)[2], forward(wide, samples)[2], rtol=0, atol=1e-3)


def test_grow_rank_with_grow_layers_keeps_the_function(tiny_target, prompt_file, vanilla, tmp_path):
    folder, responses = vanilla
    base = started(fast_args(tiny_target, prompt_file, tmp_path / "base", init_from=folder), responses)
    both = started(fast_args(tiny_target, prompt_file, tmp_path / "both", init_from=folder, grow_markov_rank=8,
                             grow_layers=1), responses)
    assert both.dcfg.markov_rank == 8 and len(both.drafter.layers) == 3
    samples = base.samples[:2]
    for x, y in zip(forward(base, samples), forward(both, samples)):
        assert torch.allclose(x, y, rtol=0, atol=1e-5), (x - y).abs().max()


def test_markov_lr_scale_gives_the_head_its_own_group(tiny_target, prompt_file, vanilla, tmp_path):
    folder, responses = vanilla
    t = started(fast_args(tiny_target, prompt_file, tmp_path / "s", init_from=folder, grow_markov_rank=8,
                          markov_lr_scale=10.0, lr=1e-3, max_steps=50), responses)
    groups = t.optimizer.param_groups
    assert len(groups) == 2
    markov = {id(p) for p in t.drafter.markov_head.parameters()}
    assert {id(p) for p in groups[1]["params"]} == markov
    assert not markov & {id(p) for p in groups[0]["params"]}
    assert sum(len(g["params"]) for g in groups) == len(t.params)
    # each group's peak follows the schedule: the head's stays 10x the rest's through warmup and decay
    for _ in range(3):
        t.train_step()
        assert groups[1]["lr"] == pytest.approx(10 * groups[0]["lr"]) and groups[0]["lr"] > 0
    one = started(fast_args(tiny_target, prompt_file, tmp_path / "one", init_from=folder), responses)
    assert len(one.optimizer.param_groups) == 1


def test_cli_grow_rank_trains_the_new_directions_and_writes_a_loadable_drafter(tiny_target, prompt_file, vanilla,
                                                                               tmp_path):
    folder, responses = vanilla
    out = tmp_path / "run"
    out.mkdir()
    shutil.copy(responses, out / "responses.jsonl")
    result = invoke("train-draft", "--target", str(tiny_target), "--prompts", str(prompt_file), "-o", str(out),
                    "--init-from", str(folder), "--grow-markov-rank", "10", "--markov-lr-scale", "3",
                    "--max-steps", "16", "--lr", "3e-3", "--log-every", "1", "--max-new-tokens", "24",
                    "--max-length", "80", "--batch-size", "4", "--anchors-per-seq", "16", "--eval-max-new-tokens",
                    "16", "--eval-max-prompts", "2", "--eval-fraction", "0.2", "--eval-temperatures", "0", "--json")
    assert result.exit_code == 0, result.output
    written = json.loads((out / "drafter" / "config.json").read_text())
    assert written["markov_rank"] == 10 and written["markov_head_type"] == "vanilla"
    drafter = load_drafter(out / "drafter", target=hf_as_engine_target(tiny_target))
    assert drafter.config.markov_rank == 10
    # the new directions learned: W2's new columns left zero
    assert drafter.markov_head.markov_w2.weight[:, RANK:].abs().max() > 0
    assert drafter.confidence_head.proj.weight.shape[1] == drafter.config.hidden_size + 10


def test_widened_run_resumes_exactly(tiny_target, prompt_file, vanilla, tmp_path):
    folder, responses = vanilla
    kw = dict(init_from=folder, grow_markov_rank=8, markov_lr_scale=2.0, max_steps=4)
    straight = started(fast_args(tiny_target, prompt_file, tmp_path / "a", **kw), responses)
    straight.train()
    interrupted = started(fast_args(tiny_target, prompt_file, tmp_path / "b", **kw), responses)
    for _ in range(2):
        interrupted.train_step()
    interrupted.save_checkpoint()
    resumed = started(fast_args(tiny_target, prompt_file, tmp_path / "b", resume=True, **kw), responses)
    assert resumed.step == 2
    resumed.train()
    a, b = model.export_state(straight.drafter), model.export_state(resumed.drafter)
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=1e-5, atol=1e-6, msg=name)
    with pytest.raises(SglaunchError) as err:  # resumed at the checkpoint's own rank: refused
        started(fast_args(tiny_target, prompt_file, tmp_path / "b", resume=True, init_from=folder), responses)
    assert "another drafter shape" in str(err.value)


def test_grow_rank_errors(tiny_target, prompt_file, vanilla, tmp_path):
    folder, _ = vanilla
    output = cli_error("--grow-markov-rank", "16", target=tiny_target, prompt_file=prompt_file, tmp_path=tmp_path)
    assert "--grow-markov-rank needs --init-from" in output
    output = cli_error("--init-from", str(folder), "--grow-markov-rank", "0", target=tiny_target,
                       prompt_file=prompt_file, tmp_path=tmp_path)
    assert "--grow-markov-rank must be at least 1, got 0" in output
    output = cli_error("--init-from", str(folder), "--markov-lr-scale", "0", target=tiny_target,
                       prompt_file=prompt_file, tmp_path=tmp_path)
    assert "--markov-lr-scale must be positive" in output
    # not wider than the checkpoint's own rank
    with pytest.raises(SglaunchError, match=f"must exceed the checkpoint's rank {RANK}"):
        model_trainer(tiny_target, prompt_file, tmp_path / "t", init_from=folder, grow_markov_rank=RANK).drafter_config()


def test_grow_rank_refuses_a_gated_head(tiny_target, prompt_file, tmp_path):
    trainer = model_trainer(tiny_target, prompt_file, tmp_path / "g", markov_rank=RANK, markov_head_type="gated")
    cfg = trainer.drafter_config()
    folder = save_drafter(tmp_path / "gated", cfg, init_drafter_state(cfg, seed=1, with_embed=False,
                                                                       with_lm_head=False), trainer.target_cfg)
    with pytest.raises(SglaunchError, match="needs a vanilla Markov head"):
        model_trainer(tiny_target, prompt_file, tmp_path / "t", init_from=folder, grow_markov_rank=8).drafter_config()
