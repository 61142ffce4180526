"""train-draft's orchestrator: data -> drafter -> AdamW + cosine loop -> checkpoints -> eval.

Output folder layout:
  responses.jsonl        the target's responses to the training prompts (generated once)
  heldout.jsonl          the held-out prompts (token ids + type), never trained on
  train_log.jsonl        one line per logged step (loss terms, lr, top-1 / accept-rate per slot)
  checkpoints/step-N/    drafter (DeepSpec format) + trainer.pt (optimizer, schedule, step) for --resume
  drafter/               the final drafter: config.json, model.safetensors (bf16, no embeddings /
                         LM head: aliased to the target's at load), eval.json, sts.json (--fit-sts)
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
import time
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from sglaunch.errors import SglaunchError
from sglaunch.training import attention as train_attention, data, model, objective, target as target_mod


@dataclass
class TrainArgs:
    target: Path
    prompts: Path
    output: Path
    eval_prompts: Path | None = None
    eval_fraction: float = 0.05
    device: str = "cpu"
    dtype: str = "float32"  # compute dtype: bfloat16 = target in bf16 + bf16 autocast, fp32 master weights
    seed: int = 0
    # drafter shape
    num_draft_layers: int = 3
    block_size: int = 7
    markov_rank: int = 256
    markov_head_type: str = "vanilla"
    intermediate_size: int | None = None  # None: the target's
    target_layer_ids: list[int] | None = None
    num_feature_layers: int = 5
    mask_token_id: int | None = None
    init_from: Path | None = None
    # depth up-scaling: the init_from drafter with this many more layers at the end, each an
    # identity at step 0 (model.grow_layers); None: its own depth. Needs init_from.
    grow_layers: int | None = None
    # a wider Markov head: the init_from drafter's vanilla head grown to this rank, the same function
    # at step 0 (model.load_into_grown_rank); None: its own rank. Needs init_from.
    grow_markov_rank: int | None = None
    # data
    max_new_tokens: int = 256
    max_length: int = 1024
    gen_temperatures: list[float] = field(default_factory=lambda: [0.0, 0.7])
    gen_top_p: float = 0.9
    gen_batch: int | None = None  # engine max running requests while generating (None: by device)
    gen_attention_backend: str = "auto"  # auto: FlashInfer + CUDA graphs on CUDA when installed
    extra_text: list[Path] = field(default_factory=list)  # plain-text files trained beside the responses
    extra_text_max_seqs: int | None = None  # cap on the text pieces (a seeded subset)
    # optimisation
    epochs: float = 1.0
    max_steps: int | None = None
    batch_size: int = 8  # sequences per micro-batch
    grad_accum: int = 1
    anchors_per_seq: int = 64
    # weight of a block whose anchor follows the drafter's own miss (and of a response's first
    # anchor), every other block 1: the anchors a server's blocks start at (objective.focus_weights)
    anchor_focus: float = 1.0
    # the vocabulary terms of the loss (objective.LossSpec): CE weight and label (the response's token
    # or the target's greedy one), L1 weight and the temperatures its distance is taken at
    loss_ce_weight: float = objective.CE_ALPHA
    loss_l1_weight: float = objective.L1_ALPHA
    ce_label: str = "response"
    l1_temperatures: list[float] = field(default_factory=lambda: [1.0])
    lr: float = 6e-4
    markov_lr_scale: float = 1.0  # the Markov head's peak lr is lr x this (its own AdamW group)
    weight_decay: float = 0.0
    warmup_fraction: float = 0.04
    grad_clip: float = 1.0
    log_every: int = 10
    save_every: int = 500
    keep_checkpoints: int = 2
    resume: bool = False
    # evaluation
    eval_temperatures: list[float] = field(default_factory=lambda: [0.0, 0.7])
    eval_max_prompts: int = 64
    eval_max_new_tokens: int = 128
    fit_sts: bool = False
    draft_vocab_size: int = 0  # > 0: write draft_vocab.json (the K most frequent response tokens)
    progress: bool = True
    time_limit_s: float | None = None  # stop (checkpointed) after this long; --resume continues
    train_minutes: float | None = None  # fix the step count from the first steps' speed to fill this budget
    num_procs: int = 1  # data-parallel processes (one per GPU on cuda); each takes batch_size sequences
    # the step's implementation: "fused" (the vocabulary side chunked over supervised slots, no host
    # sync) or "reference" (the materialised [N, G, V] loss with a metrics sync: the pre-issue-19
    # step, kept for tests and before/after benchmarks); both learn the same thing
    loss_impl: str = "fused"
    compile_loss: bool | None = None  # torch.compile the fused loss's chunk math (None: SGLAUNCH_TRAIN_COMPILE=1)
    # the drafter's grouped-layout attention (training/attention.py): auto (flex on CUDA, sdpa
    # elsewhere; SGLAUNCH_TRAIN_ATTENTION overrides), sdpa (the reference), dense, flex (CUDA)
    attention: str = "auto"

    def loss_spec(self) -> objective.LossSpec:
        return objective.LossSpec(self.loss_ce_weight, self.loss_l1_weight, self.ce_label, tuple(self.l1_temperatures))

    def to_json(self) -> dict[str, Any]:
        return {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(self).items()}


def torch_dtype(name: str) -> torch.dtype:
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]


def visible_gpus() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def resolve_device(name: str) -> torch.device:
    if name == "cuda" and not torch.cuda.is_available():
        raise SglaunchError("--device cuda was asked for, but torch sees no CUDA device",
                            hint="use --device cpu, or install a CUDA build of torch")
    return torch.device(name)


class Trainer:
    """One training process. With data parallelism (`rank`, `world` > 1, a process group already
    initialised) every rank holds the whole drafter, takes its own micro-batches, and the ranks
    average their gradients before each optimizer step, so the weights stay identical; rank 0
    alone writes logs, checkpoints and the final drafter."""

    def __init__(self, args: TrainArgs, rank: int = 0, world: int = 1):
        self.args, self.rank, self.world = args, rank, world
        self.device = resolve_device(args.device)
        if self.device.type == "cuda" and world > 1:
            self.device = torch.device("cuda", rank)
            torch.cuda.set_device(self.device)
        self.dtype = torch_dtype(args.dtype)
        self.target_cfg = target_mod.read_target_config(args.target)
        self.init_cfg = None  # the --init-from checkpoint's own config (drafter_config sets it)
        self.out = args.output
        self.log_rows: list[dict[str, Any]] = []
        self._order: tuple[int, torch.Tensor] | None = None  # (epoch, permutation of the samples)
        # benchmarks only (train_step_bench.py --phases): called with a phase's name when it ends
        self.phase_hook = None

    # ------------------------------------------------------------------ setup
    def drafter_config(self):
        a, cfg = self.args, self.target_cfg
        data.check_grow(a.grow_layers, a.init_from)
        data.check_grow_rank(a.grow_markov_rank, a.init_from)
        if a.init_from is not None:
            self.init_cfg = model.init_from_checkpoint(a.init_from, cfg)
            dcfg = model.grown_config(self.init_cfg, a.grow_layers) if a.grow_layers else self.init_cfg
            if a.grow_markov_rank:
                try:
                    dcfg = model.grown_rank_config(dcfg, a.grow_markov_rank)
                except ValueError as exc:
                    raise SglaunchError(f"--init-from {a.init_from}: {exc}",
                                        hint="grow the rank of a vanilla-head drafter, to more than its own "
                                             "markov_rank (config.json)") from None
            return dcfg
        ids = a.target_layer_ids or target_mod.default_layer_ids(int(cfg["num_hidden_layers"]), a.num_feature_layers)
        mask = a.mask_token_id if a.mask_token_id is not None else target_mod.default_mask_token(cfg, a.target)
        dcfg = target_mod.drafter_config_for(cfg, num_layers=a.num_draft_layers, block_size=a.block_size,
                                             layer_ids=ids, mask_token_id=mask, markov_rank=a.markov_rank,
                                             markov_head_type=a.markov_head_type)
        if a.intermediate_size:
            import dataclasses

            dcfg = dataclasses.replace(dcfg, intermediate_size=a.intermediate_size)
        return dcfg

    def param_groups(self) -> list[dict[str, Any]]:
        """One AdamW group, or two with --markov-lr-scale: the Markov head's at lr x scale (the
        scheduler's warmup and cosine multiply each group's own peak)."""
        a = self.args
        if a.markov_lr_scale == 1.0:
            return [{"params": self.params}]
        markov = model.markov_parameters(self.drafter)
        own = model.own_parameters(self.drafter)
        return [{"params": [p for n, p in own.items() if n not in markov]},
                {"params": [own[n] for n in sorted(markov)], "lr": a.lr * a.markov_lr_scale}]

    def prepare_data(self) -> tuple[list[data.Sample], list[data.Prompt]]:
        a = self.args
        records = data.read_prompt_records(a.prompts)
        prompts = data.tokenize_prompts(records, a.target, a.prompts)
        if a.eval_prompts is not None:
            held = data.tokenize_prompts(data.read_prompt_records(a.eval_prompts), a.target, a.eval_prompts)
            train = prompts
        else:
            train, held = data.split_heldout(prompts, a.eval_fraction, a.seed)
        self.out.mkdir(parents=True, exist_ok=True)
        cache = self.out / "responses.jsonl"
        if cache.is_file():
            samples = data.load_samples(cache)
            self.say(f"reusing {len(samples)} generated responses from {cache}")
        else:
            samples = data.generate_responses(
                a.target, train, device=a.device, dtype=a.dtype, max_new_tokens=a.max_new_tokens,
                temperatures=a.gen_temperatures, top_p=a.gen_top_p, seed=a.seed, max_length=a.max_length,
                max_running=a.gen_batch, attention_backend=a.gen_attention_backend)
            data.save_samples(samples, cache)
            if self.device.type == "cuda":
                torch.cuda.empty_cache()
        samples = [s for s in samples if len(s.response) >= 2 and len(s.prompt) + 2 <= a.max_length]
        if not samples:
            raise SglaunchError("the target produced no usable responses (each needs >= 2 tokens)",
                                hint="check the prompts and --max-new-tokens")
        if self.rank == 0:
            (self.out / "heldout.jsonl").write_text("".join(
                json.dumps({"input_ids": p.ids, "type": p.type, "line": p.index}) + "\n" for p in held))
        return samples, held

    def setup(self):
        a = self.args
        torch.manual_seed(a.seed)
        self.dcfg = self.drafter_config()
        self.samples, self.heldout = self.prepare_data()
        self.num_responses = len(self.samples)  # the target's responses come first; text pieces follow
        if a.extra_text:  # not in prepare_data: generating responses (--generate-only, or the CLI
            # before it starts its ranks) needs no text
            texts = data.text_samples(a.extra_text, a.target, max_length=a.max_length, seed=a.seed,
                                      limit=a.extra_text_max_seqs)
            self.say(f"adding {len(texts)} text pieces of up to {a.max_length} tokens from "
                     f"{len(a.extra_text)} --extra-text file(s) to {len(self.samples)} responses")
            self.samples = self.samples + texts
        self.target = target_mod.Target(a.target, list(self.dcfg.target_layer_ids), self.dtype, self.device)
        final_norm = self.target.model.model.norm.weight.detach()
        self.drafter = model.build_drafter(self.dcfg, self.target.embed_tokens, self.target.lm_head, self.device,
                                           a.max_length + self.dcfg.block_size + 1)
        model.init_weights(self.drafter, a.seed, final_norm)
        if a.init_from is None:
            self.whiten_fc()
        else:  # with --resume, load_latest below then replaces every weight (a grown run resumes grown)
            if a.grow_markov_rank:  # new layers (--grow-layers) are left to grow_layers below
                model.load_into_grown_rank(self.drafter, a.init_from, self.init_cfg, a.seed)
                self.say(f"grew {a.init_from}'s Markov rank {self.init_cfg.markov_rank} to {a.grow_markov_rank}: "
                         "W2's new columns and the confidence head's at zero (the same function at step 0)")
            else:
                model.load_checkpoint_weights(self.drafter, a.init_from, self.init_cfg)
            if a.grow_layers:
                model.grow_layers(self.drafter, self.init_cfg.num_layers)
                self.say(f"grew {a.init_from}'s {self.init_cfg.num_layers} layers by {a.grow_layers}: the new "
                         "layers come last, o_proj / down_proj at zero (the same function at step 0)")
        self.params = list(model.own_parameters(self.drafter).values())
        self.set_attention(a.attention)
        # one fused kernel for every parameter on CUDA (the default there is foreach: a few per tensor)
        fused = {"fused": True} if self.device.type == "cuda" else {}
        self.optimizer = torch.optim.AdamW(self.param_groups(), lr=a.lr, weight_decay=a.weight_decay,
                                           betas=(0.9, 0.95), **fused)
        if a.loss_impl not in ("fused", "reference"):
            raise SglaunchError(f"loss_impl {a.loss_impl!r} is not fused or reference")
        self.compile_loss = (a.compile_loss if a.compile_loss is not None
                             else os.environ.get("SGLAUNCH_TRAIN_COMPILE", "") not in ("", "0"))
        micro = a.batch_size * a.grad_accum
        steps = math.ceil(len(self.samples) * a.epochs / micro)
        self.total_steps = max(1, a.max_steps if a.max_steps is not None else steps)
        if a.train_minutes is not None:  # provisional, until fit_steps_to_budget has timed the first steps
            self.total_steps = (CALIBRATION_WARMUP + CALIBRATION_STEPS) * 40
        self.warmup_steps: int | None = None  # fixed at the --train-minutes calibration (refits keep it)
        self.fit_at: tuple[int, float] = (0, 0.0)  # (step, elapsed_s) of the last --train-minutes fit
        # NOTE: the lambda reads total_steps each call, so a --train-minutes calibration reshapes the schedule
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda s: cosine(s, self.warmup_steps or max(1, round(self.total_steps * a.warmup_fraction)),
                                             self.total_steps))
        self.step = 0
        self.calibrated = False
        if a.resume:
            self.load_latest()
        n_own = sum(p.numel() for p in self.params)
        self.say(f"drafter: {self.dcfg.num_layers} layers, block {self.dcfg.block_size}, markov rank "
                 f"{self.dcfg.markov_rank}, target layers {list(self.dcfg.target_layer_ids)}, mask id "
                 f"{self.dcfg.mask_token_id}; {n_own / 1e6:.2f}M trained parameters "
                 f"(checkpoint ~{model.checkpoint_bytes(self.dcfg) / 1e6:.1f} MB in bf16); "
                 f"{len(self.samples)} sequences, {self.total_steps} steps; attention {self.attention}")

    @torch.no_grad()
    def whiten_fc(self, batches: int = 2) -> None:
        """Data-dependent init of fc: divide each input column by that feature dimension's RMS
        over response tokens, so that the target's outlier dimensions (about 20x the layer's RMS
        in SmolLM2) do not dominate the fused context at step 0."""
        sq, n = None, 0
        for i in range(batches):
            batch = objective.collate(self.micro_batch(i), self.args.max_length)
            feats = self.target.run(batch.ids).features.float()  # right-padded: causal attention needs no mask
            rows = feats[batch.loss_mask.to(feats.device)]  # [tokens, n_features * d]
            sq = rows.pow(2).sum(0) if sq is None else sq + rows.pow(2).sum(0)
            n += rows.shape[0]
        if not n:
            return
        rms = (sq / n).sqrt().clamp_min(1e-3)
        self.drafter.fc.weight.div_(rms[None, :].to(self.drafter.fc.weight.device))

    def set_attention(self, name: str) -> str:
        """Choose the drafter's grouped-layout attention once (not per step) -> the resolved name."""
        try:
            self.attention = train_attention.resolve(name, self.device)
        except ValueError as exc:
            raise SglaunchError(str(exc), hint=f"use {train_attention.ENV}=sdpa or dense") from None
        train_attention.set_attention(self.drafter, self.attention)
        return self.attention

    # ------------------------------------------------------------------ loop
    def autocast(self):
        if self.dtype == torch.float32:
            return nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.dtype)

    def micro_batch(self, index: int) -> list[data.Sample]:
        """Deterministic order: epoch e is a seeded permutation; index counts micro-batches."""
        n, b = len(self.samples), self.args.batch_size
        out = []
        for i in range(index * b, index * b + b):
            epoch, pos = divmod(i, n)
            out.append(self.samples[int(self.epoch_order(epoch)[pos])])
        return out

    def epoch_order(self, epoch: int) -> torch.Tensor:
        cached = self._order
        if cached is None or cached[0] != epoch:
            n = len(self.samples)
            cached = (epoch, torch.randperm(n, generator=torch.Generator().manual_seed(self.args.seed * 7919 + epoch)))
            self._order = cached
        return cached[1]

    def compute_loss(self, samples: list[data.Sample], gen: torch.Generator):
        """-> (loss, metrics as device tensors) of one micro-batch, or (None, {}) without anchors.
        Everything host-side (collate, anchors, blocks, the supervised slots) is built on the CPU
        and copied without a sync, so the host prepares the next micro-batch while the GPU works."""
        a = self.args
        if a.loss_impl == "reference":
            out = self.compute_loss_reference(samples, gen)
            self._phase("forward")  # the reference step's whole forward (it syncs for its metrics)
            return out
        batch = objective.collate(samples, a.max_length)
        seq, anchor, real = objective.sample_anchors(batch, a.anchors_per_seq, gen)
        if seq.numel() == 0:
            return None, {}
        B, T = batch.ids.shape
        blocks = objective.make_blocks(batch, seq, anchor, self.dcfg.block_size, real)
        rows = objective.loss_rows(blocks, T)
        links = objective.anchor_links(batch, seq, anchor, real)
        ids, blocks, rows, links = (objective.to_device(x, self.device) for x in (batch.ids, blocks, rows, links))
        self._phase("host")
        # right-padded sequences: a real position's causal attention never reaches the padding, so
        # no mask (SDPA's flash kernel instead of a materialised [B, 1, T, T] mask)
        tout = self.target.run(ids)
        with torch.no_grad():  # the target's distribution once per distinct supervised position
            t_logits = self.target.logits(tout.final_hidden.reshape(B * T, -1).index_select(0, rows.target_rows))
            t_arg, p_t = t_logits.argmax(-1), torch.softmax(t_logits, dim=-1)
            del t_logits
        self._phase("target")
        dbatch = objective.draft_batch(ids, tout.features, blocks, groups=seq.numel() // len(samples))
        with self.autocast():
            hidden = objective.block_hidden(self.drafter, dbatch)
            z, conf = objective.teacher_forced_markov(self.drafter, hidden, blocks.prev)
        hit0 = objective.slot0_hits(self.drafter, hidden, z, blocks.labels[:, 0], self.dtype)
        mult, focus_metrics = objective.focus_weights(hit0, links, blocks.valid[:, 0], a.anchor_focus)
        if a.anchor_focus != 1.0:
            weights = rows.weights * mult.index_select(0, rows.rows // self.dcfg.block_size)
            rows = dataclasses.replace(rows, weights=weights, denom=weights.sum().clamp_min(1e-6))
        self._phase("drafter")
        out = objective.fused_dspark_loss(self.drafter, hidden, z, conf, p_t, t_arg, rows, self.dtype,
                                          compiled=self.compile_loss, spec=a.loss_spec())
        self._phase("loss")
        out[1].update(focus_metrics)
        return out

    def _phase(self, name: str) -> None:
        if self.phase_hook is not None:
            self.phase_hook(name)

    def compute_loss_reference(self, samples: list[data.Sample], gen: torch.Generator):
        """The step before issue 19's speed work: [N, G, V] logits and distributions materialised
        for every block slot, the target run with its padding mask, metrics read back each step."""
        a = self.args
        batch = objective.collate(samples, a.max_length)
        seq, anchor, real = objective.sample_anchors(batch, a.anchors_per_seq, gen)
        if seq.numel() == 0:
            return None, {}
        blocks = objective.make_blocks(batch, seq, anchor, self.dcfg.block_size, real)
        tout = self.target.run(batch.ids, batch.attention_mask)
        rows = (blocks.anchor[:, None] + torch.arange(self.dcfg.block_size)[None, :]).clamp(max=batch.ids.shape[1] - 1)
        with torch.no_grad():
            target_logits = self.target.logits(tout.final_hidden[blocks.seq[:, None].to(self.device), rows.to(self.device)])
        dbatch = objective.draft_batch(batch.ids, tout.features.float(), blocks, groups=seq.numel() // len(samples))
        with self.autocast():
            out = objective.block_forward(self.drafter, dbatch, self.dtype)
            logits, conf = objective.teacher_forced_heads(self.drafter, out, blocks.prev.to(self.device))
        links = objective.anchor_links(batch, seq, anchor, real)
        hit0 = logits[:, 0].argmax(-1).cpu() == blocks.labels[:, 0]
        mult, focus_metrics = objective.focus_weights(hit0, links, blocks.valid[:, 0], self.args.anchor_focus)
        if self.args.anchor_focus != 1.0:
            blocks = dataclasses.replace(blocks, weights=blocks.weights * mult[:, None])
        loss, metrics = objective.dspark_loss(logits, conf, target_logits, blocks, self.args.loss_spec())
        metrics.update({k: float(v) for k, v in focus_metrics.items()})
        return loss, metrics

    def train_step(self) -> dict[str, Any]:
        a = self.args
        self.drafter.train()
        totals: dict[str, Any] = {}
        per_step = a.grad_accum * self.world  # micro-batches per optimizer step, over all ranks
        for local in range(a.grad_accum):
            micro = self.rank * a.grad_accum + local  # this micro-batch's index within the step
            gen = torch.Generator().manual_seed(a.seed * 1_000_003 + self.step * 131 + micro)
            loss, metrics = self.compute_loss(self.micro_batch(self.step * per_step + micro), gen)
            if loss is None:
                continue
            (loss / per_step).backward()
            self._phase("backward")
            for k, v in metrics.items():
                totals.setdefault(k, []).append(v)
        if self.world > 1:
            self.sum_gradients()
        norm = torch.nn.utils.clip_grad_norm_(self.params, a.grad_clip)
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        self._phase("optimizer")
        self.step += 1
        row = {"step": self.step, "lr": self.scheduler.get_last_lr()[0], "grad_norm": norm.detach()}
        for k, vs in totals.items():
            if isinstance(vs[0], torch.Tensor):  # device metrics: averaged there, read at logging
                row[k] = torch.stack(vs).mean(0)
            else:
                row[k] = [sum(x) / len(vs) for x in zip(*vs)] if isinstance(vs[0], list) else sum(vs) / len(vs)
        return row

    @staticmethod
    def host_row(row: dict[str, Any]) -> dict[str, Any]:
        """A step's row with its device metrics read back (one sync): floats, lists per slot."""
        tensors = {k: v for k, v in row.items() if isinstance(v, torch.Tensor)}
        if not tensors:
            return row
        flat = torch.cat([v.detach().float().reshape(-1) for v in tensors.values()]).cpu().tolist()
        out, i = dict(row), 0
        for k, v in tensors.items():
            n = v.numel()
            out[k] = flat[i] if v.dim() == 0 else flat[i: i + n]
            i += n
        return out

    def sum_gradients(self) -> None:
        """All-reduce the gradients (each already divided by the step's micro-batch count) in one
        flat buffer, so that every rank steps with the same averaged gradient."""
        import torch.distributed as dist

        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params]
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat)
        offset = 0
        for p, g in zip(self.params, grads):
            n = g.numel()
            p.grad = flat[offset: offset + n].view_as(p).clone()
            offset += n

    def agree(self, value: float, op: str = "max") -> float:
        """The ranks' common value (rank 0's for op="rank0", the maximum for "max")."""
        if self.world == 1:
            return value
        import torch.distributed as dist

        t = torch.tensor([value], dtype=torch.float64, device=self.device)
        if op == "rank0":
            dist.broadcast(t, 0)
        else:
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return float(t.item())

    def train(self) -> Path | None:
        """Run to total_steps -> the final drafter folder; None when the time limit stopped it first."""
        a = self.args
        start = time.monotonic()
        first_step, warm_at = self.step, 0.0
        with self.bars() as bars:
            task = bars.add_task("training drafter", total=self.total_steps, completed=self.step, loss="")
            while self.step < self.total_steps:
                row = self.train_step()
                row["elapsed_s"] = round(time.monotonic() - start, 2)
                done = self.step - first_step
                if a.train_minutes is not None and not self.calibrated:
                    if done == CALIBRATION_WARMUP:
                        warm_at = row["elapsed_s"]
                    elif done >= CALIBRATION_WARMUP + CALIBRATION_STEPS:
                        self.fit_steps_to_budget(row["elapsed_s"], row["elapsed_s"] - warm_at, CALIBRATION_STEPS)
                    bars.update(task, total=self.total_steps)
                elif (a.train_minutes is not None and not a.resume and done % REFIT_EVERY == 0
                      and self.step < self.total_steps):
                    self.refit_steps_to_budget(row["elapsed_s"])
                    bars.update(task, total=self.total_steps)
                if self.step % a.log_every == 0 or self.step == self.total_steps or self.step == 1:
                    row = self.host_row(row)  # the only read-back of a step's metrics
                    self.log(row)
                    bars.update(task, loss=f"loss {row.get('loss', float('nan')):.4f}")
                bars.update(task, completed=self.step)
                if self.step % a.save_every == 0 and self.step < self.total_steps:
                    self.save_checkpoint()
                over = a.time_limit_s is not None and time.monotonic() - start > a.time_limit_s
                if a.time_limit_s is not None and self.agree(float(over)) and self.step < self.total_steps:
                    self.save_checkpoint()
                    self.say(f"time limit reached at step {self.step}/{self.total_steps}; rerun with --resume")
                    return None
        self.save_checkpoint()
        return self.save_final()

    def fit_steps_to_budget(self, elapsed: float, timed: float, steps: int) -> None:
        """--train-minutes: fix total_steps so that the run ends when the budget does, from the
        speed of `steps` steps taken after CALIBRATION_WARMUP warm-up steps (the first steps are
        slower: allocator and kernel warm-up), the cosine schedule following; fixed once and
        saved in checkpoints, so --resume keeps it."""
        left = self.args.train_minutes * 60.0 - elapsed
        self.total_steps = max(self.step + 1, self.step + int(left * steps / max(timed, 1e-6)))
        self.total_steps = int(self.agree(self.total_steps, "rank0"))  # every rank follows rank 0's clock
        self.calibrated = True
        self.warmup_steps = max(1, round(self.total_steps * self.args.warmup_fraction))
        self.fit_at = (self.step, elapsed)
        self.say(f"{steps} steps took {timed:.1f} s after warm-up: training for {self.total_steps} steps "
                 f"(--train-minutes {self.args.train_minutes:g})")

    def refit_steps_to_budget(self, elapsed: float) -> None:
        """--train-minutes, every REFIT_EVERY steps after the calibration: refit total_steps from the
        speed since the last fit, so that a slow calibration (another process sharing the GPU at
        first, as the round's baseline evaluation does) does not end training early (session 8's
        rounds: calibrated at 2.4-2.9 steps/s, ran at 6, stopped with 40% of the budget unused).
        The warm-up stays as calibrated; no refit in the last REFIT_TAIL of the budget, nor after
        --resume (the resumed run keeps the step count it saved)."""
        budget = self.args.train_minutes * 60.0
        step0, t0 = self.fit_at
        total, rate = -1, 0.0  # -1: no refit (every rank calls agree, and follows rank 0)
        if elapsed <= budget * (1.0 - REFIT_TAIL) and elapsed > t0 and self.step > step0:
            rate = (self.step - step0) / (elapsed - t0)
            total = max(self.step + 1, self.step + int((budget - elapsed) * rate))
        total = int(self.agree(total, "rank0"))
        if total < 0:
            return
        self.fit_at = (self.step, elapsed)
        if abs(total - self.total_steps) > 0.02 * self.total_steps:
            self.say(f"{rate:.2f} steps/s since step {step0}: training for {total} steps (was {self.total_steps})")
            self.total_steps = total

    # ------------------------------------------------------------------ files
    def log(self, row: dict[str, Any]) -> None:
        self.log_rows.append(row)
        if self.rank != 0:
            return
        with open(self.out / "train_log.jsonl", "a") as handle:
            handle.write(json.dumps(row) + "\n")

    def save_checkpoint(self) -> Path:
        from sglaunch.speculative.checkpoint import save_drafter

        folder = self.out / "checkpoints" / f"step-{self.step}"
        if self.rank != 0:
            return folder
        tmp = folder.with_name(folder.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        save_drafter(tmp, self.dcfg, model.export_state(self.drafter), self.target_cfg)
        torch.save({"step": self.step, "total_steps": self.total_steps, "warmup_steps": self.warmup_steps,
                    "drafter": model.torch_state(self.drafter),
                    "optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict(),
                    "drafter_config": self.dcfg.to_dict(), "args": self.args.to_json()}, tmp / "trainer.pt")
        shutil.rmtree(folder, ignore_errors=True)
        tmp.rename(folder)
        for old in checkpoints(self.out)[: -self.args.keep_checkpoints]:
            shutil.rmtree(old, ignore_errors=True)
        return folder

    def load_latest(self) -> None:
        found = checkpoints(self.out)
        if not found:
            raise SglaunchError(f"--resume: no checkpoint in {self.out / 'checkpoints'}",
                                hint="run without --resume to start training")
        state = torch.load(found[-1] / "trainer.pt", map_location="cpu", weights_only=False)
        if state["drafter_config"] != self.dcfg.to_dict():
            raise SglaunchError(f"--resume: {found[-1]} was trained with another drafter shape or target",
                                hint="resume with the same target and drafter options (the same --init-from and "
                                     "--grow-layers for a grown drafter), or use a new --output")
        model.load_torch_state(self.drafter, state["drafter"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.step = int(state["step"])
        if self.args.train_minutes is not None:
            self.total_steps = int(state["total_steps"])
            self.warmup_steps = state.get("warmup_steps")
            self.calibrated = True
        self.say(f"resumed from {found[-1]} at step {self.step}")

    def save_final(self) -> Path:
        from sglaunch.speculative.checkpoint import save_drafter

        folder = self.out / "drafter"
        if self.rank != 0:
            return folder
        tmp = folder.with_name("drafter.tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        save_drafter(tmp, self.dcfg, model.export_state(self.drafter), self.target_cfg, dtype=torch.bfloat16)
        shutil.rmtree(folder, ignore_errors=True)
        tmp.rename(folder)
        return folder

    def say(self, message: str) -> None:
        if self.args.progress and self.rank == 0:
            from rich.console import Console

            Console(stderr=True, highlight=False).print(message)

    def bars(self):
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

        return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[loss]}"),
                        TimeElapsedColumn(), TimeRemainingColumn(), disable=not self.args.progress or self.rank != 0)


CALIBRATION_WARMUP, CALIBRATION_STEPS = 5, 20
REFIT_EVERY, REFIT_TAIL = 50, 0.15  # --train-minutes: refit total_steps every 50 steps, not in the last 15%


def cosine(step: int, warmup: int, total: int) -> float:
    """Linear warmup to 1, then cosine to 0 at `total`."""
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))


def checkpoints(out: Path) -> list[Path]:
    folder = out / "checkpoints"
    if not folder.is_dir():
        return []
    found = [p for p in folder.iterdir() if p.is_dir() and p.name.startswith("step-") and not p.name.endswith(".tmp")
             and (p / "trainer.pt").is_file()]
    return sorted(found, key=lambda p: int(p.name.split("-")[1]))


def run_evaluation(trainer: Trainer, folder: Path) -> dict[str, Any]:
    """Held-out accept lengths and calibration into folder/eval.json; STS into folder/sts.json."""
    import numpy as np

    from sglaunch.engine.model_spec import load_model_spec
    from sglaunch.speculative import sts
    from sglaunch.training import evaluate

    a = trainer.args
    if not trainer.heldout:
        trainer.say("no held-out prompts (--eval-fraction 0 and no --eval-prompts): evaluation skipped")
        return {}
    eos = set(load_model_spec(str(a.target)).eos_token_ids)
    result = evaluate.evaluate(trainer.target, trainer.drafter, trainer.heldout, temperatures=a.eval_temperatures,
                               max_new_tokens=a.eval_max_new_tokens, max_prompts=a.eval_max_prompts, eos_ids=eos,
                               seed=a.seed, autocast=trainer.autocast, progress=a.progress, out_dir=folder)
    records = result.pop("_records")
    if a.fit_sts and records and records[0]["confidence_logits"]:
        logits = np.array([r["confidence_logits"] for r in records])
        fit = sts.fit_sts(logits, np.array([r["accepted"] for r in records]),
                          np.array([r["verified"] for r in records]))
        fit.extra["fitted_on"] = f"{len(records)} held-out blocks at temperatures {a.eval_temperatures}"
        sts.save_sts(fit, folder / "sts.json")
        result["sts"] = str(folder / "sts.json")
    return result


def write_draft_vocab(trainer: Trainer, folder: Path) -> None:
    """folder/draft_vocab.json from the target's responses; the evaluation then drafts over it,
    as the engine will (draft_vocab.py)."""
    from sglaunch.speculative.draft_vocab import FILE_NAME, frequent_tokens, save_draft_vocab

    responses = (s.response for s in trainer.samples[: trainer.num_responses])
    ids, covered = frequent_tokens(responses, trainer.args.draft_vocab_size)
    source = f"the {len(ids)} most frequent tokens of {trainer.num_responses} training responses (cover {covered:.4%})"
    save_draft_vocab(folder / FILE_NAME, ids, source)
    trainer.drafter.restrict_vocab(ids)
    trainer.say(f"draft vocabulary: {source}")


def finish(trainer: Trainer, folder: Path | None) -> dict[str, Any]:
    """After train(): the held-out evaluation (when training ended) and a summary of the run."""
    if folder is None:
        return {"stopped_at_step": trainer.step, "total_steps": trainer.total_steps}
    if trainer.args.draft_vocab_size > 0:
        write_draft_vocab(trainer, folder)
    result = run_evaluation(trainer, folder)
    rows = trainer.log_rows
    return {"drafter": str(folder), "steps": trainer.step,
            "first_loss": rows[0].get("loss") if rows else None, "last_loss": rows[-1].get("loss") if rows else None,
            "eval": {t: {k: v.get(k) for k in ("mean_accept_length", "per_type", "confidence_ece")}
                     for t, v in result.get("temperatures", {}).items()}}


# ------------------------------------------------------------------ data parallelism

SUMMARY_FILE = "summary.json"


def run_data_parallel(args: TrainArgs) -> dict[str, Any]:
    """Train with `args.num_procs` processes (one per GPU with --device cuda, gloo on CPUs): the
    responses must already be cached in the output folder (the caller generates them first).
    Rank 0 evaluates and writes OUT/summary.json, which is returned."""
    import datetime

    import torch.distributed as dist
    import torch.multiprocessing as mp

    summary = args.output / SUMMARY_FILE
    summary.unlink(missing_ok=True)
    # The rendezvous store lives here, in the parent, on a port the OS picks: it outlives every
    # rank, so no rank's exit can pull it from under another still tearing down its group.
    store = dist.TCPStore("127.0.0.1", 0, args.num_procs + 1, is_master=True, wait_for_workers=False,
                          timeout=datetime.timedelta(minutes=30))
    try:
        mp.spawn(_rank_main, args=(args, store.port), nprocs=args.num_procs, join=True)
    except mp.ProcessRaisedException as exc:
        lines = [line for line in str(exc).strip().splitlines() if line.strip()]
        raise SglaunchError(f"a training process failed: {lines[-1] if lines else exc}",
                            hint="the full traceback is above; rerun with --num-procs 1 to see it in this process") from None
    return json.loads(summary.read_text())


def _rank_main(rank: int, args: TrainArgs, port: int) -> None:
    import datetime
    import os
    import sys

    import torch.distributed as dist

    world = args.num_procs
    if args.device == "cuda":
        torch.cuda.set_device(rank)
    else:  # the ranks share the host's cores
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    timeout = datetime.timedelta(minutes=30)
    store = dist.TCPStore("127.0.0.1", port, world + 1, is_master=False, timeout=timeout)
    dist.init_process_group("nccl" if args.device == "cuda" else "gloo", store=store, rank=rank, world_size=world,
                            timeout=timeout)
    try:
        trainer = Trainer(args, rank, world)  # only rank 0 prints or shows progress
        trainer.setup()
        folder = trainer.train()
        if rank == 0:
            summary = finish(trainer, folder)
            tmp = args.output / (SUMMARY_FILE + ".tmp")
            tmp.write_text(json.dumps(summary))
            tmp.replace(args.output / SUMMARY_FILE)
        dist.barrier()  # every rank is done with the group before any tears it down
    finally:
        dist.destroy_process_group()
    # NOTE: a rank that finished leaves here, past the interpreter's teardown: there gloo's worker
    # threads could be destroyed unjoined ("terminate called without an active exception", SIGABRT),
    # failing a run whose work was complete. Failures still raise above and reach mp.spawn.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
