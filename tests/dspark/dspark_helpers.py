"""Tiny target checkpoints and DSpark drafters for the end-to-end tests.

- `build_target(folder, alpha)`: a random 3-layer Qwen3 (tied embeddings, q/k norms). Its
  attention and MLP outputs are scaled by `alpha`: at alpha = 0 the next greedy token is a
  function g(x) of the current token only; small alpha keeps it *mostly* so while the context
  still matters (so wrong KV would change the output).
- `random_drafter`: random weights (drafts are rarely accepted: rejection on almost every step).
- `oracle_drafter`: a real DSpark checkpoint whose Markov head (rank V, W1 = I, W2 = 50 * [v ==
  g(u)]) drafts the chain x, g(x), g(g(x)), ...: it agrees with the target most of the time, so
  several tokens are accepted per step and rejections still happen.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import torch
import transformers

from sglaunch.config import EngineConfig, SpeculativeConfig
from sglaunch.speculative.checkpoint import init_drafter_state, save_drafter
from sglaunch.speculative.drafter_config import parse_drafter_config
from sglaunch.speculative.sps import SpsTable, save_sps_table

VOCAB, HIDDEN, GAMMA = 256, 64, 4
TARGET = dict(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=128, num_hidden_layers=3,
              num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=512,
              tie_word_embeddings=True, eos_token_id=None)


def build_target(folder: Path, alpha: float = 8.0, seed: int = 1234) -> Path:
    torch.manual_seed(seed)
    model = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**TARGET)).to(torch.float32)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(("norm.weight", "layernorm.weight")):
                param.add_(torch.randn_like(param) * 0.1)
            if name.endswith(("o_proj.weight", "down_proj.weight")):
                param.mul_(alpha)
    model.save_pretrained(folder)
    return folder


def bigram_successor(target: Path) -> torch.Tensor:
    """g(x) [V]: the target's greedy next token when its layers add nothing (alpha = 0)."""
    model = transformers.AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32)
    with torch.no_grad():
        return model.lm_head(model.model.norm(model.model.embed_tokens.weight)).argmax(-1)


def drafter_config(markov_rank: int, **overrides):
    raw = dict(architectures=["Qwen3DSparkModel"], model_type="qwen3", **{k: v for k, v in TARGET.items()
                                                                           if k != "eos_token_id"})
    raw.update(num_hidden_layers=1, block_size=GAMMA, mask_token_id=VOCAB - 1, target_layer_ids=[0, 1],
               num_target_layers=3, markov_rank=markov_rank, markov_head_type="vanilla",
               enable_confidence_head=True, confidence_head_with_markov=True, tie_word_embeddings=False)
    raw.update(overrides)
    return parse_drafter_config(raw)


def random_drafter(folder: Path, seed: int = 5) -> Path:
    cfg = drafter_config(markov_rank=8)
    return save_drafter(folder, cfg, init_drafter_state(cfg, seed=seed, with_embed=False, with_lm_head=False))


def oracle_drafter(folder: Path, target: Path) -> Path:
    cfg = drafter_config(markov_rank=VOCAB)
    state = init_drafter_state(cfg, seed=11, with_embed=False, with_lm_head=False)
    g = bigram_successor(target)
    state["markov_head.markov_w1.weight"] = torch.eye(VOCAB)
    w2 = torch.zeros(VOCAB, VOCAB)
    w2[g, torch.arange(VOCAB)] = 50.0  # B(v | u) = 50 [v == g(u)]
    state["markov_head.markov_w2.weight"] = w2
    state["confidence_head.proj.bias"] = torch.tensor([2.0])  # confident: long windows usually
    return save_drafter(folder, cfg, state)


def steep_sps(path: Path) -> Path:
    """A step-cost table where extra verify tokens cost a lot: the planner trims windows."""
    save_sps_table(SpsTable.from_points({1: 100.0, 4: 90.0, 8: 60.0, 16: 35.0, 32: 18.0, 64: 9.0}), path)
    return path


def engine_config(target: Path, drafter: Path | None = None, mode: str = "compact", sps: Path | None = None,
                  sts: Path | None = None, **overrides) -> EngineConfig:
    spec = None
    if drafter is not None:
        spec = SpeculativeConfig(algorithm="DSPARK", draft_model_path=str(drafter), block_size=GAMMA,
                                 num_draft_tokens=GAMMA + 1, ragged_verify_mode=mode,
                                 sps_table_path=str(sps) if sps else None,
                                 confidence_sts_path=str(sts) if sts else None)
    base = EngineConfig(model_path=str(target), tokenizer_path=str(target), served_model_name="tiny",
                        dtype="float32", kv_cache_dtype="float32", context_length=None, max_total_tokens=4096,
                        speculative=spec)
    return dataclasses.replace(base, **overrides)


def prompts(count: int, seed: int = 0, lengths=(1, 3, 7, 12, 20, 33)) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, VOCAB - 1, (lengths[i % len(lengths)],), generator=gen).tolist() for i in range(count)]


def write_json(path: Path, data) -> Path:
    path.write_text(json.dumps(data))
    return path
