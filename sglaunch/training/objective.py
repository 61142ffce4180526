"""Anchor blocks and the DSpark training loss [DSpark §4].

Per sequence, anchors `a` are drawn uniformly without replacement among positions where both
`loss_mask[a]` and `loss_mask[a + 1]` hold. Block input [tok_a, MASK x (G - 1)] at positions
a .. a+G-1, labels tok_{a+1 .. a+G}; a block sees the target features of positions < a plus
itself. All blocks of a micro-batch run as ONE DraftBatch through the drafter module's own
block forward (one pool slot per sequence position; slot_table = the block's sequence,
ctx_lens = a), so training and serving share the forward code.

Teacher forcing: the Markov bias and the confidence features use the true previous tokens
[tok_a, label_0 .. label_{G-2}]. Losses, with w_k = exp(-k / 4) on a contiguous valid prefix:
0.1 CE(p_d, label) + 0.9 ||p_d - p_t||_1 + 1.0 BCE(conf, c* = clamp(1 - ||p_d - p_t||_1 / 2)).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from sglaunch.speculative.drafter import BlockOutput, DraftBatch, DSparkDrafter

CE_ALPHA, L1_ALPHA, CONF_ALPHA = 0.1, 0.9, 1.0
LOSS_DECAY = 4.0


@dataclass
class SeqBatch:
    ids: torch.Tensor  # [B, T] int64, right-padded with 0
    loss_mask: torch.Tensor  # [B, T] bool, response tokens
    attention_mask: torch.Tensor  # [B, T] int64


def collate(samples, max_length: int) -> SeqBatch:
    """Prompt + response per sample, truncated to max_length; loss on response tokens."""
    rows = [(s.prompt + s.response)[:max_length] for s in samples]
    T = max(len(r) for r in rows)
    ids = torch.zeros(len(rows), T, dtype=torch.int64)
    mask = torch.zeros(len(rows), T, dtype=torch.bool)
    attn = torch.zeros(len(rows), T, dtype=torch.int64)
    for i, (s, r) in enumerate(zip(samples, rows)):
        ids[i, : len(r)] = torch.tensor(r)
        attn[i, : len(r)] = 1
        mask[i, len(s.prompt): len(r)] = True
    return SeqBatch(ids, mask, attn)


@dataclass
class Blocks:
    seq: torch.Tensor  # [N] sequence of each block
    anchor: torch.Tensor  # [N] anchor position a
    prev: torch.Tensor  # [N, G] teacher-forced previous token of slot k: tok_{a+k}
    labels: torch.Tensor  # [N, G] tok_{a+k+1}
    valid: torch.Tensor  # [N, G] bool, contiguous prefix inside the sequence and the loss mask
    weights: torch.Tensor  # [N, G] float32, w_k on valid slots


def sample_anchors(batch: SeqBatch, per_seq: int, gen: torch.Generator
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """-> (seq [N], anchor [N], real [N]): up to per_seq anchors per sequence, uniform, no
    replacement, grouped: every sequence gets the same number A of blocks (N = B * A), padded
    with copies of a real anchor (or position 0) that carry no loss (real False)."""
    ok = batch.loss_mask[:, :-1] & batch.loss_mask[:, 1:]  # [B, T-1]
    picked = []
    for s in range(ok.shape[0]):
        cand = ok[s].nonzero()[:, 0]
        if cand.numel() > per_seq:
            cand = cand[torch.randperm(cand.numel(), generator=gen)[:per_seq]].sort().values
        picked.append(cand)
    A = max((c.numel() for c in picked), default=0)
    if A == 0:
        empty = torch.zeros(0, dtype=torch.int64)
        return empty, empty, empty.bool()
    seqs, anchors, real = [], [], []
    for s, cand in enumerate(picked):
        pad = A - cand.numel()
        filler = cand[:1].expand(pad) if cand.numel() else torch.zeros(pad, dtype=torch.int64)
        seqs.append(torch.full((A,), s, dtype=torch.int64))
        anchors.append(torch.cat([cand, filler]))
        real.append(torch.arange(A) < cand.numel())
    return torch.cat(seqs), torch.cat(anchors), torch.cat(real)


def make_blocks(batch: SeqBatch, seq: torch.Tensor, anchor: torch.Tensor, block_size: int,
                real: torch.Tensor | None = None) -> Blocks:
    T = batch.ids.shape[1]
    k = torch.arange(block_size)
    pos = anchor[:, None] + k[None, :]  # [N, G] position of slot k's input
    inside = pos + 1 < T
    lab_pos = (pos + 1).clamp(max=T - 1)
    labels = batch.ids[seq[:, None], lab_pos]
    prev = batch.ids[seq[:, None], pos.clamp(max=T - 1)]
    valid = (inside & batch.loss_mask[seq[:, None], lab_pos]).int().cumprod(-1).bool()
    if real is not None:
        valid &= real[:, None]
    weights = torch.exp(-k.float() / LOSS_DECAY)[None, :] * valid
    return Blocks(seq, anchor, prev, labels, valid, weights)


def draft_batch(ids: torch.Tensor, features: torch.Tensor, blocks: Blocks, groups: int = 0) -> DraftBatch:
    """Every sequence position is a context row (seq * T + pos); a block sees its sequence's
    rows < a. groups > 0: blocks come `groups` per sequence in sequence order (sample_anchors'
    layout), so the drafter shares each sequence's context K/V between its blocks."""
    B, T, width = features.shape
    dev = features.device
    seq, anchor = blocks.seq.to(dev), blocks.anchor.to(dev)
    slot_table = seq[:, None] * T + torch.arange(T, device=dev)[None, :] if not groups else seq[:, None]
    return DraftBatch(
        anchor_tokens=ids.to(dev)[seq, anchor], anchor_positions=anchor,
        ctx_features=features.reshape(B * T, width), ctx_positions=torch.arange(T, device=dev).repeat(B),
        ctx_slots=torch.arange(B * T, device=dev), slot_table=slot_table, ctx_lens=anchor, groups=groups,
    )


