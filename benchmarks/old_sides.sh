#!/usr/bin/env bash
# The old sides of two device A/Bs, rebuilt from history (git-ignored folders that do not outlive a session).
# Run from the repository root:
#   bash benchmarks/old_sides.sh
# - .pre27: sglaunch/engine/{interface,engine,ipc}.py at e6ce731, before TokenOutput's cheaper form (pipeline62 in
#   gpu_session6.sh, the token_output A/B; carry .pre27);
# - .pre36: sglaunch/engine/model_runner.py and attention/torch_backend.py at f884016, before the logit-row fix
#   (rows_ab in gpu_session6.sh, benchmarks/gpu_rows_ab.sh; carry .pre36).
# - .pre39: every Python file of sglaunch/ at e04eb44, the tree session 38 measured T=0 with (tree_ab in
#   gpu_session6.sh, pipeline80's bench5: DSpark at T=0 served 25% less at c=8 in session 39 than in session 38 with
#   plain within 7%; carry .pre39, 1.9 MB).
# - .pre42: sglaunch/engine/{sampler,engine}.py and speculative/decoder.py at 9d7f0c9, before sampler.UniformStream
#   (`PLAIN=1 tree_ab .pre42 ...` in gpu_session6.sh: plain decoding at T=0.7 with and without it; carry .pre42).
# Each folder goes into .git/info/exclude once, so the device calls carry it only when named in `carry`.
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
mkdir -p .pre27/sglaunch/engine .pre36/sglaunch/engine/attention
for f in interface engine ipc; do
  git show "e6ce731:sglaunch/engine/$f.py" > ".pre27/sglaunch/engine/$f.py"
done
git show f884016:sglaunch/engine/model_runner.py > .pre36/sglaunch/engine/model_runner.py
git show f884016:sglaunch/engine/attention/torch_backend.py > .pre36/sglaunch/engine/attention/torch_backend.py
mkdir -p .pre42/sglaunch/engine .pre42/sglaunch/speculative
for f in engine/sampler engine/engine speculative/decoder; do
  git show "9d7f0c9:sglaunch/$f.py" > ".pre42/sglaunch/$f.py"
done
rm -rf .pre39 && mkdir -p .pre39
git archive e04eb44 sglaunch | tar -x -C .pre39 --wildcards '*.py'
for d in /.pre27/ /.pre36/ /.pre39/ /.pre42/; do
  grep -qxF "$d" .git/info/exclude || echo "$d" >> .git/info/exclude
done
find .pre27 .pre36 .pre42 -name '*.py' | sort; echo ".pre39: $(find .pre39 -name '*.py' | wc -l) files"
