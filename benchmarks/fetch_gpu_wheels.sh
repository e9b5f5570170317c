#!/usr/bin/env bash
# Fetches into .whl/ (git ignores it) the wheels that benchmarks/gpu_session.sh installs on a lent
# GPU machine, which has CUDA PyTorch but no network and takes at most 64 MiB of files with the
# checkout: Eole 0.6.4 and the dependencies of its training path that such a machine lacks,
# CTranslate2 4.8.5, and aiayn's own two. For CPython 3.12 on x86-64 Linux, whatever this
# machine is. The two large wheels, pyonmttok (17.7 MB) and ctranslate2 (42.8 MB), are written
# again with LZMA compression (11 and 25 MB): pip installs the same files from them.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
exclude="$(git rev-parse --git-path info/exclude)"
mkdir -p "$(dirname "$exclude")"
grep -qx '/.whl/' "$exclude" 2>/dev/null || echo '/.whl/' >>"$exclude"

fetch() {  # fetch GROUP NAME==VERSION...
    local group="$1"
    shift
    mkdir -p ".whl/$group"
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 -d ".whl/$group" "$@"
}

fetch eole eole==0.6.4 pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 \
    typing-extensions==4.16.0 torch-optimi==0.3.3 pyonmttok==1.38.1
fetch ct2 ctranslate2==4.8.5
fetch aiayn sacremoses==0.2.0 sentencex==1.0.32

python3 - <<'PY'
import zipfile
from pathlib import Path

for wheel in [*Path(".whl/eole").glob("pyonmttok-*.whl"), *Path(".whl/ct2").glob("ctranslate2-*.whl")]:
    with zipfile.ZipFile(wheel) as source:
        if all(info.compress_type == zipfile.ZIP_LZMA for info in source.infolist()):
            continue  # already written again
        packed = wheel.with_name(wheel.name + ".partial")
        with zipfile.ZipFile(packed, "w", zipfile.ZIP_LZMA) as target:
            for info in source.infolist():
                target.writestr(info, source.read(info), compress_type=zipfile.ZIP_LZMA)
    packed.replace(wheel)
PY
du -sh .whl
