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


@dataclass(frozen=True)
class LossSpec:
    """The vocabulary terms' weights and targets (`train-draft --loss-ce-weight/--loss-l1-weight/
    --ce-label/--l1-temperatures`). The default is DeepSpec's: 0.1 CE against the response token plus
    0.9 ||p_d - p_t||_1 at temperature 1.
    - ce_label "argmax": CE against the target's greedy token instead of the response's (the same token
      in a T=0 response; in a sampled one the response's token is a draw, the greedy token is what a
      T=0 server verifies against).
    - l1_temperatures: the L1 term is the mean over these temperatures tau of ||softmax(l_d / tau) -
      softmax(l_t / tau)||_1, i.e. one minus the acceptance rate of a request sampled at tau (for
      tau != 1 the target's distribution is p_t^(1/tau) renormalised). The confidence head's target c*
      always uses tau = 1, as the server's confidences do."""

    ce: float = CE_ALPHA
    l1: float = L1_ALPHA
    ce_label: str = "response"
    l1_temperatures: tuple[float, ...] = (1.0,)

    def __post_init__(self):
        if self.ce_label not in ("response", "argmax"):
            raise ValueError(f"ce_label must be response or argmax, got {self.ce_label!r}")
        if not self.l1_temperatures or any(not t > 0 for t in self.l1_temperatures):
            raise ValueError(f"l1_temperatures must be positive, got {self.l1_temperatures}")
        if self.ce < 0 or self.l1 < 0 or self.ce + self.l1 == 0:
            raise ValueError(f"loss weights must be >= 0 and not both 0, got ce={self.ce} l1={self.l1}")

    @property
    def tempered(self) -> tuple[float, ...]:
        """The L1 temperatures other than 1 (each weighs l1 / len(l1_temperatures))."""
        return tuple(t for t in self.l1_temperatures if t != 1.0)


def tempered_probs(p: torch.Tensor, tau: float) -> torch.Tensor:
    """softmax(l / tau) from p = softmax(l): p^(1/tau) renormalised (fp32; underflow only drops mass
    too small to count)."""
    q = p.pow(1.0 / tau)
    return q.div_(q.sum(-1, keepdim=True))


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


# ----------------------------------------------------------------------------- served-anchor focus
#
# A served block starts where the previous one stopped: after a rejected draft (the anchor is the
# target's correction), after a full block, or at the response's first token. At T=0 nearly every
# block starts after a rejection (92% on the held-out set, benchmarks/anchor_bias.py), and there
# the bundled drafter's first slot agrees with the target 64% of the time against 74% over all
# anchors, which is what uniform anchors train for. `anchor_focus` weights each block by what
# precedes its anchor: a block whose anchor the drafter's own first slot, anchored one position
# earlier, missed (the teacher-forced stand-in for "a block stopped here") and a response's first
# anchor weigh `focus`, every other block 1 (focus 1: the uniform loss). Measured in session 28:
# focus 3 left both the agreement after a miss and the held-out accept length where focus 1 left
# them (docs/train-draft.md, "Where served blocks start"); the logged metrics stay either way.


@dataclass
class AnchorLinks:
    """Host-built, per block: the block anchored one position earlier in the same sequence."""

    pred: torch.Tensor  # [N] int64 its index, -1 where that anchor was not drawn (or a padding block)
    first: torch.Tensor  # [N] bool the anchor is its response's first token


def anchor_links(batch: SeqBatch, seq: torch.Tensor, anchor: torch.Tensor, real: torch.Tensor) -> AnchorLinks:
    """sample_anchors' layout: each sequence's real anchors sorted, then its padding copies."""
    N = seq.numel()
    idx = torch.arange(N)
    prev = (idx - 1).clamp_min(0)
    linked = (idx > 0) & (seq[prev] == seq) & (anchor[prev] == anchor - 1) & real[prev] & real
    first = real & ((anchor == 0) | ~batch.loss_mask[seq, (anchor - 1).clamp_min(0)])
    return AnchorLinks(torch.where(linked, prev, torch.full_like(idx, -1)), first)


