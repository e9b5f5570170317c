"""The LibreTranslate API beside aiayn's own, so that the clients people already have
(libretranslatepy, deep-translator, browser extensions, searxng, chat bots) can use `aiayn serve`.

    POST /translate   q (a string or a list), source, target, format (text or html), alternatives,
                      api_key; as JSON, as a form, or as query parameters (clients send all three)
                      -> {"translatedText": ...} (a string or a list, as q was), with
                      "alternatives" (the next best outputs of the beam) when asked, and
                      "detectedLanguage" when source was "auto"
    GET  /languages   the model's source and target, with names
    POST /detect      q -> [{"language": ..., "confidence": ...}]
    GET  /frontend/settings

Errors are {"error": "..."}, as LibreTranslate answers them: 400 a missing or bad field or a
language this model does not translate, 403 a missing or unknown key, 429 over a rate limit.

A POST /translate is LibreTranslate's when it is not a JSON object with aiayn's "text" field:
a form, query parameters, or a JSON object with one of LibreTranslate's fields (`LibreDispatch`
sends it to this module's route). One model translates one pair of languages, so `source` must be that model's source or
"auto", and `target` its target. `/detect` cannot identify languages: it answers the model's
source language, with as confidence the share of the text's characters that the model's
vocabulary covers without falling back to bytes (a text in another script scores low).
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any, Optional
from urllib.parse import parse_qsl

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException

from aiayn.serve.batcher import SECTION_6_1, Options
from aiayn.serve.connections import unless_gone
from aiayn.serve.cost import MIB
from aiayn.config import argos_code
from aiayn.corpora import language_name
from aiayn.lines import visible
from aiayn.sentences import interleave, split_sentences
from aiayn.serve.limits import bearer_key
from aiayn.serve.markup import join_html, split_html

ROUTE = "/libretranslate/translate"  # where LibreDispatch sends LibreTranslate's POST /translate
LIBRE_FIELDS = frozenset({"q", "source", "target", "format", "alternatives", "api_key"})  # none is aiayn's
MAX_ALTERNATIVES = 3  # asked for more, the beam would have to widen beyond what decodes fast: more get 3

@dataclass(frozen=True)
class Languages:
    """The one pair of languages a model translates; None where the run folder does not say."""

    source: Optional[str] = None
    target: Optional[str] = None

    @property
    def known(self) -> bool:
        return self.source is not None and self.target is not None


def error(status: int, message: str) -> HTTPException:
    return HTTPException(status, message)


def _json_start(body: bytes) -> str:
    """The body's first character but spaces, read as JSON text ("{" of a JSON object) in any of
    the encodings `json.loads` reads bytes in: UTF-8, -16 or -32, with a byte-order mark or
    without (found by a misuse hunt: a mark or UTF-16 sent LibreTranslate's request to aiayn's
    route, the check having looked at the first byte)."""
    return body.decode(json.detect_encoding(body), errors="replace").lstrip()[:1]


def _is_aiayn_json(body: bytes) -> bool:
    try:
        value = json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError):  # RecursionError: arrays nested thousands deep
        return True  # aiayn's route answers bad JSON with its 400
    return not (isinstance(value, dict) and "text" not in value and not LIBRE_FIELDS.isdisjoint(value))


class LibreDispatch:
    """Send LibreTranslate's POST /translate to its own route: a form or query parameters, or a
    JSON object with one of LIBRE_FIELDS and no "text". The body (at most 1 MiB, checked before) is read once
    and handed on unchanged."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or scope["path"] != "/translate":
            return await self.app(scope, receive, send)
        chunks, more = [], True
        while more:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client left before sending its body
            chunks.append(message.get("body", b""))
            more = message.get("more_body", False)
        body = b"".join(chunks)
        content_type = dict(scope["headers"]).get(b"content-type", b"").split(b";")[0].strip().lower()
        if _json_start(body) in ("{", "["):  # JSON, whatever the header says: aiayn's unless it has q, ...
            libre = not _is_aiayn_json(body)
        elif content_type == b"application/json" and body.strip():
            libre = False  # aiayn's route answers the bad JSON (an empty body: the query may be LibreTranslate's)
        else:  # a form, or query parameters
            libre = bool(body) or b"q=" in scope.get("query_string", b"")
        if libre:
            scope = {**scope, "path": ROUTE, "raw_path": ROUTE.encode()}
        sent = False

        async def replay():
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


