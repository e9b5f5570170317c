"""Continuous batching: the texts of concurrent requests are decoded together, and a request
that arrives while others are decoding joins their search at the next step, rather than waiting
for a whole batch to end; each text leaves the search as soon as it is done, and each caller
gets back its own results.

A single decoding thread owns the model. Requests wait in a bounded queue. Between two decoding
steps the thread takes the waiting texts that fit the budget (the decoding state of every text in
the search together), from the requests with the least left to decode first, lets them join the
search for their beam size (`Engine.join`), and takes one step of every search; the texts that
finish go back to the event loop that asked. Batching pays on a CPU because a decoding step of a
few sentences is mostly fixed cost: the same step over 16 sentences costs far less than 16 steps.
"""

from __future__ import annotations

import asyncio
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Protocol, Sequence, Union

from aiayn.config import DECODE_PRESETS, MAX_WAIT_MS_LIMIT, SERVE

SECTION_6_1 = DECODE_PRESETS["translate"]


# How long a request may wait before it goes first (see `Batcher._take`).
OVERDUE_S = 1.0

# How long an idle decoding loop sleeps at most. A process signal may be delivered to any thread;
# Python runs its handler on the main thread only when that thread next runs bytecode, so a main
# thread asleep without a timeout would never see `aiayn serve`'s SIGTERM.
IDLE_TICK = 0.2


class QueueFull(Exception):
    """The queue holds `max_queue` texts already: the caller should retry later."""


class Closed(Exception):
    """The batcher is shutting down and takes no new requests."""


@dataclass(frozen=True)
class Options:
    """The decoding options of a request's texts (§6.1: beam 4, α 0.6, output ≤ input + 50)."""

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
    """One request: its texts join the search as the budget allows, and it is answered once all
    are decoded."""

    sources: list[list[int]]  # token ids of each text, without EOS
    options: Options
    future: asyncio.Future
    loop: asyncio.AbstractEventLoop
    costs: list[int] = field(default_factory=list)  # of each text, in the batcher's budget units
    taken: int = 0  # texts handed to the decoder so far
    results: list = field(default_factory=list)  # of each text, as it finishes
    decoded: int = 0
    cancelled: bool = False  # the caller went away: skip it
    arrived: float = field(default_factory=time.monotonic)

    @property
    def waiting(self) -> int:
        return len(self.sources) - self.taken


CostFn = Callable[[Sequence[int], Options], int]


class Engine(Protocol):
    """A search that texts join between steps (aiayn.translate.ContinuousDecoding underneath).
    Optionally `cut(keys)`: the texts of `keys` (a set) end at the next step, their callers gone."""

    live: int  # texts decoding

    def join(self, sources: list[list[int]], keys: list, options: Options) -> None:
        """The texts `sources` join the search; `step` gives their `keys` back as they finish."""

    def step(self) -> list[tuple[Any, Any]]:
        """One step of every text; returns (key, result) of the texts that finished; a result
        that is an Exception fails that text's request alone."""


EngineFn = Callable[[int], Engine]  # a new search for a beam size


@dataclass(eq=False)
class Lane:
    """One decoding loop: its searches (by beam size), the (job, text, cost) keys of the texts in
    each, their cost, and how many they are (an int other lanes read without a lock)."""

    engine: EngineFn
    searches: dict[int, Engine] = field(default_factory=dict)
    decoding: dict[int, list] = field(default_factory=dict)
    spent: int = 0
    texts: int = 0
    cancellations: int = 0  # the batcher's count of requests whose caller went, as this lane last cut them

    def check(self) -> None:
        """Raise if the engine's process has gone (an engine with one, aiayn.serve.workers')."""
        getattr(self.engine, "check_alive", lambda: None)()

    def stopped(self) -> Optional[str]:
        """Why the engine's process is stopped, if it has one that is."""
        return getattr(self.engine, "stopped", lambda: None)()

    def abandon(self, reason: str) -> None:
        """Stop waiting for the engine's process (a stop at once): a lane blocked on a worker that
        never answers (stopped, hung) ends rather than holding the server's exit for ever."""
        getattr(self.engine, "abandon", lambda reason: None)(reason)


