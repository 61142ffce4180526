"""Sequential Temperature Scaling (STS) of the confidence head [DSpark §3.2.1].

Calibrated confidence: c_j = sigmoid(logit_j / T_j), one temperature per block slot j. The fit
goes left to right; at slot j a 1-D grid search picks T_j minimising the expected calibration
error (ECE) of the *cumulative product* prod_{i<=j} c_i (prefix survival) against the observed
event "drafts 0..j all accepted", with the earlier temperatures fixed. Temperatures are
positive, so the ranking of confidences at a slot is preserved.

Recorded data (input of `sglaunch fit-sts`), one drafted block per record:
- JSONL: one object per line
      {"confidence_logits": [l_0, ..., l_{G-1}], "accepted": n, "verified": L}
  `confidence_logits` are the raw head outputs (before sigmoid and any STS); `accepted` is the
  number of drafts accepted (0..L, the bonus token not counted); `verified` is how many drafts
  the target checked (optional, default G). Slots j >= L are unobserved and left out at j.
- NPZ: arrays `confidence_logits` [N, G] float, `accepted` [N] int, optional `verified` [N] int.

Calibration file (`--speculative-dspark-confidence-sts-path`), JSON:
      {"version": 1, "temperatures": [T_0, ..., T_{G-1}], "block_size": G, ...metadata}
`sts_temperatures` is accepted as the key too; the length must equal the drafter's block size.
numpy only (imported lazily), no torch.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DEFAULT_BINS = 15


def default_grid():
    """49 log-spaced temperatures from 1/8 to 8 (1.0 included)."""
    import numpy as np

    return np.exp2(np.linspace(-3.0, 3.0, 49))


def sigmoid(x):
    import numpy as np

    return 0.5 * (1.0 + np.tanh(0.5 * x))  # NOTE: overflow-free form


def ece(pred, outcome, bins: int = DEFAULT_BINS) -> float:
    """Equal-width-bin expected calibration error of probabilities `pred` vs 0/1 `outcome`."""
    import numpy as np

    pred, outcome = np.asarray(pred, dtype=np.float64), np.asarray(outcome, dtype=np.float64)
    if pred.size == 0:
        return 0.0
    which = np.minimum((pred * bins).astype(np.int64), bins - 1)
    count = np.bincount(which, minlength=bins)
    gap = np.abs(np.bincount(which, pred, bins) - np.bincount(which, outcome, bins))
    return float(gap.sum() / pred.size) if count.sum() else 0.0


def survival(logits, temperatures):
    """[N, G] raw logits, [G] temperatures -> [N, G] cumulative product of calibrated confidences."""
    import numpy as np

    return np.cumprod(sigmoid(np.asarray(logits, np.float64) / np.asarray(temperatures, np.float64)), axis=1)


@dataclass
class StsFit:
    temperatures: list[float]
    ece_before: list[float]  # per slot, survival ECE with T = 1
    ece_after: list[float]  # per slot, with the fitted temperatures
    observed: list[int]  # records observed at each slot
    num_blocks: int
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"version": 1, "temperatures": self.temperatures, "block_size": len(self.temperatures),
                "ece_before": self.ece_before, "ece_after": self.ece_after, "observed": self.observed,
                "num_blocks": self.num_blocks, **self.extra}


def slot_outcomes(accepted, verified, block_size: int):
    """-> (outcome [N, G] 0/1: drafts 0..j all accepted, observed [N, G] bool: slot j verified)."""
    import numpy as np

    j = np.arange(block_size)[None, :]
    return (np.asarray(accepted)[:, None] > j), (np.asarray(verified)[:, None] > j)


def fit_sts(logits, accepted, verified=None, grid=None, bins: int = DEFAULT_BINS) -> StsFit:
    """Left-to-right grid search of per-slot temperatures minimising the survival ECE."""
    import numpy as np

    logits = np.asarray(logits, dtype=np.float64)
    n, g = logits.shape
    verified = np.full(n, g) if verified is None else np.asarray(verified)
    outcome, observed = slot_outcomes(accepted, verified, g)
    grid = default_grid() if grid is None else np.asarray(grid, dtype=np.float64)
    grid = grid[np.argsort(np.abs(np.log(grid)), kind="stable")]  # ties resolve towards T = 1
    temps, prefix = np.ones(g), np.ones(n)
    for j in range(g):
        m = observed[:, j]
        if m.any():
            scores = [ece(prefix[m] * sigmoid(logits[m, j] / t), outcome[m, j], bins) for t in grid]
            temps[j] = grid[int(np.argmin(scores))]
        prefix = prefix * sigmoid(logits[:, j] / temps[j])
    before, after = survival(logits, np.ones(g)), survival(logits, temps)
    per_slot = lambda s: [ece(s[observed[:, j], j], outcome[observed[:, j], j], bins) for j in range(g)]  # noqa: E731
    return StsFit([float(t) for t in temps], per_slot(before), per_slot(after),
                  [int(c) for c in observed.sum(0)], n)


def load_records(path: str | Path):
    """Read recorded blocks (format in the module docstring) -> (logits [N, G], accepted [N], verified [N])."""
    import numpy as np

    path = Path(path)
    if not path.is_file():
        raise ValueError(f"recorded confidence file {path} does not exist")
    if path.suffix == ".npz":
        with np.load(path) as data:
            missing = [k for k in ("confidence_logits", "accepted") if k not in data]
            if missing:
                raise ValueError(f"{path}: the NPZ lacks array(s) {missing}; see docs/dspark.md for the format")
            logits, accepted = data["confidence_logits"], data["accepted"]
            verified = data["verified"] if "verified" in data else np.full(len(accepted), logits.shape[1])
        return _check_records(path, np.asarray(logits, np.float64), np.asarray(accepted), np.asarray(verified))
    return _check_records(path, *_read_jsonl(path))


def _read_jsonl(path: Path):
    import numpy as np

    logits, accepted, verified = [], [], []
    for lineno, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
            logits.append([float(x) for x in rec["confidence_logits"]])
            accepted.append(int(rec["accepted"]))
            verified.append(int(rec.get("verified", len(rec["confidence_logits"]))))
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"{path}:{lineno}: expected {{\"confidence_logits\": [...], \"accepted\": n, "
                             f"\"verified\": L}} ({type(exc).__name__}: {exc})") from None
    if not logits:
        raise ValueError(f"{path} holds no records")
    if len({len(x) for x in logits}) != 1:
        raise ValueError(f"{path}: records have different block sizes {sorted({len(x) for x in logits})}")
    return np.asarray(logits), np.asarray(accepted), np.asarray(verified)


def _check_records(path: Path, logits, accepted, verified):
    if logits.ndim != 2 or len(accepted) != len(logits) or len(verified) != len(logits):
        raise ValueError(f"{path}: confidence_logits must be [N, G] with N accepted/verified entries")
    g = logits.shape[1]
    if (verified < 0).any() or (verified > g).any() or (accepted < 0).any() or (accepted > verified).any():
        raise ValueError(f"{path}: need 0 <= accepted <= verified <= block size ({g}) in every record")
    return logits, accepted, verified


def load_sts(path: str | Path, block_size: int) -> list[float]:
    """Temperatures from an STS calibration file; ValueError unless there are block_size positive ones."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise ValueError(f"STS file {path} does not exist; fit one with `sglaunch fit-sts`") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"STS file {path} is not valid JSON ({exc})") from None
    temps = data if isinstance(data, list) else data.get("temperatures", data.get("sts_temperatures"))
    if not isinstance(temps, list) or not all(isinstance(t, (int, float)) and t > 0 for t in temps):
        raise ValueError(f"STS file {path}: 'temperatures' must be a list of positive numbers")
    if len(temps) != block_size:
        raise ValueError(f"STS file {path} has {len(temps)} temperatures but the drafter's block size is "
                         f"{block_size}; fit it for this drafter")
    return [float(t) for t in temps]


def save_sts(fit: StsFit, path: str | Path) -> None:
    Path(path).write_text(json.dumps(fit.to_json(), indent=1) + "\n")
