#!/usr/bin/env bash
# Creates benchmarks/.venv-peers with the peer toolkits whose corpus preprocessing is compared with
# `aiayn preprocess`. It is kept apart from aiayn's .venv and from benchmarks/.venv: the peers
# bring their own pins (ctranslate2<4 here, where benchmarks/.venv has ctranslate2 4.x). torch is
# held to the version in ../constraints.txt: any other version would download gigabytes of CUDA
# packages. Safe to run again: an existing env is reused and the installs are no-ops.
#
# Installed:
#   OpenNMT-py 3.0.4 (onmt_build_vocab): it asks for torch>=1.12.1, so the pinned CPU torch
#   satisfies it as it is and no --no-deps workaround is needed.
# Not installed:
#   fairseq 0.12.2 (fairseq-preprocess), the last release, does not work on Python 3.11. With
#   pip>=24.1 it does not even resolve: its hydra-core 1.0.7 / omegaconf<2.1 pins have metadata
#   ("PyYAML (>=5.1.*)") that newer pip rejects, so "ResolutionImpossible". With pip 23.2 it
#   installs, but every entry point fails at import with Python 3.11's dataclass check:
#   "ValueError: mutable default <class 'fairseq.dataclass.configs.CommonConfig'> for field
#   common is not allowed: use default_factory". (It would also pull torchaudio.)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
venv="$here/.venv-peers"
source "$here/peer_venv.sh"
peer_venv "$venv" sentencepiece "OpenNMT-py==3.0.4"
"$venv/bin/python" - <<'PY'
import warnings
warnings.simplefilter("ignore", FutureWarning)  # onmt 3.0.4 uses torch.cuda.amp.custom_fwd
import importlib.metadata as md
import torch
import onmt.transforms.tokenize  # the sentencepiece transform onmt_build_vocab loads
assert torch.__version__.split("+")[0] == "2.13.0", torch.__version__
print(f"benchmarks/.venv-peers ready: torch {torch.__version__}, "
      f"OpenNMT-py {md.version('OpenNMT-py')}, sentencepiece {md.version('sentencepiece')}")
PY
test -x "$venv/bin/onmt_build_vocab"
