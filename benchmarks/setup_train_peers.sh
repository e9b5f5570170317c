#!/usr/bin/env bash
# Creates benchmarks/.venv-eole with the peer toolkit whose training and decoding are compared with
# aiayn's by benchmarks/peers/eole_peer.py, then (through setup_preprocess_peers.sh) the OpenNMT-py
# 3.0.4 environment benchmarks/.venv-peers used by benchmarks/peers/onmt_peer.py. Each peer has an
# environment of its own, apart from aiayn's .venv and from benchmarks/.venv, and the two cannot
# share one: Eole 0.6.4 pins ctranslate2>=4, numpy>=2 and protobuf==7.36.2 where the OpenNMT-py
# 3.0.4 environment holds ctranslate2<4, and neither toolkit may leak into aiayn's dependencies.
# torch is held to the version in ../constraints.txt: any other version would download gigabytes
# of CUDA packages. Safe to run again: an existing env is reused and the installs are no-ops.
#
# Installed in benchmarks/.venv-eole:
#   eole 0.6.4: it asks for torch>=2.10,<2.15, so the pinned CPU torch satisfies it as it is; it
#   pulls torch-optimi, whose Adam it uses for pure-bf16 training.
#   aiohttp: Eole's CLI imports every tool at start-up, eole/bin/tools/load_test.py among them,
#   which imports aiohttp without Eole declaring it.
#   sentencepiece and sacrebleu, for the tokenised data and the scores around the peer.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
venv="$here/.venv-eole"
source "$here/peer_venv.sh"
peer_venv "$venv" "eole==0.6.4" aiohttp sentencepiece sacrebleu
"$venv/bin/python" - <<'PY'
import warnings
warnings.simplefilter("ignore", RuntimeWarning)  # eole warns that its CUDA/C++ ops are absent
import importlib.metadata as md
import torch
import eole.bin.main  # the CLI entry point: fails here if aiohttp is missing
import optimi  # Eole's pure-bf16 optimizer
assert torch.__version__.split("+")[0] == "2.13.0", torch.__version__
print(f"benchmarks/.venv-eole ready: torch {torch.__version__}, eole {md.version('eole')}, "
      f"torch-optimi {md.version('torch-optimi')}, sentencepiece {md.version('sentencepiece')}, "
      f"sacrebleu {md.version('sacrebleu')}")
PY
test -x "$venv/bin/eole"

bash "$here/setup_preprocess_peers.sh"
