"""The HTTP API (FastAPI) over one model, and the page that draws its attention.

    POST /translate   {"text": "..." or [...], "beam": 4, "alpha": 0.6, "max_length": null,
                       "attention": false}  ->  {"translations": [...], "details": [...]}
    GET  /health      liveness, queue length and counters
    GET  /info        model config, parameter count, tokenizer, precision, limits
    GET  /            the page: translate, then a heatmap of any layer's and head's attention
    GET  /openapi.json

Every error is JSON, {"error": "one line"}: 400 invalid JSON, 408 a request not sent whole in
time, 411 a body without a Content-Length, 413 a body over 1 MiB or a request whose decoding
state or attention maps would be over the server's memory limits (aiayn.serve.cost), 403 a
page of a site the server does not answer, 421 a Host that is not this server's
(aiayn.serve.origins), 422 a field of the wrong type or out of range (beam 0, too many
texts, a text over the token limit), 500 a batch whose decoding failed ("decoding failed: ...") or
a fault of the server's own ("the server failed: ..."), 503 a full queue, too
many connections or a server shutting down (with Retry-After). The one exception: a browser's
CORS preflight that asks for what --cors-origins does not allow gets Starlette's plain-text 400.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from contextlib import asynccontextmanager
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Optional, Union

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, Response
from fastapi.staticfiles import StaticFiles
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException

from aiayn.config import DECODE_PRESETS, MAX_ALPHA, MAX_OUTPUT_LEN, SERVE, ServeOptions
from starlette.requests import ClientDisconnect
from starlette.routing import Match

from aiayn.lines import visible
from aiayn.sentences import interleave, split_sentences
from aiayn.serve.batcher import SECTION_6_1, Batcher, Closed, Options, QueueFull
from aiayn.serve import libre
from aiayn.serve.connections import DecodingFailed, unless_gone
from aiayn.serve.cost import MIB, attention_bytes, decoding_bytes, output_limit
from aiayn.serve.libre import Languages, LibreDispatch
from aiayn.serve.origins import LOOPBACK_NAMES, add_origin_checks, error as _error
from aiayn.serve.limits import Admission, bearer_key
from aiayn.translate import ContinuousDecoding, Translator, cut_at_limit, input_token_limit
from aiayn.visualize import CUT, pair_attention

MAX_BODY_BYTES = 1 << 20
MAX_BEAM = 16
STATIC = Path(str(resources.files("aiayn.serve") / "static"))
# How long after the drain deadline the texts still decoding may take to finish before they are
# answered 503 and the decoding stops (`drain`): within uvicorn's own deadline (aiayn.serve.server),
# which would cancel their requests with a text/plain 500.
DRAIN_GRACE_S = 10.0


class TranslateRequest(BaseModel):
    """One text or a list of texts, with §6.1's decoding settings as defaults."""

    model_config = ConfigDict(extra="forbid")
    text: Union[str, list[str]] = Field(description="a sentence, or a list of sentences translated in order")
    beam: int = Field(SECTION_6_1.beam, ge=1, le=MAX_BEAM, strict=True,
                      description=f"beam size (§6.1: {SECTION_6_1.beam}); 1 is greedy")
    alpha: float = Field(SECTION_6_1.alpha, ge=0.0, le=MAX_ALPHA, allow_inf_nan=False, strict=True,  # not true: 1.0
                         description=f"length penalty α (§6.1: {SECTION_6_1.alpha})")
    max_length: Optional[int] = Field(None, ge=1, le=MAX_OUTPUT_LEN, strict=True, description=(
        f"output tokens at most (default: source length + {SECTION_6_1.extra_len})"))
    attention: bool = Field(False, strict=True,
                            description="also return the tokens and every layer's and head's attention weights")
    split_sentences: bool = Field(False, strict=True, description=(
        "translate each text sentence by sentence (sentencex's rules for the model's source language) and put "
        "the translations back between the text's own spaces and line breaks; with attention, `details` has "
        "one entry per sentence, with the index of its `text`"))


