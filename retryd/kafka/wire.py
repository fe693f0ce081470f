"""The few pieces of the Kafka wire protocol ``retryd.kafka.share_offsets`` needs.

librdkafka 2.16 (confluent-kafka 2.16) has no share-group admin API, so the share-group
offsets are read with requests written here: big-endian integers, the classic strings and
arrays (length prefixed by int16/int32) and the *flexible* encodings of KIP-482 (compact
strings and arrays, whose length + 1 is an unsigned varint, and tagged fields after every
struct). Only what the three requests use is implemented.

``Connection`` sends one request at a time on one socket, each bounded by a deadline (every
send and receive waits at most what is left of it) and by a response size cap checked before
the response is read.

One error type: whatever goes wrong below a caller (a connection refused, a TLS handshake, a
timeout, a peer that closes, and every response that does not decode) raises ``WireError``,
with the cause chained; callers never meet ``OSError``, ``UnicodeError`` or ``struct.error``.
A background reader (``retryd.share.lag``) must outlive any answer a broker, or anything
listening on its port, gives: issue 31 fault 7 was a FindCoordinator answer whose host the
IDNA codec refused (a 64-character label), whose ``UnicodeError`` got past the ``OSError``
handler and killed the share-lag thread.

Every read is bounds-checked: a truncated or malformed response raises ``WireError`` naming
where it broke, never an ``IndexError`` or a huge allocation (a length read from the wire is
checked against the bytes left before anything is read, and a response's size against
``max_response_bytes`` before it is received). Negative lengths other than -1 (null) are
malformed. ``decoder`` wraps each response decoder as a last net: an error a check above
missed still leaves as ``WireError``.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import socket
import ssl
import struct
import time
from collections.abc import Callable
from typing import ParamSpec, TypeVar

from retryd.errors import KafkaRuntimeError

API_VERSIONS = 18
MAX_RESPONSE_BYTES = 8 * 1024 * 1024

_I8 = struct.Struct(">b")
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")
_MAX_UVARINT = 0xFFFFFFFF  # Kafka's unsigned varints carry 32 bits
_SHOWN = 100  # at most this much of a peer's string goes into a message (and a log line)
# what decoding a hostile response can raise besides WireError, should a check miss it
_DECODE_ERRORS = (struct.error, ValueError, IndexError, KeyError, OverflowError)

P = ParamSpec("P")
T = TypeVar("T")


class WireError(KafkaRuntimeError):
    """A request that could not be made (connection, TLS, timeout) or a response that does
    not decode (truncated, oversize, a bad string or host, not what was asked for). A
    ``KafkaRuntimeError``: the next attempt may work, nothing about the set-up is wrong."""


def shown(text: str) -> str:
    """``text`` quoted and cut for a message: a peer's strings can be 32 KiB of anything."""
    return repr(text if len(text) <= _SHOWN else text[:_SHOWN] + "...")


def decoder(what: str) -> Callable[[Callable[P, T]], Callable[P, T]]:
    """Wrap a response decoder so nothing but ``WireError`` (and the caller's own errors,
    e.g. a broker's error code) leaves it; ``what`` names the response in the message."""

    def wrap(fn: Callable[P, T]) -> Callable[P, T]:
        @functools.wraps(fn)
        def decode(*args: P.args, **kwargs: P.kwargs) -> T:
            try:
                return fn(*args, **kwargs)
            except _DECODE_ERRORS as exc:
                raise WireError(f"malformed {what}: {type(exc).__name__}: {exc}") from exc

        return decode

    return wrap


def check_address(host: str | None, port: int, what: str) -> tuple[str, int]:
    """A broker address read from a response, checked before anything connects to it: a
    host the IDNA codec refuses (a label over 63 characters, an empty one) would raise
    ``UnicodeError`` from ``getaddrinfo``, and a port out of range ``OverflowError`` or a
    connection to another port."""
    if not host:
        raise WireError(f"malformed {what}: no host")
    if not 0 < port <= 0xFFFF:
        raise WireError(f"malformed {what}: port {port} of {shown(host)} is out of range")
    try:
        host.encode("idna")
    except UnicodeError as exc:
        raise WireError(
            f"malformed {what}: {shown(host)} is not a valid host name ({exc})"
        ) from exc
    return host, port


