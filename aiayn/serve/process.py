"""`aiayn serve` as a child process on a free loopback port, started and stopped as an operator
would (SIGTERM): what the tests, the load benchmark and the page's screenshot script run."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Optional, Union

PORT_TRIES = 3


def free_port() -> int:
    """A loopback port nothing listens on now (the OS's pick)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class ServerProcess:
    """`python -m aiayn serve RUN_DIR --port PORT OPTIONS...`, returned once /health answers.
    Its output goes to temporary files, not pipes: a pipe nobody reads could fill and stall it.
    With `checkout`, the aiayn of that source tree is run (another revision, for a benchmark)."""

    def __init__(self, run_dir: Union[str, Path], *options: str, timeout: float = 300,
                 checkout: Optional[Path] = None) -> None:
        self._out, self._err = tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")
        argv = [sys.executable, "-m", "aiayn", "serve", str(Path(run_dir).resolve()), *options]
        # The port is free when chosen, but the server binds it seconds later, after importing
        # PyTorch: a connection of another program may take it in between (an ephemeral port
        # is drawn from the same range). Such a start is tried again on another port.
        for attempt in range(PORT_TRIES):
            self.port = free_port()
            self.url = f"http://127.0.0.1:{self.port}/"
            self.process = subprocess.Popen(argv + ["--port", str(self.port)], stdout=self._out, stderr=self._err,
                                            text=True, cwd=checkout)  # -m imports from the working directory first
            error = self._wait_for_health(timeout)
            if error is None:
                return
            if "Address already in use" not in error or attempt == PORT_TRIES - 1:
                raise RuntimeError(f"aiayn serve exited: {error}")
            for handle in (self._out, self._err):
                handle.seek(0)
                handle.truncate()

    def _wait_for_health(self, timeout: float) -> Optional[str]:
        """None once /health answers; the server's error output if it exits first."""
        deadline = time.monotonic() + timeout
        while True:
            if self.process.poll() is not None:
                return self._read(self._err).strip()
            try:
                with urllib.request.urlopen(self.url + "health", timeout=5):
                    return None
            except OSError:
                if time.monotonic() > deadline:
                    self.process.kill()
                    raise RuntimeError(f"aiayn serve did not answer within {timeout:.0f} s") from None
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