async def request_fields(request: Request) -> dict[str, Any]:
    """A LibreTranslate request's fields as its clients send them: query parameters, under a JSON
    object or a form body (urlencoded or multipart) whose fields win. Repeated q fields make a list."""
    fields: dict[str, Any] = {}
    for key, value in request.query_params.multi_items():
        _add(fields, key, value)
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    body = await request.body()
    if (content_type == "application/json" and body.strip()) or _json_start(body) == "{":
        try:
            value = json.loads(body)
        except (ValueError, UnicodeDecodeError, RecursionError) as problem:  # (nested too deep: found in review)
            raise error(400, f"Invalid request: the body is not valid JSON ({type(problem).__name__}: "
                             f"{str(problem)[:200]})") from None
        if not isinstance(value, dict):
            raise error(400, "Invalid request: the body must be a JSON object")
        fields.update(value)
    elif content_type == "multipart/form-data":
        try:
            form = await request.form()
        except AssertionError:  # starlette without python-multipart
            raise error(400, "Invalid request: send the fields as JSON or urlencoded, not multipart") from None
        for key, value in form.multi_items():
            if isinstance(value, str):  # a file is no field of LibreTranslate's /translate (found in review: q was "")
                _add(fields, key, value)
    elif body:
        try:
            pairs = parse_qsl(body.decode("utf-8"), keep_blank_values=True, strict_parsing=False)
        except UnicodeDecodeError:
            raise error(400, "Invalid request: the form is not UTF-8") from None
        for key, value in pairs:
            _add(fields, key, value)
    return fields


def _add(fields: dict, key: str, value: str) -> None:
    """A field into `fields`; repeated q fields into one list, appended in place (found in review:
    a list made anew for each took time quadratic in their number, on the event loop)."""
    if key == "q" and key in fields:
        if not isinstance(fields[key], list):
            fields[key] = [fields[key]]
        fields[key].append(value)
    else:
        fields[key] = value


def texts_of(fields: dict) -> tuple[list[str], bool]:
    """(the texts of q, whether q was a list)."""
    q = fields.get("q")
    if q is None or (isinstance(q, (str, list)) and not q):  # "" and [] too, as LibreTranslate's `not q` (a misuse hunt)
        raise error(400, "Invalid request: missing q parameter")
    texts = [q] if isinstance(q, str) else q
    if not isinstance(texts, list) or not all(isinstance(text, str) for text in texts):
        raise error(400, "Invalid request: q must be a string or a list of strings")
    for text in texts:
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:  # JSON's "\ud800" escape: a lone surrogate, no character at all
            raise error(400, "Invalid request: q holds a lone surrogate, which is not Unicode text") from None
    return list(texts), not isinstance(q, str)


def check_languages(fields: dict, languages: Languages) -> bool:
    """Whether the source was "auto"; a 400 for a pair this model does not translate."""
    if not languages.known:
        raise error(400, "this server does not know its model's languages; start it with --source-lang and --target-lang")
    source, target = fields.get("source"), fields.get("target")
    source = "auto" if source is None else source  # left out or null (found by a misuse hunt: "None is not supported")
    if target is None:
        raise error(400, "Invalid request: missing target parameter")
    pair = f"{languages.source} to {languages.target}"
    auto = _code(source) == "auto"
    if not auto and _code(source) != _code(languages.source):
        raise error(400, f"{_shown(source, str)} is not supported as a source: this server translates {pair}")
    if _code(target) != _code(languages.target):
        raise error(400, f"{_shown(target, str)} is not supported as a target: this server translates {pair}")
    return auto


