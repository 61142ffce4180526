"""`sglaunch train-draft`: train a DSpark drafter for a target (docs/train-draft.md).

Torch is imported only once the options are valid; errors are `Error:` / `Hint:` lines.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer

from sglaunch.cli.common import JsonOption, funnel
from sglaunch.errors import SglaunchError


def _floats(text: str, flag: str) -> list[float]:
    try:
        values = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise SglaunchError(f"{flag} {text!r} is not a comma-separated list of numbers", hint=f"e.g. {flag} 0,0.7")
    if not values or any(v < 0 for v in values):
        raise SglaunchError(f"{flag} needs at least one temperature >= 0", hint=f"e.g. {flag} 0,0.7")
    return values


def _ints(text: str | None, flag: str) -> list[int] | None:
    if text is None:
        return None
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise SglaunchError(f"{flag} {text!r} is not a comma-separated list of integers", hint=f"e.g. {flag} 1,8,14")


@funnel
def train_draft(
    prompts: Annotated[Path, typer.Option("--prompts", help="JSONL prompt file: {\"prompt\"|\"messages\"|\"input_ids\", \"type\"} per line.")],
    output: Annotated[Path, typer.Option("--output", "-o", help="Output folder (responses, logs, checkpoints, drafter/).")],
    target: Annotated[Optional[Path], typer.Option("--target", help="Target HF checkpoint folder; default: the built-in SmolLM2 (pulled if needed).")] = None,
    eval_prompts: Annotated[Optional[Path], typer.Option(help="Held-out prompt file; default: --eval-fraction of --prompts.")] = None,
    eval_fraction: Annotated[float, typer.Option(help="Share of --prompts held out for evaluation (per type).")] = 0.05,
    device: Annotated[str, typer.Option(help="cpu or cuda.")] = "cpu",
    dtype: Annotated[Optional[str], typer.Option(help="float32 | bfloat16 (default: bfloat16 on cuda, float32 on cpu).")] = None,
    seed: Annotated[int, typer.Option(help="Seed for data order, anchors, init, generation.")] = 0,
    num_draft_layers: Annotated[int, typer.Option(help="Draft decoder layers.")] = 3,
    block_size: Annotated[int, typer.Option(help="gamma: draft tokens per step.")] = 7,
    markov_rank: Annotated[int, typer.Option(help="Markov head rank r (0: pure DFlash).")] = 256,
    markov_head_type: Annotated[str, typer.Option(help="vanilla | gated | rnn.")] = "vanilla",
    intermediate_size: Annotated[Optional[int], typer.Option(help="Draft MLP width (default: the target's).")] = None,
    target_layer_ids: Annotated[Optional[str], typer.Option(help="Comma-separated target layers to read (default: spread, never the last).")] = None,
    num_feature_layers: Annotated[int, typer.Option(help="How many target layers to read when --target-layer-ids is not given.")] = 5,
    mask_token_id: Annotated[Optional[int], typer.Option(help="MASK id (default: an unused row or special token).")] = None,
    init_from: Annotated[Optional[Path], typer.Option(help="Start from this DSpark checkpoint (fine-tuning).")] = None,
    grow_layers: Annotated[Optional[int], typer.Option(
        help="With --init-from: add N layers after its own (depth up-scaling), each an identity at step 0 "
             "(o_proj / down_proj at zero), so training starts from the checkpoint's function.")] = None,
    grow_markov_rank: Annotated[Optional[int], typer.Option(
        help="With --init-from: widen its (vanilla) Markov head to rank R, the new directions adding nothing at "
             "step 0 (W2's new columns at zero), so training starts from the checkpoint's function.")] = None,
    max_new_tokens: Annotated[int, typer.Option(help="Response length the target generates per prompt.")] = 256,
    max_length: Annotated[int, typer.Option(help="Prompt + response tokens kept per training sequence.")] = 1024,
    gen_temperatures: Annotated[str, typer.Option(help="Generation temperatures, cycled over the prompts.")] = "0,0.7",
    gen_top_p: Annotated[float, typer.Option(help="top-p of sampled generations.")] = 0.9,
    epochs: Annotated[float, typer.Option(help="Passes over the responses.")] = 1.0,
    max_steps: Annotated[Optional[int], typer.Option(help="Optimizer steps (overrides --epochs).")] = None,
    batch_size: Annotated[int, typer.Option(help="Sequences per micro-batch.")] = 8,
    grad_accum: Annotated[int, typer.Option(help="Micro-batches per optimizer step.")] = 1,
    anchors_per_seq: Annotated[int, typer.Option(help="Anchor blocks sampled per sequence.")] = 64,
    anchor_focus: Annotated[float, typer.Option(
        help="Loss weight of a block whose anchor follows the drafter's own first-slot miss one position "
             "earlier (and of a response's first anchor); other blocks weigh 1. A server's blocks start "
             "after a rejected draft, so >1 trains for the anchors it serves. 1: uniform.")] = 1.0,
    loss_ce_weight: Annotated[float, typer.Option(help="Weight of the loss's cross-entropy term.")] = 0.1,
    loss_l1_weight: Annotated[float, typer.Option(
        help="Weight of the loss's ||p_d - p_t||_1 term (one minus the acceptance rate of sampling).")] = 0.9,
    ce_label: Annotated[str, typer.Option(
        help="The cross-entropy's label: response (the response's token) or argmax (the target's greedy "
             "token, what a T=0 server verifies against; the same token in a T=0 response).")] = "response",
    l1_temperatures: Annotated[str, typer.Option(
        help="Temperatures the L1 term is taken at, averaged (e.g. 1,0.7: the acceptance of requests "
             "sampled at 0.7 as well as at 1).")] = "1",
    lr: Annotated[float, typer.Option(help="Peak AdamW learning rate (4% warmup, cosine to 0).")] = 6e-4,
    markov_lr_scale: Annotated[float, typer.Option(
        help="The Markov head's peak learning rate is --lr times this (e.g. for a head just widened).")] = 1.0,
    log_every: Annotated[int, typer.Option(help="Steps between train_log.jsonl lines.")] = 10,
    save_every: Annotated[int, typer.Option(help="Steps between checkpoints.")] = 500,
    resume: Annotated[bool, typer.Option("--resume", help="Continue from the latest checkpoint in --output.")] = False,
    eval_temperatures: Annotated[str, typer.Option(help="Temperatures of the held-out evaluation.")] = "0,0.7",
    eval_max_prompts: Annotated[int, typer.Option(help="Held-out prompts evaluated.")] = 64,
    eval_max_new_tokens: Annotated[int, typer.Option(help="Tokens decoded per evaluated prompt.")] = 128,
    fit_sts: Annotated[bool, typer.Option("--fit-sts", help="Fit the STS calibration file on the evaluation blocks.")] = False,
    draft_vocab_size: Annotated[int, typer.Option(
        help="Also write draft_vocab.json: the K most frequent tokens of the target's responses, which the "
             "engine then drafts over (a K-row LM head; TP 1). 0: the whole vocabulary.")] = 0,
    generate_only: Annotated[bool, typer.Option("--generate-only", help="Only generate (and cache) the target's responses, then stop.")] = False,
    time_limit_min: Annotated[Optional[float], typer.Option(help="Stop with a checkpoint after this many minutes; --resume continues.")] = None,
    train_minutes: Annotated[Optional[float], typer.Option(help="Train for about this long: the step count is fixed from the speed of steps 6-25 (overrides --epochs/--max-steps).")] = None,
    gen_batch: Annotated[Optional[int], typer.Option(help="Requests the engine decodes at once while generating responses (default: 256 on cuda, 32 on cpu).")] = None,
    gen_attention_backend: Annotated[str, typer.Option(help="Engine attention backend while generating: auto (FlashInfer with CUDA graphs on CUDA when installed), torch or flashinfer.")] = "auto",
    num_procs: Annotated[int, typer.Option(help="Data-parallel training processes: one per GPU with --device cuda (gradients averaged over NCCL), gloo processes on CPUs.")] = 1,
    extra_text: Annotated[Optional[list[Path]], typer.Option(help="Plain-text file (.txt or .txt.gz) cut into --max-length pieces and trained beside the responses; repeatable.")] = None,
    extra_text_max_seqs: Annotated[Optional[int], typer.Option(help="Use at most this many --extra-text pieces (a seeded subset).")] = None,
    as_json: JsonOption = False,
) -> None:
    """Train a DSpark drafter on the target's own responses; write drafter/, eval.json and sts.json."""
    if device not in ("cpu", "cuda"):
        raise SglaunchError(f"--device {device!r} is not cpu or cuda", hint="--device cuda on GPU machines")
    dtype = dtype or ("bfloat16" if device == "cuda" else "float32")
    if dtype not in ("float32", "bfloat16"):
        raise SglaunchError(f"--dtype {dtype!r} is not float32 or bfloat16", hint="bfloat16 on GPUs, float32 on CPUs")
    for flag, value in (("--train-minutes", train_minutes), ("--gen-batch", gen_batch),
                        ("--extra-text-max-seqs", extra_text_max_seqs)):
        if value is not None and value <= 0:
            raise SglaunchError(f"{flag} must be positive, got {value}", hint=f"omit {flag} for the default")
    if not anchor_focus > 0 or anchor_focus == float("inf"):
        raise SglaunchError(f"--anchor-focus must be a positive number, got {anchor_focus}",
                            hint="1 weighs every block alike; 3 triples the blocks served anchors look like")
    if num_procs < 1:
        raise SglaunchError(f"--num-procs must be at least 1, got {num_procs}", hint="1 trains in this process")
    if ce_label not in ("response", "argmax"):
        raise SglaunchError(f"--ce-label {ce_label!r} is not response or argmax",
                            hint="response is DeepSpec's; argmax trains toward the target's greedy token")
    l1_temps = _floats(l1_temperatures, "--l1-temperatures")
    if not l1_temps or any(not t > 0 or t == float("inf") for t in l1_temps):
        raise SglaunchError(f"--l1-temperatures must be positive numbers, got {l1_temperatures!r}",
                            hint="e.g. 1 (the default) or 1,0.7")
    for flag, value in (("--loss-ce-weight", loss_ce_weight), ("--loss-l1-weight", loss_l1_weight)):
        if not 0 <= value < float("inf"):
            raise SglaunchError(f"{flag} must be 0 or more, got {value}", hint="the defaults are 0.1 and 0.9")
    if loss_ce_weight + loss_l1_weight == 0:
        raise SglaunchError("--loss-ce-weight and --loss-l1-weight are both 0: nothing would train the drafter's "
                            "tokens", hint="the defaults are 0.1 and 0.9")
    if draft_vocab_size < 0:
        raise SglaunchError(f"--draft-vocab-size must be 0 or more, got {draft_vocab_size}",
                            hint="0 drafts over the whole vocabulary")
    if device == "cuda" and num_procs > 1:
        from sglaunch.training.trainer import visible_gpus

        if num_procs > visible_gpus():
            raise SglaunchError(f"--num-procs {num_procs} needs {num_procs} GPUs; {visible_gpus()} visible",
                                hint="one process per GPU: lower --num-procs or set CUDA_VISIBLE_DEVICES")
    if gen_attention_backend not in ("auto", "torch", "flashinfer"):
        raise SglaunchError(f"--gen-attention-backend {gen_attention_backend!r} is not auto, torch or flashinfer",
                            hint="auto picks FlashInfer on CUDA when it is installed")
    if gen_attention_backend == "flashinfer" and (device != "cuda" or dtype == "float32"):
        raise SglaunchError("--gen-attention-backend flashinfer needs --device cuda and bf16",
                            hint="use auto, which falls back to the torch backend")
    if not prompts.is_file():
        raise SglaunchError(f"prompt file {prompts} does not exist",
                            hint="pass a JSONL file (see docs/train-draft.md; `python -m sglaunch.training.corpus` "
                                 "builds one from the license-clean corpus)")
    from sglaunch.training.data import check_grow, check_grow_rank, require_text_file  # torch-free

    check_grow(grow_layers, init_from)
    check_grow_rank(grow_markov_rank, init_from)
    if markov_lr_scale <= 0:
        raise SglaunchError(f"--markov-lr-scale must be positive, got {markov_lr_scale}",
                            hint="1 trains the Markov head at --lr like every other weight")
    for path in extra_text or []:
        require_text_file(path)
    if target is None:
        from sglaunch.hub.default_model import ensure_default_model

        target = ensure_default_model(progress=not as_json)
    from sglaunch.training.trainer import TrainArgs, Trainer, finish, run_data_parallel

    args = TrainArgs(
        target=target, prompts=prompts, output=output, eval_prompts=eval_prompts, eval_fraction=eval_fraction,
        device=device, dtype=dtype, seed=seed, num_draft_layers=num_draft_layers, block_size=block_size,
        markov_rank=markov_rank, markov_head_type=markov_head_type, intermediate_size=intermediate_size,
        target_layer_ids=_ints(target_layer_ids, "--target-layer-ids"), num_feature_layers=num_feature_layers,
        mask_token_id=mask_token_id, init_from=init_from, grow_layers=grow_layers, grow_markov_rank=grow_markov_rank, max_new_tokens=max_new_tokens, max_length=max_length,
        gen_temperatures=_floats(gen_temperatures, "--gen-temperatures"), gen_top_p=gen_top_p, epochs=epochs,
        max_steps=max_steps, batch_size=batch_size, grad_accum=grad_accum, anchors_per_seq=anchors_per_seq, anchor_focus=anchor_focus, lr=lr, markov_lr_scale=markov_lr_scale,
        loss_ce_weight=loss_ce_weight, loss_l1_weight=loss_l1_weight, ce_label=ce_label, l1_temperatures=l1_temps,
        log_every=log_every, save_every=save_every, resume=resume,
        eval_temperatures=_floats(eval_temperatures, "--eval-temperatures"), eval_max_prompts=eval_max_prompts,
        eval_max_new_tokens=eval_max_new_tokens, fit_sts=fit_sts, draft_vocab_size=draft_vocab_size,
        progress=not as_json,
        time_limit_s=None if time_limit_min is None else 60.0 * time_limit_min, train_minutes=train_minutes,
        gen_batch=gen_batch, gen_attention_backend=gen_attention_backend, extra_text=list(extra_text or []),
        extra_text_max_seqs=extra_text_max_seqs, num_procs=num_procs,
    )
    trainer = Trainer(args)
    if generate_only:
        samples, held = trainer.prepare_data()
        print(json.dumps({"responses": len(samples), "heldout": len(held)}) if as_json else
              f"cached {len(samples)} responses in {output / 'responses.jsonl'} ({len(held)} held-out prompts)")
        return
    if num_procs > 1:
        trainer.prepare_data()  # generate (and cache) the responses once, before the ranks start
        summary = run_data_parallel(args)
    else:
        trainer.setup()
        summary = finish(trainer, trainer.train())
    if as_json:
        print(json.dumps(summary))
        return
    if "drafter" not in summary:  # stopped by --time-limit-min: the checkpoint is saved, --resume goes on
        return
    print(f"wrote the drafter to {summary['drafter']} ({summary['steps']} steps, loss {summary['first_loss']} -> "
          f"{summary['last_loss']})")
    for temp, figures in summary["eval"].items():
        print(f"held-out T={temp}: mean accept length {figures['mean_accept_length']}, per type {figures['per_type']}")
