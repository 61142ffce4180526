"""train-draft on tiny random targets: loss goes down, checkpoints load, resume is exact,
the training forward is the serving forward, bad inputs are clear errors."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from typer.testing import CliRunner

from sglaunch.cli.app import app
from sglaunch.speculative.checkpoint import load_drafter, init_drafter_state, save_drafter
from sglaunch.speculative.drafter import BlockOutput, DraftContextCache
from sglaunch.training import model, objective
from sglaunch.training.data import Sample
from sglaunch.training.trainer import TrainArgs, Trainer

FAST = ["--num-draft-layers", "1", "--markov-rank", "16", "--max-new-tokens", "24", "--max-length", "80",
        "--batch-size", "4", "--anchors-per-seq", "16", "--eval-max-new-tokens", "16", "--eval-max-prompts", "4",
        "--eval-fraction", "0.2"]


def invoke(*args):
    return CliRunner().invoke(app, list(args), env={"COLUMNS": "200", "SGLAUNCH_NO_PROGRESS": "1"})


def fast_args(target, prompts, out, **overrides) -> TrainArgs:
    base = dict(target=target, prompts=prompts, output=out, num_draft_layers=1, markov_rank=16, max_new_tokens=24,
                max_length=80, batch_size=4, anchors_per_seq=16, eval_fraction=0.2, progress=False, lr=3e-3)
    return TrainArgs(**{**base, **overrides})


def hf_as_engine_target(path: Path):
    """What load_drafter reads from the engine's CausalLM: spec + embed_tokens + lm_head."""
    import transformers

    hf = transformers.AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
    spec = SimpleNamespace(hidden_size=hf.config.hidden_size, vocab_size=hf.config.vocab_size,
                           num_layers=hf.config.num_hidden_layers)
    return SimpleNamespace(spec=spec, model=SimpleNamespace(embed_tokens=hf.model.embed_tokens), lm_head=hf.lm_head)


def test_cli_training_lowers_loss_and_writes_a_loadable_drafter(tiny_target, prompt_file, tmp_path):
    out = tmp_path / "run"
    result = invoke("train-draft", "--target", str(tiny_target), "--prompts", str(prompt_file), "-o", str(out),
                    "--max-steps", "40", "--lr", "3e-3", "--log-every", "1", "--fit-sts", "--json", *FAST)
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    first, last = sum(r["loss"] for r in rows[:5]) / 5, sum(r["loss"] for r in rows[-5:]) / 5
    assert last < 0.9 * first, (first, last)
    # the drafter itself moves towards the target (not only the confidence head)
    first_l1, last_l1 = sum(r["l1"] for r in rows[:5]) / 5, sum(r["l1"] for r in rows[-5:]) / 5
    assert last_l1 < 0.95 * first_l1, (first_l1, last_l1)
    assert rows[-1]["lr"] < rows[5]["lr"]  # cosine decay
    folder = out / "drafter"
    names = {p.name for p in folder.iterdir()}
    assert {"config.json", "model.safetensors", "eval.json", "sts.json"} <= names
    from safetensors import safe_open

    with safe_open(str(folder / "model.safetensors"), "pt") as handle:
        assert not any(k.startswith(("embed_tokens", "lm_head")) for k in handle.keys())  # aliased, not stored
    drafter = load_drafter(folder, target=hf_as_engine_target(tiny_target))
    assert drafter.config.block_size == 7 and drafter.aliased == {"embed_tokens", "lm_head"}
    report = json.loads((folder / "eval.json").read_text())
    for temp in ("0.0", "0.7"):
        figures = report["temperatures"][temp]
        assert 1.0 <= figures["mean_accept_length"] <= 8.0
        assert len(figures["accept_rate_per_position"]) == 7 and set(figures["per_type"]) <= {"chat", "text"}
        assert 0.0 <= figures["confidence_ece"] <= 1.0
    assert len(json.loads((folder / "sts.json").read_text())["temperatures"]) == 7


