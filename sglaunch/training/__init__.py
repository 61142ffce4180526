"""`sglaunch train-draft`: train a DSpark drafter for a target model (DeepSpec recipe, §4 of the
spec), evaluate it by simulated draft-then-verify decoding, fit its STS calibration.

Modules: `data` (prompt files, the target's own responses via our engine), `target` (the
frozen target: features and logits, default layer ids, mask token), `objective` (anchor
blocks, teacher-forced drafter forward, the three losses), `trainer` (AdamW + cosine, bf16
autocast, checkpoints, resume), `evaluate` (accept lengths, calibration), `corpus` (prompts
from the license-clean corpus).
"""