class Details(BaseModel):
    text: Optional[int] = Field(None, description="with split_sentences: the index of the text this sentence is from")
    source_tokens: list[str] = Field(description="source pieces, ending with </s>")
    target_tokens: list[str] = Field(description="output pieces, ending with </s>, or (cut) where the output reached "
                                     "its length limit: row t of a decoder map produced token t")
    fed_tokens: list[str] = Field(description="the decoder's inputs: its start token (the model's own: <s>, or an "
                                  "imported Marian model's <pad>), then the outputs; key t of a decoder map")
    attention: dict[str, list[list[list[list[float]]]]] = Field(
        description='{"encoder": [layer][head][source][source], "decoder": [layer][head][target][target], '
                    '"cross": [layer][head][target][source]}; a decoder key t is fed_tokens[t]')


class TranslateResponse(BaseModel):
    translations: list[str]
    details: Optional[list[Details]] = None


class ServedModel:
    """The model side of the server: a search per beam size that texts join between steps
    (`search`, aiayn.translate.ContinuousDecoding over the `Translator`'s decoding copy, made
    once), and each finished text's answer: its translation, alternatives and, when asked, the
    attention of its output read back through the model (`aiayn.visualize.pair_attention`)."""

    def __init__(self, translator: Translator) -> None:
        self.translator = translator
        self.model, self.tokenizer = translator.model, translator.tokenizer
        self.device = next(self.model.parameters()).device

    def search(self, beam: int) -> "ServedSearch":
        return ServedSearch(self, ContinuousDecoding(self.model, dataclasses.replace(self.translator.decode, beam=beam)))

    def answer(self, source: list[int], outputs: list[list[int]], options: Options) -> dict:
        """The answer for one text: `outputs` its output ids, best first."""
        result = {"translation": self.tokenizer.decode(outputs[0])}
        if options.alternatives:
            result["alternatives"] = [self.tokenizer.decode(ids) for ids in outputs[1:]]
        if options.attention:
            result["details"] = self.attention(source, outputs[0], options.max_output_len)
        return result

    def attention(self, source: list[int], output: list[int], max_output_len: Optional[int] = None) -> dict:
        maps, src, fed = pair_attention(self.model, source, output)
        # (h, L_q, L_k) per layer, rounded to 3 decimals in float64 (so that 0.001 prints as 0.001, not
        # as float32's 0.0010000000474974513): the JSON stays small.
        rounded = {kind: [(layer[0].double() * 1000).round().div(1000).tolist() for layer in layers]
                   for kind, layers in maps.items()}
        piece = self.tokenizer.id_to_piece
        decode = dataclasses.replace(self.translator.decode, max_output_len=max_output_len)
        last = CUT if cut_at_limit(self.model.config, source, output, decode) else piece(self.model.config.eos_id)
        return {"source_tokens": [piece(i) for i in src], "target_tokens": [piece(i) for i in output] + [last],
                "fed_tokens": [piece(i) for i in fed],
                "attention": rounded}


class ServedSearch:
    """A search of one beam size as the batcher drives it (aiayn.serve.batcher.Engine)."""

    def __init__(self, served: ServedModel, decoding: ContinuousDecoding) -> None:
        self.served, self.decoding = served, decoding
        self.gone: set = set()  # keys of texts whose caller has gone: finished unanswered

    @property
    def live(self) -> int:
        return self.decoding.live

    def join(self, sources: list[list[int]], keys: list, options: Options) -> None:
        keys = [(key, source, options) for key, source in zip(keys, sources)]
        self.decoding.join(sources, keys, options.alpha, options.alternatives + 1, options.max_output_len)

    def cut(self, keys: set) -> None:
        """The texts of `keys` end at the next step, and come back with None: their callers have gone.
        Only the live ones are kept: a worker steps ahead of its lane, which may cut texts it has
        finished, and a search that decodes on under load would keep those keys for ever."""
        self.gone |= {key for key, _, _ in self.decoding.cut(lambda key: key[0] in keys)}

    def step(self) -> list[tuple]:
        finished = []
        for (key, source, options), outputs in self.decoding.step():
            if key in self.gone:  # neither detokenized nor read back for attention maps
                self.gone.discard(key)
                finished.append((key, None))
                continue
            if isinstance(outputs, Exception):  # scores that are not numbers: this text's request fails
                finished.append((key, outputs))
                continue
            try:
                finished.append((key, self.served.answer(source, outputs, options)))
            except Exception as error:  # noqa: BLE001 - this text's request fails, the search goes on
                finished.append((key, error))
        return finished


EMPTY = {"translation": "", "details": {"source_tokens": [], "target_tokens": [], "fed_tokens": [], "attention": {}}}