def focus_weights(hit0: torch.Tensor, links: AnchorLinks, valid0: torch.Tensor, focus: float
                  ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """hit0 [N] bool (slot 0's drafter argmax equals its label), valid0 [N] bool -> (block weight
    multipliers [N], metrics: the share of linked blocks after a miss, and slot 0's agreement after a
    miss and after a hit). Device tensors, no sync."""
    known = links.pred >= 0
    pred_hit = hit0.index_select(0, links.pred.clamp_min(0))
    after_miss = known & ~pred_hit
    after_hit = known & pred_hit
    mult = torch.where(after_miss | links.first, torch.full_like(hit0, focus, dtype=torch.float32),
                       torch.ones_like(hit0, dtype=torch.float32))

    def rate(mask):
        mask = mask & valid0
        return (hit0 & mask).float().sum() / mask.float().sum().clamp_min(1)

    metrics = {"after_miss_share": after_miss.float().sum() / known.float().sum().clamp_min(1),
               "top1@0_after_miss": rate(after_miss), "top1@0_after_hit": rate(after_hit)}
    return mult, metrics


@torch.no_grad()
def slot0_hits(drafter: DSparkDrafter, hidden: torch.Tensor, z: torch.Tensor | None, labels0: torch.Tensor,
               dtype: torch.dtype) -> torch.Tensor:
    """The fused path's slot-0 agreement [N] bool: argmax(h_0 W^T + z_0 W2^T) == labels0, chunked over
    rows, with _FusedVocabLoss's logits (_head_logits)."""
    N, V = hidden.shape[0], drafter.lm_head.weight.shape[0]
    with torch.autocast(hidden.device.type, enabled=False):
        W = drafter.lm_head.weight.detach().to(dtype)
        W2 = drafter.markov_head.markov_w2.weight.detach().to(dtype) if z is not None else None
        h0 = hidden[:, 0].detach().to(dtype)
        z0 = z[:, 0].detach().to(dtype) if z is not None else None
        out = torch.empty(N, dtype=torch.bool, device=hidden.device)
        step = max(1, min(N, CHUNK_ELEMENTS // V)) if N else 1
        for i in range(0, N, step):
            sl = slice(i, min(N, i + step))
            out[sl] = _head_logits(h0[sl], W, z0[sl] if z0 is not None else None, W2).argmax(-1) == labels0[sl]
    return out


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
                blocks: Blocks, spec: LossSpec = LossSpec()) -> tuple[torch.Tensor, dict[str, float]]:
    """logits/target_logits [N, G, V] float32, conf [N, G] -> (total loss, metrics)."""
    dev = logits.device
    w, valid, labels = blocks.weights.to(dev), blocks.valid.to(dev), blocks.labels.to(dev)
    if spec.ce_label == "argmax":
        labels = target_logits.argmax(-1)
    denom = w.sum().clamp_min(1e-6)
    logp_d = torch.log_softmax(logits.float(), dim=-1)
    p_d, p_t = logp_d.exp(), torch.softmax(target_logits.float(), dim=-1)
    l1 = (p_d - p_t).abs().sum(-1)  # [N, G]
    ce = -logp_d.gather(-1, labels[..., None])[..., 0]
    loss_ce, loss_l1 = (w * ce).sum() / denom, (w * l1).sum() / denom
    c_star = (1.0 - 0.5 * l1).clamp(0.0, 1.0).detach()
    per_t = spec.l1 / len(spec.l1_temperatures)
    loss = spec.ce * loss_ce + (per_t * loss_l1 if 1.0 in spec.l1_temperatures else 0.0)
    metrics = {"ce": loss_ce.item(), "l1": loss_l1.item()}
    for tau in spec.tempered:
        l1_t = (torch.softmax(logits.float() / tau, -1) - torch.softmax(target_logits.float() / tau, -1)).abs().sum(-1)
        loss_t = (w * l1_t).sum() / denom
        loss = loss + per_t * loss_t
        metrics[f"l1@{tau:g}"] = loss_t.item()
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


# ----------------------------------------------------------------------------- the fast training path
#
# What the step above materialises is vocabulary-sized: every block slot's drafter logits, Markov
# bias, log-probabilities, probabilities and the target's logits and probabilities, [N, G, V] fp32
# each (32 x 128 x 7 x 49152 = 1.4G elements, 5.6 GB apiece for SmolLM2), and as many again in the
# backward; most of a step's GPU time went there. The path below computes the same loss and the
# same gradients chunk by chunk of SUPERVISED slots only (weight > 0: padding blocks and the slots
# past a response's end carry none), with the target's distribution computed once per distinct
# position (a position is read by up to G blocks) and the gradient w.r.t. the logits formed in
# closed form inside the chunk, so no [rows, V] tensor outlives its chunk and nothing
# vocabulary-sized is kept for the backward.

CHUNK_ELEMENTS = 1 << 28  # rows x V per chunk: 1 GiB in fp32


@dataclass
class LossRows:
    """The supervised slots of a micro-batch's blocks, built on the host (no device sync)."""

    rows: torch.Tensor  # [R] flat slot index j * G + k, valid slots only
    target_rows: torch.Tensor  # [P] distinct flat target positions s * T + (a_j + k) they read
    inverse: torch.Tensor  # [R] index of each slot's position in target_rows
    labels: torch.Tensor  # [R] tok_{a+k+1}
    weights: torch.Tensor  # [R] w_k
    slot: torch.Tensor  # [R] k
    denom: torch.Tensor  # [] sum of all weights (clamped), the normaliser of every term


def loss_rows(blocks: Blocks, T: int) -> LossRows:
    N, G = blocks.valid.shape
    rows = blocks.valid.reshape(-1).nonzero()[:, 0]
    j, k = rows // G, rows % G
    # a valid slot has a + k + 1 < T, so its target row a + k needs no clamp
    flat = blocks.seq[j] * T + blocks.anchor[j] + k
    target_rows, inverse = torch.unique(flat, return_inverse=True)
    return LossRows(rows, target_rows, inverse, blocks.labels.reshape(-1)[rows], blocks.weights.reshape(-1)[rows],
                    k, blocks.weights.sum().clamp_min(1e-6))


def to_device(x, device: torch.device):
    """Host tensors (or a dataclass of them) to the device without a stream sync: pinned memory and
    non_blocking copies on CUDA, so the host can go on preparing the next micro-batch."""
    import dataclasses

    if dataclasses.is_dataclass(x):
        return type(x)(**{f.name: to_device(getattr(x, f.name), device) for f in dataclasses.fields(x)})
    if not isinstance(x, torch.Tensor) or x.device == device:
        return x
    if device.type == "cuda":
        return x.pin_memory().to(device, non_blocking=True)
    return x.to(device)


class _NoLMHead(torch.nn.Module):
    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return hidden[..., :1]  # forward_block's logits become [B, G, 1]: the loss computes the real ones


def block_hidden(drafter: DSparkDrafter, batch: DraftBatch) -> torch.Tensor:
    """The drafter's own forward_block (grouped layout), with autograd, returning the final-normed
    block states h [B, G, d] only: the LM head is applied chunk-wise by fused_dspark_loss."""
    if drafter.draft_vocab is not None:
        raise ValueError("train with the full vocabulary (restrict_vocab comes after training)")
    head = drafter.lm_head
    drafter.lm_head = _NoLMHead()
    try:
        return block_forward(drafter, batch, torch.float32).hidden
    finally:
        drafter.lm_head = head


def teacher_forced_markov(drafter: DSparkDrafter, hidden: torch.Tensor, prev: torch.Tensor
                          ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """teacher_forced_heads without the vocabulary: -> (z [N, G, r], the Markov head's input to W2,
    so that its bias is z W2^T; confidence logits [N, G]). z comes from the head's own bias() with
    W2 replaced by the r x r identity, so every head type (vanilla, gated, rnn) keeps its code."""
    N, G, _ = hidden.shape
    head = drafter.markov_head
    z = None
    e = head.markov_w1(prev) if head is not None else None  # [N, G, r]
    if head is not None:
        eye = torch.eye(head.rank, dtype=e.dtype, device=e.device)
        if head.kind != "rnn":
            z = head.bias(e, hidden, None, eye)[0]
        else:
            zs, state = [], head.init_state(N, e[:, 0])
            for k in range(G):
                zk, state = head.bias(e[:, k], hidden[:, k], state, eye)
                zs.append(zk)
            z = torch.stack(zs, 1)
    conf = None
    if drafter.confidence_head is not None:
        flat_e = e.reshape(N * G, -1) if e is not None else None
        conf = drafter.confidence_head(hidden.reshape(N * G, -1), flat_e).view(N, G)
    return z, conf


def _tempered_l1(logits: torch.Tensor, taus: tuple[float, ...], p_taus, w_t: torch.Tensor):
    """-> (sum over taus of d/d logits of w_t ||softmax(l / tau) - p_t^(tau)||_1 [c, V], or None without taus;
    the weighted sum of those L1 distances per row [c]). p_taus: the chunk's own copies of the target's tempered
    distributions p_t^(tau) [c, V] (tempered_probs), one per tau; overwritten. The gradient of one term w.r.t.
    logit v is (w_t / tau) q_v (s_v - <q, s>), q = softmax(l / tau), s = sign(q - p_t^(tau))."""
    g, val = None, torch.zeros_like(w_t)
    for tau, p_tau in zip(taus, p_taus):  # one more [c, V] temporary a temperature
        q = torch.softmax(logits / tau, -1)
        d = p_tau.neg_().add_(q)  # q - p_t^(tau), in the chunk's copy
        val = val + w_t * torch.linalg.vector_norm(d, 1, dim=-1)
        qs = d.sign_().mul_(q)
        gt = qs.addcmul_(q, qs.sum(-1, keepdim=True), value=-1.0).mul_((w_t / tau)[:, None])
        g = gt if g is None else g.add_(gt)
    return g, val


def _chunk_grad(logits: torch.Tensor, p_t: torch.Tensor, labels: torch.Tensor, w_ce: torch.Tensor,
                w_l1: torch.Tensor, t_arg: torch.Tensor, taus: tuple[float, ...] = (), w_t: torch.Tensor | None = None,
                p_taus=()):
    """One chunk, in place on its fp32 logits [c, V] (then free): -> (d loss / d logits [c, V] in
    logits' storage, ce [c], l1 [c], top1 [c], the weighted tempered L1 terms [c]). loss = sum_r w_ce CE +
    w_l1 ||p_d - p_t||_1 (+ the tempered terms of `_tempered_l1`), whose gradient w.r.t. logit v is
    w_ce (p_v - [v = label]) + w_l1 p_v (s_v - <p, s>), s = sign(p_d - p_t)."""
    top1 = logits.argmax(-1) == t_arg
    g_t, l1_t = _tempered_l1(logits, taus, p_taus, w_t if w_t is not None else torch.zeros_like(w_ce))
    lse = torch.logsumexp(logits, -1)
    ce = lse - logits.gather(1, labels[:, None])[:, 0]
    p = logits.sub_(lse[:, None]).exp_()  # p_d
    d = torch.sub(p, p_t, out=p_t)  # p_t is this chunk's own gathered copy
    l1 = torch.linalg.vector_norm(d, 1, dim=-1)
    q = d.sign_().mul_(p)  # p_v s_v
    ps = q.sum(-1)  # <p, s>
    g = q.mul_(w_l1[:, None]).addcmul_(p, (w_ce - w_l1 * ps)[:, None])
    g.scatter_add_(1, labels[:, None], -w_ce[:, None])
    if g_t is not None:
        g.add_(g_t)
    return g, ce, l1, top1, l1_t


def _chunk_grad_functional(logits, p_t, labels, w_ce, w_l1, t_arg, taus=(), w_t=None, p_taus=()):
    """_chunk_grad without in-place ops on its inputs (but p_taus, the chunk's own copies), for torch.compile
    (which fuses it into a few passes)."""
    top1 = logits.argmax(-1) == t_arg
    g_t, l1_t = _tempered_l1(logits, taus, p_taus, w_t if w_t is not None else torch.zeros_like(w_ce))
    lse = torch.logsumexp(logits, -1, keepdim=True)
    ce = lse[:, 0] - logits.gather(1, labels[:, None])[:, 0]
    p = torch.exp(logits - lse)
    d = p - p_t
    l1 = d.abs().sum(-1)
    s = torch.sign(d)
    ps = (p * s).sum(-1, keepdim=True)
    g = p * (w_l1[:, None] * (s - ps) + w_ce[:, None])
    g = g - w_ce[:, None] * F.one_hot(labels, logits.shape[1]).to(g.dtype)
    if g_t is not None:
        g = g + g_t
    return g, ce, l1, top1, l1_t


_COMPILED: dict[str, object] = {}


def compiled_chunk_grad():
    if "fn" not in _COMPILED:
        _COMPILED["fn"] = torch.compile(_chunk_grad_functional, dynamic=True)
    return _COMPILED["fn"]


def _head_logits(h: torch.Tensor, W: torch.Tensor, z: torch.Tensor | None, W2: torch.Tensor | None) -> torch.Tensor:
    """A chunk's fp32 logits h W^T + z W2^T, the matmuls in the inputs' dtype (bf16 under autocast)."""
    logits = F.linear(h, W).float()
    if W2 is not None:
        logits.add_(F.linear(z, W2))
    return logits


class _FusedVocabLoss(torch.autograd.Function):
    """sum_r w_ce[r] CE_r + w_l1[r] L1_r over the rows' logits l_r = h_r W^T + z_r W2^T, chunk by
    chunk; the gradients w.r.t. h, z and W2 are formed in the forward (the loss is a scalar) and
    scaled by the incoming gradient in the backward. Matmuls run in `dtype` (bf16 under autocast,
    as the unfused step's) with their outputs rounded to it before the fp32 softmax, as there."""

    @staticmethod
    def forward(ctx, hidden, z, head_w, w2, p_t, t_arg, inverse, labels, w_ce, w_l1, dtype, compiled, taus=(),
                w_t=None, p_taus=()):
        R, V = hidden.shape[0], head_w.shape[0]
        dev = hidden.device
        with torch.autocast(dev.type, enabled=False):
            W = head_w.detach().to(dtype)
            W2 = w2.detach().to(dtype) if w2 is not None else None
            hd = hidden.detach().to(dtype)
            zd = z.detach().to(dtype) if z is not None else None
            gh = torch.empty(R, hidden.shape[1], dtype=hidden.dtype, device=dev)
            gz = torch.empty(R, z.shape[1], dtype=z.dtype, device=dev) if z is not None else None
            gw2 = torch.zeros(V, w2.shape[1], dtype=torch.float32, device=dev) if w2 is not None else None
            ce, l1, l1_t = torch.empty(R, device=dev), torch.empty(R, device=dev), torch.zeros(R, device=dev)
            top1 = torch.empty(R, dtype=torch.bool, device=dev)
            step = max(1, min(R, CHUNK_ELEMENTS // V // (1 + len(taus))))  # the tempered terms' temporaries
            chunk_fn = compiled_chunk_grad() if compiled else _chunk_grad
            for i in range(0, R, step):
                sl = slice(i, min(R, i + step))
                logits = _head_logits(hd[sl], W, zd[sl] if zd is not None else None, W2)
                inv = inverse[sl]
                g, ce[sl], l1[sl], top1[sl], l1_t[sl] = chunk_fn(
                    logits, p_t.index_select(0, inv), labels[sl], w_ce[sl], w_l1[sl], t_arg.index_select(0, inv),
                    taus, w_t[sl] if w_t is not None else None, [p.index_select(0, inv) for p in p_taus])
                g = g.to(dtype)
                gh[sl] = g @ W
                if W2 is not None:
                    gz[sl] = g @ W2
                    gw2.add_((g.t() @ zd[sl]).float())
                del logits, g
            loss = (w_ce * ce).sum() + (w_l1 * l1).sum() + l1_t.sum()
        ctx.save_for_backward(gh, gz, gw2)
        ctx.has_z, ctx.w2_dtype = z is not None, (w2.dtype if w2 is not None else None)
        ctx.mark_non_differentiable(ce, l1, top1, l1_t)
        return loss, ce, l1, top1, l1_t

    @staticmethod
    def backward(ctx, g_loss, *unused):
        gh, gz, gw2 = ctx.saved_tensors
        return (gh * g_loss.to(gh.dtype), gz * g_loss.to(gz.dtype) if ctx.has_z else None, None,
                (gw2 * g_loss).to(ctx.w2_dtype) if gw2 is not None else None) + (None,) * 11


def fused_dspark_loss(drafter: DSparkDrafter, hidden: torch.Tensor, z: torch.Tensor | None,
                      conf: torch.Tensor | None, p_t: torch.Tensor, t_arg: torch.Tensor, rows: LossRows,
                      dtype: torch.dtype, compiled: bool = False, spec: LossSpec = LossSpec()
                      ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """dspark_loss's loss and metrics, from the block states h [N, G, d], the Markov input z
    [N, G, r] and the confidence logits [N, G], against the target's distribution p_t [P, V] (fp32)
    and argmax t_arg [P] at rows.target_rows. Metrics stay device tensors (no sync)."""
    N, G, d = hidden.shape
    head = drafter.lm_head
    if getattr(head, "bias", None) is not None:
        raise ValueError("fused_dspark_loss expects an LM head without bias")
    dev = hidden.device
    w = rows.weights
    per_t = spec.l1 / len(spec.l1_temperatures)
    w_ce = (spec.ce / rows.denom) * w
    w_l1 = (per_t / rows.denom) * w if 1.0 in spec.l1_temperatures else torch.zeros_like(w)
    w_t = (per_t / rows.denom) * w if spec.tempered else None
    labels = t_arg.index_select(0, rows.inverse) if spec.ce_label == "argmax" else rows.labels
    p_taus = [tempered_probs(p_t, tau) for tau in spec.tempered]  # once per distinct position, as p_t
    h_rows = hidden.reshape(N * G, d).index_select(0, rows.rows)
    z_rows = z.reshape(N * G, -1).index_select(0, rows.rows) if z is not None else None
    w2 = drafter.markov_head.markov_w2.weight if z is not None else None
    vocab_loss, ce, l1, top1, l1_t = _FusedVocabLoss.apply(h_rows, z_rows, head.weight, w2, p_t, t_arg, rows.inverse,
                                                           labels, w_ce, w_l1, dtype, compiled, spec.tempered, w_t,
                                                           p_taus)
    loss = vocab_loss
    metrics = {"ce": (w * ce).sum() / rows.denom, "l1": (w * l1).sum() / rows.denom}
    if spec.tempered:  # the tempered terms' mean L1 (their sum over taus, each weighed like the others)
        metrics["l1_tempered"] = l1_t.sum() / (per_t * len(spec.tempered))
    c_rows = (1.0 - 0.5 * l1).clamp(0.0, 1.0)  # c* of the supervised slots (detached: l1 has no grad)
    if conf is not None:
        c_star = torch.zeros(N * G, device=dev).index_copy_(0, rows.rows, c_rows)
        w_full = torch.zeros(N * G, device=dev).index_copy_(0, rows.rows, w)
        bce = F.binary_cross_entropy_with_logits(conf.reshape(-1).float(), c_star, reduction="none")
        loss_conf = (w_full * bce).sum() / rows.denom
        loss = loss + CONF_ALPHA * loss_conf
        metrics["conf"] = loss_conf.detach()
        metrics["conf_bias"] = ((torch.sigmoid(conf.detach().reshape(-1).float().index_select(0, rows.rows)) - c_rows).sum()
                                / max(1, rows.rows.numel()))
    counts = torch.zeros(G, device=dev).index_add_(0, rows.slot, torch.ones_like(c_rows)).clamp_min(1)
    metrics["top1@k"] = torch.zeros(G, device=dev).index_add_(0, rows.slot, top1.float()) / counts
    metrics["accept_rate@k"] = torch.zeros(G, device=dev).index_add_(0, rows.slot, c_rows) / counts
    metrics["loss"] = loss.detach()
    return loss, metrics