def test_resume_continues_exactly(tiny_target, prompt_file, tmp_path):
    straight = Trainer(fast_args(tiny_target, prompt_file, tmp_path / "a", max_steps=6))
    straight.setup()
    straight.train()
    interrupted = Trainer(fast_args(tiny_target, prompt_file, tmp_path / "b", max_steps=6))
    interrupted.setup()
    for _ in range(3):
        interrupted.train_step()
    interrupted.save_checkpoint()  # then the process "dies"
    resumed = Trainer(fast_args(tiny_target, prompt_file, tmp_path / "b", max_steps=6, resume=True))
    resumed.setup()
    assert resumed.step == 3
    resumed.train()
    a, b = model.export_state(straight.drafter), model.export_state(resumed.drafter)
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=1e-5, atol=1e-6, msg=name)


def test_training_forward_is_the_serving_forward(tiny_target, prompt_file, tmp_path):
    trainer = Trainer(fast_args(tiny_target, prompt_file, tmp_path / "c", max_steps=1, markov_head_type="rnn"))
    trainer.setup()
    drafter, G = trainer.drafter, trainer.dcfg.block_size
    with torch.no_grad():
        for p in model.own_parameters(drafter).values():
            p.add_(torch.randn_like(p) * 0.05)
    sample = trainer.samples[0]
    batch = objective.collate([sample], 80)
    anchor = len(sample.prompt) + 1
    blocks = objective.make_blocks(batch, torch.tensor([0]), torch.tensor([anchor]), G)
    tout = trainer.target.run(batch.ids)
    with torch.no_grad():
        train_out = objective.block_forward(drafter, objective.draft_batch(batch.ids, tout.features, blocks), torch.float32)
    cache = DraftContextCache(drafter.make_pool(128))
    cache.add("r")
    cache.append("r", tout.features[0, :anchor])
    serve_out = drafter.forward_block(cache.build_batch(["r"], batch.ids[0, anchor:anchor + 1], torch.tensor([anchor])),
                                      cache.pool)
    torch.testing.assert_close(train_out.logits, serve_out.logits, rtol=1e-4, atol=1e-4)
    # greedy sampling feeds its own tokens back; teacher forcing with those tokens gives the same logits
    block = drafter.sample_block(serve_out, batch.ids[0, anchor:anchor + 1], torch.tensor([0.0]))
    prev = torch.cat([batch.ids[0, anchor:anchor + 1], block.tokens[0, :-1]])[None]
    with torch.no_grad():
        logits, conf = objective.teacher_forced_heads(drafter, train_out, prev)
    torch.testing.assert_close(logits, block.logits, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(conf, block.conf_logits, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("head", ["vanilla", "gated", "rnn"])
def test_grouped_training_layout_equals_the_serving_forward(tiny_target, prompt_file, tmp_path, head):
    """Several blocks per sequence (with padding) through the shared-context training path give
    the serving forward's logits block by block, and teacher-forced heads equal sample_block's."""
    trainer = Trainer(fast_args(tiny_target, prompt_file, tmp_path / head, max_steps=1, markov_head_type=head))
    trainer.setup()
    drafter, G = trainer.drafter, trainer.dcfg.block_size
    with torch.no_grad():
        for p in model.own_parameters(drafter).values():
            p.add_(torch.randn_like(p) * 0.05)
    batch = objective.collate(trainer.samples[:3], 80)
    seq, anchor, real = objective.sample_anchors(batch, 5, torch.Generator().manual_seed(1))
    blocks = objective.make_blocks(batch, seq, anchor, G, real)
    tout = trainer.target.run(batch.ids, batch.attention_mask)
    with torch.no_grad():
        out = objective.block_forward(drafter, objective.draft_batch(batch.ids, tout.features, blocks, groups=5),
                                      torch.float32)
    for j in range(seq.numel()):
        s, a = int(seq[j]), int(anchor[j])
        cache = DraftContextCache(drafter.make_pool(128))
        cache.add("r")
        cache.append("r", tout.features[s, :a])
        serve = drafter.forward_block(cache.build_batch(["r"], batch.ids[s, a:a + 1], torch.tensor([a])), cache.pool)
        torch.testing.assert_close(out.logits[j:j + 1], serve.logits, rtol=1e-4, atol=1e-4)
        block = drafter.sample_block(serve, batch.ids[s, a:a + 1], torch.tensor([0.0]))
        prev = torch.cat([batch.ids[s, a:a + 1], block.tokens[0, :-1]])[None]
        one = BlockOutput(out.hidden[j:j + 1], out.logits[j:j + 1])
        with torch.no_grad():
            logits, conf = objective.teacher_forced_heads(drafter, one, prev)
        torch.testing.assert_close(logits, block.logits, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(conf, block.conf_logits, rtol=1e-4, atol=1e-4)


def test_anchor_blocks_stay_inside_the_loss_mask():
    samples = [Sample([5, 6, 7], [8, 9, 10, 11], "t"), Sample([1], [2, 3, 4, 5, 6, 7, 8, 9, 10], "t")]
    batch = objective.collate(samples, 64)
    seq, anchor, real = objective.sample_anchors(batch, 3, torch.Generator().manual_seed(0))
    assert (batch.loss_mask[seq, anchor] & batch.loss_mask[seq, anchor + 1]).all()
    assert seq.tolist().count(0) == 3 and seq.tolist().count(1) == 3 and real.all()
    # grouped layout: a sequence with fewer candidates is padded with loss-free copies
    seq, anchor, real = objective.sample_anchors(batch, 6, torch.Generator().manual_seed(0))
    assert seq.tolist() == [0] * 6 + [1] * 6 and real.tolist() == [True] * 3 + [False] * 3 + [True] * 6
    assert not objective.make_blocks(batch, seq, anchor, 7, real).valid[3:6].any()
    blocks = objective.make_blocks(batch, torch.tensor([0]), torch.tensor([3]), 7)
    assert blocks.labels[0, :3].tolist() == [9, 10, 11] and blocks.valid[0].tolist() == [True] * 3 + [False] * 4
    assert blocks.prev[0, :3].tolist() == [8, 9, 10]
    assert blocks.weights[0, 1].item() == pytest.approx(torch.exp(torch.tensor(-0.25)).item())


def test_loss_terms_follow_the_recipe():
    N, G, V = 2, 3, 5
    blocks = objective.Blocks(torch.zeros(N, dtype=torch.long), torch.zeros(N, dtype=torch.long),
                              torch.zeros(N, G, dtype=torch.long), torch.ones(N, G, dtype=torch.long),
                              torch.ones(N, G, dtype=torch.bool), torch.ones(N, G))
    logits = torch.randn(N, G, V)
    same = objective.dspark_loss(logits, torch.full((N, G), 20.0), logits.clone(), blocks)[1]
    assert same["l1"] == pytest.approx(0.0, abs=1e-6) and same["accept_rate@k"] == pytest.approx([1.0] * G)
    assert same["conf"] == pytest.approx(0.0, abs=1e-6)  # c* = 1, confident head
    other = objective.dspark_loss(logits, torch.zeros(N, G), -logits, blocks)[1]
    assert 0 < other["l1"] <= 2.0 and other["loss"] > same["loss"]


# ----------------------------------------------------------------------------- errors


def test_missing_prompt_file_is_a_clear_error(tiny_target, tmp_path):
    result = invoke("train-draft", "--target", str(tiny_target), "--prompts", str(tmp_path / "nope.jsonl"),
                    "-o", str(tmp_path / "o"))
    assert result.exit_code == 2 and "prompt file" in result.output and "Hint:" in result.output


def test_malformed_prompt_line_names_the_line(tiny_target, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "ok"}\n{"text": "no prompt field"}\n')
    result = invoke("train-draft", "--target", str(tiny_target), "--prompts", str(bad), "-o", str(tmp_path / "o"))
    assert result.exit_code == 2 and "bad.jsonl:2" in result.output


def test_incompatible_drafter_is_refused(tiny_target, prompt_file, tmp_path):
    from spec_helpers_local import foreign_drafter_config

    cfg = foreign_drafter_config()
    foreign = save_drafter(tmp_path / "foreign", cfg, init_drafter_state(cfg, with_embed=False, with_lm_head=False))
    result = invoke("train-draft", "--target", str(tiny_target), "--prompts", str(prompt_file),
                    "-o", str(tmp_path / "o"), "--init-from", str(foreign), *FAST)
    assert result.exit_code == 2 and "hidden_size" in result.output and "Hint:" in result.output


def test_resume_with_another_shape_is_refused(tiny_target, prompt_file, tmp_path):
    first = Trainer(fast_args(tiny_target, prompt_file, tmp_path / "r", max_steps=1))
    first.setup()
    first.train()
    result = invoke("train-draft", "--target", str(tiny_target), "--prompts", str(prompt_file), "-o",
                    str(tmp_path / "r"), "--resume", *[a if a != "16" else "8" for a in FAST[:4]], *FAST[4:])
    assert result.exit_code == 2 and "another drafter shape" in result.output


def test_unsupported_target_is_refused(tmp_path, prompt_file):
    folder = tmp_path / "gpt2"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    result = invoke("train-draft", "--target", str(folder), "--prompts", str(prompt_file), "-o", str(tmp_path / "o"))
    assert result.exit_code == 2 and "not supported" in result.output


def test_time_limit_stops_with_a_checkpoint_and_resume_finishes(tiny_target, prompt_file, tmp_path):
    first = Trainer(fast_args(tiny_target, prompt_file, tmp_path / "t", max_steps=3, time_limit_s=0.0))
    first.setup()
    assert first.train() is None and first.step == 1
    second = Trainer(fast_args(tiny_target, prompt_file, tmp_path / "t", max_steps=3, resume=True))
    second.setup()
    assert second.step == 1 and second.train() == tmp_path / "t" / "drafter"


def test_train_minutes_fixes_the_step_count_from_the_first_steps(tiny_target, prompt_file, tmp_path, monkeypatch):
    from sglaunch.training import trainer as trainer_mod

    monkeypatch.setattr(trainer_mod, "CALIBRATION_WARMUP", 2)
    monkeypatch.setattr(trainer_mod, "CALIBRATION_STEPS", 3)
    run = Trainer(fast_args(tiny_target, prompt_file, tmp_path / "m", train_minutes=0.02))  # ~1.2 s of steps
    run.setup()
    assert run.total_steps == 200  # provisional until timed
    assert run.train() == tmp_path / "m" / "drafter"
    assert run.calibrated and 5 <= run.step == run.total_steps < 200
    rows = [json.loads(line) for line in (tmp_path / "m" / "train_log.jsonl").read_text().splitlines()]
    assert rows[-1]["lr"] < 0.2 * max(r["lr"] for r in rows)  # the cosine ran to (near) its end


def test_bad_train_minutes_is_a_clear_error(tiny_target, prompt_file, tmp_path):
    result = invoke("train-draft", "--target", str(tiny_target), "--prompts", str(prompt_file), "-o",
                    str(tmp_path / "o"), "--train-minutes", "0")
    assert result.exit_code == 2 and "--train-minutes must be positive" in result.output


# ----------------------------------------------------------------------------- --extra-text


def test_extra_text_is_cut_into_supervised_pieces_and_trained(tiny_target, prompt_file, tmp_path):
    import gzip

    from sglaunch.server.tokenizer import load_tokenizer
    from sglaunch.training import data

    text = "\n\n".join(f"Paragraph {i}: the quick brown fox jumps over the lazy dog {i} times." for i in range(40))
    plain, packed = tmp_path / "a.txt", tmp_path / "b.txt.gz"
    plain.write_text(text)
    packed.write_bytes(gzip.compress(text.encode()))
    pieces = data.text_samples([plain], tiny_target, max_length=60, seed=0)
    ids = load_tokenizer(tiny_target).encode(text, add_special_tokens=False)
    assert [t for p in pieces for t in p.prompt + p.response] == ids[: sum(len(p.prompt + p.response) for p in pieces)]
    assert all(p.type == "extra-text" and len(p.prompt) == data.TEXT_PROMPT_TOKENS and len(p.prompt + p.response) <= 60
               for p in pieces)
    assert len(ids) - sum(len(p.prompt + p.response) for p in pieces) < data.TEXT_PROMPT_TOKENS + 2  # only a stub dropped
    both = data.text_samples([plain, packed], tiny_target, max_length=60, seed=0)
    assert len(both) == 2 * len(pieces)
    subset = data.text_samples([plain, packed], tiny_target, max_length=60, seed=0, limit=3)
    assert len(subset) == 3 and all(s in both for s in subset)

    run = Trainer(fast_args(tiny_target, prompt_file, tmp_path / "x", max_steps=2, extra_text=[packed]))
    run.setup()
    kinds = [s.type for s in run.samples]
    expected = len(data.text_samples([packed], tiny_target, max_length=run.args.max_length, seed=0))
    assert kinds.count("extra-text") == expected and len(kinds) > expected
    assert run.train() == tmp_path / "x" / "drafter"


def test_missing_extra_text_is_a_clear_error(tiny_target, prompt_file, tmp_path):
    result = invoke("train-draft", "--target", str(tiny_target), "--prompts", str(prompt_file), "-o",
                    str(tmp_path / "o"), "--extra-text", str(tmp_path / "none.txt"))
    assert result.exit_code == 2 and "--extra-text file" in result.output and "Hint:" in result.output


def test_corpus_train_text_never_reads_the_heldout_tail(tmp_path):
    from sglaunch.training import corpus

    folder = tmp_path / "corpus"
    folder.mkdir()
    for name in ("kjv.txt", "pydocs.txt"):
        lines = [f"{name} train line {i}" for i in range(2000)] + [f"{name} HELDOUT line {i}" for i in range(100)]
        (folder / name).write_text("\n".join(lines) + "\n")
    text = corpus.train_text(folder, chars=40_000, fraction=100 / 2100, seed=0, window=2000)
    assert "HELDOUT" not in text
    assert "kjv.txt train" in text and "pydocs.txt train" in text
    assert 25_000 < len(text) <= 40_000
    assert corpus.train_text(folder, chars=40_000, fraction=100 / 2100, seed=0, window=2000) == text  # seeded


def test_generation_backend_auto_is_torch_off_cuda_and_bad_choices_are_clear(tiny_target, prompt_file, tmp_path):
    from sglaunch.training.data import generation_backend

    assert generation_backend("auto", "cpu", "float32") == "torch"
    assert generation_backend("auto", "cuda", "float32") == "torch"  # FlashInfer has no fp32 kernels
    assert generation_backend("torch", "cuda", "bfloat16") == "torch"
    for value, message in (("triton", "is not auto, torch or flashinfer"), ("flashinfer", "needs --device cuda")):
        result = invoke("train-draft", "--target", str(tiny_target), "--prompts", str(prompt_file), "-o",
                        str(tmp_path / "o"), "--gen-attention-backend", value)
        assert result.exit_code == 2 and message in result.output and "Hint:" in result.output


# ----------------------------------------------------------------------------- --num-procs


def test_data_parallel_over_gloo_equals_gradient_accumulation(tiny_target, prompt_file, tmp_path):
    """Two ranks with one micro-batch each take exactly the step of one process accumulating the
    same two micro-batches (same samples, same anchors, averaged gradients)."""
    single = Trainer(fast_args(tiny_target, prompt_file, tmp_path / "one", max_steps=3, grad_accum=2,
                               eval_max_prompts=2, eval_max_new_tokens=8))
    single.setup()
    single.train()
    # through the CLI: it generates the responses once, then starts the ranks
    result = invoke("train-draft", "--target", str(tiny_target), "--prompts", str(prompt_file), "-o",
                    str(tmp_path / "two"), "--num-procs", "2", "--max-steps", "3", "--lr", "3e-3", "--json",
                    *FAST[: FAST.index("--eval-max-new-tokens")], "--eval-max-new-tokens", "8", "--eval-max-prompts",
                    "2", "--eval-fraction", "0.2")
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output.strip().splitlines()[-1])
    assert summary["steps"] == 3 and summary["drafter"] == str(tmp_path / "two" / "drafter")
    assert (tmp_path / "two" / "responses.jsonl").read_text() == (tmp_path / "one" / "responses.jsonl").read_text()
    assert (tmp_path / "two" / "drafter" / "eval.json").is_file()
    one = torch.load(tmp_path / "one/checkpoints/step-3/trainer.pt", weights_only=False)["drafter"]
    two = torch.load(tmp_path / "two/checkpoints/step-3/trainer.pt", weights_only=False)["drafter"]
    assert one.keys() == two.keys()
    for name in one:
        assert torch.allclose(one[name], two[name], atol=1e-5, rtol=1e-4), name
    rows = [json.loads(line) for line in (tmp_path / "two" / "train_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows][-1] == 3  # rank 0 alone logs


def test_bad_num_procs_is_a_clear_error(tiny_target, prompt_file, tmp_path):
    result = invoke("train-draft", "--target", str(tiny_target), "--prompts", str(prompt_file), "-o",
                    str(tmp_path / "o"), "--num-procs", "0")
    assert result.exit_code == 2 and "--num-procs must be at least 1" in result.output
    if not torch.cuda.is_available():
        result = invoke("train-draft", "--target", str(tiny_target), "--prompts", str(prompt_file), "-o",
                        str(tmp_path / "o"), "--num-procs", "2", "--device", "cuda")
        assert result.exit_code == 2 and "CUDA" in result.output


def test_draft_vocab_size_writes_the_most_frequent_response_tokens(tiny_target, prompt_file, tmp_path):
    from sglaunch.speculative.draft_vocab import frequent_tokens, load_draft_vocab

    out = tmp_path / "run"
    result = invoke("train-draft", "--target", str(tiny_target), "--prompts", str(prompt_file), "-o", str(out),
                    "--max-steps", "3", "--draft-vocab-size", "20", "--eval-temperatures", "0", *FAST)
    assert result.exit_code == 0, result.output
    responses = [json.loads(line)["response_ids"] for line in (out / "responses.jsonl").read_text().splitlines()]
    expected, _ = frequent_tokens(responses, 20)
    vocab_size = json.loads((tiny_target / "config.json").read_text())["vocab_size"]
    assert load_draft_vocab(out / "drafter" / "draft_vocab.json", vocab_size) == expected
    assert (out / "drafter" / "eval.json").is_file()  # evaluated with the restricted drafter
    bad = invoke("train-draft", "--target", str(tiny_target), "--prompts", str(prompt_file), "-o",
                 str(tmp_path / "o"), "--draft-vocab-size", "-1")
    assert bad.exit_code == 2 and "--draft-vocab-size must be 0 or more" in bad.output


# ----------------------------------------------------------------------------- the fast step (issue 19)


LOSS_VARIANTS = {"default": {}, "argmax-ce": dict(ce_label="argmax", loss_ce_weight=0.5),
                 "tempered": dict(l1_temperatures=[1.0, 0.7]), "tempered-only": dict(l1_temperatures=[0.7, 0.5],
                                                                                       loss_l1_weight=0.6)}


@pytest.mark.parametrize("head,focus,loss", [("vanilla", 1.0, "default"), ("gated", 1.0, "default"),
                                             ("rnn", 1.0, "default"), ("vanilla", 3.0, "default"),
                                             ("rnn", 2.5, "default"), ("vanilla", 1.0, "argmax-ce"),
                                             ("rnn", 1.0, "tempered"), ("vanilla", 2.0, "tempered-only")])
def test_fused_step_equals_the_reference_step(tiny_target, prompt_file, tmp_path, head, focus, loss):
    """The fused, chunked loss over supervised slots (target distribution once per position, the
    logit gradient in closed form) gives the materialised loss's value, metrics and gradients,
    with the served-anchor focus (--anchor-focus) as without it, and with each loss variant
    (--ce-label argmax, --l1-temperatures)."""
    from sglaunch.training import objective as obj

    trainer = Trainer(fast_args(tiny_target, prompt_file, tmp_path / head, max_steps=1, markov_head_type=head,
                                anchor_focus=focus, **LOSS_VARIANTS[loss]))
    trainer.setup()
    with torch.no_grad():
        for p in model.own_parameters(trainer.drafter).values():
            p.add_(torch.randn_like(p) * 0.05)
    samples = trainer.micro_batch(0)
    results = {}
    for impl, chunk in (("reference", None), ("fused", None), ("fused", 7 * trainer.dcfg.vocab_size)):
        trainer.args.loss_impl = impl
        old = obj.CHUNK_ELEMENTS
        obj.CHUNK_ELEMENTS = chunk or old  # 7 rows a chunk: several chunks, a ragged last one
        try:
            trainer.drafter.zero_grad(set_to_none=True)
            loss, metrics = trainer.compute_loss(samples, torch.Generator().manual_seed(5))
            loss.backward()
        finally:
            obj.CHUNK_ELEMENTS = old
        grads = {n: p.grad.clone() for n, p in model.own_parameters(trainer.drafter).items() if p.grad is not None}
        results[(impl, chunk)] = (float(loss), Trainer.host_row(metrics), grads)
    ref_loss, ref_metrics, ref_grads = results[("reference", None)]
    # the reference reports the L1 at each temperature other than 1, the fused step their mean
    tempered = {k: ref_metrics.pop(k) for k in list(ref_metrics) if k.startswith("l1@")}
    assert len(tempered) == len([t for t in trainer.args.l1_temperatures if t != 1.0])
    assert 0 < ref_metrics["after_miss_share"] <= 1  # linked blocks after a miss: the focus reweighs some
    for key in (("fused", None), ("fused", 7 * trainer.dcfg.vocab_size)):
        loss, metrics, grads = results[key]
        assert loss == pytest.approx(ref_loss, rel=1e-5)
        if tempered:
            assert metrics.pop("l1_tempered") == pytest.approx(sum(tempered.values()) / len(tempered), rel=1e-4)
        assert metrics.keys() == ref_metrics.keys()
        for name, value in ref_metrics.items():
            assert metrics[name] == pytest.approx(value, rel=1e-4, abs=1e-5), name
        assert grads.keys() == ref_grads.keys()
        for name, g in ref_grads.items():
            # fp32 rounding, and |p_d - p_t|'s subgradient: where p_d and p_t (nearly) tie, the two
            # roundings of p_d can take opposite signs of that entry (2 w p_v apart)
            err = float((grads[name] - g).norm() / g.norm().clamp_min(1e-12))
            assert err <= 2e-3, (key, name, err)


def test_anchor_links_find_the_block_one_position_earlier():
    """Blocks in sample_anchors' layout (per sequence: sorted real anchors, then padding copies)."""
    from sglaunch.training import objective as obj

    mask = torch.zeros(2, 12, dtype=torch.bool)
    mask[0, 3:11] = True  # sequence 0: response 3..10
    mask[1, 5:12] = True  # sequence 1: response 5..11
    batch = obj.SeqBatch(torch.zeros(2, 12, dtype=torch.int64), mask, torch.ones(2, 12, dtype=torch.int64))
    seq = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    anchor = torch.tensor([3, 4, 6, 3, 5, 6, 7, 8])
    real = torch.tensor([True, True, True, False, True, True, True, True])
    links = obj.anchor_links(batch, seq, anchor, real)
    # 4 follows 3; 6 does not follow 4; the padding copy links nowhere; 5 of sequence 1 is not
    # linked to the padding block before it, 6/7/8 follow 5/6/7
    assert links.pred.tolist() == [-1, 0, -1, -1, -1, 4, 5, 6]
    assert links.first.tolist() == [True, False, False, False, True, False, False, False]


def test_focus_weights_weigh_blocks_after_a_miss_and_first_anchors():
    from sglaunch.training import objective as obj

    links = obj.AnchorLinks(torch.tensor([-1, 0, 1, -1, 3]), torch.tensor([True, False, False, False, False]))
    hit0 = torch.tensor([False, True, False, True, True])
    valid0 = torch.ones(5, dtype=torch.bool)
    mult, metrics = obj.focus_weights(hit0, links, valid0, 3.0)
    # block 1 follows block 0's miss, block 2 follows block 1's hit, block 4 follows block 3's hit
    assert mult.tolist() == [3.0, 3.0, 1.0, 1.0, 1.0]
    assert float(metrics["after_miss_share"]) == pytest.approx(1 / 3)
    assert float(metrics["top1@0_after_miss"]) == pytest.approx(1.0)  # block 1 hit
    assert float(metrics["top1@0_after_hit"]) == pytest.approx(0.5)  # blocks 2 (miss) and 4 (hit)
    assert obj.focus_weights(hit0, links, valid0, 1.0)[0].tolist() == [1.0, 1.0, 1.0, 1.0, 1.0]


def test_anchor_focus_is_checked_by_the_cli(tiny_target, prompt_file, tmp_path):
    bad = invoke("train-draft", "--target", str(tiny_target), "--prompts", str(prompt_file), "-o",
                 str(tmp_path / "o"), "--anchor-focus", "0")
    assert bad.exit_code == 2 and "--anchor-focus must be a positive number" in bad.output


def test_compiled_chunk_math_equals_the_in_place_one():
    """What torch.compile runs (SGLAUNCH_TRAIN_COMPILE=1) is the in-place chunk's math."""
    from sglaunch.training import objective as obj

    torch.manual_seed(0)
    c, V = 5, 11
    logits = torch.randn(c, V) * 3
    p_t = torch.softmax(torch.randn(c, V), -1)
    labels, t_arg = torch.randint(0, V, (c,)), torch.randint(0, V, (c,))
    w_ce, w_l1 = torch.rand(c), torch.rand(c)
    want = obj._chunk_grad_functional(logits, p_t, labels, w_ce, w_l1, t_arg)
    got = obj._chunk_grad(logits.clone(), p_t.clone(), labels, w_ce, w_l1, t_arg)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    # and the closed-form gradient is autograd's
    x = logits.clone().requires_grad_(True)
    logp = torch.log_softmax(x, -1)
    loss = (w_ce * -logp.gather(1, labels[:, None])[:, 0]).sum() + (w_l1 * (logp.exp() - p_t).abs().sum(-1)).sum()
    loss.backward()
    torch.testing.assert_close(want[0], x.grad, rtol=1e-5, atol=1e-6)


def test_tempered_l1_gradient_is_autograds():
    """--l1-temperatures: the chunk's closed-form gradient of w_t ||softmax(l / tau) - p_t^(tau)||_1 summed
    over taus (plus the tau = 1 and CE terms) is autograd's, in place and functional alike."""
    from sglaunch.training import objective as obj

    torch.manual_seed(1)
    c, V = 6, 13
    logits = torch.randn(c, V) * 2
    t_logits = torch.randn(c, V) * 2
    p_t = torch.softmax(t_logits, -1)
    labels, t_arg = torch.randint(0, V, (c,)), torch.randint(0, V, (c,))
    w_ce, w_l1, w_t = torch.rand(c), torch.rand(c), torch.rand(c)
    taus = (0.7, 0.4)
    p_taus = [obj.tempered_probs(p_t, tau) for tau in taus]
    want = obj._chunk_grad_functional(logits, p_t, labels, w_ce, w_l1, t_arg, taus, w_t, [p.clone() for p in p_taus])
    got = obj._chunk_grad(logits.clone(), p_t.clone(), labels, w_ce, w_l1, t_arg, taus, w_t, [p.clone() for p in p_taus])
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    x = logits.clone().requires_grad_(True)
    logp = torch.log_softmax(x, -1)
    loss = (w_ce * -logp.gather(1, labels[:, None])[:, 0]).sum() + (w_l1 * (logp.exp() - p_t).abs().sum(-1)).sum()
    tempered = sum(w_t * (torch.softmax(x / tau, -1) - torch.softmax(t_logits / tau, -1)).abs().sum(-1)
                   for tau in taus)
    (loss + tempered.sum()).backward()
    torch.testing.assert_close(want[0], x.grad, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(want[4], tempered.detach(), rtol=1e-5, atol=1e-6)
    # the temperature matters: tau = 1 alone would be another gradient
    assert not torch.allclose(obj._chunk_grad_functional(logits, p_t, labels, w_ce, w_l1, t_arg, (1.0,), w_t,
                                                         [p_t.clone()])[0], want[0], atol=1e-4)


def test_loss_options_are_checked_by_the_cli(tiny_target, prompt_file, tmp_path):
    base = ("train-draft", "--target", str(tiny_target), "--prompts", str(prompt_file), "-o", str(tmp_path / "o"))
    for extra, message in ((("--ce-label", "sampled"), "--ce-label 'sampled' is not response or argmax"),
                           (("--l1-temperatures", "1,0"), "--l1-temperatures must be positive numbers"),
                           (("--loss-ce-weight", "-1"), "--loss-ce-weight must be 0 or more"),
                           (("--loss-ce-weight", "0", "--loss-l1-weight", "0"), "are both 0")):
        bad = invoke(*base, *extra)
        assert bad.exit_code == 2 and message in bad.output, (extra, bad.output)


def test_a_step_reads_nothing_back_until_it_is_logged(tiny_target, prompt_file, tmp_path):
    """train_step leaves its metrics on the device (no per-step sync); host_row reads them once."""
    trainer = Trainer(fast_args(tiny_target, prompt_file, tmp_path / "s", max_steps=2))
    trainer.setup()
    row = trainer.train_step()
    assert isinstance(row["loss"], torch.Tensor) and isinstance(row["grad_norm"], torch.Tensor)
    host = Trainer.host_row(row)
    assert isinstance(host["loss"], float) and len(host["top1@k"]) == trainer.dcfg.block_size
    assert all(isinstance(x, float) for x in host["accept_rate@k"])
