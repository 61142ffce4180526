"""The drafter being trained: built from the speculative package's module with the target's
embed_tokens / lm_head aliased (frozen, never saved), initialised, exported to DeepSpec names."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from sglaunch.engine.distributed import TPGroup
from sglaunch.errors import SglaunchError
from sglaunch.speculative.checkpoint import load_weights, resolve_module, tensor_index, weight_files
from sglaunch.speculative.drafter import DSparkDrafter
from sglaunch.speculative.drafter_config import DrafterConfig, check_target_compat, expected_shapes, load_drafter_config

ALIASED = ("embed_tokens.", "lm_head.")


def build_drafter(cfg: DrafterConfig, embed_tokens, lm_head, device: torch.device, max_positions: int
                  ) -> DSparkDrafter:
    """fp32 master weights; autocast supplies bf16 compute on GPUs."""
    drafter = DSparkDrafter(cfg, TPGroup(0, 1), torch.float32, device, max_positions,
                            embed_tokens=embed_tokens, lm_head=lm_head)
    for param in own_parameters(drafter).values():
        param.requires_grad_(True)
    return drafter


def own_parameters(drafter: DSparkDrafter) -> dict[str, torch.nn.Parameter]:
    """Trainable parameters: everything but the aliased (frozen) embeddings and LM head."""
    return {n: p for n, p in drafter.named_parameters() if not n.startswith(ALIASED)}


# At init the block rows are little more than token embeddings; with a tied LM head the target's
# final norm would make each row predict its own input token with near-certainty (CE ~ 90 on
# SmolLM2), where the L1 term's gradient vanishes. Scaled down, the drafter starts near uniform.
OUTPUT_NORM_SCALE = 0.05


def init_weights(drafter: DSparkDrafter, seed: int, final_norm: torch.Tensor | None, std: float = 0.02) -> None:
    """HF-style init: N(0, std) matrices, zero biases, unit norms; the output norm starts as the
    target's final norm scaled by OUTPUT_NORM_SCALE (the frozen lm_head was trained behind it); Markov W2 starts at zero so
    the drafter begins as pure DFlash."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in own_parameters(drafter).items():
            if "norm" in name:
                param.fill_(1.0)
            elif name.endswith("bias") or name.startswith("markov_head.markov_w2"):
                param.zero_()
            else:
                param.copy_(torch.randn(param.shape, generator=gen) * std)
        if final_norm is not None:
            drafter.norm.weight.copy_(final_norm.float() * OUTPUT_NORM_SCALE)


def export_state(drafter: DSparkDrafter) -> dict[str, torch.Tensor]:
    """DeepSpec tensor names (q/k/v and gate/up unpacked), without embed_tokens / lm_head."""
    out = {}
    for name in expected_shapes(drafter.config, False, False):
        module, attr, section = resolve_module(drafter, name)
        tensor = getattr(module, attr)
        sizes = getattr(module, "local_sizes", None)
        if sizes is not None and len(sizes) > 1:
            start = sum(sizes[:section])
            tensor = tensor[start: start + sizes[section]]
        out[name] = tensor.detach().float().cpu().clone()
    return out


def torch_state(drafter: DSparkDrafter) -> dict[str, torch.Tensor]:
    return {n: t.detach().cpu().clone() for n, t in drafter.state_dict().items() if not n.startswith(ALIASED)}


def load_torch_state(drafter: DSparkDrafter, state: dict[str, torch.Tensor]) -> None:
    result = drafter.load_state_dict(state, strict=False)
    missing = [k for k in result.missing_keys if not k.startswith(ALIASED)]
    if missing or result.unexpected_keys:
        raise SglaunchError(f"the training checkpoint does not match this drafter: missing {missing[:3]}, "
                            f"unexpected {result.unexpected_keys[:3]}",
                            hint="resume with the same --num-draft-layers / --markov-rank / target as before")


def init_from_checkpoint(path: Path, target_cfg: dict) -> DrafterConfig:
    """Config of an existing DSpark checkpoint to fine-tune, checked against the target."""
    try:
        cfg = load_drafter_config(path)
        check_target_compat(cfg, int(target_cfg["hidden_size"]), int(target_cfg["vocab_size"]),
                            int(target_cfg["num_hidden_layers"]))
    except ValueError as exc:
        raise SglaunchError(f"--init-from {path}: {exc}", hint="start from a drafter trained for this target, "
                            "or train from scratch without --init-from") from None
    return cfg


def load_checkpoint_weights(drafter: DSparkDrafter, path: Path, cfg: DrafterConfig | None = None) -> None:
    """Fill the drafter from a checkpoint whose config is `cfg` (default: the drafter's own); a
    grown drafter passes the checkpoint's (fewer layers): its first layers and every non-layer
    tensor are loaded, the later layers are left as they are (see grow_layers)."""
    try:
        index = tensor_index(weight_files(path))
        index = {k: v for k, v in index.items() if not k.startswith(ALIASED)}
        load_weights(drafter, cfg or drafter.config, path, index)
    except ValueError as exc:
        raise SglaunchError(f"--init-from {path}: {exc}") from None