@dataclass
class Stats:
    requests: int = 0
    texts: int = 0  # decoded
    joins: int = 0  # times texts joined a search (those arriving together join at once)
    steps: int = 0
    cancelled: int = 0
    revived: int = 0  # worker processes started again after they were found gone
    step_texts: deque = field(default_factory=lambda: deque(maxlen=1000))  # texts decoding per step, the last 1,000

    def as_dict(self) -> dict:
        recent = self.step_texts
        return {"requests": self.requests, "texts": self.texts, "joins": self.joins, "steps": self.steps,
                "cancelled": self.cancelled, "revived": self.revived,
                "mean_step_texts": round(sum(recent) / len(recent), 2) if recent else 0.0}


class Batcher:
    """Collects requests from any number of coroutines and decodes them together on one thread.

    `engine(beam)` makes the search that texts of that beam size join (`Engine`); it runs only on
    the batcher's thread, so the model it closes over is never used by two threads at once. A
    list of engines makes as many lanes, each a decoding loop with searches of its own (a lane per
    worker process: aiayn.serve.workers): the lanes share the queue, and a lane takes no more than
    its even share of the texts decoding and waiting, so concurrent requests spread over them. The
    texts decoding at once have `cost`s that add up to at most `budget` (at least one text). A
    request larger than that joins over several takes as earlier texts leave, and the requests
    with the least left to decode go first (arrival order among equals): a small request waits
    for room in the search, never behind the rest of a large one that came before it, and of
    several large requests one is finished before the next is begun. With nothing decoding, the
    first request waits up to `max_wait_ms` for company, so that texts sent together start
    together.

    The decoding loops (`run`) run on threads of their own, or, with `own_thread` False, the first
    on the thread that calls `run`. `aiayn serve` decodes on its main thread, which loaded the model:
    PyTorch's OpenMP workers belong to the thread that first ran a parallel operator, and a
    second thread's operators ran several times slower beside them on a 2-core CPU.
    """

    def __init__(self, engine: Union[EngineFn, Sequence[EngineFn]], max_wait_ms: float = SERVE.max_wait_ms, budget: int = DECODE_PRESETS["translate"].batch_tokens,
                 max_queue: int = SERVE.max_queue, cost: CostFn = source_tokens, own_thread: bool = True) -> None:
        if not 0 <= max_wait_ms <= MAX_WAIT_MS_LIMIT or budget < 1 or max_queue < 1:  # nan fails too
            raise ValueError(f"max_wait_ms must be in [0, {MAX_WAIT_MS_LIMIT:g}], budget and max_queue ≥ 1")
        self.lanes = [Lane(fn) for fn in (engine if isinstance(engine, (list, tuple)) else [engine])]
        if not self.lanes:
            raise ValueError("a batcher needs at least one engine")
        self.cost = cost
        self.max_wait = max_wait_ms / 1000
        self.budget = budget
        self.max_queue = max_queue
        self.stats = Stats()
        self._queue: deque[Job] = deque()  # jobs with texts not yet taken, in arrival order
        self._queued_texts = 0
        self._cancellations = 0  # requests whose caller went (`_cancel`), for the lanes to cut their texts
        self._closing = False
        self._aborted: Optional[str] = None  # set by `abort`
        self.failure: Optional[str] = None  # why the decoding thread stopped, if it died
        self._lock = threading.Condition()
        self._stopped = threading.Event()
        self._running = len(self.lanes)  # lanes whose loop has not ended
        self._own_thread = own_thread
        if own_thread:
            self._start_lanes(self.lanes)

    def _start_lanes(self, lanes: list[Lane]) -> None:
        for lane in lanes:
            threading.Thread(target=self._run_lane, args=(lane,), name=f"aiayn-decoder-{self.lanes.index(lane)}",
                             daemon=True).start()

    @property
    def queued_texts(self) -> int:
        """Texts waiting for a batch (a large request's later texts included)."""
        return self._queued_texts

    async def submit(self, sources: Sequence[Sequence[int]], options: Options) -> list[Any]:
        """Queue the texts and wait for their results. Raises QueueFull or Closed at once; if the
        awaiting task is cancelled (the client disconnected), its texts still waiting are dropped
        undecoded (those decoding end at the next step, unanswered: `_cut_gone`)."""
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
            self._lock.notify_all()  # every idle lane: several take their shares of a request at once
        try:
            return await job.future
        except asyncio.CancelledError:
            self._cancel(job)
            raise

    def _cancel(self, job: Job) -> None:
        with self._lock:
            job.cancelled = True
            self.stats.cancelled += 1
            self._cancellations += 1
            if job in self._queue:
                self._queue.remove(job)
                self._queued_texts -= job.waiting

    def run(self) -> None:
        """With `own_thread` False: the first lane's decoding loop on this thread, the others' on
        threads of their own, until `close` (or `drain`) and nothing is left to decode."""
        if self._own_thread:
            raise RuntimeError("this batcher's lanes run on threads of their own already")
        self._start_lanes(self.lanes[1:])
        self._run_lane(self.lanes[0])
        while not self._stopped.wait(IDLE_TICK):  # with a timeout: the main thread runs signal handlers
            pass

    def _run_lane(self, lane: Lane) -> None:
        try:
            self._run_until_failure(lane)
        finally:
            with self._lock:
                self._running -= 1
                if not self._running:
                    self._stopped.set()

    @property
    def stopped(self) -> bool:
        """Every decoding loop has ended."""
        return self._stopped.is_set()

    def close(self, timeout: Optional[float] = None) -> None:
        """Refuse new requests, finish the queued ones, then wait for the decoding loop to end."""
        self.drain()
        self._stopped.wait(timeout)

    def drain(self) -> None:
        """Refuse new requests (Closed); the queued ones are still decoded."""
        with self._lock:
            self._closing = True
            self._lock.notify_all()

    def abort(self, reason: str) -> None:
        """Stop at once (a second Ctrl-C): the decoding loop answers every request still
        waiting or decoding with Closed(reason) at its next step and ends. Safe in a signal
        handler: it only sets a flag, which the loop reads between steps, and one that a lane
        waiting for its worker process reads while it waits (found by a fault hunt: a lane on a
        stopped worker never reached its next step, and the server never exited)."""
        self._aborted = reason
        for lane in self.lanes:
            lane.abandon(reason)

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

    def _take(self, lane: Lane) -> Optional[list[tuple[Job, int, int]]]:
        """The texts to join `lane`'s searches now: with nothing decoding there, block until
        there is work and wait up to `max_wait` for the budget to fill; otherwise take what is
        waiting at once. Texts go up to the budget (at least one when nothing decodes) and the
        lane's share, from the requests with the least cost left first. Returns (job, first
        text, end) parts; None once closed and nothing is left."""
        with self._lock:
            if not lane.spent:
                while not self._queue:
                    if self._closing or self._aborted is not None:
                        return None
                    self._lock.wait(IDLE_TICK)
                    lane.check()  # a worker that dies idle fails the lane now, and /health says so
                deadline = time.monotonic() + self.max_wait
                while (sum(sum(job.costs[job.taken:]) for job in self._queue) < self.budget and not self._closing
                       and self._aborted is None and (left := deadline - time.monotonic()) > 0):
                    self._lock.wait(min(left, IDLE_TICK))
            parts, spent, now = [], lane.spent, time.monotonic()
            # With several lanes, each takes up to its even share of all the texts decoding and
            # waiting: 16 requests on two lanes decode 8 and 8, not 16 and 0.
            share = -(-(sum(other.texts for other in self.lanes) + self._queued_texts) // len(self.lanes))
            room = share - lane.texts if len(self.lanes) > 1 else self._queued_texts
            # Least left first (arrival order among equals), but the requests that have waited
            # OVERDUE_S go before every other, oldest first, and none overtakes them: room frees
            # until their texts fit, so a large text is not starved by a stream of small ones.
            order = sorted(self._queue, key=lambda job: (0, job.arrived) if now - job.arrived >= OVERDUE_S
                           else (1, sum(job.costs[job.taken:])))
            for job in order:
                start = end = job.taken
                while (end < len(job.sources) and room > 0
                       and (spent == 0 or spent + job.costs[end] <= self.budget)):
                    spent += job.costs[end]
                    end += 1
                    room -= 1
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
            # Counted now, under the lock, so that another lane's share counts them at once.
            lane.texts += sum(end - start for _, start, end in parts)
            return parts

    def _run_until_failure(self, lane: Lane) -> None:
        """A lane's loop: should it ever die (an error outside a search's own work), its engine
        is started again if it can be (`_revive`); else every waiting caller gets the error,
        and later ones a 503, rather than waiting for ever."""
        while True:
            try:
                self._run(lane)
                return
            except BaseException as error:  # noqa: BLE001 - reported to every caller and to /health
                if self._aborted is None and not self._closing and (error := self._revive(lane, error)) is None:
                    continue
                if self._aborted is not None:  # a lane abandoned by a stop at once (its revival too): the stop's answer
                    self._drain_now(lane, self._aborted)
                    return
                with self._lock:  # a second lane that fails keeps the first one's reason
                    self.failure = self.failure or _said(error)
                    self._closing = True
                self._drain_now(lane, f"the decoder has stopped ({self.failure}); restart the server")
                print(f"aiayn: error: the decoding thread stopped ({self.failure}); /health reports it", file=sys.stderr)
                return

    def _revive(self, lane: Lane, error: BaseException) -> Optional[BaseException]:
        """Start `lane`'s engine again after `error` ended its loop, if it is a process that can
        be (aiayn.serve.workers.Worker.revive): the texts it was decoding are answered 503
        (retry), the rest of the queue waits for it or goes to the other lanes meanwhile. None
        once started; else the error the lane fails with."""
        revive = getattr(lane.engine, "revive", None)
        if revive is None:
            return error
        self._answer_decoding(lane, Closed(f"{_said(error, named=False)} while decoding this request; retry"))
        print(f"aiayn: warning: {_said(error, named=False)}; starting it again", file=sys.stderr, flush=True)
        try:
            revive()
        except BaseException as failed:  # noqa: BLE001 - the lane fails with this reason instead
            return failed
        with self._lock:
            self.stats.revived += 1
        return None

    def _run(self, lane: Lane) -> None:
        while (parts := self._take(lane)) is not None:
            if self._aborted is not None:  # taken as the stop came: answered with the rest, not decoded
                lane.texts -= sum(end - start for _, start, end in parts)
                self._fail({job for job, _, _ in parts}, Closed(self._aborted))
                break
            groups: dict[Options, list[tuple[Job, int, int]]] = {}
            for job, start, end in parts:
                if job.cancelled or job.future.done():  # gone, failed or expired: skip
                    lane.texts -= end - start
                else:
                    groups.setdefault(job.options, []).append((job, start, end))
            for options in list(groups):  # one by one: a join that ends the loop fails those not joined yet too
                self._join(lane, options, groups.pop(options), groups)
            if lane.cancellations != self._cancellations:
                self._cut_gone(lane)
            for beam in list(lane.searches):
                self._step(lane, beam)
        if self._aborted is not None:
            self._drain_now(lane, self._aborted)

    def _cut_gone(self, lane: Lane) -> None:
        """The texts decoding in `lane` whose caller has gone end at the next step, where the engine
        can cut them (found in review: they decoded to their end, their answers thrown away)."""
        lane.cancellations = self._cancellations
        for beam, keys in lane.decoding.items():
            if gone := {key for key in keys if key[0].cancelled}:
                getattr(lane.searches[beam], "cut", lambda keys: None)(gone)

    def _drain_now(self, lane: Lane, reason: str) -> None:
        """Answer every text decoding in `lane` and every request waiting with Closed(reason)."""
        self._answer_decoding(lane, Closed(reason))
        self.expire(reason)

    def _answer_decoding(self, lane: Lane, error: BaseException) -> None:
        """Answer the requests of every text decoding in `lane` with `error`; its searches go."""
        jobs = {job for keys in lane.decoding.values() for job, _, _ in keys}
        for beam in list(lane.searches):
            self._drop(lane, beam)
        self._fail(jobs, error)

    def _join(self, lane: Lane, options: Options, group: list[tuple[Job, int, int]], left: dict) -> None:
        """`group` joins `lane`'s search of its beam (made if none); `left`, taken with it, fails too if this ends the loop."""
        keys = [(job, i, job.costs[i]) for job, start, end in group for i in range(start, end)]
        try:
            search = lane.searches.get(options.beam) or lane.engine(options.beam)
            search.join([job.sources[i] for job, i, _ in keys], keys, options)
        except Exception as error:  # noqa: BLE001 - these callers get the error, the others decode on
            lane.texts -= len(keys)
            self._fail({job for job, _, _ in keys}, error)
            return
        except BaseException as error:  # the loop ends: these callers hear why, and those taken with them
            keys += [(job, i, 0) for rest in left.values() for job, start, end in rest for i in range(start, end)]
            lane.texts -= len(keys)
            self._fail({job for job, _, _ in keys}, self._died(error))
            raise
        lane.searches[options.beam] = search
        lane.decoding.setdefault(options.beam, []).extend(keys)
        lane.spent += sum(cost for _, _, cost in keys)
        with self._lock:  # the counters are shared by the lanes
            self.stats.joins += 1

    def _step(self, lane: Lane, beam: int) -> None:
        """One step of `lane`'s search of `beam`; its finished texts go back to their callers. If
        the step fails, every text in that search fails with it and the search is dropped."""
        search, keys = lane.searches[beam], lane.decoding[beam]
        try:
            finished = search.step()
        except Exception as error:  # noqa: BLE001 - the callers get the error, the thread lives on
            self._drop(lane, beam)
            self._fail({job for job, _, _ in keys}, error)
            return
        except BaseException as error:  # the thread dies: this search's callers hear why
            self._drop(lane, beam)
            self._fail({job for job, _, _ in keys}, self._died(error))
            raise
        with self._lock:
            self.stats.steps += 1
            self.stats.texts += len(finished)
        self.stats.step_texts.append(len(keys))
        for key, result in finished:
            job, i, cost = key
            keys.remove(key)
            lane.spent -= cost
            lane.texts -= 1
            if isinstance(result, Exception):  # this text's answer failed: its request only
                self._fail({job}, result)
                continue
            with self._lock:  # a request's texts may finish in several lanes
                job.results[i] = result
                job.decoded += 1
                done = job.decoded == len(job.sources)
            if done:
                _resolve(job, job.results)
        if not search.live:
            self._drop(lane, beam)

    def _died(self, error: BaseException) -> Closed:
        """What the callers of a search hear when an error that is not an Exception ends the loop
        (a stop at once's reason, if the loop was abandoned for one)."""
        if self._aborted is not None:
            return Closed(self._aborted)
        return Closed(f"the decoder stopped while decoding this request ({_said(error)})")

    def _drop(self, lane: Lane, beam: int) -> None:
        lane.searches.pop(beam, None)
        keys = lane.decoding.pop(beam, [])
        lane.spent -= sum(cost for _, _, cost in keys)
        lane.texts -= len(keys)

    def _fail(self, jobs: set, error: BaseException) -> None:
        """Answer `jobs` with `error`; their texts still waiting are not decoded."""
        with self._lock:
            for job in jobs:
                if job in self._queue:
                    self._queue.remove(job)
                    self._queued_texts -= job.waiting
        for job in jobs:
            _resolve(job, error=error)


def _said(error: BaseException, named: bool = True) -> str:
    """`error` in one line, its type's name first when `named`."""
    said = " ".join(str(error).split())
    return f"{type(error).__name__}: {said}" if named else said or type(error).__name__


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
