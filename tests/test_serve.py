"""`aiayn serve`: the batcher on its own, then the HTTP API and the page as a user meets them,
against a real server process on loopback with a tiny random model."""

import asyncio
import http.client
import importlib.util
import json
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from aiayn.model import Transformer
from aiayn.serve.batcher import Batcher, Closed, Options, QueueFull
from aiayn.serve.process import ServerProcess, free_port
from aiayn.tokenizer import Tokenizer
from aiayn.translate import translate_ids, translate_texts
from test_faults import make_model

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

ROOT = Path(__file__).resolve().parent.parent


# ---------------------------------------------------------------------------------------------
# The batcher, with a fake decoder: which texts were decoded together, and who got what back.

class FakeDecoder:
    def __init__(self, gate: threading.Event = None) -> None:
        self.batches: list[tuple[list, Options]] = []
        self.gate = gate

    def __call__(self, sources, options):
        if self.gate is not None:
            self.gate.wait(10)
        self.batches.append(([list(s) for s in sources], options))
        return [f"{options.beam}:{sum(s)}" for s in sources]


def run(coroutine):
    return asyncio.run(coroutine)


def test_concurrent_requests_share_a_batch_and_get_their_own_results():
    decoder = FakeDecoder()
    batcher = Batcher(decoder, max_wait_ms=200)

    async def main():
        requests = [[[i, 1]] * (1 + i % 3) for i in range(8)]
        return requests, await asyncio.gather(*(batcher.submit(r, Options()) for r in requests))

    requests, results = run(main())
    batcher.close()
    assert results == [[f"4:{i + 1}"] * (1 + i % 3) for i in range(8)]
    assert len(decoder.batches) == 1 and len(decoder.batches[0][0]) == sum(len(r) for r in requests)
    assert batcher.stats.as_dict()["mean_batch_texts"] == len(decoder.batches[0][0])


def test_budget_and_options_split_batches():
    decoder = FakeDecoder()
    batcher = Batcher(decoder, max_wait_ms=200, batch_tokens=40)  # cost = (2 + 1) tokens × beam

    async def main():
        greedy = [batcher.submit([[1, 1]], Options(beam=1)) for _ in range(3)]
        beam4 = [batcher.submit([[2, 2]], Options(beam=4)) for _ in range(6)]
        return await asyncio.gather(*greedy, *beam4)

    results = run(main())
    batcher.close()
    assert results == [["1:2"]] * 3 + [["4:4"]] * 6
    for sources, options in decoder.batches:  # one beam size per batch, within the token budget
        assert len({tuple(s) for s in sources}) == 1 and len(sources) * 3 * options.beam <= 40
    assert sum(len(sources) for sources, _ in decoder.batches) == 9


def test_a_full_queue_refuses_and_a_cancelled_request_is_not_decoded():
    gate = threading.Event()
    decoder = FakeDecoder(gate)
    batcher = Batcher(decoder, max_wait_ms=0, max_queue=3)

    async def main():
        first = asyncio.ensure_future(batcher.submit([[1]], Options()))  # taken: the decoder waits on the gate
        while batcher.queued_texts or not batcher.stats.requests:
            await asyncio.sleep(0.01)
        waiting = asyncio.ensure_future(batcher.submit([[5], [5]], Options()))
        await asyncio.sleep(0.05)
        with pytest.raises(QueueFull):
            await batcher.submit([[7], [7]], Options())  # 2 waiting + 2 > 3
        waiting.cancel()  # the client went away
        await asyncio.sleep(0.05)
        assert batcher.queued_texts == 0
        last = asyncio.ensure_future(batcher.submit([[3], [3], [3]], Options()))  # room again
        gate.set()
        return await first, await last

    assert run(main()) == (["4:1"], ["4:3"] * 3)
    batcher.close()
    decoded = [s for sources, _ in decoder.batches for s in sources]
    assert [5] not in decoded and batcher.stats.cancelled == 1


def test_a_failing_batch_reaches_its_callers_and_the_thread_lives_on():
    calls = []

    def decode(sources, options):
        calls.append(sources)
        if len(calls) == 1:
            raise RuntimeError("out of memory")
        return ["ok"] * len(sources)

    batcher = Batcher(decode, max_wait_ms=0)

    async def main():
        with pytest.raises(RuntimeError, match="out of memory"):
            await batcher.submit([[1]], Options())
        return await batcher.submit([[2]], Options())

    assert run(main()) == ["ok"]
    batcher.close()


