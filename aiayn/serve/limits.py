"""Keys and request rates, for a server reached from beyond this machine (as LibreTranslate's
--api-keys and --req-limit).

- A key file (`aiayn serve --api-keys FILE`): one key a line, optionally followed by that key's
  own limit in requests per minute; `#` at a line's start or after a space starts a comment (a
  key may hold one: found in review, "pass#word" was read as "pass"). With one, every translation request
  needs a key of the file (403 otherwise), from the LibreTranslate field `api_key`, the query
  parameter `api_key`, or the header `Authorization: Bearer KEY`.
- A rate per address (`--req-limit N` requests per minute), and a key's own rate: over either,
  429 with Retry-After, the seconds until one more request is allowed. A request with a wrong
  key or none costs its address a request too, so keys cannot be guessed faster than the rate.
  An address is counted as what it is, however written: IPv4 (an IPv4-mapped IPv6 address as its
  IPv4), IPv6 by its /64, the least a client is given (found in review: each of a /64's
  addresses, and each spelling of one, had a rate of its own).

Rates are token buckets: a client may send its minute's requests (at least one) at once, then one
every 60 / N seconds. Without a key file and a rate, everything is open, as before.
"""

from __future__ import annotations

import ipaddress
import math
import re
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional, Union

from starlette.exceptions import HTTPException

from aiayn.config import REQUESTS_PER_MINUTE


MAX_BUCKETS = 100_000  # rate-limit entries kept before the full ones are dropped


class Refused(HTTPException):
    """403 or 429, with the Retry-After header for the latter."""


def read_keys(path: Union[str, Path]) -> dict[str, Optional[float]]:
    """key -> its requests per minute (None: the address rate only), from a key file. A key is
    printable ASCII, which an `Authorization` header can carry as written, and is given once
    (found by a misuse hunt: "clé" was refused in the header, and a key given twice took its
    last line's rate, none)."""
    keys: dict[str, Optional[float]] = {}
    lines_of: dict[str, int] = {}
    least, most = REQUESTS_PER_MINUTE
    try:
        lines = Path(path).read_text(encoding="utf-8-sig").splitlines()  # a byte-order mark is no part of a key
    except FileNotFoundError:
        raise FileNotFoundError(f"no such key file: {path}") from None
    except UnicodeDecodeError:
        raise ValueError(f"{path} is not UTF-8 text: a key file holds one key a line") from None
    for number, line in enumerate(lines, start=1):
        words = re.split(r"(?:^|\s)#", line, maxsplit=1)[0].split()
        if not words:
            continue
        if len(words) > 2:
            raise ValueError(f"{path}, line {number}: expected KEY or KEY REQUESTS_PER_MINUTE")
        limit = None
        if len(words) == 2:
            try:
                limit = float(words[1])
            except ValueError:
                limit = -1.0
            if not least <= limit <= most:
                raise ValueError(f"{path}, line {number}: the requests per minute must be a number from {least:g} "
                                 f"to {most:,.0f}")
        if not (words[0].isascii() and words[0].isprintable()):
            raise ValueError(f"{path}, line {number}: a key is printable ASCII, as a header carries it")
        if words[0] in lines_of:
            raise ValueError(f"{path}, line {number}: the key of line {lines_of[words[0]]} again; give each key once")
        keys[words[0]], lines_of[words[0]] = limit, number
    if not keys:
        raise ValueError(f"{path} holds no key")
    return keys


def bearer_key(headers) -> Optional[str]:
    """The key of an `Authorization: Bearer KEY` header, or None."""
    value = headers.get("authorization", "")
    return value[7:].strip() if value.lower().startswith("bearer ") else None


def client_address(address: str) -> str:
    """The address a rate counts: IPv4 as is, an IPv4-mapped IPv6 address as its IPv4, IPv6 by its
    /64; text that is no address (a test client's name) as given."""
    try:
        ip = ipaddress.ip_address(address.strip("[]"))
    except ValueError:
        return address
    if ip.version == 6 and ip.ipv4_mapped is not None:
        return str(ip.ipv4_mapped)
    return str(ipaddress.ip_network(f"{ip}/64", strict=False)) if ip.version == 6 else str(ip)


def _room(per_minute: float) -> float:
    """The requests a bucket holds when full: a minute's, and at least one, so that a rate under
    one request a minute still admits one request every 60 / rate seconds."""
    return max(per_minute, 1.0)


@dataclass
class _Bucket:
    tokens: float
    stamp: float


@dataclass
class Admission:
    """Who may send a translation request now. `keys` None: no key needed; `per_address`
    None: no rate per address. `clock` is for tests."""

    keys: Optional[dict[str, Optional[float]]] = None
    per_address: Optional[float] = None
    clock: Callable[[], float] = time.monotonic
    _buckets: dict = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def key_required(self) -> bool:
        return self.keys is not None

    def admit(self, address: str, key: object) -> None:
        """Take one request from the address's and the key's allowance, or raise `Refused`: a
        request without a valid key is refused after it has taken its address's (403, or 429
        where that is spent)."""
        limits, refused = [], None
        if self.keys is not None:
            if not key:
                refused = Refused(403, "Please provide an API key (api_key)")
            elif not isinstance(key, str) or key not in self.keys:  # a JSON body may send any type
                refused = Refused(403, "Invalid API key")
            elif self.keys[key] is not None:
                limits.append((("key", key), self.keys[key]))
        if self.per_address is not None:
            limits.append((("address", client_address(address)), self.per_address))
        with self._lock:
            now = self.clock()
            if len(self._buckets) > MAX_BUCKETS:
                self._forget_full(now)
            waits = [self._wait(name, per_minute, now) for name, per_minute in limits]
            if any(waits):
                wait = max(waits)
                over = " and ".join(f"{per_minute:g} requests a minute per {kind}"
                                    for ((kind, _), per_minute), waited in zip(limits, waits) if waited)
                raise Refused(429, f"Too many requests: over {over}; retry in {math.ceil(wait)} s",
                              headers={"Retry-After": str(max(1, math.ceil(wait)))})
            for name, _ in limits:  # taken only when every bucket has one
                self._buckets[name].tokens -= 1
        if refused is not None:
            raise refused

    def _wait(self, name: tuple, per_minute: float, now: float) -> float:
        """Seconds until `name`'s bucket holds a request (0: it holds one now), refilled first."""
        rate, room = per_minute / 60.0, _room(per_minute)
        bucket = self._buckets.setdefault(name, _Bucket(room, now))
        bucket.tokens = min(room, bucket.tokens + (now - bucket.stamp) * rate)
        bucket.stamp = now
        return 0.0 if bucket.tokens >= 1 else (1 - bucket.tokens) / rate

    def _forget_full(self, now: float) -> None:
        """Drop the buckets that have refilled: they hold nothing a new bucket would not, and
        without this, clients from ever new addresses would grow the table without bound."""
        for name, bucket in list(self._buckets.items()):
            per_minute = self.per_address if name[0] == "address" else (self.keys or {}).get(name[1])
            if per_minute is None or bucket.tokens + (now - bucket.stamp) * per_minute / 60.0 >= _room(per_minute):
                del self._buckets[name]
