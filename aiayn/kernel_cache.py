"""oneDNN's cache of compiled kernels, sized before PyTorch starts: a process's memory over a long
run. Free of torch, so that `import aiayn` sets it before anything has imported PyTorch, and the
command line answers --help and argument errors without waiting seconds for PyTorch to load."""

from __future__ import annotations

import os

# oneDNN, which runs PyTorch's bf16 matrix products on the CPU, keeps the kernel it compiled for
# each problem shape, 1,024 of them by default (each a fraction of a MB). Training batches come in
# hundreds of shapes, so that cache kept growing through a long run: 400 demo steps ended at
# 2,333 MiB with it and 1,625 MiB with 128 kernels (docs/robustness.md). A step's layers share
# their shapes, so the kernels a step reuses fit in 128: the demo trained no slower.
KERNEL_CACHE_CAPACITY = 128
# A server's decoding steps come in more shapes than a training step's: the rows decoding times
# the columns of the keys attended, which change with every step and every join. With 128 kernels
# a 16-sentence search compiled about 2 kernels a step, about 0.3 ms each (benchmarks/
# decode_steps.py, AMD EPYC Zen 5); oneDNN's own 1,024 keep them, for about 210 MiB more in the
# demo model's server (docs/serving-load.md).
SERVING_KERNEL_CACHE_CAPACITY = 1024
# The size aiayn set, beside oneDNN's variable: a child process inherits both (a server started
# by a program that imported aiayn), and must not take aiayn's own setting for the user's.
_OURS = "AIAYN_ONEDNN_PRIMITIVE_CACHE_CAPACITY"
_GIVEN = os.environ.get("ONEDNN_PRIMITIVE_CACHE_CAPACITY")
_USER_SIZED = "DNNL_PRIMITIVE_CACHE_CAPACITY" in os.environ or (_GIVEN is not None and _GIVEN != os.environ.get(_OURS))


def bound_kernel_cache(capacity: int = KERNEL_CACHE_CAPACITY) -> None:
    """Cap oneDNN's cache of compiled kernels at `capacity`, unless the user set its size
    (ONEDNN_ or DNNL_PRIMITIVE_CACHE_CAPACITY). oneDNN reads the variable once, when the process
    compiles its first kernel, so `import aiayn` calls this, and `aiayn serve` again with
    SERVING_KERNEL_CACHE_CAPACITY before it loads a model."""
    if not _USER_SIZED:
        os.environ["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] = os.environ[_OURS] = str(capacity)
