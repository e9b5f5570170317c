"""`aiayn serve --workers N`: the batcher's lanes on their own, then a server whose searches run
in worker processes (aiayn.serve.workers), as a user meets it."""

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from aiayn.serve.batcher import Batcher, Options
from aiayn.serve.process import ServerProcess
from test_faults import make_model
from test_serve import SENTENCES, FakeEngine, check_concurrent_clients, health, request, run, wait_for

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")


def test_lanes_take_even_shares_and_each_caller_gets_its_own_result():
    """Eight requests at two idle lanes: each lane takes its share of four (not all eight), and
    every caller is answered with its own text's result."""
    gate = threading.Event()
    engines = [FakeEngine(gate), FakeEngine(gate)]
    batcher = Batcher(engines, max_wait_ms=50)

    async def main():
        futures = [asyncio.ensure_future(batcher.submit([[i + 1, 1]], Options())) for i in range(8)]
        while sum(len(engine.joins) for engine in engines) < 2:  # each lane has joined its share
            await asyncio.sleep(0.01)
        joined = [sum(len(sources) for sources, _ in engine.joins) for engine in engines]
        gate.set()
        return joined, await asyncio.gather(*futures)

    joined, results = run(main())
    batcher.close()
    assert joined == [4, 4]
    assert results == [[f"4:{i + 2}"] for i in range(8)]
    assert all(len(sources) <= 4 for engine in engines for _, sources in engine.steps)
    assert batcher.stats.texts == 8 and batcher.stopped


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_model(tmp_path_factory.mktemp("workers"))


def _read(path: Path) -> bytes:
    """A /proc file, or nothing if its thread or process has just exited."""
    try:
        return path.read_bytes()
    except (FileNotFoundError, ProcessLookupError):
        return b""


def _workers(pid: int) -> list[int]:
    """The server's worker processes (multiprocessing's resource tracker is a child too)."""
    children = [int(child) for task in Path(f"/proc/{pid}/task").iterdir() for child in _read(task / "children").split()]
    return [child for child in children if b"spawn_main" in _read(Path(f"/proc/{child}/cmdline"))]


@pytest.fixture(scope="module")
def workers_server(model_dir):
    process = ServerProcess(model_dir, "--workers", "2", "--max-wait-ms", "50", "--source-lang", "en",
                            "--target-lang", "es", "--stop", "bound")
    yield process
    code, out, err = process.stop()
    assert code == 0, err
    assert "stopped:" in out


def test_workers_translate_as_one_process_does(workers_server, model_dir):
    port = workers_server.port
    info = request(port, "GET", "/info")[1]
    assert info["batching"]["workers"] == 2 and info["device"] == "cpu" and info["decoding"]["stop"] == "bound"
    before = health(port)
    check_concurrent_clients(port, model_dir)
    assert health(port)["texts"] - before["texts"] == 16
    # Beam search, alternatives through the LibreTranslate API and attention maps cross the pipe too.
    status, body, _ = request(port, "POST", "/translate", {"q": SENTENCES[:3], "source": "en", "target": "es",
                                                           "alternatives": 2})
    assert status == 200 and len(body["translatedText"]) == 3 and all(len(a) <= 2 for a in body["alternatives"])
    status, body, _ = request(port, "POST", "/translate", {"text": SENTENCES[1], "attention": True})
    cross = body["details"][0]["attention"]["cross"]
    assert status == 200 and len(cross) == info["model"]["n_layers"]
    assert all(abs(sum(row) - 1) < 1e-2 for head in cross[0] for row in head)