def _shown(value, written=repr, most: int = 40) -> str:
    """A client's value in an error, cut at `most` characters (found by a misuse hunt: a source of
    200,000 characters came back whole in the error)."""
    text = written(value)
    return text if len(text) <= most else f"{text[:most]}… ({len(text):,} characters)"


def _code(code) -> str:
    """A language code as LibreTranslate compares them (found in review: "EN" and "zh-Hans" were
    refused where LibreTranslate takes them)."""
    return argos_code(str(code))


def alternatives_of(fields: dict) -> int:
    value = fields.get("alternatives", 0)
    try:  # a form's "2", JSON's 2 or 2.0; not 1.7 or true, which int() would take for 1 (found in review)
        count = int(value) if not isinstance(value, (bool, float)) or float(value).is_integer() else None
        if isinstance(value, bool) or count is None:
            raise ValueError
    except (TypeError, ValueError, OverflowError):  # OverflowError: JSON's 1e400 is an infinite float
        raise error(400, f"Invalid request: alternatives must be a whole number, got {_shown(value)}") from None
    return min(max(count, 0), MAX_ALTERNATIVES)  # LibreTranslate takes a negative count for 0 (found in review)


def format_of(fields: dict) -> str:
    value = fields.get("format") or "text"  # an empty or null format is text, as LibreTranslate takes it
    if value not in ("text", "html"):
        raise error(400, f"Invalid request: format must be text or html, got {_shown(value)}")
    return value


def distinct(alternatives: list[str], translation: str) -> list[str]:
    """The alternatives a reader can use, as LibreTranslate keeps them: none empty, none the
    translation itself, none twice (found in review: a text's best filled the gaps of a paragraph's
    alternatives, and searxng showed the translation again as an example)."""
    seen = {translation, ""}
    return [a for a in alternatives if not (a in seen or seen.add(a))]


def coverage(tokenizer, text: str) -> float:
    """The share (0-100) of the text's characters that the tokenizer spells with pieces of its
    vocabulary rather than with byte fallback or the unknown piece: the /detect confidence."""
    stripped = "".join(text.split())
    if not stripped:
        return 0.0
    pieces = [tokenizer.id_to_piece(i) for i in tokenizer.encode(text)]
    fallback = sum(1 for p in pieces if (p.startswith("<0x") and p.endswith(">")) or p == "<unk>")
    known = sum(len(p.replace("\u2581", "")) for p in pieces if not (p.startswith("<0x") or p == "<unk>"))
    return round(100.0 * known / max(known + fallback, 1), 1)


def page_translator(tokenizer, batcher, limits, text_bytes, lang: str):
    """The coroutine `add_routes` translates with: texts through the server's batcher, a
    paragraph sentence by sentence (aiayn.sentences, rules for `lang`) and a page (format=html)
    text node by text node, every piece checked against `limits` (a ServeOptions) first."""

    async def translate(texts: list[str], html: bool, alternatives: int,
                        request: Request) -> Optional[list[tuple[str, list[str]]]]:
        """LibreTranslate's texts (pages with format=html): every piece to translate in one
        submission, each piece's translation and alternatives back in its place; None if the
        client of `request` went away first (found in review: its texts were decoded anyway)."""
        # In a thread: the event loop answers other clients while a large page is read (found in
        # review: /health waited 26 s on Python's own parsing loop, since replaced by markup.py's).
        pages = await asyncio.to_thread(
            lambda: [split_html(text, lang) if html else split_sentences(text, lang) for text in texts])
        pieces = [piece for page, _ in pages for piece in page]
        if len(pieces) > limits.max_queue:
            raise HTTPException(400, f"Invalid request: {len(pieces)} sentences in one "
                                     f"request; this server takes at most {limits.max_queue} (max_queue)")
        # Read as aiayn's own API reads a text (app.py), control characters dropped (found by a misuse hunt)
        sources = tokenizer.encode_batch([visible(piece) for piece in pieces], threads=1)
        options = Options(max(SECTION_6_1.beam, alternatives + 1), SECTION_6_1.alpha, alternatives=alternatives)
        for number, ids in enumerate(sources, start=1):
            if len(ids) > limits.max_input_tokens:
                raise HTTPException(400, f"Invalid request: sentence {number} has {len(ids)} tokens; the limit is "
                                         f"{limits.max_input_tokens} (send shorter texts)")
            if text_bytes(ids, options) > limits.max_batch_mib * MIB:
                raise HTTPException(400, f"Invalid request: sentence {number} needs more decoding memory than "
                                         f"max_batch_mib ({limits.max_batch_mib:g} MiB)")
        results = await unless_gone(batcher.submit(sources, options), request) if sources else []
        if results is None:
            return None
        answers, at = [], 0
        for page, rest in pages:
            done, at = results[at: at + len(page)], at + len(page)
            translated = [r["translation"] for r in done]
            join = join_html if html else interleave
            # The i-th alternative of a paragraph: each piece's i-th (its best where it has fewer).
            others = [join([r["alternatives"][i] if i < len(r["alternatives"]) else r["translation"] for r in done], rest)
                      for i in range(alternatives)]
            answers.append((join(translated, rest), others))
        return answers

    return translate