class Writer:
    """Builds one request body (or header) in order."""

    def __init__(self) -> None:
        self._parts: list[bytes] = []

    def bytes(self) -> bytes:
        return b"".join(self._parts)

    def int8(self, v: int) -> Writer:
        self._parts.append(_I8.pack(v))
        return self

    def int16(self, v: int) -> Writer:
        self._parts.append(_I16.pack(v))
        return self

    def int32(self, v: int) -> Writer:
        self._parts.append(_I32.pack(v))
        return self

    def int64(self, v: int) -> Writer:
        self._parts.append(_I64.pack(v))
        return self

    def uvarint(self, v: int) -> Writer:
        if v < 0:
            raise ValueError(f"uvarint of a negative number: {v}")
        out = bytearray()
        while v >= 0x80:
            out.append((v & 0x7F) | 0x80)
            v >>= 7
        out.append(v)
        self._parts.append(bytes(out))
        return self

    def string(self, s: str | None) -> Writer:
        """A classic (int16 length) nullable string, e.g. the request header's client id."""
        if s is None:
            return self.int16(-1)
        raw = s.encode("utf-8")
        self.int16(len(raw))
        self._parts.append(raw)
        return self

    def compact_string(self, s: str | None) -> Writer:
        """Length + 1 as an unsigned varint (0 = null), then the UTF-8 bytes."""
        if s is None:
            return self.uvarint(0)
        raw = s.encode("utf-8")
        self.uvarint(len(raw) + 1)
        self._parts.append(raw)
        return self

    def compact_array_length(self, n: int | None) -> Writer:
        """Announce a compact array of ``n`` items (None: a null array)."""
        return self.uvarint(0 if n is None else n + 1)

    def no_tags(self) -> Writer:
        """An empty tagged-field section (every flexible struct ends with one)."""
        return self.uvarint(0)


class Reader:
    """Reads one response body in order; every read checks that the bytes are there."""

    def __init__(self, data: bytes, what: str) -> None:
        self.data = memoryview(data)
        self.pos = 0
        self.what = what

    @property
    def left(self) -> int:
        return len(self.data) - self.pos

    def _take(self, n: int) -> memoryview:
        if n < 0 or n > self.left:
            raise WireError(
                f"truncated {self.what}: {n} bytes needed at byte {self.pos}, {self.left} left"
            )
        out = self.data[self.pos : self.pos + n]
        self.pos += n
        return out

    def int8(self) -> int:
        return int(_I8.unpack(self._take(1))[0])

    def int16(self) -> int:
        return int(_I16.unpack(self._take(2))[0])

    def int32(self) -> int:
        return int(_I32.unpack(self._take(4))[0])

    def int64(self) -> int:
        return int(_I64.unpack(self._take(8))[0])

    def uuid(self) -> bytes:
        return bytes(self._take(16))

    def uvarint(self) -> int:
        value, shift = 0, 0
        while True:
            byte = self._take(1)[0]
            value |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return value
            shift += 7
            if shift > 28:  # at most 5 bytes for 32 bits
                raise WireError(f"malformed {self.what}: varint longer than 5 bytes")
            if value > _MAX_UVARINT:
                raise WireError(f"malformed {self.what}: varint over 32 bits")

    def string(self) -> str | None:
        n = self._length(self.int16(), "string")
        if n < 0:
            return None
        return self._decode(self._take(n))

    def compact_string(self) -> str | None:
        n = self.uvarint()
        if n == 0:
            return None
        return self._decode(self._take(n - 1))

    def _decode(self, raw: memoryview) -> str:
        try:
            return bytes(raw).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise WireError(f"malformed {self.what}: a string is not UTF-8 ({exc})") from exc

    def array_length(self, min_item: int) -> int:
        """A classic array's length (int32, -1 = null read as 0)."""
        return self._checked(self._length(self.int32(), "array"), min_item)

    def _length(self, n: int, of: str) -> int:
        """-1 is null; any other negative length is malformed."""
        if n < -1:
            raise WireError(f"malformed {self.what}: {of} of length {n} at byte {self.pos}")
        return n

    def compact_array_length(self, min_item: int) -> int:
        """A compact array's length (null read as 0). ``min_item``: the fewest bytes one item
        takes, so a hostile length fails here, before any item is read."""
        return self._checked(self.uvarint() - 1, min_item)

    def _checked(self, n: int, min_item: int) -> int:
        if n < 0:
            return 0
        if n * min_item > self.left:
            raise WireError(
                f"malformed {self.what}: an array of {n} items cannot fit in {self.left} bytes"
            )
        return n

    def skip_tags(self) -> None:
        """Skip a tagged-field section: none of the tags matters here."""
        for _ in range(self._checked(self.uvarint(), 2)):
            self.uvarint()  # tag
            self._take(self.uvarint())

    def end(self) -> None:
        """Every byte of the response must have been read: more means a misread version."""
        if self.left:
            raise WireError(f"malformed {self.what}: {self.left} bytes left over")