def test_a_stopped_worker_makes_health_say_stalled_and_its_request_waits_for_it(workers_server):
    """A worker stopped by SIGSTOP is alive but answers nothing: /health says "stalled", naming
    it (found in review: "ok", while its lane's requests waited); a request it holds is answered
    once it continues, and /health is "ok" again."""
    port = workers_server.port
    worker = _workers(workers_server.pid)[1]
    os.kill(worker, signal.SIGSTOP)
    try:
        wait_for(lambda: request(port, "GET", "/health")[0] == 503, "/health saying the worker is stopped", 10)
        body = request(port, "GET", "/health")[1]
        assert body["status"] == "stalled" and body["error"].startswith("worker 1 is stopped (SIGSTOP)")
        with ThreadPoolExecutor(1) as pool:  # 2 lanes: the even share puts texts on the stopped worker's too
            answer = pool.submit(request, port, "POST", "/translate", {"text": SENTENCES * 2}, timeout=60)
            wait_for(lambda: health(port)["queued_texts"] == 0 and health(port)["requests"] >= 1, "the texts taken", 10)
            time.sleep(0.5)
            assert not answer.done()
            os.kill(worker, signal.SIGCONT)
            status, body, _ = answer.result()
        assert status == 200 and len(body["translations"]) == 2 * len(SENTENCES)
        assert request(port, "GET", "/health")[1]["status"] == "ok"
    finally:
        os.kill(worker, signal.SIGCONT)


def test_a_stopped_worker_does_not_keep_the_server_from_stopping(model_dir):
    """SIGTERM while a stopped worker (SIGSTOP) holds texts of a request (found by a fault hunt:
    the drain cut that request with a text/plain 500 and a traceback, and the server never
    exited, a second SIGTERM and SIGINT included): the request gets a JSON 503 once the drain and
    its grace are over, the process exits 0 and the stopped worker is killed with the server."""
    from aiayn.serve.app import DRAIN_GRACE_S

    drain = 1.0
    process = ServerProcess(model_dir, "--workers", "2", "--max-wait-ms", "50", "--drain-seconds", str(drain))
    workers = _workers(process.pid)
    port = process.port
    os.kill(workers[1], signal.SIGSTOP)
    try:
        wait_for(lambda: request(port, "GET", "/health")[0] == 503, "/health saying the worker is stopped", 10)
        with ThreadPoolExecutor(1) as pool:  # 2 lanes: the even share puts texts on the stopped worker's too
            answer = pool.submit(request, port, "POST", "/translate", {"text": SENTENCES * 2}, timeout=120)
            wait_for(lambda: health(port)["queued_texts"] == 0 and health(port)["requests"] >= 1, "the texts taken", 10)
            stopped = time.monotonic()
            code, out, err = process.stop(timeout=drain + DRAIN_GRACE_S + 30)
            took = time.monotonic() - stopped
            status, body, headers = answer.result()
    finally:
        for pid in workers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
    assert code == 0 and took < drain + DRAIN_GRACE_S + 10, (code, took, err)
    assert status == 503 and body["error"] == "the server stopped while decoding this request (1 s drain); retry"
    assert "retry-after" in headers and "Traceback" not in err and "stopped: 1 request" in out, err
    assert not [pid for pid in workers if Path(f"/proc/{pid}").exists()]


def test_the_workers_of_a_killed_server_end_even_when_stopped(model_dir):
    """`kill -9` of the server: its workers end with it, a stopped one too (found by a fault hunt:
    a stopped worker cannot read its pipe's end, and stayed, an orphan holding its model)."""
    process = ServerProcess(model_dir, "--workers", "2")
    workers = _workers(process.pid)
    os.kill(workers[1], signal.SIGSTOP)
    try:
        process.process.kill()
        process.process.wait(30)
        wait_for(lambda: not [pid for pid in workers if _alive(pid)], "the workers ending", 30)
    finally:
        for pid in workers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)


def _alive(pid: int) -> bool:
    """A process that exists and is no zombie (an orphan's parent, init, reaps it in its own time)."""
    stat = _read(Path(f"/proc/{pid}/stat"))
    return bool(stat) and stat[stat.rindex(b")") + 2:][:1] != b"Z"