def block_forward(drafter: DSparkDrafter, batch: DraftBatch, pool_dtype: torch.dtype) -> BlockOutput:
    """The drafter's own parallel stage (forward_block), with autograd (it is inference-mode
    decorated for serving). The grouped layout needs no pool."""
    pool = None if batch.groups else drafter.make_pool(batch.ctx_slots.numel(), pool_dtype)
    return DSparkDrafter.forward_block.__wrapped__(drafter, batch, pool)


def teacher_forced_heads(drafter: DSparkDrafter, out: BlockOutput, prev: torch.Tensor
                         ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Markov-corrected logits l_k = U_k + B_k(prev_k) [N, G, V] and confidence logits [N, G].
    Teacher forcing makes every slot's inputs known, so all slots are computed at once, except
    for the rnn head whose state runs left to right."""
    N, G, _ = out.logits.shape
    head = drafter.markov_head
    e = head.markov_w1(prev) if head is not None else None  # [N, G, r]
    if head is None:
        logits = out.logits
    elif head.kind != "rnn":
        logits = out.logits + head.bias(e, out.hidden, None)[0]
    else:
        biases, state = [], head.init_state(N, e[:, 0])
        for k in range(G):
            bias, state = head.bias(e[:, k], out.hidden[:, k], state)
            biases.append(bias)
        logits = out.logits + torch.stack(biases, 1)
    conf = None
    if drafter.confidence_head is not None:
        flat_e = e.reshape(N * G, -1) if e is not None else None
        conf = drafter.confidence_head(out.hidden.reshape(N * G, -1), flat_e).view(N, G)
    return logits, conf


def dspark_loss(logits: torch.Tensor, conf: torch.Tensor | None, target_logits: torch.Tensor,
                blocks: Blocks) -> tuple[torch.Tensor, dict[str, float]]:
    """logits/target_logits [N, G, V] float32, conf [N, G] -> (total loss, metrics)."""
    dev = logits.device
    w, valid, labels = blocks.weights.to(dev), blocks.valid.to(dev), blocks.labels.to(dev)
    denom = w.sum().clamp_min(1e-6)
    logp_d = torch.log_softmax(logits.float(), dim=-1)
    p_d, p_t = logp_d.exp(), torch.softmax(target_logits.float(), dim=-1)
    l1 = (p_d - p_t).abs().sum(-1)  # [N, G]
    ce = -logp_d.gather(-1, labels[..., None])[..., 0]
    loss_ce, loss_l1 = (w * ce).sum() / denom, (w * l1).sum() / denom
    c_star = (1.0 - 0.5 * l1).clamp(0.0, 1.0).detach()
    loss = CE_ALPHA * loss_ce + L1_ALPHA * loss_l1
    metrics = {"ce": loss_ce.item(), "l1": loss_l1.item()}
    if conf is not None:
        bce = F.binary_cross_entropy_with_logits(conf.float(), c_star, reduction="none")
        loss_conf = (w * bce).sum() / denom
        loss = loss + CONF_ALPHA * loss_conf
        metrics["conf"] = loss_conf.item()
        metrics["conf_bias"] = _masked_mean(torch.sigmoid(conf.detach().float()) - c_star, valid)
    with torch.no_grad():
        top1 = (logits.argmax(-1) == target_logits.argmax(-1)).float()
        counts = valid.sum(0).clamp_min(1)
        metrics["top1@k"] = ((top1 * valid).sum(0) / counts).tolist()
        metrics["accept_rate@k"] = ((c_star * valid).sum(0) / counts).tolist()
    metrics["loss"] = loss.item()
    return loss, metrics


def _masked_mean(x: torch.Tensor, mask: torch.Tensor) -> float:
    return float((x * mask).sum() / mask.sum().clamp_min(1))
