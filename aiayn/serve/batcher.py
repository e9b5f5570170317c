"""Dynamic batching: the requests that arrive while the model is busy (or within a few
milliseconds of each other) are decoded as one length-sorted batch, and each caller gets back its
own results.

A single decoding thread owns the model. Requests wait in a bounded queue; the thread takes
every request that fits a token budget, groups them by decoding options (a batch has one beam
size and one α), decodes each group with `translate_ids` (which sorts by length and packs the
batch) and hands each request's outputs back to the event loop that asked. Batching pays on a
CPU because a decoding step of a few sentences is mostly fixed cost: the same step over 16
sentences costs far less than 16 steps.
"""

from __future__ import annotations

import asyncio
import sys
import threading
from collections import deque
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

from aiayn.config import DECODE_PRESETS, MAX_WAIT_MS_LIMIT, SERVE

SECTION_6_1 = DECODE_PRESETS["translate"]


class QueueFull(Exception):
    """The queue holds `max_queue` texts already: the caller should retry later."""


class Closed(Exception):
    """The batcher is shutting down and takes no new requests."""


@dataclass(frozen=True)
class Options:
    """The decoding options a batch shares (§6.1: beam 4, α 0.6, output ≤ input + 50)."""

    beam: int = SECTION_6_1.beam
    alpha: float = SECTION_6_1.alpha
    max_output_len: Optional[int] = None
    attention: bool = False  # also return every layer's attention weights of each text
    alternatives: int = 0  # also return this many next best outputs of the beam (LibreTranslate's)


def source_tokens(source: Sequence[int], options: Options) -> int:
    """The batcher's default cost of a text: its source tokens (with EOS) × beam."""
    return (len(source) + 1) * options.beam


@dataclass(eq=False)  # a request is itself: compared and hashed by identity
class Job:
    """One request: its texts are decoded in one or more batches, and answered once all are."""

    sources: list[list[int]]  # token ids of each text, without EOS
    options: Options
    future: asyncio.Future
    loop: asyncio.AbstractEventLoop
    costs: list[int] = field(default_factory=list)  # of each text, in the batcher's budget units
    taken: int = 0  # texts handed to the decoder so far
    results: list = field(default_factory=list)  # of each text, as its batch ends
    decoded: int = 0
    cancelled: bool = False  # the caller went away: skip it

    @property
    def waiting(self) -> int:
        return len(self.sources) - self.taken


DecodeFn = Callable[[list[list[int]], Options], list[Any]]
CostFn = Callable[[Sequence[int], Options], int]


@dataclass
class Stats:
    requests: int = 0
    texts: int = 0
    batches: int = 0
    cancelled: int = 0
    batch_texts: deque = field(default_factory=lambda: deque(maxlen=1000))  # texts per batch, the last 1,000

    def as_dict(self) -> dict:
        recent = self.batch_texts
        return {"requests": self.requests, "texts": self.texts, "batches": self.batches,
                "cancelled": self.cancelled,
                "mean_batch_texts": round(sum(recent) / len(recent), 2) if recent else 0.0}


