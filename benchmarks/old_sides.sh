#!/usr/bin/env bash
# The old sides of two device A/Bs, rebuilt from history (git-ignored folders that do not outlive a session).
# Run from the repository root:
#   bash benchmarks/old_sides.sh
# - .pre27: sglaunch/engine/{interface,engine,ipc}.py at e6ce731, before TokenOutput's cheaper form (pipeline62 in
#   gpu_session6.sh, the token_output A/B; carry .pre27);
# - .pre36: sglaunch/engine/model_runner.py and attention/torch_backend.py at f884016, before the logit-row fix
#   (rows_ab in gpu_session6.sh, benchmarks/gpu_rows_ab.sh; carry .pre36).
# Each folder goes into .git/info/exclude once, so the device calls carry it only when named in `carry`.
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
mkdir -p .pre27/sglaunch/engine .pre36/sglaunch/engine/attention
for f in interface engine ipc; do
  git show "e6ce731:sglaunch/engine/$f.py" > ".pre27/sglaunch/engine/$f.py"
done
git show f884016:sglaunch/engine/model_runner.py > .pre36/sglaunch/engine/model_runner.py
git show f884016:sglaunch/engine/attention/torch_backend.py > .pre36/sglaunch/engine/attention/torch_backend.py
for d in /.pre27/ /.pre36/; do
  grep -qxF "$d" .git/info/exclude || echo "$d" >> .git/info/exclude
done
find .pre27 .pre36 -name '*.py' | sort
