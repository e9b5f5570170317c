"""Decoding in worker processes: `aiayn serve --workers N`, CTranslate2's `inter_threads`.

A decoding step of a few sentences is mostly fixed cost: Python and the dispatch of some hundred
small operators, which one thread runs while PyTorch's other OpenMP threads wait for work. Split
over worker processes of one thread each, the fixed costs of N searches run side by side on N
cores, where one process's threads would run them one after the other: on a 2-core AMD EPYC
(Zen 5), two workers answered 16 clients 1.23× the sentences a second of one 2-thread process
(`benchmarks/serve_load.py --workers 2 --compare-workers 1`, docs/serving-load.md).
Threads of one process would share the model, but Python's lock would run their fixed costs one
at a time again.

Each worker loads the model itself and decodes the searches of the batcher's lane that drives it
(aiayn.serve.batcher). A join is one message and one answer over a pipe. Steps need no message:
a worker with texts decoding steps its searches on its own, taking the joins that have come in
between two steps, and sends one report a step, the finished texts' results (translation,
alternatives, attention) as plain Python values. The lane reads the reports in order, one a step
of its own. So no step waits for the server: with a step that waited for the server's message,
one client got 0.92× as many sentences a second (p50 latency 77 against 69 ms, 16 clients
unchanged: benchmarks/serve_load.py --compare-with, 2-core AMD EPYC Zen 5,
docs/serving-load.md).
The server process keeps the HTTP side, the queue and the tokenizer; it reads the model's
config and lets the weights go.
A worker ignores SIGINT and SIGTERM (a Ctrl-C reaches the whole process group): the server
drains, then closes the pipes, and a worker whose pipe has closed exits. A worker that dies
otherwise is started again by its lane (`Worker.revive`), until it has died REVIVALS times
within REVIVAL_WINDOW_S.
"""

from __future__ import annotations

import ctypes
import dataclasses
import multiprocessing
import os
import pickle
import signal
import sys
import time
from collections import deque
from itertools import count
from pathlib import Path
from typing import Any, Optional

from aiayn.serve.batcher import SECTION_6_1, Options


class WorkerLost(BaseException):
    """A worker process has gone. Not an Exception: the batcher fails a search's callers on an
    Exception and decodes on, but a lane whose process is gone can decode nothing more, so its
    loop ends and /health reports the failure."""


def _picklable(error: Exception) -> Exception:
    """`error` as it can cross the pipe: itself, or a RuntimeError that says the same."""
    try:
        pickle.loads(pickle.dumps(error))
        return error
    except Exception:  # noqa: BLE001 - any exception type may refuse to pickle
        return RuntimeError(f"{type(error).__name__}: {error}")


def _work(connection, run_dir: str, device: str, precision: str, threads: int, server: int, stop: str) -> None:
    """A worker's body: load the model, then answer joins and report steps until the pipe closes
    (or the process `server` ends)."""
    _end_with_server(server)
    try:
        _answer_until_closed(connection, run_dir, device, precision, threads, stop)
    except OSError:  # the server closed the pipe while this worker was answering: it is done with it
        pass


def _end_with_server(server: int) -> None:
    """Have the kernel kill this worker when the server process (pid `server`) ends, however it
    ends: a worker reads its pipe's end and exits on its own, but not one that is stopped
    (SIGSTOP) or hung (found by a fault hunt: after the server's `kill -9`, a stopped worker
    stayed, an orphan holding its copy of the model). Linux only (prctl PR_SET_PDEATHSIG);
    elsewhere a no-op. The parent is compared with the server's pid, not with 1: a server may be
    a container's first process."""
    if not sys.platform.startswith("linux"):
        return
    PR_SET_PDEATHSIG = 1
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != server:  # the server was gone before the request took hold
        os._exit(0)