class Batcher:
    """Collects requests from any number of coroutines and decodes them in batches on one thread.

    `decode(sources, options)` returns one result per source, in order; it runs only on the
    batcher's thread, so the model it closes over is never used by two threads at once. A batch
    holds texts whose `cost` adds up to at most `budget` (at least one text). A request larger
    than that is decoded over several batches, and the requests with the least left to decode go
    first (arrival order among equals): a small request waits behind the batch being decoded,
    never behind the rest of a large one that came before it, and of several large requests one
    is finished before the next is begun.
    """

    def __init__(self, decode: DecodeFn, max_wait_ms: float = SERVE.max_wait_ms, budget: int = DECODE_PRESETS["translate"].batch_tokens,
                 max_queue: int = SERVE.max_queue, cost: CostFn = source_tokens) -> None:
        if not 0 <= max_wait_ms <= MAX_WAIT_MS_LIMIT or budget < 1 or max_queue < 1:  # nan fails too
            raise ValueError(f"max_wait_ms must be in [0, {MAX_WAIT_MS_LIMIT:g}], budget and max_queue ≥ 1")
        self.decode = decode
        self.cost = cost
        self.max_wait = max_wait_ms / 1000
        self.budget = budget
        self.max_queue = max_queue
        self.stats = Stats()
        self._queue: deque[Job] = deque()  # jobs with texts not yet taken, in arrival order
        self._queued_texts = 0
        self._closing = False
        self.failure: Optional[str] = None  # why the decoding thread stopped, if it died
        self._lock = threading.Condition()
        self._thread = threading.Thread(target=self._run_until_failure, name="aiayn-decoder", daemon=True)
        self._thread.start()

    @property
    def queued_texts(self) -> int:
        """Texts waiting for a batch (a large request's later texts included)."""
        return self._queued_texts

    async def submit(self, sources: Sequence[Sequence[int]], options: Options) -> list[Any]:
        """Queue the texts and wait for their results. Raises QueueFull or Closed at once; if the
        awaiting task is cancelled (the client disconnected), the texts are dropped undecoded."""
        loop = asyncio.get_running_loop()
        texts = [list(s) for s in sources]
        job = Job(texts, options, loop.create_future(), loop, costs=[self.cost(s, options) for s in texts],
                  results=[None] * len(texts))
        with self._lock:
            if self.failure is not None:
                raise Closed(f"the decoder has stopped ({self.failure}); restart the server")
            if self._closing:
                raise Closed("the server is shutting down")
            if self._queued_texts + len(job.sources) > self.max_queue:
                raise QueueFull(f"the queue is full ({self._queued_texts} texts waiting); retry shortly")
            self._queue.append(job)
            self._queued_texts += len(job.sources)
            self.stats.requests += 1
            self._lock.notify()
        try:
            return await job.future
        except asyncio.CancelledError:
            self._cancel(job)
            raise

    def _cancel(self, job: Job) -> None:
        with self._lock:
            job.cancelled = True
            self.stats.cancelled += 1
            if job in self._queue:
                self._queue.remove(job)
                self._queued_texts -= job.waiting

    def close(self, timeout: Optional[float] = None) -> None:
        """Refuse new requests, finish the queued ones, then stop the thread."""
        self.drain()
        self._thread.join(timeout)

    def drain(self) -> None:
        """Refuse new requests (Closed); the queued ones are still decoded."""
        with self._lock:
            self._closing = True
            self._lock.notify()

    def expire(self, reason: str) -> int:
        """Answer every request still waiting with Closed(reason), without decoding any more of
        it (the batch being decoded finishes); returns how many. A stopping server calls it at
        its drain deadline."""
        with self._lock:
            jobs = list(self._queue)
            self._queue.clear()
            self._queued_texts = 0
        for job in jobs:
            _resolve(job, error=Closed(reason))
        return len(jobs)

    def _take(self) -> Optional[list[tuple[Job, int, int]]]:
        """Block until there is work; then wait up to `max_wait` for the batch to fill, and take
        texts up to the budget (at least one), from the requests with the least cost left first.
        Returns (job, first text, end) parts; None once closed and empty."""
        with self._lock:
            while not self._queue:
                if self._closing:
                    return None
                self._lock.wait()
            deadline = time.monotonic() + self.max_wait
            while (sum(sum(job.costs[job.taken:]) for job in self._queue) < self.budget and not self._closing
                   and (left := deadline - time.monotonic()) > 0):
                self._lock.wait(left)
            parts, spent = [], 0
            for job in sorted(self._queue, key=lambda job: sum(job.costs[job.taken:])):  # stable: arrival order among equals
                start = end = job.taken
                while end < len(job.sources) and (spent == 0 or spent + job.costs[end] <= self.budget):
                    spent += job.costs[end]
                    end += 1
                if end == start:
                    break
                parts.append((job, start, end))
                job.taken = end
                self._queued_texts -= end - start
                if job.waiting:
                    break
            for job, _, _ in parts:
                if not job.waiting:
                    self._queue.remove(job)
            return parts

    def _run_until_failure(self) -> None:
        """The thread's body: should it ever die (an error outside a batch's decoding), every
        waiting caller gets the error, and later ones a 503, rather than waiting for ever."""
        try:
            self._run()
        except BaseException as error:  # noqa: BLE001 - reported to every caller and to /health
            with self._lock:
                self.failure = f"{type(error).__name__}: {' '.join(str(error).split())}"
                self._closing = True
            self.expire(f"the decoder has stopped ({self.failure}); restart the server")
            print(f"aiayn: error: the decoding thread stopped ({self.failure}); /health reports it", file=sys.stderr)

    def _run(self) -> None:
        while (parts := self._take()) is not None:
            groups: dict[Options, list[tuple[Job, int, int]]] = {}
            for part in parts:
                if not part[0].cancelled and not part[0].future.done():  # gone, failed or expired: skip
                    groups.setdefault(part[0].options, []).append(part)
            for options, group in groups.items():
                sources = [source for job, start, end in group for source in job.sources[start:end]]
                try:
                    results = self.decode(sources, options)
                except Exception as error:  # noqa: BLE001 - the callers get the error, the thread lives on
                    self._fail({job for job, _, _ in group}, error)
                    continue
                except BaseException as error:  # the thread dies: this batch's callers hear why
                    self._fail({job for job, _, _ in group},
                               Closed(f"the decoder has stopped ({type(error).__name__}); restart the server"))
                    raise
                self.stats.batches += 1
                self.stats.texts += len(sources)
                self.stats.batch_texts.append(len(sources))
                done = 0
                for job, start, end in group:
                    job.results[start:end] = results[done : done + end - start]
                    done += end - start
                    job.decoded += end - start
                    if job.decoded == len(job.sources):
                        _resolve(job, job.results)

    def _fail(self, jobs: set, error: BaseException) -> None:
        """Answer `jobs` with `error`; their texts still waiting are not decoded."""
        with self._lock:
            for job in jobs:
                if job in self._queue:
                    self._queue.remove(job)
                    self._queued_texts -= job.waiting
        for job in jobs:
            _resolve(job, error=error)


def _resolve(job: Job, result: Any = None, error: Optional[BaseException] = None) -> None:
    def settle() -> None:
        if job.future.done():  # cancelled meanwhile
            return
        if error is not None:
            job.future.set_exception(error)
        else:
            job.future.set_result(result)

    try:
        job.loop.call_soon_threadsafe(settle)
    except RuntimeError:  # the loop has closed: nobody is waiting
        pass
