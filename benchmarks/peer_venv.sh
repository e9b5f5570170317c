# Sourced by the setup_*_peers.sh scripts: `peer_venv DIR PACKAGE...` creates (or reuses) the
# virtual environment DIR and installs the packages into it, with torch held to the version in
# ../constraints.txt (any other version would download gigabytes of CUDA packages), then checks
# that the installed packages agree with each other.
peer_venv() {
    local venv="$1"
    shift
    local root
    root="$(dirname "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)")"
    test -x "$venv/bin/python" || "${PYTHON:-python3}" -m venv "$venv"
    # PIP_CONSTRAINT as well as -c: pip hands the environment, not -c, on to the isolated build
    # environments of any source distribution, which would otherwise be free to fetch another torch.
    PIP_CONSTRAINT="$root/constraints.txt" "$venv/bin/python" -m pip install -q -c "$root/constraints.txt" --upgrade pip
    PIP_CONSTRAINT="$root/constraints.txt" "$venv/bin/python" -m pip install -q -c "$root/constraints.txt" torch "$@"
    "$venv/bin/python" -m pip check
}