def request_header(
    api_key: int, version: int, correlation_id: int, client_id: str, *, flexible: bool
) -> bytes:
    """Request header v1 (classic) or v2 (flexible: an empty tagged-field section)."""
    w = Writer().int16(api_key).int16(version).int32(correlation_id).string(client_id)
    if flexible:
        w.no_tags()
    return w.bytes()


def frame(header: bytes, body: bytes) -> bytes:
    """A request on the wire: its size (int32), then header and body."""
    return _I32.pack(len(header) + len(body)) + header + body


def response_body(payload: bytes, correlation_id: int, *, flexible: bool, what: str) -> Reader:
    """The body of a response, its header checked (v1: flexible, v0: classic; ApiVersions
    answers with v0 whatever its version)."""
    r = Reader(payload, what)
    got = r.int32()
    if got != correlation_id:
        raise WireError(f"{what}: correlation id {got}, expected {correlation_id}")
    if flexible:
        r.skip_tags()
    return r


class Connection:
    """One broker connection; every request waits at most ``timeout_s``."""

    _ids = itertools.count(1)

    def __init__(
        self,
        host: str,
        port: int,
        tls: ssl.SSLContext | None,
        timeout_s: float,
        *,
        client_id: str = "retryd-share-lag",
        max_response_bytes: int = MAX_RESPONSE_BYTES,
    ) -> None:
        self.host, self.port = host, port
        self.where = f"{host if len(host) <= _SHOWN else shown(host)}:{port}"
        self.timeout_s = timeout_s
        self.client_id = client_id
        self.max_response_bytes = max_response_bytes
        try:
            # ValueError: a host the IDNA codec refuses (UnicodeError), an embedded NUL;
            # OverflowError: a port out of range
            raw = socket.create_connection((host, port), timeout=timeout_s)
        except (OSError, ValueError, OverflowError) as exc:
            raise WireError(f"cannot connect to {self.where}: {exc}") from exc
        try:
            self.sock = tls.wrap_socket(raw, server_hostname=host) if tls else raw
        except (OSError, ValueError) as exc:  # ssl.SSLError and CertificateError included
            raw.close()
            raise WireError(f"TLS with {self.where} failed: {exc}") from exc

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()

    def __enter__(self) -> Connection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def request(
        self, api_key: int, version: int, body: bytes, *, flexible: bool, what: str
    ) -> Reader:
        """Send one request and read its response; ``flexible``: request header v2 and
        response header v1 (ApiVersions' response header is always v0)."""
        correlation = next(self._ids) & 0x7FFFFFFF
        header = request_header(api_key, version, correlation, self.client_id, flexible=flexible)
        deadline = time.monotonic() + self.timeout_s
        try:
            self._settime(deadline)
            self.sock.sendall(frame(header, body))
            size = int.from_bytes(self._exactly(4, deadline, what), "big", signed=True)
            if size < 4 or size > self.max_response_bytes:
                raise WireError(
                    f"{what} from {self.where}: a {size}-byte response (limit "
                    f"{self.max_response_bytes}): not a Kafka response to this request"
                )
            payload = self._exactly(size, deadline, what)
        except TimeoutError as exc:
            raise WireError(
                f"{what} to {self.where}: no response within {self.timeout_s:g}s"
            ) from exc
        except (OSError, ValueError) as exc:  # ValueError: e.g. a TLS socket closed under us
            raise WireError(f"{what} to {self.where} failed: {exc}") from exc
        reply_flexible = flexible and api_key != API_VERSIONS
        return response_body(payload, correlation, flexible=reply_flexible, what=what)

    def _settime(self, deadline: float) -> None:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError
        self.sock.settimeout(left)

    def _exactly(self, n: int, deadline: float, what: str) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            self._settime(deadline)
            chunk = self.sock.recv(min(n - len(buf), 65536))
            if not chunk:
                raise WireError(
                    f"{what}: {self.where} closed the connection after {len(buf)} of {n} bytes"
                )
            buf += chunk
        return bytes(buf)