def grown_config(cfg: DrafterConfig, grow_layers: int) -> DrafterConfig:
    """The checkpoint's config with `grow_layers` more decoder layers (config.json's layer_types
    follows num_layers when written: DrafterConfig.to_config_dict)."""
    return dataclasses.replace(cfg, num_layers=cfg.num_layers + grow_layers)


@torch.no_grad()
def grow_layers(drafter: DSparkDrafter, first_new: int) -> None:
    """Make layers first_new.. identities through their residual connections, so the grown
    drafter computes exactly what the first_new-layer checkpoint did: o_proj and down_proj (and
    their biases) at zero, so each new layer adds 0 to the residual stream. The new layers sit
    at the end of the stack, after the loaded ones and before the final norm.

    NOTE: the other weights of a new layer (its norms, q/k/v, q/k norms, gate/up) are copied
    from the last loaded layer rather than drawn at random (LLaMA Pro's block expansion,
    arXiv:2401.02415, does the same): they are already scaled to this residual stream and to
    trained norms, so the first gradients of the zeroed o_proj / down_proj act on attention
    patterns and MLP features the trained layer already computes, where N(0, 0.02) q/k
    give near-uniform attention. The copy cannot
    make the new layer redundant with its source: it reads the source's output, not its input,
    and its output weights start at zero and then follow their own gradients."""
    if not 1 <= first_new <= len(drafter.layers):
        raise ValueError(f"grow_layers: first_new {first_new} not in [1, {len(drafter.layers)}]")
    source = dict(drafter.layers[first_new - 1].named_parameters())
    for layer in drafter.layers[first_new:]:
        for name, param in layer.named_parameters():
            param.copy_(source[name])
        for proj in (layer.self_attn.o_proj, layer.mlp.down_proj):
            proj.weight.zero_()
            if proj.bias is not None:
                proj.bias.zero_()


def grown_rank_config(cfg: DrafterConfig, rank: int) -> DrafterConfig:
    """The checkpoint's config with a Markov head of `rank` (> its own; vanilla heads only: a gated
    or rnn head's projections are shaped by the rank in ways a zero extension does not keep)."""
    if cfg.markov_rank <= 0 or cfg.markov_head_type != "vanilla":
        raise ValueError(f"--grow-markov-rank needs a vanilla Markov head, the checkpoint has "
                         f"{cfg.markov_head_type!r} of rank {cfg.markov_rank}")
    if rank <= cfg.markov_rank:
        raise ValueError(f"--grow-markov-rank {rank} must exceed the checkpoint's rank {cfg.markov_rank}")
    return dataclasses.replace(cfg, markov_rank=rank)


@torch.no_grad()
def load_into_grown_rank(drafter: DSparkDrafter, path: Path, cfg: DrafterConfig, seed: int) -> None:
    """Fill a drafter whose Markov rank R exceeds the checkpoint's r (config `cfg`) so that it
    computes exactly the checkpoint's function: W1[:, :r] and W2[:, :r] are the checkpoint's,
    W2[:, r:] is zero (the new directions add nothing to the bias at step 0), and the confidence
    head's columns for the new Markov dimensions are zero. W1[:, r:] is drawn N(0, s) with s the
    RMS of the checkpoint's W1 (seeded), so the first gradients of W2's new columns read features
    of the previous token at the scale the trained ones have (zero W1 columns would leave W2's new
    columns without gradient: W2's gradient is the bias gradient times W1[x]).

    NOTE: the checkpoint is loaded into a drafter of its own shape on the CPU first (the one
    loader, its shape checks), then copied over. That drafter borrows this one's aliased
    embeddings / LM head (the target's, not part of a checkpoint's own tensors, never touched
    here) rather than allocating a vocabulary-sized pair of its own."""
    small = DSparkDrafter(cfg, TPGroup(0, 1), torch.float32, torch.device("cpu"), 16,
                          embed_tokens=drafter.embed_tokens, lm_head=drafter.lm_head)
    load_checkpoint_weights(small, path, cfg)
    r, d = cfg.markov_rank, cfg.hidden_size
    big = own_parameters(drafter)
    gen = torch.Generator().manual_seed(seed)
    for name, src in own_parameters(small).items():
        dst = big[name]
        if dst.shape == src.shape:
            dst.copy_(src)
        elif name == "markov_head.markov_w1.weight":
            noise = torch.randn(dst.shape[0], dst.shape[1] - r, generator=gen) * src.pow(2).mean().sqrt()
            dst.copy_(torch.cat([src, noise], dim=1))
        elif name == "markov_head.markov_w2.weight":
            dst.zero_()
            dst[:, :r].copy_(src)
        elif name == "confidence_head.proj.weight":
            dst.zero_()
            dst[:, : d + r].copy_(src)
        else:
            raise ValueError(f"grow_markov_rank: {name} is {list(src.shape)} in the checkpoint, {list(dst.shape)} here")


def markov_parameters(drafter: DSparkDrafter) -> set[str]:
    """The Markov head's own parameters (W1, W2, and a gated / rnn head's projections)."""
    return {n for n in own_parameters(drafter) if n.startswith("markov_head.")}


def checkpoint_bytes(cfg: DrafterConfig, bytes_per_param: int = 2) -> int:
    shapes = expected_shapes(cfg, False, False)
    total = 0
    for shape in shapes.values():
        n = 1
        for s in shape:
            n *= s
        total += n
    return total * bytes_per_param
