"""DeepSpec-format checkpoints: written here, loaded and run; dflash_config normalisation;
embed_tokens / lm_head aliased to the target's when absent; malformed ones -> clear errors."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from spec_helpers import feature_rows, run_batch, tiny_config, tiny_raw
from sglaunch.engine.distributed import TPGroup
from sglaunch.engine.layers import ParallelLMHead, VocabParallelEmbedding
from sglaunch.speculative.checkpoint import init_drafter_state, load_drafter, save_drafter
from sglaunch.speculative.drafter import DraftContextCache, as_model_spec
from sglaunch.speculative.drafter_config import load_drafter_config, parse_drafter_config


def logits_of(drafter, seed=0):
    cache = DraftContextCache(drafter.make_pool(32))
    cache.add(0)
    cache.append(0, feature_rows(6, drafter.config, seed=seed))
    return run_batch(drafter, cache, [0], [11]).logits


def test_written_checkpoint_has_deepspec_names_and_fields(qwen3_ckpt):
    cfg = json.loads((qwen3_ckpt / "config.json").read_text())
    assert cfg["architectures"] == ["Qwen3DSparkModel"] and cfg["model_type"] == "qwen3"
    for key in ("block_size", "mask_token_id", "target_layer_ids", "markov_rank", "markov_head_type",
                "enable_confidence_head", "confidence_head_with_markov", "num_hidden_layers"):
        assert key in cfg
    names = set(load_file(str(qwen3_ckpt / "model.safetensors")))
    assert {"fc.weight", "hidden_norm.weight", "norm.weight", "layers.0.self_attn.q_proj.weight",
            "layers.1.self_attn.k_norm.weight", "layers.0.mlp.gate_proj.weight", "markov_head.markov_w1.weight",
            "markov_head.markov_w2.weight", "confidence_head.proj.weight", "confidence_head.proj.bias",
            "embed_tokens.weight", "lm_head.weight"} <= names
    assert not any(n.startswith("model.") for n in names)
    assert torch.isfinite(logits_of(load_drafter(qwen3_ckpt))).all()


def test_target_config_is_kept_and_dflash_variant_normalised(tmp_path):
    cfg = tiny_config()
    path = save_drafter(tmp_path / "a", cfg, init_drafter_state(cfg), target_config={"bos_token_id": 1, "hidden_size": 1})
    raw = json.loads((path / "config.json").read_text())
    assert raw["bos_token_id"] == 1 and raw["hidden_size"] == 32
    variant = dict(raw, architectures=["DSparkDraftModel"], dflash_config={"mask_token_id": 5, "target_layer_ids": [1, 2]})
    del variant["mask_token_id"], variant["target_layer_ids"]
    parsed = parse_drafter_config(variant)
    assert parsed.architecture == "Qwen3DSparkModel" and parsed.mask_token_id == 5 and parsed.target_layer_ids == (1, 2)
    llama = parse_drafter_config(tiny_raw(architectures=["LlamaDSparkModel"], model_type="llama"))
    assert llama.family == "llama" and not llama.qk_norm


def test_llama_drafter_with_attention_bias_runs(tmp_path):
    cfg = tiny_config(architectures=["LlamaDSparkModel"], model_type="llama", attention_bias=True)
    path = save_drafter(tmp_path / "l", cfg, init_drafter_state(cfg))
    drafter = load_drafter(path)
    assert not hasattr(drafter.layers[0].self_attn, "q_norm")
    assert torch.isfinite(logits_of(drafter)).all()


class FakeTarget:
    """The parts of the engine's CausalLM the loader uses."""

    def __init__(self, state):
        self.spec = dataclasses.replace(as_model_spec(tiny_config()), num_layers=4)
        tp = TPGroup(0, 1)
        self.model = torch.nn.Module()
        self.model.embed_tokens = VocabParallelEmbedding(97, 32, tp, torch.float32, torch.device("cpu"))
        self.lm_head = ParallelLMHead(97, 32, tp, torch.float32, torch.device("cpu"))
        with torch.no_grad():
            self.model.embed_tokens.weight.copy_(state["embed_tokens.weight"])
            self.lm_head.weight.copy_(state["lm_head.weight"])


