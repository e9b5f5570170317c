"""Who may call the server: the Host names it answers to, the web pages (origins) that may use
it from a browser, and the CORS headers that let the pages named read its answers.

A browser sends any page's request to any address, naming the page's site in Origin, and lets
the page read the answer only where the server's CORS headers allow that origin. LibreTranslate
allows every origin. aiayn answers, on a loopback address, its own page, clients that are no web
page (no Origin: curl, libretranslatepy) and browser extensions (an origin no web page can
send); the pages of other sites only where `--cors-origins` names them (or `*`: every site).
"""

from __future__ import annotations

import ipaddress
import re
from typing import Optional
from urllib.parse import urlsplit

from fastapi.responses import JSONResponse
from starlette.middleware.cors import CORSMiddleware

LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "[::1]"})
# An extension's own pages and background scripts, which only an installed extension can send
# as its Origin (a LibreTranslate browser extension pointed at a local server).
EXTENSION_SCHEMES = frozenset({"chrome-extension", "moz-extension", "safari-web-extension"})
_ORIGIN = re.compile(r"[a-z][a-z0-9+.-]*://[^/?#\s,]+")


def error(status: int, message: str, headers: Optional[dict] = None) -> JSONResponse:
    """Every error the server sends: {"error": "one line"}."""
    return JSONResponse({"error": message}, status_code=status, headers=headers)


class HostCheck:
    """Answer only requests whose Host header names this server (421 otherwise). A server on a
    loopback address is then out of reach of DNS rebinding: a page from evil.example whose name
    has been pointed at 127.0.0.1 sends Host: evil.example. Nor does it answer another site's page
    (403): a browser sends a page's form or text POST to any address without asking, and names the
    page's site in Origin (found in review: any page the user opened could make a local server
    translate), unless it is a browser extension's or one of `origins` (--cors-origins; "*" any).
    `allowed` None: any Host and Origin. Two Host headers are a 400 (RFC 9112)."""

    def __init__(self, app, allowed: Optional[frozenset] = LOOPBACK_NAMES, origins: tuple[str, ...] = ()) -> None:
        self.app, self.allowed, self.origins = app, allowed, frozenset(origins)

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http":
            hosts = [value for name, value in scope["headers"] if name == b"host"]
            if len(hosts) > 1:  # (found in review: the last one was judged)
                return await error(400, "the request has more than one Host header")(scope, receive, send)
            if self.allowed is not None and hosts:  # HTTP/1.0 may send none; a browser always does
                name = hosts[0].decode("latin-1").lower()
                name = ipv6_name(name.rsplit(":", 1)[0] if not name.endswith("]") else name).rstrip(".")  # no port, no root dot
                if name not in self.allowed:
                    message = (f"this server answers to {', '.join(sorted(self.allowed))}, not to Host {name!r} "
                               "(a proxy that passes its Host on: aiayn serve --allowed-hosts NAME)")
                    return await error(421, message)(scope, receive, send)
            origin = dict(scope["headers"]).get(b"origin")
            if self.allowed is not None and origin is not None and not self._may_call(origin):
                message = (f"a page of {origin.decode('latin-1')!r} may not use this server; it answers its own "
                           "page, browser extensions and clients that are no web page (--cors-origins names sites)")
                return await error(403, message)(scope, receive, send)
        await self.app(scope, receive, send)

    def _may_call(self, origin: bytes) -> bool:
        """A loopback server's own page, an extension, or a site --cors-origins names."""
        text = origin.decode("latin-1").lower()
        return (_origin_host(origin) in self.allowed or text.split("://", 1)[0] in EXTENSION_SCHEMES
                or text in self.origins or "*" in self.origins)


def _origin_host(origin: bytes) -> Optional[str]:
    """The host an Origin header names, as a Host header would ("[::1]"); None for "null" (a
    page of no site: a file, a sandbox) and for what is no origin."""
    try:
        host = urlsplit(origin.decode("latin-1")).hostname
    except ValueError:
        return None
    return None if host is None else ipv6_name(f"[{host}]") if ":" in host else host.rstrip(".")


def ipv6_name(name: str) -> str:
    """A bracketed IPv6 address in one spelling, Python's (a browser writes ::ffff:127.0.0.1 as
    ::ffff:7f00:1: found in review); any other name as it is."""
    if name.startswith("[") and name.endswith("]"):
        try:
            return f"[{ipaddress.ip_address(name[1:-1])}]"
        except ValueError:
            pass
    return name


_HOST = re.compile(r"[a-z0-9]([a-z0-9-]*[a-z0-9])?(\.[a-z0-9]([a-z0-9-]*[a-z0-9])?)*\.?")


def host_names(text: Optional[str]) -> tuple[str, ...]:
    """--allowed-hosts checked: names a Host header may give (no port), comma-separated."""
    if text is None:
        return ()
    names = []
    for name in (part.strip().lower().rstrip(".") for part in text.split(",")):
        if not (_HOST.fullmatch(name) or name.startswith("[") and name.endswith("]") and _ipv6(name[1:-1])):
            raise ValueError(f"--allowed-hosts: {name!r} is not a host name: give names as a Host header holds them, "
                             "without a port, e.g. translate.example.com or [2001:db8::1]")
        names.append(ipv6_name(name))
    return tuple(names)


def _ipv6(text: str) -> bool:
    try:
        return ipaddress.ip_address(text).version == 6
    except ValueError:
        return False


def cors_origins(text: Optional[str]) -> tuple[str, ...]:
    """--cors-origins checked: origins (scheme://host[:port], as a browser sends them in Origin),
    comma-separated, or * for every site; none by default. An origin is written as a browser
    writes it: lower case, without its scheme's default port (found in review: https://a:443
    was taken and then matched nothing); one no browser sends (a wildcard, a user, a name not in
    ASCII, which a browser sends as punycode) is refused, not left to match nothing."""
    if text is None:
        return ()
    return tuple(_origin(origin.strip().lower()) for origin in text.split(","))


def _origin(origin: str) -> str:
    if origin == "*":
        return origin
    parts = urlsplit(origin) if _ORIGIN.fullmatch(origin) and origin.isascii() else None
    try:
        port = parts and parts.port
    except ValueError:  # a port that is no number, or past 65535
        parts = None
    if not parts or not parts.hostname or "@" in parts.netloc or "*" in parts.netloc:
        raise ValueError(f"--cors-origins: {origin!r} is not an origin: scheme://host[:port] as a browser sends it "
                         "(no path, no trailing /, no wildcard), e.g. http://localhost:3000, or * for every site")
    default = {"http": 80, "https": 443}.get(parts.scheme)
    return f"{parts.scheme}://{parts.netloc.rsplit(':', 1)[0] if port else parts.netloc}" + (
        f":{port}" if port and port != default else "")


def add_origin_checks(app, allowed_hosts: Optional[frozenset], origins: tuple[str, ...]) -> None:
    """The outermost layers of `app`: HostCheck first, then, for `origins`, CORS: the preflight
    of a page's JSON POST answered, and every answer to those pages readable by them."""
    if origins:
        app.add_middleware(CORSMiddleware, allow_origins=list(origins), allow_methods=["GET", "POST"],
                           allow_headers=["Content-Type", "Authorization"], expose_headers=["Retry-After"],
                           max_age=86400)
    app.add_middleware(HostCheck, allowed=allowed_hosts, origins=origins)  # added last, so it runs first