class BodyLimit:
    """Refuse a request body over `limit` bytes from its Content-Length, before it is read. A body
    sent in chunks could grow without bound, so it is refused too (411), whatever Content-Length
    it also claims. A request with neither has no body (RFC 9112, 6.3): a LibreTranslate client's
    query parameters alone."""

    def __init__(self, app, limit: int = MAX_BODY_BYTES) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http":
            headers = dict(scope["headers"])
            length = headers.get(b"content-length")
            if b"transfer-encoding" in headers:  # with a Content-Length too, some servers read the chunks
                return await _error(411, "send the body with a Content-Length header")(scope, receive, send)
            if length is not None and int(length) > self.limit:  # the HTTP parser has checked it is a number
                return await _error(413, f"the request body is over {self.limit:,} bytes")(scope, receive, send)
        await self.app(scope, receive, send)


class HeadAsGet:
    """HEAD answered as GET is, without the body, as HTTP asks of every server (RFC 9110, 9.3.2)
    and uptime monitors send it (found by a misuse hunt: 405 from /health, / and /languages)."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or scope["method"] != "HEAD":
            return await self.app(scope, receive, send)

        async def headers_only(message) -> None:
            await send({**message, "body": b""} if message["type"] == "http.response.body" else message)

        await self.app({**scope, "method": "GET"}, receive, headers_only)


# What FastAPI answers for a JSON body it failed to read (not UTF-8, nested too deep for Python's
# parser), the failure as its cause; the JSON errors it names are a RequestValidationError.
FASTAPI_UNREADABLE_BODY = "There was an error parsing the body"


def _add_error_handlers(app: FastAPI) -> None:
    """Every error as {"error": "..."} with its status: 400 bad JSON, 422 a bad field, 503 a full
    queue or a stopping server (with Retry-After), 500 a decoding failure."""

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, error: RequestValidationError) -> JSONResponse:
        first = error.errors()[0]
        if first["type"] == "json_invalid":
            return _error(400, f"the body is not valid JSON: {first.get('ctx', {}).get('error', first['msg'])}")
        field = [str(part) for part in first["loc"][1:]]
        if not field:
            return _error(422, 'the body must be a JSON object such as {"text": "Hello"}, '
                               "sent with Content-Type: application/json")
        if field[0] == "text" and first["type"] != "missing":  # pydantic names each member of the union
            return _error(422, "text: give a string or a list of strings")
        return _error(422, f"{'.'.join(field)}: {first['msg']}")

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, error: HTTPException) -> JSONResponse:
        if error.status_code == 400 and error.detail == FASTAPI_UNREADABLE_BODY:
            cause = error.__cause__
            return _error(400, "the body is not valid JSON: " + (
                "it is not UTF-8 text" if isinstance(cause, UnicodeDecodeError) else f"{type(cause).__name__}"))
        if error.status_code == 405:  # the methods of every route of the path, not of the first (found by a
            # misuse hunt: PUT /languages said "Allow: POST", where GET is served too)
            methods = {m for route in app.router.routes if route.matches(request.scope)[0] != Match.NONE
                       for m in getattr(route, "methods", None) or ()}
            methods |= {"HEAD"} if "GET" in methods else set()
            return _error(405, str(error.detail), {**(error.headers or {}), "Allow": ", ".join(sorted(methods))})
        return _error(error.status_code, str(error.detail), error.headers)

    @app.exception_handler(QueueFull)
    async def full(request: Request, error: QueueFull) -> JSONResponse:
        return _error(503, str(error), {"Retry-After": "1"})

    @app.exception_handler(Closed)
    async def closed(request: Request, error: Closed) -> JSONResponse:
        return _error(503, str(error), {"Retry-After": "5"})

    @app.exception_handler(ClientDisconnect)
    async def gone(request: Request, error: ClientDisconnect) -> Response:  # its connection was closed: no one reads this
        return Response(status_code=499)

    @app.exception_handler(DecodingFailed)
    async def failed(request: Request, error: DecodingFailed) -> JSONResponse:
        cause = error.__cause__
        logging.getLogger("uvicorn.error").error("decoding failed", exc_info=cause)
        return _error(500, f"decoding failed: {type(cause).__name__}: {' '.join(str(cause).split())}")

    @app.exception_handler(Exception)
    async def broken(request: Request, error: Exception) -> JSONResponse:  # a fault of the server's: uvicorn logs it
        return _error(500, f"the server failed: {type(error).__name__}: {' '.join(str(error).split())}")


@dataclass
class ReadRequest:
    """A request's texts, ready to queue: `units` are the texts, or with split_sentences their
    sentences (`owner[u]`: the text of unit u; `rest[i]`: what lies around text i's sentences)."""

    texts: list[str]
    units: list[str]
    owner: list[int]
    rest: Optional[list[list[str]]]
    sources: list[list[int]]  # token ids of each unit
    given: list[int]  # the units that are not blank
    options: Options


def _read_request(body: TranslateRequest, tokenizer, limits: ServeOptions, text_bytes, config, lang: str) -> ReadRequest:
    """A request read and checked against `limits`, or the HTTPException (422, 413) that says
    which limit it goes over, before anything is queued."""
    texts = [body.text] if isinstance(body.text, str) else body.text
    if not texts:
        raise HTTPException(422, "text: give at least one text")
    if len(texts) > limits.max_texts:
        raise HTTPException(422, f"text: {len(texts)} texts in one request; the limit is {limits.max_texts}")
    for number, text in enumerate(texts, start=1):
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:  # JSON's "\ud800" escape: a lone surrogate, no character at all
            raise HTTPException(422, f"text {number} is not valid Unicode (it holds a lone surrogate)") from None
    units, owner, rest = texts, list(range(len(texts))), None
    if body.split_sentences:
        splits = [split_sentences(text, lang) for text in texts]
        units = [sentence for sentences, _ in splits for sentence in sentences]
        owner = [i for i, (sentences, _) in enumerate(splits) for _ in sentences]
        rest = [around for _, around in splits]
        if len(units) > limits.max_texts:
            raise HTTPException(422, f"text: {len(units)} sentences in one request; the limit is {limits.max_texts}")
    name = [f"sentence {u - owner.index(owner[u]) + 1} of text {owner[u] + 1}" if rest else f"text {u + 1}"
            for u in range(len(units))]
    shown = [visible(unit) for unit in units]  # "" for a unit with nothing to translate
    sources = tokenizer.encode_batch(shown, threads=1)  # on the event loop: a request's few texts, no pool of threads
    for u, ids in enumerate(sources):
        if len(ids) > limits.max_input_tokens:
            raise HTTPException(422, f"{name[u]} has {len(ids)} tokens; the limit is {limits.max_input_tokens}")
    given = [u for u, text in enumerate(shown) if text]  # an empty text is translated as empty
    options = Options(body.beam, body.alpha, body.max_length, body.attention)
    maps = 0
    for u in given:
        source = len(sources[u])
        output = output_limit(source, SECTION_6_1.extra_len, body.max_length)
        if (needed := text_bytes(sources[u], options)) > limits.max_batch_mib * MIB:
            raise HTTPException(413, f"{name[u]} needs {needed / MIB:,.0f} MiB of decoding state (beam {body.beam} × "
                                     f"({source + 1} source + {output} output tokens)); the limit is "
                                     f"{limits.max_batch_mib:g} MiB (max_batch_mib): lower beam or max_length")
        if body.attention:
            maps += attention_bytes(config, source, output)
    if maps > limits.max_attention_mib * MIB:
        raise HTTPException(413, f"the attention maps of these texts take up to {maps / MIB:,.0f} MiB (layers × heads "
                                 f"× (S² + T² + T·S) weights); the limit is {limits.max_attention_mib:g} MiB "
                                 "(max_attention_mib): send fewer or shorter texts")
    return ReadRequest(texts, units, owner, rest, sources, given, options)


def _answer(read: ReadRequest, results: list[dict]) -> dict:
    """The response to a request whose units decoded to `results`."""
    if read.rest is None:
        response = {"translations": [r["translation"] for r in results]}
        if read.options.attention:
            response["details"] = [r["details"] for r in results]
        return response
    pieces: list[list[str]] = [[] for _ in read.texts]
    for u, result in enumerate(results):
        pieces[read.owner[u]].append(result["translation"])
    response = {"translations": [interleave(done, around) for done, around in zip(pieces, read.rest)]}
    if read.options.attention:
        response["details"] = [{"text": read.owner[u], **results[u]["details"]} for u in read.given]
    return response


def create_app(model, tokenizer, *, precision: str = "fp32", stop: str = SECTION_6_1.stop, source: str = "", max_wait_ms: float = SERVE.max_wait_ms,
               max_queue: int = SERVE.max_queue, max_texts: int = SERVE.max_texts,
               max_input_tokens: int = SERVE.max_input_tokens, allowed_hosts: Optional[frozenset] = LOOPBACK_NAMES,
               max_batch_mib: float = SERVE.max_batch_mib, max_attention_mib: float = SERVE.max_attention_mib,
               languages: Languages = Languages(), admission: Optional[Admission] = None,
               decode_on_caller: bool = False, engines: Optional[list] = None,
               cors_origins: tuple[str, ...] = ()) -> FastAPI:
    """The ASGI app serving `model` (put in eval mode: it decodes without dropout) with its
    `tokenizer`, decoding with the stop rule `stop` (aiayn.search); its batcher's thread starts now and stops, after finishing
    the queued requests, when the server shuts down (with `decode_on_caller`, there is no such
    thread: the caller runs `app.state.batcher.run()`, as `aiayn serve` does on its main
    thread). `allowed_hosts`: the Host names it answers
    to (None: any, for a server meant to be reached by other names); `cors_origins` the sites whose
    pages may call it from a browser (aiayn.serve.origins). `max_batch_mib` bounds the
    decoding state of the texts decoding at once and `max_attention_mib` the attention maps of one answer
    (aiayn.serve.cost). `languages`: the model's pair, for the LibreTranslate API
    (aiayn.serve.libre); `admission`: keys and request rates (aiayn.serve.limits), none by default.
    `app.state.drain(seconds)`, called on the event loop, begins a stop. `engines`: the searches of
    worker processes to decode on, a batcher lane each (aiayn.serve.workers), instead of a decoding
    copy of `model` in this process, which then reads only its config.

    Length: the routes are closures over this app's batcher, model and limits, FastAPI's way;
    the checks of a request and the error answers live apart (`_read_request`,
    `_add_error_handlers`)."""
    if not hasattr(tokenizer, "encode_batch"):  # (found in review: a server whose every translation was a 500)
        raise TypeError(f"create_app needs the model's tokenizer (aiayn.tokenizer.load_tokenizer(folder)), not a "
                        f"{type(tokenizer).__name__}")
    decode = dataclasses.replace(DECODE_PRESETS["translate"], precision=precision, stop=stop)
    # A request of more texts than the queue holds could never be queued: refused as too many
    # (422), not told to retry a 503 for ever (found in review).
    max_texts = min(max_texts, max_queue)
    parameters = model.num_parameters()  # the model's own: an int8 copy's packed weights are no parameters
    config = model.config
    if engines is None:
        translator = ServedModel(Translator(model.eval(), tokenizer, decode))
        engines, device = translator.search, translator.device
    else:
        device = next(model.parameters()).device
    extra_len = SECTION_6_1.extra_len

    def text_bytes(source, options: Options) -> int:
        return decoding_bytes(config, precision, len(source),
                              output_limit(len(source), extra_len, options.max_output_len), options.beam)

    batcher = Batcher(engines, max_wait_ms, int(max_batch_mib * MIB), max_queue, cost=text_bytes,
                      own_thread=not decode_on_caller)
    max_input_tokens = input_token_limit(config, max_input_tokens)
    limits = dataclasses.replace(SERVE, max_texts=max_texts, max_input_tokens=max_input_tokens, max_queue=max_queue,
                                 max_batch_mib=max_batch_mib, max_attention_mib=max_attention_mib)

    admission = admission or Admission()

    def admit(request: Request, key: Optional[str]) -> None:
        admission.admit(request.client.host if request.client else "", key)

    def drain(seconds: float) -> None:
        """Refuse new requests; decode what is queued for `seconds`, then answer the rest 503; the
        texts decoding then get DRAIN_GRACE_S more to finish, then are answered 503 too and the
        decoding stops (found by a fault hunt: a search longer than that, or one on a stopped
        worker, was cut by uvicorn's deadline with a text/plain 500 and a traceback a request,
        and a stopped worker's lane kept the process from ever exiting)."""
        batcher.drain()
        loop = asyncio.get_running_loop()
        loop.call_later(seconds, batcher.expire, f"the server stopped before decoding this request ({seconds:g} s drain); retry")
        loop.call_later(seconds + DRAIN_GRACE_S, batcher.abort,
                        f"the server stopped while decoding this request ({seconds:g} s drain); retry")

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        yield
        await asyncio.to_thread(batcher.close)

    # redirect_slashes off: `/translate/` is a JSON 404, not a 307 with an empty body (a Flask
    # LibreTranslate answers it with a 404 too).
    app = FastAPI(title="aiayn", version="0.1.0", lifespan=lifespan, docs_url=None, redoc_url=None, redirect_slashes=False,
                  description="Translation with the Transformer of 'Attention Is All You Need'. "
                              "Concurrent requests are decoded together: each joins the running search.")
    app.state.batcher = batcher
    app.state.drain = drain
    app.add_middleware(HeadAsGet)
    app.add_middleware(LibreDispatch)  # inside BodyLimit: it reads bodies already bounded
    app.add_middleware(BodyLimit)
    add_origin_checks(app, allowed_hosts, cors_origins)  # added last, so they run first
    app.mount("/static", StaticFiles(directory=STATIC), name="static")

    _add_error_handlers(app)

    @app.get("/", include_in_schema=False)
    async def page() -> FileResponse:
        return FileResponse(STATIC / "index.html")

    @app.get("/health")
    async def health():
        figures = {"queued_texts": batcher.queued_texts, **batcher.stats.as_dict()}
        if batcher.failure is not None:  # the decoding thread died: translations would never come
            return JSONResponse({"status": "failed", "error": f"the decoder has stopped ({batcher.failure})", **figures},
                                status_code=503)
        if stopped := next(filter(None, (lane.stopped() for lane in batcher.lanes)), None):
            return JSONResponse({"status": "stalled", "error": stopped, **figures}, status_code=503)
        return {"status": "ok", **figures}

    @app.get("/info")
    async def info() -> dict:
        return {
            # The folder's name, not its path: the server's file system is nobody's business.
            "model": config.to_dict(), "parameters": parameters, "source": Path(source).name,
            "tokenizer": {"kind": type(tokenizer).__name__, "vocab_size": tokenizer.vocab_size},
            "precision": precision, "device": str(device),
            "decoding": {name: TranslateRequest.model_fields[name].default for name in ("beam", "alpha")}
            | {"max_length": f"source length + {SECTION_6_1.extra_len}", "stop": stop},
            "limits": {"max_texts": max_texts, "max_input_tokens": max_input_tokens, "max_beam": MAX_BEAM,
                       "max_queue": max_queue, "max_body_bytes": MAX_BODY_BYTES,
                       "max_batch_mib": max_batch_mib, "max_attention_mib": max_attention_mib},
            "batching": {"max_wait_ms": max_wait_ms, "continuous": True, "workers": len(batcher.lanes)},
        }

    async def admit_bearer(request: Request) -> None:  # async: FastAPI runs a plain def on a thread of its pool
        """aiayn's own API takes its key from `Authorization: Bearer KEY` or `?api_key=`: checked,
        as a dependency, before the body is (a request without a key learns 403, not 422)."""
        key = bearer_key(request.headers)
        admit(request, key if key is not None else request.query_params.get("api_key"))

    @app.post("/translate", response_model=TranslateResponse, response_model_exclude_none=True, dependencies=[Depends(admit_bearer)],
              responses={400: {"description": "invalid JSON"}, 413: {"description": "body too large"},
                         422: {"description": "invalid field"}, 503: {"description": "queue full or shutting down"}})
    async def translate(body: TranslateRequest, request: Request):
        read = _read_request(body, tokenizer, limits, text_bytes, config, languages.source or "en")
        results = [EMPTY] * len(read.units)
        if read.given:
            decoded = await unless_gone(batcher.submit([read.sources[u] for u in read.given], read.options), request)
            if decoded is None:  # the client went away: its texts leave the queue undecoded
                return Response(status_code=499)
            for u, result in zip(read.given, decoded):
                results[u] = result
        # Sent as it is: the response model documents it, and validating millions of attention
        # weights again would double what the answer holds in memory.
        return JSONResponse(_answer(read, results))

    libre.add_routes(app, tokenizer, languages, libre.page_translator(tokenizer, batcher, limits, text_bytes, languages.source or "en"), admit,
                     {"charLimit": -1, "frontendTimeout": 500, "apiKeys": admission.key_required,
                      "keyRequired": admission.key_required})
    return app