def test_embed_and_lm_head_alias_the_target_when_absent(tmp_path):
    cfg = tiny_config()
    state = init_drafter_state(cfg, seed=5)
    full = load_drafter(save_drafter(tmp_path / "full", cfg, state))
    bare_state = {k: v for k, v in state.items() if k not in ("embed_tokens.weight", "lm_head.weight")}
    bare = save_drafter(tmp_path / "bare", cfg, bare_state)
    with pytest.raises(ValueError, match="no 'embed_tokens.weight'.*target"):
        load_drafter(bare)
    target = FakeTarget(state)
    aliased = load_drafter(bare, target=target)
    assert aliased.embed_tokens is target.model.embed_tokens and aliased.lm_head is target.lm_head
    assert aliased.aliased == {"embed_tokens", "lm_head"}
    torch.testing.assert_close(logits_of(aliased), logits_of(full))


def test_incompatible_target_is_refused(tmp_path):
    cfg = tiny_config()
    bare = save_drafter(tmp_path / "b", cfg, {k: v for k, v in init_drafter_state(cfg).items() if k != "lm_head.weight"})
    target = FakeTarget(init_drafter_state(cfg))
    target.spec = dataclasses.replace(target.spec, num_layers=3)  # layer 2 is now the final layer
    with pytest.raises(ValueError, match="target_layer_ids"):
        load_drafter(bare, target=target)


def test_missing_tensor_is_named(qwen3_ckpt, tmp_path):
    state = load_file(str(qwen3_ckpt / "model.safetensors"))
    del state["layers.1.self_attn.k_norm.weight"]
    (tmp_path / "config.json").write_text((qwen3_ckpt / "config.json").read_text())
    save_file(state, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match=r"lacks 1 tensor.*layers\.1\.self_attn\.k_norm\.weight"):
        load_drafter(tmp_path)


def test_wrong_shape_and_unexpected_tensor_are_named(qwen3_ckpt, tmp_path):
    state = load_file(str(qwen3_ckpt / "model.safetensors"))
    (tmp_path / "config.json").write_text((qwen3_ckpt / "config.json").read_text())
    save_file({**state, "markov_head.markov_w1.weight": torch.zeros(97, 4)}, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match=r"'markov_head.markov_w1.weight' has shape \[97, 4\].*\[97, 8\]"):
        load_drafter(tmp_path)
    save_file({**state, "extra.weight": torch.zeros(2)}, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match="unexpected tensor 'extra.weight'"):
        load_drafter(tmp_path)


@pytest.mark.parametrize("field,value,message", [
    ("architectures", ["Qwen3ForCausalLM"], "'architectures'"),
    ("architectures", ["Gemma4DSparkModel"], "Gemma4"),
    ("mask_token_id", 500, "'mask_token_id' = 500"),
    ("target_layer_ids", [2, 1], "strictly increasing"),
    ("target_layer_ids", [0, 3], "final layer"),
    ("target_layer_ids", "1,2", "'target_layer_ids'"),
    ("markov_head_type", "lstm", "'markov_head_type'"),
    ("block_size", 0, "'block_size' = 0"),
    ("block_size", None, "required field 'block_size'"),
    ("enable_confidence_head", "yes", "'enable_confidence_head'"),
])
def test_bad_config_field_is_named(tmp_path, qwen3_ckpt, field, value, message):
    raw = json.loads((qwen3_ckpt / "config.json").read_text())
    raw[field] = value
    (tmp_path / "config.json").write_text(json.dumps(raw))
    with pytest.raises(ValueError, match=message):
        load_drafter_config(tmp_path)


def test_no_config_or_weights(tmp_path):
    with pytest.raises(ValueError, match="config.json does not exist"):
        load_drafter(tmp_path)
    cfg = tiny_config()
    (tmp_path / "config.json").write_text(json.dumps(cfg.to_config_dict()))
    with pytest.raises(ValueError, match="no \\*.safetensors"):
        load_drafter(tmp_path)