def add_routes(app: FastAPI, tokenizer, languages: Languages, translate, admit, settings: dict) -> None:
    """LibreTranslate's routes. `translate(texts, html, alternatives, request)` (a coroutine)
    returns, per text, (its translation, its alternatives), or None if the client went away;
    `admit(request, key)` applies the keys and rate limits; `settings` goes into
    /frontend/settings."""

    def detected(text: str) -> dict:
        return {"confidence": coverage(tokenizer, text), "language": languages.source}

    @app.post(ROUTE, include_in_schema=False)
    async def libre_translate(request: Request) -> JSONResponse:
        fields = await request_fields(request)
        admit(request, fields.get("api_key") or bearer_key(request.headers))
        texts, listed = texts_of(fields)
        auto = check_languages(fields, languages)
        alternatives, html = alternatives_of(fields), format_of(fields) == "html"
        results = await translate(texts, html, alternatives, request)
        if results is None:  # the client went away
            return Response(status_code=499)
        results = [(text, distinct(others, text)) for text, others in results]
        answer: dict[str, Any] = {"translatedText": [t for t, _ in results] if listed else results[0][0]}
        if alternatives:
            answer["alternatives"] = [a for _, a in results] if listed else results[0][1]
        if auto:
            answer["detectedLanguage"] = [detected(t) for t in texts] if listed else detected(texts[0])
        return JSONResponse(answer)

    # One route a method, each its own OpenAPI operation id (one route of both named both alike).
    @app.get("/languages", tags=["LibreTranslate"], operation_id="libre_languages")
    @app.post("/languages", tags=["LibreTranslate"], operation_id="libre_languages_post")
    async def libre_languages() -> list:
        """The model's source language (which translates to its target) and its target."""
        if not languages.known:
            return []
        return [{"code": languages.source, "name": language_name(languages.source), "targets": [languages.target]},
                {"code": languages.target, "name": language_name(languages.target), "targets": []}]

    @app.post("/detect", tags=["LibreTranslate"])
    async def libre_detect(request: Request) -> list:
        """The model's source language, with the share of the text its vocabulary covers."""
        fields = await request_fields(request)
        admit(request, fields.get("api_key") or bearer_key(request.headers))
        texts, _ = texts_of(fields)
        if not languages.known:
            raise error(400, "this server does not know its model's languages; start it with --source-lang")
        return [detected(" ".join(texts))]

    @app.get("/frontend/settings", tags=["LibreTranslate"])
    async def libre_settings() -> dict:
        source = {"code": languages.source, "name": language_name(languages.source or "")}
        target = {"code": languages.target, "name": language_name(languages.target or "")}
        return {**settings, "suggestions": False, "filesTranslation": False, "supportedFilesFormat": [],
                "language": {"source": source, "target": target}}
