#!/usr/bin/env bash
# Creates benchmarks/.venv-libretranslate with LibreTranslate 1.9.6 (and argos-translate-lt
# 1.12.1, CTranslate2, through its pins) and spaCy, whose rule-based sentencizer splits sentences
# for benchmarks/libretranslate_load.py: LibreTranslate's own splitters download their models on
# first use. LibreTranslate needs no torch, so none is installed here; the install is held to
# ../constraints.txt all the same, so that a dependency that ever asks for torch gets the one CPU
# wheel, not gigabytes of CUDA packages. Apart from aiayn's .venv: it pins Flask, numpy<2 and
# requests of its own. Safe to run again.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
export PIP_CONSTRAINT="$(dirname "$here")/constraints.txt"  # also seen by source builds' isolated environments
venv="$here/.venv-libretranslate"
test -x "$venv/bin/python" || "${PYTHON:-python3}" -m venv "$venv"
"$venv/bin/python" -m pip install -q -c "$PIP_CONSTRAINT" --upgrade pip
"$venv/bin/python" -m pip install -q -c "$PIP_CONSTRAINT" "libretranslate==1.9.6" "spacy==3.8.18"
"$venv/bin/python" -m pip check
"$venv/bin/python" -c "import importlib.metadata as m; print('benchmarks/.venv-libretranslate ready: LibreTranslate', m.version('libretranslate'), 'argos-translate-lt', m.version('argos-translate-lt'), 'ctranslate2', m.version('ctranslate2'), 'spacy', m.version('spacy'))"
