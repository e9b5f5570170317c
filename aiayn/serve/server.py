"""Running `aiayn serve`: the listening socket bound before the model loads (a port in use is a
one-line error, not a log after seconds of loading), the app, uvicorn with the guarded protocol
(aiayn.serve.connections), and the drain on SIGTERM or Ctrl-C: no request is taken, the queue is
decoded for `drain_seconds`, what is left is answered 503, then the process exits (0 on SIGTERM).
The model decodes on the main thread, which loaded it (aiayn.serve.batcher says why), or with
`--workers N` in N processes of its own (aiayn.serve.workers); uvicorn's event loop runs on a
thread of its own."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import os
import re
import signal
import socket
import stat
import sys
import threading
from urllib.parse import unquote_plus

import torch
import uvicorn

from aiayn.config import DecodeConfig, ServeOptions
from aiayn.device import check_precision, resolve_device
from aiayn.kernel_cache import SERVING_KERNEL_CACHE_CAPACITY, bound_kernel_cache
from aiayn.run import languages_of, load_for_inference, pinned_model_dir, stderr_note
from aiayn.serve.app import DRAIN_GRACE_S, create_app
from aiayn.serve.origins import LOOPBACK_NAMES, cors_origins, host_names, ipv6_name
from aiayn.serve.connections import RESERVED_DESCRIPTORS, connection_cap, guarded_protocol
from aiayn.serve.libre import Languages
from aiayn.serve.limits import Admission, read_keys
from aiayn.serve.workers import Workers


def _listen(host: str, port: int) -> socket.socket:
    listener = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listener.bind((host, port))
    except (OSError, OverflowError) as error:
        listener.close()
        raise ValueError(f"cannot listen on {host}:{port}: {getattr(error, 'strerror', None) or error}") from None
    return listener


def _languages(options: ServeOptions) -> Languages:
    """The model's pair: as given, else as its run folder recorded it."""
    source, target = languages_of(options.run_dir)
    source, target = options.source_lang or source, options.target_lang or target
    if source and target and source.lower() == target.lower():  # as train and export-argos refuse it (found in review)
        raise ValueError(f"the server's source and target language are both {source!r}; give the model's two "
                         "languages with --source-lang and --target-lang")
    return Languages(source, target)


def _load(options: ServeOptions, decode: DecodeConfig, listener: socket.socket):
    """(device, model, tokenizer, the worker processes or None); a model that does not load,
    here or in a worker, frees the port at once."""
    bound_kernel_cache(SERVING_KERNEL_CACHE_CAPACITY)  # before the process's first matrix product
    try:
        device = resolve_device(options.device)
        check_precision(device, decode.precision)  # here, before N workers would each load the model to refuse it
        # One folder for this process and its workers, whatever a run training there writes meanwhile
        model_dir = pinned_model_dir(options.run_dir, stderr_note)
        model, tokenizer = load_for_inference(model_dir, device)
        workers = (Workers(str(model_dir), str(device), decode.precision, options.workers, stop=decode.stop)
                   if options.workers > 1 else None)
        return device, model, tokenizer, workers
    except BaseException:
        listener.close()
        raise


def _allowed_hosts(address: str, named: tuple[str, ...] = ()):
    """On a loopback address only loopback names are answered (no DNS rebinding), and the names
    --allowed-hosts adds: a reverse proxy on this machine that passes its clients' Host on (Caddy's
    default; found in review: every request through it was a 421). A server on another address is
    meant to be reached by names this process cannot know (None: any; --allowed-hosts is not
    needed there, and a list of it would leave out the addresses of a 0.0.0.0 server)."""
    if not _loopback(address):
        return None
    return LOOPBACK_NAMES | {ipv6_name(f"[{address}]") if ":" in address else address} | set(named)  # as HostCheck reads Host


def _loopback(address: str) -> bool:
    ip = ipaddress.ip_address(address)
    return ip.is_loopback or bool(getattr(ip, "ipv4_mapped", None) and ip.ipv4_mapped.is_loopback)  # ::ffff:127.0.0.1 (found in review)


