"""train-draft --grow-layers N (depth up-scaling): the --init-from drafter with N more layers at
the end, each an identity at step 0, so the grown drafter starts as the checkpoint's function;
it trains, writes a drafter the serving loader loads, resumes, and refuses bad options."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from sglaunch.errors import SglaunchError
from sglaunch.speculative.checkpoint import init_drafter_state, load_drafter, save_drafter
from sglaunch.speculative.drafter import DraftContextCache
from sglaunch.training import model, objective
from sglaunch.training.trainer import TrainArgs, Trainer
from test_train_draft import fast_args as train_fast_args, hf_as_engine_target, invoke

BASE_LAYERS = 2


def build_target(folder: Path, model_type: str) -> Path:
    """conftest.build_target, loaded under its own name (several test folders have a conftest.py)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("training_conftest_for_grow", Path(__file__).with_name("conftest.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.build_target(folder, model_type)


def fast_args(target, prompts, out, **overrides) -> TrainArgs:
    """test_train_draft's fast settings, with a BASE_LAYERS-layer drafter to grow from."""
    return train_fast_args(target, prompts, out, **{"num_draft_layers": BASE_LAYERS, **overrides})


@pytest.fixture(scope="module")
def targets(tiny_target, tmp_path_factory) -> dict[str, Path]:
    # qwen3 too: its layers have q/k norms, which a new layer must copy as well
    return {"llama": tiny_target, "qwen3": build_target(tmp_path_factory.mktemp("grow_targets") / "qwen3", "qwen3")}


@pytest.fixture(scope="module")
def checkpoints(targets, prompt_file, tmp_path_factory) -> dict[str, tuple[Path, Path]]:
    """Per target family: (a 2-layer drafter checkpoint with random, non-trivial weights: rnn
    Markov head, confidence head; a responses.jsonl generated once, copied into each run)."""
    root = tmp_path_factory.mktemp("grow")
    out = {}
    for family, target in targets.items():
        trainer = Trainer(fast_args(target, prompt_file, root / f"gen-{family}", markov_head_type="rnn"))
        cfg = trainer.drafter_config()
        assert cfg.num_layers == BASE_LAYERS and cfg.enable_confidence_head
        state = init_drafter_state(cfg, seed=3, with_embed=False, with_lm_head=False, scale=0.1)
        folder = save_drafter(root / f"base-{family}", cfg, state, trainer.target_cfg)
        trainer.prepare_data()
        out[family] = (folder, root / f"gen-{family}" / "responses.jsonl")
    return out


def started(args: TrainArgs, responses: Path) -> Trainer:
    args.output.mkdir(parents=True, exist_ok=True)
    if not (args.output / "responses.jsonl").exists():
        shutil.copy(responses, args.output / "responses.jsonl")
    trainer = Trainer(args)
    trainer.setup()
    return trainer


def forward(trainer: Trainer, samples, seed: int = 1):
    """The training forward (grouped layout) and teacher-forced heads on fixed anchor blocks."""
    batch = objective.collate(samples, trainer.args.max_length)
    seq, anchor, real = objective.sample_anchors(batch, 5, torch.Generator().manual_seed(seed))
    blocks = objective.make_blocks(batch, seq, anchor, trainer.dcfg.block_size, real)
    tout = trainer.target.run(batch.ids, batch.attention_mask)
    with torch.no_grad():
        out = objective.block_forward(trainer.drafter, objective.draft_batch(batch.ids, tout.features, blocks, groups=5),
                                      torch.float32)
        logits, conf = objective.teacher_forced_heads(trainer.drafter, out, blocks.prev)
    return out.hidden, out.logits, logits, conf


def serve(drafter, trainer: Trainer, sample_index: int = 0):
    """The serving forward_block of one block (context = a sample's prompt + first response token)."""
    sample = trainer.samples[sample_index]
    batch = objective.collate([sample], trainer.args.max_length)
    anchor = len(sample.prompt) + 1
    features = trainer.target.run(batch.ids).features
    cache = DraftContextCache(drafter.make_pool(128))
    cache.add("r")
    cache.append("r", features[0, :anchor])
    return drafter.forward_block(cache.build_batch(["r"], batch.ids[0, anchor:anchor + 1], torch.tensor([anchor])),
                                 cache.pool)


# ----------------------------------------------------------------------------- identity at step 0


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_grown_drafter_computes_the_checkpoints_function_at_step_0(targets, prompt_file, checkpoints, tmp_path, family):
    folder, responses = checkpoints[family]
    target = targets[family]
    base = started(fast_args(target, prompt_file, tmp_path / "base", init_from=folder, markov_head_type="rnn"), responses)
    grown = started(fast_args(target, prompt_file, tmp_path / "grown", init_from=folder, grow_layers=2), responses)
    assert base.dcfg.num_layers == BASE_LAYERS and len(base.drafter.layers) == BASE_LAYERS
    assert grown.dcfg.num_layers == BASE_LAYERS + 2 and len(grown.drafter.layers) == BASE_LAYERS + 2
    assert grown.dcfg == model.grown_config(base.dcfg, 2)
    n_base, n_grown = (sum(p.numel() for p in model.own_parameters(t.drafter).values()) for t in (base, grown))
    per_layer = sum(p.numel() for p in grown.drafter.layers[-1].parameters())
    assert n_grown == n_base + 2 * per_layer

    # every checkpoint tensor is loaded as it was; the new layers come last: o_proj / down_proj
    # zero, the rest copied from the last loaded layer
    b, g = model.export_state(base.drafter), model.export_state(grown.drafter)
    for name, tensor in b.items():
        torch.testing.assert_close(g[name], tensor, rtol=0, atol=0, msg=name)
    last = f"layers.{BASE_LAYERS - 1}."
    for new in range(BASE_LAYERS, BASE_LAYERS + 2):
        for name in (n for n in g if n.startswith(f"layers.{new}.")):
            if "o_proj" in name or "down_proj" in name:
                assert not g[name].any(), name
            else:
                torch.testing.assert_close(g[name], b[name.replace(f"layers.{new}.", last)], rtol=0, atol=0, msg=name)
    if family == "qwen3":
        assert f"layers.{BASE_LAYERS}.self_attn.q_norm.weight" in g

    # the same function: training forward, teacher-forced heads, the loss, the serving forward
    samples = base.samples[:3]
    for x, y in zip(forward(base, samples), forward(grown, samples)):
        assert torch.allclose(x, y, rtol=0, atol=1e-6), (x - y).abs().max()
    gen_a, gen_b = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    with torch.no_grad():
        loss_base, _ = base.compute_loss(samples, gen_a)
        loss_grown, _ = grown.compute_loss(samples, gen_b)
    assert torch.allclose(loss_base, loss_grown, rtol=0, atol=1e-6), (loss_base, loss_grown)
    s_base, s_grown = serve(base.drafter, base), serve(grown.drafter, grown)
    assert torch.allclose(s_base.logits, s_grown.logits, rtol=0, atol=1e-6)

    # ... and the comparison can fail: a new layer that is not an identity changes the logits
    with torch.no_grad():
        grown.drafter.layers[-1].self_attn.o_proj.weight.normal_(0, 0.05)
    assert not torch.allclose(forward(base, samples)[1], forward(grown, samples)[1], rtol=0, atol=1e-3)


def test_grow_layers_init_is_exact_identity_even_from_random_new_weights(targets, prompt_file, checkpoints):
    """model.grow_layers alone: whatever the new layer held before (the usual random init), it
    leaves the residual stream unchanged once o_proj / down_proj are zero."""
    folder, _ = checkpoints["llama"]
    trainer = Trainer(fast_args(targets["llama"], prompt_file, Path("unused"), init_from=folder, grow_layers=1))
    cfg = trainer.drafter_config()
    drafter = model.build_drafter(cfg, torch.nn.Embedding(cfg.vocab_size, cfg.hidden_size),
                                  torch.nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False), torch.device("cpu"), 128)
    model.init_weights(drafter, 0, None)
    model.load_checkpoint_weights(drafter, folder, trainer.init_cfg)
    layer = drafter.layers[BASE_LAYERS]
    x = torch.randn(2 * cfg.block_size, cfg.hidden_size)
    assert layer.self_attn.o_proj.weight.abs().sum() > 0  # random before growing
    model.grow_layers(drafter, BASE_LAYERS)
    assert not layer.self_attn.o_proj.weight.any() and not layer.mlp.down_proj.weight.any()
    with torch.no_grad():
        assert torch.equal(layer.mlp(layer.post_attention_layernorm(x)), torch.zeros_like(x))


# ----------------------------------------------------------------------------- CLI, serving


def test_cli_grow_trains_and_writes_a_deeper_loadable_drafter(targets, prompt_file, checkpoints, tmp_path):
    folder, responses = checkpoints["llama"]
    out = tmp_path / "run"
    out.mkdir()
    shutil.copy(responses, out / "responses.jsonl")
    result = invoke("train-draft", "--target", str(targets["llama"]), "--prompts", str(prompt_file), "-o", str(out),
                    "--init-from", str(folder), "--grow-layers", "1", "--max-steps", "24", "--lr", "3e-3",
                    "--log-every", "1", "--max-new-tokens", "24", "--max-length", "80", "--batch-size", "4",
                    "--anchors-per-seq", "16", "--eval-max-new-tokens", "16", "--eval-max-prompts", "2",
                    "--eval-fraction", "0.2", "--eval-temperatures", "0", "--json")
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    assert len(rows) == 24
    first, last = sum(r["loss"] for r in rows[:4]) / 4, sum(r["loss"] for r in rows[-4:]) / 4
    assert last < 0.9 * first, (first, last)

    written = json.loads((out / "drafter" / "config.json").read_text())
    assert written["num_hidden_layers"] == BASE_LAYERS + 1
    assert written["layer_types"] == ["full_attention"] * (BASE_LAYERS + 1)
    original = json.loads((folder / "config.json").read_text())
    for key in ("target_layer_ids", "markov_rank", "markov_head_type", "intermediate_size", "mask_token_id"):
        assert written[key] == original[key], key

    drafter = load_drafter(out / "drafter", target=hf_as_engine_target(targets["llama"]))
    assert drafter.config.num_layers == BASE_LAYERS + 1 and len(drafter.layers) == BASE_LAYERS + 1
    # the new layer learned: its output projections left zero
    assert drafter.layers[-1].self_attn.o_proj.weight.abs().max() > 0
    assert drafter.layers[-1].mlp.down_proj.weight.abs().max() > 0
    pool = drafter.make_pool(16)
    assert len(pool.k) == BASE_LAYERS + 1
    report = json.loads((out / "drafter" / "eval.json").read_text())
    assert 1.0 <= report["temperatures"]["0.0"]["mean_accept_length"] <= 8.0


def test_grown_drafter_round_trips_through_the_serving_loader(targets, prompt_file, checkpoints, tmp_path):
    """Saved at step 0 (fp32) and loaded with load_drafter, the grown drafter's serving forward
    is the original checkpoint's."""
    folder, responses = checkpoints["llama"]
    grown = started(fast_args(targets["llama"], prompt_file, tmp_path / "g", init_from=folder, grow_layers=1), responses)
    saved = save_drafter(tmp_path / "saved", grown.dcfg, model.export_state(grown.drafter), grown.target_cfg)
    engine_target = hf_as_engine_target(targets["llama"])
    loaded, original = load_drafter(saved, target=engine_target), load_drafter(folder, target=engine_target)
    assert len(loaded.layers) == BASE_LAYERS + 1 and len(original.layers) == BASE_LAYERS
    a, b = serve(original, grown), serve(loaded, grown)
    assert torch.allclose(a.logits, b.logits, rtol=0, atol=1e-6)


# ----------------------------------------------------------------------------- resume


def test_grown_run_resumes_exactly(targets, prompt_file, checkpoints, tmp_path):
    folder, responses = checkpoints["llama"]
    kw = dict(init_from=folder, grow_layers=1, max_steps=4)
    straight = started(fast_args(targets["llama"], prompt_file, tmp_path / "a", **kw), responses)
    straight.train()
    interrupted = started(fast_args(targets["llama"], prompt_file, tmp_path / "b", **kw), responses)
    for _ in range(2):
        interrupted.train_step()
    interrupted.save_checkpoint()
    resumed = started(fast_args(targets["llama"], prompt_file, tmp_path / "b", resume=True, **kw), responses)
    assert resumed.step == 2 and len(resumed.drafter.layers) == BASE_LAYERS + 1
    resumed.train()
    a, b = model.export_state(straight.drafter), model.export_state(resumed.drafter)
    assert set(a) == set(b) and f"layers.{BASE_LAYERS}.mlp.down_proj.weight" in a
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=1e-5, atol=1e-6, msg=name)
    # the resumed weights are the checkpoint's, not a fresh growth of --init-from
    assert b[f"layers.{BASE_LAYERS}.self_attn.o_proj.weight"].any()

    # resuming the grown run without --grow-layers is refused, with a hint that names it
    with pytest.raises(SglaunchError) as err:
        started(fast_args(targets["llama"], prompt_file, tmp_path / "b", resume=True, init_from=folder), responses)
    assert "another drafter shape" in str(err.value) and "--grow-layers" in (err.value.hint or "")


