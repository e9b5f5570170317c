"""`python peak_rss_child.py ARGS` runs `aiayn ARGS`, then prints "PEAK_MIB RANK MIB": the peak
resident set (VmHWM) of this process, whatever way the command ended. Launched by torchrun,
every rank prints its own line."""

import os
import sys
from pathlib import Path

from aiayn.cli import main

try:
    status = main(sys.argv[1:])
finally:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            print("PEAK_MIB", os.environ.get("RANK", "0"), int(line.split()[1]) / 1024, flush=True)
sys.exit(status)