def _proxies(forwarded_allow_ips: str | None) -> str | None:
    """--forwarded-allow-ips checked: addresses or networks, or '*'. uvicorn would take a typo
    for a socket path and trust nobody, unsaid."""
    if forwarded_allow_ips is None:
        return None
    for proxy in forwarded_allow_ips.split(","):
        if proxy.strip() != "*":
            try:
                ipaddress.ip_network(proxy.strip(), strict=False)
            except ValueError:
                raise ValueError(f"--forwarded-allow-ips: {proxy.strip()!r} is no IP address or network "
                                 "(give addresses separated by commas, or *)") from None
    return forwarded_allow_ips


def _uvicorn_config(app, options: ServeOptions, proxies: str | None) -> uvicorn.Config:
    # The batcher answers what is still queued at the drain deadline, and what is still decoding
    # DRAIN_GRACE_S later; uvicorn's own deadline, later still, then finds nothing to cancel.
    config = uvicorn.Config(app, log_level="info" if options.access_log else "warning", access_log=options.access_log,
                            http=guarded_protocol(options.read_timeout, options.max_connections),
                            timeout_graceful_shutdown=options.drain_seconds + DRAIN_GRACE_S + 5,
                            proxy_headers=proxies is not None, forwarded_allow_ips=proxies)
    logging.getLogger("uvicorn.access").addFilter(_hide_keys)  # after the Config, which sets the loggers up
    return config


def _hide_keys(record: logging.LogRecord) -> bool:
    """The access log's line with `?api_key=...` written as `api_key=...` hidden (found in review:
    --access-log wrote every key sent in the query)."""
    if isinstance(record.args, tuple) and len(record.args) > 2 and isinstance(record.args[2], str):
        record.args = (*record.args[:2], _QUERY_FIELD.sub(_hidden, record.args[2]), *record.args[3:])
    return True


_QUERY_FIELD = re.compile(r"([?&])([^=&#\s]*)=([^&#\s]*)")


def _hidden(field: re.Match) -> str:
    """A query field as logged: api_key's value hidden, however its name is escaped (api%5Fkey)."""
    return f"{field[1]}{field[2]}=***" if unquote_plus(field[2]) == "api_key" else field[0]


def _keys(path: str) -> dict:
    """The key file's keys, and a note where every user of the machine may read it (found in
    review: unsaid)."""
    keys = read_keys(path)
    if os.stat(path).st_mode & stat.S_IROTH:
        print(f"aiayn: note: {path} may be read by every user of this machine; chmod o-r {path}", file=sys.stderr, flush=True)
    return keys


def _start_up_notes(options: ServeOptions, loopback: bool, keys, origins: tuple[str, ...]) -> None:
    """A server beyond loopback without keys is open to whoever reaches it (as LibreTranslate's
    default is), and so is one on loopback behind a proxy (--allowed-hosts), and one whose
    --cors-origins is * to every page its users open: allowed, but said; and so are a --max-texts
    that --max-queue cuts and more workers than cores."""
    if (cap := connection_cap(options.max_connections)) < options.max_connections:  # (found by a fault hunt: unsaid)
        print(f"aiayn: note: the file descriptor limit leaves room for {cap:,} connection{'s' if cap != 1 else ''} "
              f"at once, not --max-connections {options.max_connections:,} ({RESERVED_DESCRIPTORS} descriptors are "
              f"kept for the server's own files); raise it with ulimit -n", file=sys.stderr, flush=True)
    if options.workers > (cores := torch.get_num_threads()):  # (found in review: unsaid)
        print(f"aiayn: note: --workers {options.workers} is more than the {cores} CPU threads PyTorch decodes on here: "
              "the workers take turns on them, each with its copy of the model; a worker a core decodes more "
              "(docs/serving-load.md)", file=sys.stderr, flush=True)
    if options.max_texts > options.max_queue:
        print(f"aiayn: note: a request may hold {options.max_queue} texts, --max-queue's size, not --max-texts "
              f"{options.max_texts}", file=sys.stderr, flush=True)
    if (not loopback or options.allowed_hosts) and keys is None:
        print("aiayn: note: any client that reaches this address may translate; --api-keys FILE asks for a key",
              file=sys.stderr, flush=True)
    elif "*" in origins and keys is None:
        print("aiayn: note: --cors-origins '*': any web page opened on this machine may translate with this server",
              file=sys.stderr, flush=True)