def _answer_until_closed(connection, run_dir: str, device: str, precision: str, threads: int, stop: str) -> None:
    """Load the model (or say why not), then decode until the pipe closes: answer each join, and
    while texts are decoding, step every search and report it; a search the worker has finished
    or failed is forgotten."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    import torch

    from aiayn.config import DECODE_PRESETS
    from aiayn.kernel_cache import SERVING_KERNEL_CACHE_CAPACITY, bound_kernel_cache
    from aiayn.run import load_for_inference
    from aiayn.serve.app import ServedModel
    from aiayn.translate import Translator

    torch.set_num_threads(threads)
    bound_kernel_cache(SERVING_KERNEL_CACHE_CAPACITY)  # before the first matrix product, as `aiayn serve`
    try:
        model, tokenizer = load_for_inference(run_dir, device)
        served = ServedModel(Translator(model, tokenizer, dataclasses.replace(DECODE_PRESETS["translate"],
                                                                              precision=precision, stop=stop)))
        del model  # the decoding copy only (aiayn.serve.server says why)
    except Exception as error:  # noqa: BLE001 - the server reports it in one line
        said = str(error) if isinstance(error, ValueError) else f"{type(error).__name__}: {error}"  # a user's mistake, or not
        connection.send(("failed", said))
        return
    connection.send(("ready", None))
    searches: dict[int, Any] = {}  # the server's search id -> ServedSearch
    # Searches whose step raised: a join the lane sent before it read that report fails with the
    # step's error, rather than starting a search the lane has dropped.
    failed: dict[int, Exception] = {}
    while True:
        # Wait for a message only with nothing to decode; else take the joins that have come, and step.
        while not searches or connection.poll(0):
            try:
                kind, search_id, *message = connection.recv()
            except EOFError:  # the server has closed the pipe: it is done with this worker
                return
            if kind == "cut":  # no answer: the texts come back at the next step
                if search_id in searches:
                    searches[search_id].cut(set(message[0]))
                continue
            beam, sources, keys, options = message
            try:
                if search_id in failed:
                    raise failed[search_id]
                # A search finished here may be joined again before the lane has read its last report.
                search = searches.get(search_id) or served.search(beam)
                search.join(sources, keys, options)
                searches[search_id] = search
            except Exception as error:  # noqa: BLE001 - the lane's callers get it, as in one process
                connection.send(("joined", _picklable(error)))
                continue
            connection.send(("joined", None))
        report: dict[int, Any] = {}
        for search_id, search in list(searches.items()):
            try:
                report[search_id] = [(key, _picklable(result) if isinstance(result, Exception) else result)
                                     for key, result in search.step()]
            except Exception as error:  # noqa: BLE001 - the batcher drops a search whose step failed
                report[search_id] = failed[search_id] = _picklable(error)
            if isinstance(report[search_id], Exception) or not search.live:
                del searches[search_id]
        connection.send(("stepped", report))


# How often a lane waiting for its worker's answer checks that it was not abandoned (a stop at
# once) and that the process is alive. A killed worker's pipe usually ends at once (EOFError); the
# check covers one whose pipe another process holds.
ABANDON_TICK_S = 0.2

# How long stopping workers may take, all together, before they are killed.
CLOSE_S = 10.0

# A worker that has died this many times within this window is not started again (`Worker.revive`):
# a model that crashes its process on every load, or a machine short of memory, fails the server
# in minutes rather than reloading for ever.
REVIVALS = 3
REVIVAL_WINDOW_S = 600.0


class Worker:
    """One worker process and the pipe to it; `search(beam)` is its lane's engine. The answers to
    joins and the reports of steps come over the one pipe: each read keeps what it is for."""

    def __init__(self, context, run_dir: str, device: str, precision: str, threads: int, number: int,
                 stop: str = SECTION_6_1.stop) -> None:
        self._context, self._args = context, (run_dir, device, precision, threads, os.getpid(), stop)
        self.number = number
        self._ids = count()
        self._abandoned: Optional[str] = None  # set by `abandon`: stop waiting for this process
        self._deaths: deque = deque(maxlen=REVIVALS)  # when the process was last found gone (time.monotonic)
        self._start()

    def _start(self) -> None:
        self.connection, theirs = self._context.Pipe()
        self.process = self._context.Process(target=_work, args=(theirs, *self._args),
                                             name=f"aiayn-worker-{self.number}", daemon=True)
        self.process.start()
        theirs.close()
        self._joined: deque = deque()  # answers to joins (None, or the error), in order
        self._reports: dict[int, deque] = {}  # search id -> its steps' finished texts (or error), in order

    def ready(self) -> None:
        """Wait until the model has loaded; ValueError with the worker's reason if it did not."""
        try:
            self._wait()
            kind, reason = self.connection.recv()
        except (EOFError, OSError):
            raise ValueError(f"worker {self.number} exited while loading the model ({self._exit()})") from None
        if kind != "ready":
            raise ValueError(f"worker {self.number} could not load the model: {reason}")

    def revive(self) -> None:
        """Start the process again after it was found gone, the model loaded afresh, so that its
        lane decodes on (found in review: a worker the kernel's OOM killer took left the server
        answering 503 until someone restarted it). A worker that dies REVIVALS times within
        REVIVAL_WINDOW_S is not started again: WorkerLost, and its lane fails as before."""
        self._deaths.append(time.monotonic())
        if len(self._deaths) == REVIVALS and self._deaths[-1] - self._deaths[0] < REVIVAL_WINDOW_S:
            raise WorkerLost(f"worker {self.number} has exited {REVIVALS} times in "
                             f"{REVIVAL_WINDOW_S / 60:g} minutes ({self._exit()}); not started again")
        self.connection.close()
        self.close(time.monotonic())  # a hung process is killed
        self._start()
        self.ready()

    def _exit(self) -> str:
        """How the process ended, as far as is known yet."""
        self.process.join(1)
        code = self.process.exitcode
        if code is None:
            return "still running"
        if code < 0:
            return f"killed by {signal.Signals(-code).name}" if -code in signal.valid_signals() else f"signal {-code}"
        return f"exit code {code}"

    def _lost(self) -> WorkerLost:
        return WorkerLost(f"worker {self.number} has exited ({self._exit()})")

    def _wait(self) -> None:
        """Until the worker's next message has come: WorkerLost once abandoned (a stop at once,
        while it loads, steps or is stopped), EOFError once its process has gone without one."""
        while not self.connection.poll(ABANDON_TICK_S):
            if self._abandoned is not None:
                raise WorkerLost(f"worker {self.number} was abandoned ({self._abandoned})")
            if not self.process.is_alive() and not self.connection.poll(0):  # (what it sent before it ended is read)
                raise EOFError("no answer")

    def _read(self) -> None:
        """Wait for the worker's next message and keep it: a join's answer, or a step's report."""
        try:
            self._wait()
            kind, content = self.connection.recv()
        except (EOFError, OSError):
            raise self._lost() from None
        if kind == "joined":
            self._joined.append(content)
            return
        for search_id, finished in content.items():
            self._reports.setdefault(search_id, deque()).append(finished)

    def join(self, search_id: int, beam: int, sources: list, keys: list, options: Options) -> None:
        self._send(("join", search_id, beam, sources, keys, options))
        while not self._joined:
            self._read()
        if (error := self._joined.popleft()) is not None:
            raise error

    def cut(self, search_id: int, numbers: list) -> None:
        self._send(("cut", search_id, numbers))

    def _send(self, message: tuple) -> None:
        try:
            self.connection.send(message)
        except OSError:
            raise self._lost() from None

    def step(self, search_id: int) -> list:
        """The finished texts of the search's next step (a search being decoded, whose steps the
        worker reports)."""
        while not self._reports.get(search_id):
            self._read()
        reports = self._reports[search_id]
        finished = reports.popleft()
        if not reports:
            del self._reports[search_id]
        if isinstance(finished, Exception):
            raise finished
        return finished

    def __call__(self, beam: int) -> "RemoteSearch":
        """A new search of `beam` in the worker: the worker is its lane's engine."""
        return RemoteSearch(self, beam, next(self._ids))

    def abandon(self, reason: str) -> None:
        """Stop waiting for this process's answers: the lane's next wait for one raises
        WorkerLost (a stop at once, while the process is stopped or hung). A flag only: safe in a
        signal handler."""
        self._abandoned = reason

    def check_alive(self) -> None:
        """WorkerLost if the process is gone: its lane asks while idle, so that /health says
        "failed" when a worker dies between requests (found in review: "ok" until the next
        request failed)."""
        if not self.process.is_alive():
            raise WorkerLost(f"worker {self.number} has exited ({self._exit()})")

    def stopped(self) -> Optional[str]:
        """Why the process is stopped, if it is (SIGSTOP, Ctrl-Z's SIGTSTP to it alone, a debugger):
        it keeps its lane's requests waiting until it continues, so /health says so meanwhile
        (found in review: "ok"). Linux only (/proc); elsewhere None."""
        pid = getattr(self.process, "pid", None)  # None: not started (or a thread standing in, in a test)
        if pid is None:
            return None
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return None
        state = stat[stat.rindex(")") + 2]  # the field after the command's name, which may hold ")"
        if state in "Tt":
            return f"worker {self.number} is stopped ({'traced' if state == 't' else 'SIGSTOP'}); its requests wait until it continues"
        return None

    def close(self, deadline: float) -> None:
        """Wait until `deadline` (time.monotonic) for the process to exit, then kill it. A stopped
        process cannot read its pipe's end, so it is killed at once."""
        if self.process.is_alive() and self.stopped():
            self.process.kill()
        self.process.join(max(0.0, deadline - time.monotonic()))
        if self.process.is_alive():
            self.process.kill()
            self.process.join()


