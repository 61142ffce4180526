"""Draft vocabulary: the frequent-token file, and a drafter restricted to it drafts only its
tokens, with the same first-slot logits over them and probabilities of 0 elsewhere; over the
whole vocabulary it drafts exactly what the unrestricted drafter drafts."""

from __future__ import annotations

import gzip
import json

import pytest
import torch

from spec_helpers import feature_rows, run_batch, tiny_config
from sglaunch.speculative.checkpoint import init_drafter_state, load_drafter, save_drafter
from sglaunch.speculative.draft_vocab import frequent_tokens, load_draft_vocab, main, save_draft_vocab
from sglaunch.speculative.drafter import DraftContextCache


def test_frequent_tokens_rank_by_count_then_id_and_report_coverage():
    ids, covered = frequent_tokens([[5, 5, 5, 2, 2, 9], [9, 7]], 2)
    assert ids == [2, 5] and covered == pytest.approx(5 / 8)  # 2 and 9 tie at 2 counts: the smaller id wins
    with pytest.raises(ValueError, match="at least 1"):
        frequent_tokens([[1]], 0)
    with pytest.raises(ValueError, match="empty"):
        frequent_tokens([[]], 3)


def test_draft_vocab_file_round_trip_errors_and_cli(tmp_path, capsys):
    save_draft_vocab(tmp_path / "v.json", [9, 3, 4], "test")
    assert load_draft_vocab(tmp_path / "v.json", 10) == [3, 4, 9]
    with pytest.raises(ValueError, match="outside the target's vocabulary of 5"):
        load_draft_vocab(tmp_path / "v.json", 5)
    (tmp_path / "dup.json").write_text(json.dumps({"token_ids": [1, 1]}))
    with pytest.raises(ValueError, match="repeat"):
        load_draft_vocab(tmp_path / "dup.json", 5)
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(ValueError, match="not valid JSON"):
        load_draft_vocab(tmp_path / "bad.json", 5)
    responses = tmp_path / "responses.jsonl.gz"
    with gzip.open(responses, "wt") as f:
        for r in ([1, 1, 2], [3, 1, 2, 2]):
            f.write(json.dumps({"prompt_ids": [0], "response_ids": r, "type": "t"}) + "\n")
    assert main([str(responses), "--size", "2", "-o", str(tmp_path / "out.json")]) == 0
    assert load_draft_vocab(tmp_path / "out.json", 4) == [1, 2]
    assert "cover 85.7143%" in capsys.readouterr().out  # 6 of the 7 response tokens
    # files of the same name (each drafter round writes responses.jsonl.gz) are told apart by folder
    second = tmp_path / "round2" / "responses.jsonl.gz"
    second.parent.mkdir()
    second.write_bytes(responses.read_bytes())
    assert main([str(responses), str(second), "--size", "2", "-o", str(tmp_path / "out2.json")]) == 0
    source = json.loads((tmp_path / "out2.json").read_text())["source"]
    assert f"{tmp_path.name}/responses.jsonl.gz, round2/responses.jsonl.gz" in source


def drafter_and_block_output(tmp_path):
    cfg = tiny_config()
    drafter = load_drafter(save_drafter(tmp_path / "d", cfg, init_drafter_state(cfg, seed=9)))
    cache = DraftContextCache(drafter.make_pool(64))
    for rid, n in enumerate((5, 9, 3)):
        cache.add(rid)
        cache.append(rid, feature_rows(n, cfg, seed=60 + rid))
    return drafter, cache


def test_the_whole_vocabulary_drafts_what_the_unrestricted_drafter_drafts(tmp_path):
    drafter, cache = drafter_and_block_output(tmp_path)
    anchors, temps = torch.tensor([4, 5, 6]), torch.tensor([0.0, 0.9, 0.6])
    uniforms = torch.rand(3, drafter.config.block_size, generator=torch.Generator().manual_seed(3))
    full = drafter.sample_block(run_batch(drafter, cache, [0, 1, 2], [4, 5, 6]), anchors, temps, uniforms=uniforms)
    drafter.restrict_vocab(range(drafter.config.vocab_size))
    same = drafter.sample_block(run_batch(drafter, cache, [0, 1, 2], [4, 5, 6]), anchors, temps, uniforms=uniforms)
    assert torch.equal(same.tokens, full.tokens)
    torch.testing.assert_close(same.probs, full.probs)
    torch.testing.assert_close(same.conf_logits, full.conf_logits)


def test_a_subset_drafts_only_its_tokens(tmp_path):
    drafter, cache = drafter_and_block_output(tmp_path)
    V, G = drafter.config.vocab_size, drafter.config.block_size
    anchors = torch.tensor([4, 5, 6])
    full = drafter.sample_block(run_batch(drafter, cache, [0, 1, 2], [4, 5, 6]), anchors, torch.zeros(3))
    # keep every other token, but never the unrestricted drafter's first greedy drafts
    subset = [t for t in range(V) if t % 2 == 0 and t not in full.tokens[:, 0].tolist()]
    drafter.restrict_vocab(subset)
    out = run_batch(drafter, cache, [0, 1, 2], [4, 5, 6])
    assert out.logits.shape == (3, G, len(subset))
    greedy = drafter.sample_block(out, anchors, torch.zeros(3))
    allowed = torch.tensor(subset)
    assert torch.isin(greedy.tokens, allowed).all()
    # slot 0's Markov bias depends on the anchor only: the restricted logits are the full ones' columns
    torch.testing.assert_close(greedy.logits[:, 0], full.logits[:, 0][:, allowed])
    assert torch.equal(greedy.tokens[:, 0], allowed[full.logits[:, 0][:, allowed].argmax(-1)])
    sampled = drafter.sample_block(out, anchors, torch.full((3,), 0.8), generator=torch.Generator().manual_seed(1))
    assert sampled.probs.shape == (3, G, V) and torch.isin(sampled.tokens, allowed).all()
    torch.testing.assert_close(sampled.probs.sum(-1), torch.ones(3, G))
    outside = torch.ones(V, dtype=torch.bool)
    outside[allowed] = False
    assert sampled.probs[..., outside].abs().sum() == 0
    with pytest.raises(ValueError, match="must lie in"):
        drafter.restrict_vocab([V])