def test_an_error_in_a_worker_reaches_its_caller_and_the_worker_decodes_on(model_dir):
    """What the server checks never reaches a worker; an error raised there (more outputs than
    the beam keeps) comes back as itself, and the worker's next search decodes. A worker decodes
    with the server's stop rule: under "bound" it refuses a negative α, as only that rule does
    (found in review: `aiayn serve` had no --stop)."""
    from aiayn.serve.workers import WorkerLost, Workers

    with Workers(str(model_dir), "cpu", "fp32", 1, stop="bound") as bounded:
        with pytest.raises(ValueError, match="the bound stop rule needs α ≥ 0, got -1.0"):
            bounded.engines[0](2).join([[5, 6]], ["key"], Options(beam=2, alpha=-1.0))

    with pytest.raises(ValueError, match="--workers 2 decodes on a CPU's cores; on cuda one process"):
        Workers(str(model_dir), "cuda", "fp32", 2)  # refused before any process starts
    workers = Workers(str(model_dir), "cpu", "fp32", 1)
    try:
        (engine,) = workers.engines
        with pytest.raises(ValueError, match="beam"):
            engine(2).join([[5, 6]], ["key"], Options(beam=2, alternatives=4))
        engine(2).join([[5, 6]], ["key"], Options(beam=2, alpha=-1.0))  # the default rule's search takes it
        search = engine(2)
        search.join([[5, 6], [7]], ["a", "b"], Options(beam=2, alternatives=1))
        finished = []
        while search.live:
            finished += search.step()
        assert sorted(key for key, _ in finished) == ["a", "b"]
        assert all(set(result) == {"translation", "alternatives"} for _, result in finished)
        engine.check_alive()
        os.kill(engine.process.pid, signal.SIGKILL)
        engine.process.join(30)
        with pytest.raises(WorkerLost, match="worker 0 has exited"):
            engine.check_alive()
        with pytest.raises(WorkerLost, match="worker 0 has exited"):  # a lane that meets it mid-work
            search.join([[5, 6]], ["c"], Options(beam=2))
    finally:
        workers.close()
    assert not workers.workers[0].process.is_alive()


def test_a_worker_steps_on_its_own_and_reports_each_search(model_dir):
    """No step waits for a message from the server: once texts have joined, the worker decodes
    and its reports wait in the pipe. Two searches on one worker (two beam sizes) each get their
    own texts back, and a join that fails leaves the search it was for decoding."""
    from aiayn.serve.workers import Workers

    workers = Workers(str(model_dir), "cpu", "fp32", 1)
    try:
        (engine,), (worker,) = workers.engines, workers.workers
        wide, greedy = engine(2), engine(1)
        wide.join([[5, 6, 7]], ["a"], Options(beam=2))
        wait_for(lambda: worker.connection.poll(), "a report without a step asked for")
        greedy.join([[8, 9]], ["b"], Options(beam=1))
        with pytest.raises(ValueError, match="beam"):
            wide.join([[5]], ["c"], Options(beam=2, alternatives=4))
        finished = {}
        while wide.live or greedy.live:
            for search in (wide, greedy):
                if search.live:
                    finished.update(search.step())
        assert sorted(finished) == ["a", "b"] and all("translation" in result for result in finished.values())
    finally:
        workers.close()
    # Its pipe closed, the worker ends on its own (found by mutation: a close that left the pipes
    # open, so each worker was killed at the deadline, passed).
    assert worker.process.exitcode == 0