def serve(options: ServeOptions, decode: DecodeConfig) -> None:
    keys = _keys(options.api_keys) if options.api_keys else None
    proxies = _proxies(options.forwarded_allow_ips)
    origins, hosts = cors_origins(options.cors_origins), host_names(options.allowed_hosts)
    languages = _languages(options)  # before the model loads
    listener = _listen(options.host, options.port)
    device, model, tokenizer, workers = _load(options, decode, listener)
    with workers or contextlib.nullcontext():  # stopped however serving ends
        allowed = _allowed_hosts(listener.getsockname()[0], hosts)
        app = create_app(model, tokenizer, precision=decode.precision, stop=decode.stop, source=str(options.run_dir),
                         max_wait_ms=options.max_wait_ms, max_queue=options.max_queue,
                         max_texts=options.max_texts, max_input_tokens=options.max_input_tokens, allowed_hosts=allowed,
                         max_batch_mib=options.max_batch_mib, max_attention_mib=options.max_attention_mib,
                         languages=languages, admission=Admission(keys, options.req_limit),
                         decode_on_caller=True, engines=workers and workers.engines, cors_origins=origins)
        parameters = model.num_parameters()
        del model  # a bf16 or int8 server keeps only its decoding copy (with workers, none here), not the fp32 weights as well
        host, port = listener.getsockname()[:2]
        shown = f"[{host}]" if ":" in host else host
        on = f"{device}, {options.workers} workers" if workers else device
        print(f"serving {options.run_dir} ({parameters:,} parameters, {decode.precision} on {on}) at "
              f"http://{shown}:{port}/  (API: POST /translate, GET /health, /info, /openapi.json; "
              f"LibreTranslate: POST /translate with q, GET /languages, POST /detect)", flush=True)
        _start_up_notes(options, _loopback(listener.getsockname()[0]), keys, origins)
        config = _uvicorn_config(app, options, proxies)
        loop = None

        class Server(uvicorn.Server):
            def handle_exit(self, sig, frame) -> None:
                # A signal handler: it only schedules the drain, on the event loop, which takes locks;
                # a second signal stops the decoding loop at its next step (a flag, no lock).
                if self.should_exit:
                    app.state.batcher.abort(f"the server was stopped at once ({signal.Signals(sig).name} twice); retry")
                elif self.started:
                    loop.call_soon_threadsafe(app.state.drain, options.drain_seconds)
                super().handle_exit(sig, frame)

            async def startup(self, sockets=None) -> None:
                nonlocal loop
                loop = asyncio.get_running_loop()
                await super().startup(sockets)

        server = Server(config)
        # Off the main thread uvicorn installs no signal handlers: these stand in for its own. A
        # stop drains (above); a second Ctrl-C stops at once.
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, server.handle_exit)
        batcher = app.state.batcher

        def serve_http() -> None:
            try:
                server.run(sockets=[listener])
            finally:
                batcher.drain()  # uvicorn has stopped (or never started): so does the decoding loop

        http = threading.Thread(target=serve_http, name="aiayn-http")
        http.start()
        batcher.run()
        http.join()
    stats = batcher.stats
    counted = lambda n, what: f"{n:,} {what}{'s' if n != 1 else ''}"  # noqa: E731
    print(f"stopped: {counted(stats.requests, 'request')}, {counted(stats.texts, 'text')} in "
          f"{counted(stats.steps, 'decoding step')}", flush=True)