# ----------------------------------------------------------------------------- errors


def cli_error(*extra, target, prompt_file, tmp_path):
    result = invoke("train-draft", "--target", str(target), "--prompts", str(prompt_file), "-o", str(tmp_path / "o"),
                    *extra)
    assert result.exit_code == 2, result.output
    assert "Hint:" in result.output
    assert not (tmp_path / "o").exists()  # refused before anything ran
    return result.output


def test_grow_without_init_from_is_a_clear_error(targets, prompt_file, tmp_path):
    output = cli_error("--grow-layers", "1", target=targets["llama"], prompt_file=prompt_file, tmp_path=tmp_path)
    assert "--grow-layers needs --init-from" in output
    with pytest.raises(SglaunchError, match="needs --init-from"):
        Trainer(fast_args(targets["llama"], prompt_file, tmp_path / "t", grow_layers=1)).drafter_config()


@pytest.mark.parametrize("n", ["0", "-2"])
def test_grow_below_one_is_a_clear_error(targets, prompt_file, checkpoints, tmp_path, n):
    folder, _ = checkpoints["llama"]
    output = cli_error("--init-from", str(folder), "--grow-layers", n, target=targets["llama"],
                       prompt_file=prompt_file, tmp_path=tmp_path)
    assert f"--grow-layers must be at least 1, got {n}" in output
    with pytest.raises(SglaunchError, match="at least 1"):
        Trainer(fast_args(targets["llama"], prompt_file, tmp_path / "t", init_from=folder,
                          grow_layers=int(n))).drafter_config()
