#!/usr/bin/env bash
# Creates benchmarks/.venv with aiayn (editable) and the peer implementations it is compared
# with. The peers live here, never in aiayn's own dependencies. torch is held to the version in
# ../constraints.txt: any other version would download gigabytes of CUDA packages.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(dirname "$here")"
python="${PYTHON:-python3}"

test -x "$here/.venv/bin/python" || "$python" -m venv "$here/.venv"
pip=("$here/.venv/bin/python" -m pip install -q -c "$root/constraints.txt")
"${pip[@]}" --upgrade pip
"${pip[@]}" torch numpy matplotlib sentencepiece \
    "transformers==5.23.0" "ctranslate2==4.8.5" \
    -e "$root"
"$here/.venv/bin/python" - <<'PY'
import ctranslate2, torch, transformers
print(f"benchmarks/.venv ready: torch {torch.__version__}, transformers {transformers.__version__}, "
      f"ctranslate2 {ctranslate2.__version__}")
PY