def test_a_lost_worker_is_started_again_until_it_dies_too_often(model_dir):
    """A worker that dies (the OOM killer's SIGKILL) is started again, and its lane decodes on
    (found in review: the server answered 503 until someone restarted it): the request it was
    decoding gets a 503 to retry, naming the worker and the signal; the next request is
    translated. The third death within REVIVALS' window fails the server as before: /health says
    so, for a supervisor to restart it, and SIGTERM still stops it cleanly."""
    from aiayn.serve.workers import REVIVALS

    process = ServerProcess(model_dir, "--workers", "2", "--max-wait-ms", "0")
    port, seen = process.port, set()
    try:
        workers = _workers(process.pid)
        assert len(workers) == 2, workers
        seen.update(workers)
        os.kill(workers[1], signal.SIGKILL)  # idle: its lane finds it gone within a fifth of a second
        wait_for(lambda: health(port)["revived"] == 1, "the idle worker started again", 120)
        assert request(port, "POST", "/translate", {"text": SENTENCES})[0] == 200
        workers = _workers(process.pid)
        seen.update(workers)
        os.kill(workers[1], signal.SIGSTOP)  # stopped, its lane waits for it with this request's texts
        requests = health(port)["requests"]
        with ThreadPoolExecutor(1) as pool:
            busy = pool.submit(request, port, "POST", "/translate", {"text": SENTENCES * 2}, timeout=120)
            wait_for(lambda: health(port)["requests"] > requests, "the request arrives")
            time.sleep(0.5)
            os.kill(workers[1], signal.SIGKILL)
            status, body, headers = busy.result()
        assert status == 503 and "worker 1 has exited (killed by SIGKILL)" in body["error"] and "retry-after" in headers
        wait_for(lambda: health(port)["revived"] == 2, "the killed worker started again", 120)
        assert health(port)["status"] == "ok" and request(port, "POST", "/translate", {"text": SENTENCES})[0] == 200
        assert REVIVALS == 3
        workers = _workers(process.pid)
        seen.update(workers)
        os.kill(workers[1], signal.SIGKILL)
        wait_for(lambda: request(port, "GET", "/health")[0] == 503, "/health failing after a third death", 30)
        body = request(port, "GET", "/health")[1]
        assert body["status"] == "failed" and "worker 1 has exited 3 times in 10 minutes" in body["error"]
        status, body, headers = request(port, "POST", "/translate", {"text": SENTENCES}, timeout=60)
        assert status == 503 and "restart the server" in body["error"] and "retry-after" in headers
    finally:
        code, out, err = process.stop()
    assert code == 0, err
    assert "aiayn: warning: worker 1 has exited (killed by SIGKILL); starting it again" in err
    assert len(seen) == 4 and not [pid for pid in seen if Path(f"/proc/{pid}").exists()]


def test_sigterm_drains_through_the_workers_and_they_exit(model_dir):
    process = ServerProcess(model_dir, "--workers", "2")
    workers = _workers(process.pid)
    port = process.port
    with ThreadPoolExecutor(1) as pool:
        busy = pool.submit(request, port, "POST", "/translate", {"text": SENTENCES * 4, "beam": 8})
        wait_for(lambda: health(port)["requests"] == 1, "the request arrives")
        code, out, err = process.stop()
        status, body, _ = busy.result()
    assert status == 200 and len(body["translations"]) == 32
    assert code == 0, err
    assert "stopped: 1 request, 32 texts" in out and "2 workers" in out
    assert len(workers) == 2 and not [pid for pid in workers if Path(f"/proc/{pid}").exists()]