def test_close_finishes_the_queue_then_refuses():
    gate = threading.Event()
    batcher = Batcher(FakeDecoder(gate), max_wait_ms=0)

    async def main():
        pending = [asyncio.ensure_future(batcher.submit([[i]], Options())) for i in range(3)]
        await asyncio.sleep(0.05)
        closing = asyncio.ensure_future(asyncio.to_thread(batcher.close))
        await asyncio.sleep(0.05)
        with pytest.raises(Closed):
            await batcher.submit([[9]], Options())
        gate.set()
        await closing
        return await asyncio.gather(*pending)

    assert run(main()) == [["4:0"], ["4:1"], ["4:2"]]


# ---------------------------------------------------------------------------------------------
# The server, over HTTP.

def request(port: int, method: str, path: str, body=None, headers=None, timeout: float = 120):
    """(status, parsed JSON or text, headers) of one request; `body` is sent as JSON unless bytes."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        if body is not None and not isinstance(body, bytes):
            body = json.dumps(body).encode()
            headers = {"Content-Type": "application/json", **(headers or {})}
        connection.request(method, path, body=body, headers=headers or {})
        response = connection.getresponse()
        data = response.read().decode()
        is_json = response.getheader("Content-Type", "").startswith("application/json")
        return response.status, json.loads(data) if is_json else data, {k.lower(): v for k, v in response.getheaders()}
    finally:
        connection.close()


def wait_for(condition, what: str, seconds: float = 60) -> None:
    """Poll `condition()` until it holds; fail, naming `what`, after `seconds`."""
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {seconds} s")
        time.sleep(0.01)


def health(port: int) -> dict:
    return request(port, "GET", "/health")[1]


SENTENCES = ["the small cat", "a red bird eats the fish", "la casa grande", "el perro come", "the big dog",
             "a blue fish under the bridge", "the river", "los niños"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_model(tmp_path_factory.mktemp("served"))


@pytest.fixture(scope="module")
def server(model_dir):
    process = ServerProcess(model_dir, "--max-wait-ms", "50", "--max-queue", "70", "--max-input-tokens", "60")
    yield process.port
    code, out, err = process.stop()
    assert code == 0, err
    assert "stopped:" in out


def test_health_info_and_the_openapi_schema(server, model_dir):
    status, answer, _ = request(server, "GET", "/health")
    assert status == 200 and answer["status"] == "ok"
    status, info, _ = request(server, "GET", "/info")
    model = Transformer.load(model_dir)
    assert status == 200 and info["parameters"] == model.num_parameters()
    assert info["model"]["d_model"] == model.config.d_model and info["precision"] == "fp32"
    assert info["tokenizer"]["vocab_size"] == model.config.vocab_size
    assert info["limits"]["max_input_tokens"] == 60
    status, schema, _ = request(server, "GET", "/openapi.json")
    assert status == 200 and {"/translate", "/health", "/info"} <= set(schema["paths"])


def test_translate_returns_what_the_python_api_returns_in_order(server, model_dir):
    model, tokenizer = Transformer.load(model_dir), Tokenizer.load(model_dir)
    texts = SENTENCES[:5] + [""]
    status, body, _ = request(server, "POST", "/translate", {"text": texts, "beam": 2, "alpha": 0.6})
    expected = translate_texts(model, tokenizer, [t for t in texts if t], beam=2, alpha=0.6)  # one batch, as served
    assert status == 200 and body["translations"] == expected + [""] and "details" not in body
    status, one, _ = request(server, "POST", "/translate", {"text": SENTENCES[0], "beam": 1, "max_length": 3})
    assert status == 200 and len(one["translations"]) == 1
    assert all(len(ids) <= 3 for ids in translate_ids(model, [tokenizer.encode(SENTENCES[0])], beam=1, max_output_len=3))
    assert one["translations"] == translate_texts(model, tokenizer, [SENTENCES[0]], beam=1, max_output_len=3)
    before = health(server)["requests"]
    assert request(server, "POST", "/translate", {"text": ""})[1] == {"translations": [""]}
    assert health(server)["requests"] == before  # nothing was queued


def test_attention_has_every_layer_and_head_and_rows_sum_to_one(server, model_dir):
    config = Transformer.load(model_dir).config
    status, body, _ = request(server, "POST", "/translate", {"text": [SENTENCES[1], " "], "attention": True, "beam": 2})
    assert status == 200 and body["translations"][1] == ""
    assert body["details"][1] == {"source_tokens": [], "target_tokens": [], "attention": {}}  # nothing to attend
    detail = body["details"][0]
    S, T = len(detail["source_tokens"]), len(detail["target_tokens"])
    assert detail["source_tokens"][-1] == "</s>" and detail["target_tokens"][-1] == "</s>"
    shapes = {"encoder": (S, S), "decoder": (T, T), "cross": (T, S)}
    for kind, (rows, columns) in shapes.items():
        layers = detail["attention"][kind]
        assert len(layers) == config.n_layers and all(len(heads) == config.n_heads for heads in layers)
        for heads in layers:
            for weights in heads:
                assert len(weights) == rows and all(len(row) == columns for row in weights)
                for q, row in enumerate(weights):
                    # Softmax rows sum to 1; each weight is rounded to 3 decimals (error ≤ 0.0005).
                    assert abs(sum(row) - 1) <= 0.0005 * columns + 1e-9
                    assert all(len(repr(w)) <= 5 for w in row)  # "0.123": 3 decimals on the wire
                    if kind == "decoder":  # causal: no weight on later positions
                        assert all(w == 0 for w in row[q + 1:])


@pytest.mark.parametrize("body, headers, status, fragment", [
    (b'{"text": ', {"Content-Type": "application/json"}, 400, "not valid JSON"),
    (b'{"text": "a"}', {}, 422, "JSON object"),
    ({"text": "a", "beam": 0}, None, 422, "beam: Input should be greater than or equal to 1"),
    ({"text": "a", "beam": "four"}, None, 422, "beam: Input should be a valid integer"),
    ({"text": 5}, None, 422, "text: give a string or a list of strings"),
    ({"text": []}, None, 422, "give at least one text"),
    ({"text": ["a"] * 65}, None, 422, "65 texts in one request; the limit is 64"),
    ({"text": "the small cat " * 30}, None, 422, "text 1 has"),
    ({"text": "a", "temperature": 1}, None, 422, "temperature: Extra inputs are not permitted"),
    ({"text": "a", "max_length": 0}, None, 422, "max_length"),
    (b"x" * ((1 << 20) + 1), {"Content-Type": "application/json"}, 413, "over 1,048,576 bytes"),
])
def test_bad_requests_get_a_json_error_and_the_server_keeps_serving(server, body, headers, status, fragment):
    got, answer, _ = request(server, "POST", "/translate", body, headers)
    assert got == status and fragment in answer["error"] and "\n" not in answer["error"], answer
    assert request(server, "POST", "/translate", {"text": "the cat"})[0] == 200


def test_a_failing_batch_is_a_json_500_and_the_next_request_succeeds(model_dir):
    import uvicorn

    from aiayn.serve.app import create_app

    app = create_app(Transformer.load(model_dir), Tokenizer.load(model_dir))
    batcher, real = app.state.batcher, app.state.batcher.decode
    calls = []

    def flaky(sources, options):
        calls.append(sources)
        if len(calls) == 1:
            raise RuntimeError("out of\nmemory")
        return real(sources, options)

    batcher.decode = flaky
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, port=port, log_level="critical"))
    thread = threading.Thread(target=server.run)  # not the main thread: uvicorn leaves the signals alone
    thread.start()
    try:
        wait_for(lambda: server.started, "uvicorn starts")
        status, body, _ = request(port, "POST", "/translate", {"text": "the cat"})
        assert status == 500 and body == {"error": "decoding failed: RuntimeError: out of memory"}
        assert request(port, "POST", "/translate", {"text": "the cat"})[0] == 200
    finally:
        server.should_exit = True
        thread.join(60)
    assert not batcher._thread.is_alive()  # the app's shutdown stopped the decoding thread


def test_a_chunked_body_is_refused_unread(server):
    with socket.create_connection(("127.0.0.1", server), timeout=30) as raw:
        raw.sendall(b"POST /translate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                    b"Transfer-Encoding: chunked\r\n\r\n5\r\n{\"tex\r\n")  # and it could go on for ever
        response = http.client.HTTPResponse(raw)
        response.begin()
        answer = json.loads(response.read())
    assert response.status == 411 and answer == {"error": "send the body with a Content-Length header"}
    assert request(server, "POST", "/translate", {"text": "the cat"})[0] == 200


def test_unknown_paths_and_methods_are_json_errors(server):
    status, body, _ = request(server, "GET", "/nowhere")
    assert status == 404 and body == {"error": "Not Found"}
    status, body, _ = request(server, "GET", "/translate")
    assert status == 405 and "error" in body


def _batch_invariant(model_dir) -> dict:
    """The in-process greedy translation of each sentence, kept only where decoding it alone and
    decoding it in one batch with all the others agree (padding changes the summation order, so
    on a random model a near-tie could flip a token)."""
    model, tokenizer = Transformer.load(model_dir), Tokenizer.load(model_dir)
    together = translate_texts(model, tokenizer, SENTENCES, beam=1)
    return {s: t for s, t in zip(SENTENCES, together) if translate_texts(model, tokenizer, [s], beam=1) == [t]}


def test_concurrent_clients_are_batched_and_each_gets_its_own_translation(server, model_dir):
    expected = _batch_invariant(model_dir)
    before = health(server)
    jobs = [SENTENCES[i % len(SENTENCES)] for i in range(16)]
    with ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(lambda s: request(server, "POST", "/translate", {"text": s, "beam": 1}), jobs))
    assert [a[0] for a in answers] == [200] * 16
    for sentence, (_, body, _) in zip(jobs, answers):
        assert len(body["translations"]) == 1
        if sentence in expected:
            assert body["translations"][0] == expected[sentence]
    after = health(server)
    assert after["texts"] - before["texts"] == 16
    assert after["batches"] - before["batches"] < 16  # some were decoded together


def _slow_request(texts: int = 64) -> dict:
    """A request that keeps the decoder busy for a while: many texts, a wide beam."""
    return {"text": [f"{s} and {s}" for s in SENTENCES] * (texts // len(SENTENCES)), "beam": 16}


def test_a_full_queue_gets_503_and_a_client_that_leaves_is_dropped(server):
    before = health(server)
    with ThreadPoolExecutor(2) as pool:
        busy = pool.submit(request, server, "POST", "/translate", _slow_request())
        wait_for(lambda: health(server)["requests"] > before["requests"], "the slow request arrives")
        # The decoder works on the first request; this one waits in the queue, then its client leaves.
        leaving = socket.create_connection(("127.0.0.1", server))
        payload = json.dumps({"text": ["the cat"] * 60}).encode()
        leaving.sendall(b"POST /translate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                        b"Content-Length: " + str(len(payload)).encode() + b"\r\n\r\n" + payload)
        wait_for(lambda: health(server)["queued_texts"] == 60, "the second request waits in the queue")
        status, body, headers = request(server, "POST", "/translate", {"text": ["a"] * 11})  # 60 + 11 > 70
        assert status == 503 and "queue is full" in body["error"] and headers["retry-after"] == "1"
        leaving.close()
        wait_for(lambda: health(server)["cancelled"] > before["cancelled"], "the request of the client that left is dropped")
        assert health(server)["queued_texts"] == 0
        assert busy.result()[0] == 200
    after = health(server)
    assert after["cancelled"] - before["cancelled"] == 1
    assert after["texts"] - before["texts"] == 64  # the 60 texts of the client that left were never decoded


def test_sigterm_finishes_the_requests_in_flight_then_exits(model_dir):
    process = ServerProcess(model_dir)
    port = process.port
    with ThreadPoolExecutor(1) as pool:
        busy = pool.submit(request, port, "POST", "/translate", _slow_request())
        wait_for(lambda: health(port)["requests"] == 1, "the slow request arrives")
        code, out, err = process.stop()
        status, body, _ = busy.result()
    assert status == 200 and len(body["translations"]) == 64
    assert code == 0, err
    assert "stopped: 1 requests, 64 texts" in out
    with pytest.raises(OSError):
        request(port, "GET", "/health", timeout=5)


def test_serve_refuses_a_port_in_use_and_bad_settings_in_one_line(model_dir):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run([sys.executable, "-m", "aiayn", "serve", str(model_dir), "--port", str(port)],
                              capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stderr.startswith(f"aiayn: error: cannot listen on 127.0.0.1:{port}")
    assert done.stderr.count("\n") == 1
    done = subprocess.run([sys.executable, "-m", "aiayn", "serve", str(model_dir), "--max-queue", "0"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "--max-queue must be at least 1" in done.stderr


# ---------------------------------------------------------------------------------------------
# The page, in a real browser.

def _page_tools():
    spec = importlib.util.spec_from_file_location("page_screenshot", ROOT / "scripts" / "page_screenshot.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_page_translates_and_draws_the_attention_in_chromium(server, tmp_path):
    tools = _page_tools()
    if importlib.util.find_spec("playwright") is None:
        pytest.skip("Playwright is not installed (pip install playwright)")
    chromium = tools.find_chromium()
    if chromium is None:
        pytest.skip("no Chromium on PATH (apt-get install chromium; .ci/run installs it)")
    shot = tmp_path / "page.png"
    seen = tools.drive_page(f"http://127.0.0.1:{server}/", "the small cat", shot, chromium)
    _, expected, _ = request(server, "POST", "/translate", {"text": ["the small cat"]})
    assert seen["translations"] == [" ".join(t.split()) for t in expected["translations"]]  # as HTML shows it
    assert seen["drawn"][0].startswith("cross:") and seen["drawn"][1] == "encoder:0:0"
    assert seen["drawn"][2].endswith(":mean") and "encoder-decoder attention" in seen["caption"]
    assert seen["colors"] > 8  # a heatmap of many weights, not a blank canvas
    assert all(url.startswith(f"http://127.0.0.1:{server}/") for url in seen["requests"])  # nothing from a CDN
    assert shot.stat().st_size > 10_000 and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