class RemoteSearch:
    """A search of one beam size in a worker (aiayn.serve.batcher.Engine). The batcher's keys
    hold its requests' futures, which do not cross processes: the worker sees numbers."""

    def __init__(self, worker: Worker, beam: int, search_id: int) -> None:
        self.worker, self.beam, self.search_id = worker, beam, search_id
        self._keys: dict[int, Any] = {}
        self._numbers = count()

    @property
    def live(self) -> int:
        return len(self._keys)

    def join(self, sources: list[list[int]], keys: list, options: Options) -> None:
        numbers = [next(self._numbers) for _ in keys]
        self.worker.join(self.search_id, self.beam, sources, numbers, options)
        self._keys.update(zip(numbers, keys))

    def cut(self, keys: set) -> None:
        """The texts of `keys` end at the worker's next step (aiayn.serve.app.ServedSearch.cut)."""
        if numbers := [number for number, key in self._keys.items() if key in keys]:
            self.worker.cut(self.search_id, numbers)

    def step(self) -> list[tuple[Any, Any]]:
        try:
            finished = self.worker.step(self.search_id)
        except Exception:  # the worker has dropped the search: so does the batcher
            self._keys.clear()
            raise
        return [(self._keys.pop(number), result) for number, result in finished]


class Workers:
    """`size` worker processes decoding `run_dir` in `precision` on `device`, the CPU's threads
    shared among them; `engines` are their lanes' engines. Started by `aiayn serve` before it
    listens for requests (spawned: a forked copy of a process with OpenMP threads may hang)."""

    def __init__(self, run_dir: str, device: str, precision: str, size: int, threads: Optional[int] = None,
                 stop: str = SECTION_6_1.stop) -> None:
        import torch

        if torch.device(device).type != "cpu":
            raise ValueError(f"--workers {size} decodes on a CPU's cores; on {device} one process decodes the "
                             "concurrent requests together (--workers 1)")
        threads = threads or max(1, torch.get_num_threads() // size)
        context = multiprocessing.get_context("spawn")
        self.workers: list[Worker] = []
        try:
            for number in range(size):
                self.workers.append(Worker(context, run_dir, device, precision, threads, number, stop))
            for worker in self.workers:
                worker.ready()
        except BaseException:
            self.close()
            raise

    @property
    def engines(self) -> list:
        return list(self.workers)

    def close(self) -> None:
        """Close every pipe (each worker exits at its next read), then wait for them together."""
        for worker in self.workers:
            worker.connection.close()
        deadline = time.monotonic() + CLOSE_S
        for worker in self.workers:
            worker.close(deadline)

    def __enter__(self) -> "Workers":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