def test_a_model_a_worker_cannot_load_is_a_one_line_error(model_dir):
    done = subprocess.run([sys.executable, "-m", "aiayn", "serve", str(model_dir), "--port", "0", "--workers", "2",
                           "--precision", "fp16"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith("aiayn: error: fp16 needs a CUDA GPU")  # before any worker loads the model
    import multiprocessing

    from aiayn.serve.workers import Worker

    worker = Worker(multiprocessing.get_context("spawn"), str(model_dir), "cpu", "fp16", 1, 0)  # as if it got that far
    with pytest.raises(ValueError, match="^worker 0 could not load the model: fp16 needs a CUDA GPU"):
        worker.ready()  # the refusal as the server says it, not "ValueError: ..." in the middle of it
    worker.process.join(60)
    worker.connection.close()
    done = subprocess.run([sys.executable, "-m", "aiayn", "serve", str(model_dir), "--workers", "0"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "--workers must be between 1 and 64, got 0" in done.stderr


def _worker_in_a_thread(model_dir, monkeypatch):
    """A Worker whose body runs in a thread of this process, where a patched class reaches it."""
    import multiprocessing
    import types
    from multiprocessing.connection import Connection

    import torch

    from aiayn.serve import workers

    monkeypatch.setattr(workers.signal, "signal", lambda *args: None)  # only a main thread may set handlers
    monkeypatch.setattr(workers, "_end_with_server", lambda server: None)  # not this process's death signal
    monkeypatch.setattr(torch, "set_num_threads", lambda threads: None)  # this process keeps its threads

    def thread(target, args, **named):  # its own copy of the pipe's end, as a process has: Worker closes the server's
        return threading.Thread(target=target, args=(Connection(os.dup(args[0].fileno())), *args[1:]), **named)

    return workers.Worker(types.SimpleNamespace(Pipe=multiprocessing.Pipe, Process=thread), str(model_dir), "cpu",
                          "fp32", 1, 0)


def test_aiayn_serve_starts_its_workers_with_its_stop_rule(model_dir, monkeypatch):
    """`aiayn serve --workers N --stop bound` hands the rule to the worker processes, which build
    their searches with it (found by mutation testing: workers decoding with the beams rule under
    --stop bound passed every test, /info saying bound). The processes themselves are not started."""
    import dataclasses
    import socket

    from aiayn.config import DECODE_PRESETS, ServeOptions
    from aiayn.serve import server

    started = []

    def workers(run_dir, device, precision, size, threads=None, stop="beams"):
        started.append((size, stop))

    monkeypatch.setattr(server, "Workers", workers)
    for stop in ("beams", "bound"):
        with socket.socket() as listener:
            server._load(ServeOptions(run_dir=str(model_dir), device="cpu", workers=2),
                         dataclasses.replace(DECODE_PRESETS["translate"], stop=stop), listener)
    assert started == [(2, "beams"), (2, "bound")]


def test_a_step_that_raises_in_a_worker_fails_that_search_only(model_dir, monkeypatch):
    """Nothing a client sends makes a worker's step raise (a text's failure is its result), so the
    fault is injected: the worker's body runs in a thread of this process, where a patched step
    reaches it. The failed search's caller gets the step's error; a join sent for that search after
    it failed gets the same error, rather than starting afresh a search the lane has dropped; the
    worker's other search decodes to its end."""
    from aiayn.serve import app

    step = app.ServedSearch.step

    def faulty(self):
        if self.decoding.decode.beam == 2:
            raise RuntimeError("injected fault")
        return step(self)

    monkeypatch.setattr(app.ServedSearch, "step", faulty)
    worker = _worker_in_a_thread(model_dir, monkeypatch)
    try:
        worker.ready()
        failing, greedy = worker(2), worker(1)
        greedy.join([[8, 9, 10]], ["b"], Options(beam=1))
        failing.join([[5, 6, 7]], ["a"], Options(beam=2))
        while not any(isinstance(report, Exception) for report in worker._reports.get(failing.search_id, ())):
            assert worker.connection.poll(60), "the worker sent nothing for 60 s, and no report of the failed step"
            worker._read()  # until the failed step's report has come
        with pytest.raises(RuntimeError, match="injected fault"):
            failing.join([[5]], ["c"], Options(beam=2))
        assert failing.live == 1  # "c" never joined; "a" fails with the step that failed
        with pytest.raises(RuntimeError, match="injected fault"):
            while True:
                failing.step()  # the reports of the steps before the failure first, if any
        assert failing.live == 0
        finished = []
        while greedy.live:
            finished += greedy.step()
        assert [key for key, _ in finished] == ["b"] and "translation" in finished[0][1]
    finally:
        worker.connection.close()  # the worker's next read ends it
        worker.close(time.monotonic() + 60)
    assert not worker.process.is_alive()


def _held_steps(monkeypatch) -> tuple[threading.Event, threading.Event]:
    """(entered, gate): a worker's search steps, once `entered`, only after `gate` opens (so the
    first is held until it does, and none after)."""
    from aiayn.serve import app

    entered, gate, step = threading.Event(), threading.Event(), app.ServedSearch.step

    def held(self):
        entered.set()
        gate.wait(60)
        return step(self)

    monkeypatch.setattr(app.ServedSearch, "step", held)
    return entered, gate


def test_a_cut_reaches_only_the_texts_it_names_and_one_for_a_search_the_worker_ended_is_ignored(model_dir,
                                                                                                monkeypatch):
    """A client leaves while its text decodes beside another client's (found in review: it
    decoded to its end): the lane's cut, sent while the worker's step is held, ends its text at
    the next step, unanswered (None), and the other is translated. A cut may come for a search the worker has already
    finished (the worker steps on its own; the lane has not read the last report yet): it is
    ignored, and the worker decodes on. Found by mutation testing: a RemoteSearch.cut that named
    every text of its search, and a worker that cut a search it had forgotten (a KeyError that
    ended the worker), passed every test."""
    entered, gate = _held_steps(monkeypatch)
    worker = _worker_in_a_thread(model_dir, monkeypatch)
    try:
        worker.ready()
        search = worker(2)
        search.join([[5, 6, 7], [8, 9]], ["gone", "stays"], Options(beam=2, max_output_len=200))
        assert entered.wait(60)
        search.cut({"gone"})
        gate.set()
        assert search.step() == []  # the step under way when the cut came (EOS is barred at the first)
        finished = search.step()
        assert ("gone", None) in finished  # the next one
        while search.live:
            finished += search.step()
        results = dict(finished)
        assert sorted(results) == ["gone", "stays"] and results["gone"] is None and "translation" in results["stays"]

        ended = worker(1)
        ended.join([[5, 6]], ["short"], Options(beam=1, max_output_len=1))  # one step: the worker forgets it
        while not worker._reports.get(ended.search_id):
            assert worker.connection.poll(60), "no report of the one-step search in 60 s"
            worker._read()
        ended.cut({"short"})  # the lane has not read that report: the text is live to it
        assert [key for key, _ in ended.step()] == ["short"] and not ended.live
        again = worker(2)
        again.join([[8, 9]], ["next"], Options(beam=2))
        finished = []
        while again.live:
            finished += again.step()
        assert [key for key, _ in finished] == ["next"] and "translation" in finished[0][1]
    finally:
        worker.connection.close()
        worker.close(time.monotonic() + 60)


def test_a_stop_at_once_ends_the_wait_for_a_revived_worker_that_has_not_loaded(model_dir):
    """A stop at once (a second SIGTERM) while a revived worker loads its model: the lane stops
    waiting for it at its next look (ABANDON_TICK_S) and ends, as one waiting for a step does.
    Found by mutation testing: a load that ignored the stop (the server's exit waited for it)
    passed every test. The process here is a thread that never answers, for 5 s at most."""
    import multiprocessing
    import types
    from multiprocessing.connection import Connection

    from aiayn.serve.workers import ABANDON_TICK_S, Worker, WorkerLost

    loading = threading.Event()  # set: the "process" ends

    def thread(target, args, **named):  # its own copy of the pipe's end, as a process has, left unanswered
        theirs = Connection(os.dup(args[0].fileno()))
        return threading.Thread(target=lambda: (loading.wait(5), theirs.close()), daemon=True)

    worker = Worker(types.SimpleNamespace(Pipe=multiprocessing.Pipe, Process=thread), str(model_dir), "cpu", "fp32", 1, 0)
    threading.Timer(0.2, worker.abandon, ["stopped at once"]).start()
    started = time.monotonic()
    try:
        with pytest.raises(WorkerLost, match=r"^worker 0 was abandoned \(stopped at once\)$"):
            worker.ready()
        assert time.monotonic() - started < 0.2 + ABANDON_TICK_S + 2
    finally:
        loading.set()
        worker.connection.close()
