"""`aiayn serve` as a child process on a free loopback port, started and stopped as an operator
would (SIGTERM): what the tests, the load benchmark and the page's screenshot script run."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Optional, Union

SERVING_AT = re.compile(r" at http://[^ ]*:(\d+)/ ")  # the line `aiayn serve` prints once it listens


def free_port() -> int:
    """A loopback port nothing listens on now (the OS's pick)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class ServerProcess:
    """`python -m aiayn serve RUN_DIR OPTIONS... --port 0`, returned once /health answers on the
    port it says it bound (`port`, `url`).
    Its output goes to temporary files, not pipes: a pipe nobody reads could fill and stall it.
    With `checkout`, the aiayn of that source tree is run (another revision, for a benchmark)."""

    def __init__(self, run_dir: Union[str, Path], *options: str, timeout: float = 300,
                 checkout: Optional[Path] = None) -> None:
        # --port 0: the server binds a port of the OS's choosing and says which, so no other
        # program can take it between a choice here and the bind (after PyTorch loads, seconds
        # later), and no other server's /health can answer for this one.
        self._out, self._err = tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "aiayn", "serve", str(Path(run_dir).resolve()), *options, "--port", "0"],
            stdout=self._out, stderr=self._err, text=True, cwd=checkout)  # -m imports from the working directory first
        deadline = time.monotonic() + timeout
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"aiayn serve exited: {self._read(self._err).strip()}")
            # pread: the child writes through the same file offset, which a seek here would move
            bound = SERVING_AT.search(os.pread(self._out.fileno(), 1 << 16, 0).decode("utf-8", "replace"))
            if bound:
                self.port = int(bound[1])
                self.url = f"http://127.0.0.1:{self.port}/"
                try:
                    with urllib.request.urlopen(self.url + "health", timeout=5):
                        return
                except OSError:
                    pass
            if time.monotonic() > deadline:
                self.process.kill()
                self.process.wait()
                raise RuntimeError(f"aiayn serve did not answer within {timeout:.0f} s")
            time.sleep(0.1)

    @property
    def pid(self) -> int:
        return self.process.pid

    def stop(self, timeout: float = 120) -> tuple[int, str, str]:
        """SIGTERM, then wait for the drain: (exit status, stdout, stderr)."""
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        return self.process.returncode, self._read(self._out), self._read(self._err)

    @staticmethod
    def _read(handle) -> str:
        handle.seek(0)
        return handle.read()

    def __enter__(self) -> "ServerProcess":
        return self

    def __exit__(self, *exc) -> None:
        if self.process.poll() is None:
            self.stop()
