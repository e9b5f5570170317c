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
import threading
from collections import deque
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

from aiayn.serve import BATCH_TOKENS, MAX_QUEUE, MAX_WAIT_MS


class QueueFull(Exception):
    """The queue holds `max_queue` texts already: the caller should retry later."""


class Closed(Exception):
    """The batcher is shutting down and takes no new requests."""


@dataclass(frozen=True)
class Options:
    """The decoding options a batch shares (§6.1: beam 4, α 0.6, output ≤ input + 50)."""

    beam: int = 4
    alpha: float = 0.6
    max_output_len: Optional[int] = None
    attention: bool = False  # also return every layer's attention weights of each text


@dataclass
class Job:
    sources: list[list[int]]  # token ids of each text, without EOS
    options: Options
    future: asyncio.Future
    loop: asyncio.AbstractEventLoop
    cost: int = 0  # source tokens × beam
    cancelled: bool = False  # the caller went away: skip it


DecodeFn = Callable[[list[list[int]], Options], list[Any]]


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
    batcher's thread, so the model it closes over is never used by two threads at once.
    """

    def __init__(self, decode: DecodeFn, max_wait_ms: float = MAX_WAIT_MS, batch_tokens: int = BATCH_TOKENS,
                 max_queue: int = MAX_QUEUE) -> None:
        if max_wait_ms < 0 or batch_tokens < 1 or max_queue < 1:
            raise ValueError("max_wait_ms must be ≥ 0, batch_tokens and max_queue ≥ 1")
        self.decode = decode
        self.max_wait = max_wait_ms / 1000
        self.batch_tokens = batch_tokens
        self.max_queue = max_queue
        self.stats = Stats()
        self._queue: list[Job] = []
        self._queued_texts = 0
        self._closing = False
        self._lock = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="aiayn-decoder", daemon=True)
        self._thread.start()

    @property
    def queued_texts(self) -> int:
        return self._queued_texts

    async def submit(self, sources: Sequence[Sequence[int]], options: Options) -> list[Any]:
        """Queue the texts and wait for their results. Raises QueueFull or Closed at once; if the
        awaiting task is cancelled (the client disconnected), the texts are dropped undecoded."""
        loop = asyncio.get_running_loop()
        job = Job([list(s) for s in sources], options, loop.create_future(), loop,
                  cost=sum(len(s) + 1 for s in sources) * options.beam)
        with self._lock:
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
                self._queued_texts -= len(job.sources)

    def close(self, timeout: Optional[float] = None) -> None:
        """Refuse new requests, finish the queued ones, then stop the thread."""
        with self._lock:
            self._closing = True
            self._lock.notify()
        self._thread.join(timeout)

    def _take(self) -> Optional[list[Job]]:
        """Block until there is work; then wait up to `max_wait` for the batch to fill and take
        jobs in arrival order up to the token budget (at least one). None once closed and empty."""
        with self._lock:
            while not self._queue:
                if self._closing:
                    return None
                self._lock.wait()
            deadline = time.monotonic() + self.max_wait
            while (sum(job.cost for job in self._queue) < self.batch_tokens and not self._closing
                   and (left := deadline - time.monotonic()) > 0):
                self._lock.wait(left)
            taken, cost = [], 0
            for job in self._queue:
                if taken and cost + job.cost > self.batch_tokens:
                    break
                taken.append(job)
                cost += job.cost
            del self._queue[: len(taken)]
            self._queued_texts -= sum(len(job.sources) for job in taken)
            return taken

    def _run(self) -> None:
        while (jobs := self._take()) is not None:
            groups: dict[Options, list[Job]] = {}
            for job in jobs:
                if not job.cancelled:
                    groups.setdefault(job.options, []).append(job)
            for options, group in groups.items():
                sources = [source for job in group for source in job.sources]
                try:
                    results = self.decode(sources, options)
                except Exception as error:  # noqa: BLE001 - the callers get the error, the thread lives on
                    for job in group:
                        _resolve(job, error=error)
                    continue
                self.stats.batches += 1
                self.stats.texts += len(sources)
                self.stats.batch_texts.append(len(sources))
                start = 0
                for job in group:
                    _resolve(job, results[start : start + len(job.sources)])
                    start += len(job.sources)


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
