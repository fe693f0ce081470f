"""HTTP/1.1 response framing for the lean client (``retryd.handlers.http_pool``): bytes in, one
answer per call out, no I/O, so that it can be checked byte for byte against h11
(``tests/unit/test_http_framing_oracle.py`` does, on generated streams).

Why not httptools (what the pool used before): llhttp ends a message at an interim ``1xx``
head, so a ``103 Early Hints`` became the call's answer and the real answer the next call's;
and it reads trailers without any bound (a trailer that never ends was buffered until the
deadline). Why not h11 itself: 35-60 µs per answer in pure Python, against about 2-3 µs here
for the common answer (one regex checks the whole head, one more finds the fields read);
llhttp took about 1 µs.

The grammar (``retryd.handlers.http_syntax``) and the framing decisions are h11's (0.16):
``\\n`` taken for ``\\r\\n`` in heads and trailers, obsolete line folding joined, Content-Length
and Transfer-Encoding checked in every head and trailer section, no body for 204 and 304,
Transfer-Encoding (``chunked`` only) over Content-Length, else the body ends with the
connection; ``Connection: close`` or a version below 1.1 ends it after the answer. On top:

* an interim ``1xx`` answer is parsed, validated and skipped (RFC 9110 §15.2); a
  ``101 Switching Protocols`` was never asked for: an error;
* one bound, ``max_head`` bytes, on everything a call receives that is not body: ``1xx``
  heads, the head, chunk-size lines and the CRLF after each chunk, trailers. Past it the call
  fails (nothing of that kind is buffered without bound, and no call can stall the loop);
* at most ``max_body`` bytes of body are kept: reaching that ends the call (``cut``), the rest
  is never read, and the connection cannot be reused;
* bytes after the end of an answer (a 204's body, say) were not asked for: the connection
  cannot be trusted, so it is not reused.

Everything malformed raises ``HttpFramingError``, and nothing else: the pool fails that call
(retryable) and closes the connection.
"""

from __future__ import annotations

from retryd.handlers.http_syntax import (
    BLANK_RE,
    CHUNK_LINE_RE,
    FAST_HEAD_RE,
    FRAMING_FIELDS_RE,
    STATUS_RE,
    HttpFramingError,
    check_fields,
    content_length,
    framing_fields,
    header_fields,
    split_lines,
)

__all__ = ["MAX_HEAD_BYTES", "HttpFramingError", "Response", "ResponseReader"]

# Everything of an answer that is not body (see the module docstring) past this size fails the
# call: aiohttp's limit is 8 KiB a line; this bounds what a broken or hostile service can make
# the worker buffer per connection.
MAX_HEAD_BYTES = 64 * 1024


class Response:
    """What the handler needs of an answer: status, two headers, the (capped) body."""

    __slots__ = ("body", "content_type", "error_header", "status")

    def __init__(self) -> None:
        self.status = 0
        self.content_type: str | None = None
        self.error_header: str | None = None
        self.body = b""


# reader states
_HEAD, _LENGTH, _CHUNK_LINE, _CHUNK_DATA, _CHUNK_END, _TRAILER, _TO_CLOSE, _DONE = range(8)


class ResponseReader:
    """The answers on one connection, one call at a time: ``begin`` a call, ``feed`` it what
    the socket delivers (and ``feed_eof`` when the server closes) until it returns the
    ``Response``; then ``reusable`` says whether the connection may carry another call."""

    __slots__ = (
        "_body",
        "_budget",
        "_buf",
        "_close",
        "_remaining",
        "_response",
        "_scan",
        "_size",
        "_state",
        "max_body",
        "max_head",
        "received",
        "reusable",
    )

    def __init__(self, max_body: int, max_head: int = MAX_HEAD_BYTES) -> None:
        self.max_body = max_body
        self.max_head = max_head
        self._buf = bytearray()  # an incomplete head, chunk line or trailer section
        self._remaining = 0  # of a Content-Length body or of a chunk (set with the state)
        self._close = False  # the connection ends after this answer (set by the head)
        self.begin()

    def begin(self) -> None:
        """A new call on this connection (the previous answer was complete and clean)."""
        self._state = _HEAD
        self._budget = self.max_head  # of bytes that are not body, for this call
        self._scan = 0  # where the search for the end of ``_buf``'s element resumes
        self._body: list[bytes] = []
        self._size = 0
        self._response = Response()
        self.received = False  # any byte for this call (none: the connection was closed idle)
        self.reusable = False
        if self._buf:
            self._buf.clear()

    # -- input
    def feed(self, data: bytes) -> Response | None:
        """The answer once ``data`` completes it, else None; raises ``HttpFramingError``."""
        if not data:
            return None
        self.received = True
        state = self._state
        pending = self._buf
        if state == _HEAD and not pending:  # the common case: a head, often all, at once
            pos = self._head(data, 0)
            if pos >= 0:
                state = self._state
                if state == _DONE:  # no body (204, 304, Content-Length: 0)
                    if pos < len(data):
                        self.reusable = False
                    return self._response
                if state == _LENGTH:
                    size = self._remaining
                    if len(data) - pos == size and size < self.max_body:  # all of the body
                        self._body.append(data[pos:])
                        self._size = size
                        return self._finish()
                pos = self._parse(data, pos)
            else:
                pos = -pos - 1
            buf: bytes | bytearray = data
        elif state == _DONE:  # bytes after the answer: nobody asked for them
            self.reusable = False
            return None
        elif pending:
            pending += data
            buf = pending
            pos = self._parse(buf, 0)
        else:
            buf = data
            pos = self._parse(buf, 0)
        if self._state == _DONE:
            if pos < len(buf):
                self.reusable = False
            if pending:
                pending.clear()
            return self._response
        if pos < len(buf):  # an incomplete element: keep it (only it: body bytes are taken)
            if buf is pending:
                del pending[:pos]
            else:
                pending += buf[pos:]
        elif pending:
            pending.clear()
        return None

    def feed_eof(self) -> Response | None:
        """The server closed the connection: the answer if that ends it (no length given), None
        if nothing at all came for this call; raises ``HttpFramingError`` on an answer cut
        short."""
        state = self._state
        if state == _TO_CLOSE:
            return self._finish()
        if state == _DONE:
            return None
        if state == _HEAD and not self.received:
            return None
        raise HttpFramingError("the server closed the connection in the middle of an answer")

    # -- the state machine
    def _parse(self, buf: bytes | bytearray, pos: int) -> int:
        """Consume what ``buf`` holds from ``pos``; the position where parsing stopped."""
        end = len(buf)
        while True:
            state = self._state
            if state == _HEAD:
                if pos >= end:
                    return pos
                pos = self._head(buf, pos)
            elif state == _LENGTH:
                if pos >= end:
                    return pos
                take = self._remaining
                if take == end - pos and take < self.max_body - self._size:  # all of it
                    self._body.append(bytes(buf[pos:]))
                    self._size += take
                    self._finish()
                    return end
                take = min(take, end - pos)
                self._remaining -= take
                pos = self._add_body(buf, pos, take)
                if self._remaining == 0 and self._state != _DONE:
                    self._finish()
            elif state == _CHUNK_DATA:
                if pos >= end:
                    return pos
                take = min(self._remaining, end - pos)
                self._remaining -= take
                pos = self._add_body(buf, pos, take)
                if self._remaining == 0 and self._state != _DONE:
                    self._state = _CHUNK_END
                    self._remaining = 2
            elif state == _CHUNK_END:  # the CRLF after a chunk, maybe in pieces
                if pos >= end:
                    return pos
                take = min(self._remaining, end - pos)
                expected = b"\r\n"[2 - self._remaining : 2 - self._remaining + take]
                if buf[pos : pos + take] != expected:
                    raise HttpFramingError("malformed chunk footer (no CRLF after the chunk)")
                self._spend(take)
                pos += take
                self._remaining -= take
                if self._remaining == 0:
                    self._state = _CHUNK_LINE
            elif state == _CHUNK_LINE:
                if pos >= end:
                    return pos
                pos = self._chunk_line(buf, pos)
            elif state == _TRAILER:
                if pos >= end:
                    return pos
                pos = self._trailer(buf, pos)
            elif state == _TO_CLOSE:
                if pos < end:
                    pos = self._add_body(buf, pos, end - pos)
                return pos
            else:  # _DONE
                return pos
            if pos < 0:  # an incomplete element: wait for more
                return -pos - 1

    def _spend(self, size: int) -> None:
        """Count ``size`` bytes that are not body against the call's one bound."""
        self._budget -= size
        if self._budget < 0:
            raise HttpFramingError(
                f"more than {self.max_head} bytes of head, interim answers, chunk lines and "
                "trailers"
            )

    def _wait(self, buf: bytes | bytearray, pos: int) -> int:
        """More bytes are needed for the element at ``pos``: it may not outgrow the bound."""
        if len(buf) - pos > self._budget:
            self._spend(len(buf) - pos)
        self._scan = max(0, len(buf) - pos - 3)
        return -pos - 1

    def _head(self, buf: bytes | bytearray, pos: int) -> int:
        """A head at ``pos``: an interim one is checked and skipped, the answer's sets the
        framing. Where it ends, or ``-pos - 1`` while it is incomplete (as every element)."""
        if buf[pos] < 0x21:  # as h11: a head starts with a visible character
            raise HttpFramingError("the answer does not start with a status line")
        scan = self._scan
        end = buf.find(b"\r\n\r\n", pos + scan)
        fast = None if end < 0 else FAST_HEAD_RE.fullmatch(buf, pos, end + 4)
        if fast is not None:  # (then no blank line comes before ``end``)
            head_end = end + 4
            self._scan = 0
            self._budget -= head_end - pos
            if self._budget < 0:
                self._spend(0)  # (raises)
            if type(buf) is not bytes:  # (the pending bytearray: values are hashed below)
                buf = bytes(buf)
            version, status_text = fast[1], fast[2]
            # the fields framing and the handler read, as (name, value with spaces around)
            fields = FRAMING_FIELDS_RE.findall(buf, fast.start(3) - 1, end + 2)
        else:
            match = BLANK_RE.search(buf, pos + scan)
            if match is None:
                return self._wait(buf, pos)
            head_end = match.end()
            self._scan = 0
            self._spend(head_end - pos)
            lines = split_lines(bytes(buf[pos:head_end]))
            status_line = STATUS_RE.fullmatch(lines[0])
            if status_line is None:
                raise HttpFramingError(f"illegal status line: {lines[0][:80]!r}")
            version, status_text = status_line[1], status_line[2]
            fields = framing_fields(header_fields(lines[1:]))
        status = int(status_text)
        if status < 200:
            if status < 100:
                raise HttpFramingError(f"status {status_text!r} is no HTTP status")
            if status == 101:  # never asked for (no Upgrade is ever sent)
                raise HttpFramingError("101 Switching Protocols, never asked for")
            check_fields(fields)  # an interim answer (100 Continue, 103 Early Hints): skipped
            return head_end
        # the answer's head: what the handler reads of it, and how its body is framed
        response = self._response
        response.status = status
        length: bytes | None = None
        chunked = False
        close = version < b"1.1"
        for name, value in fields:
            size = len(name)
            if size == 14:
                if name[0] in b"cC":
                    value = value.strip(b" \t")
                    if length is None and value.isdigit() and len(value) <= 20:
                        length = value  # (bytes.isdigit: ASCII digits only)
                    else:
                        length = content_length(value, length)
                else:
                    response.error_header = value.strip(b" \t").decode("latin-1")
            elif size == 12:
                response.content_type = value.strip(b" \t").decode("latin-1")
            elif size == 10:
                if not close:
                    close = b"close" in [t.strip() for t in value.lower().split(b",")]
            elif chunked or value.strip(b" \t").lower() != b"chunked":  # Transfer-Encoding
                raise HttpFramingError("a Transfer-Encoding other than one chunked")
            else:
                chunked = True
        self._close = close
        if status == 204 or status == 304:
            self._finish()
        elif chunked:
            self._state = _CHUNK_LINE
        elif length is not None:
            self._remaining = int(length)
            if self._remaining:
                self._state = _LENGTH
            else:
                self._finish()
        else:
            self._close = True
            self._state = _TO_CLOSE
        return head_end

    def _chunk_line(self, buf: bytes | bytearray, pos: int) -> int:
        """A chunk-size line (extensions ignored, as h11 does); size 0 starts the trailers."""
        line_end = buf.find(b"\r\n", pos + self._scan)
        if line_end < 0:
            return self._wait(buf, pos)
        line_end += 2
        self._scan = 0
        self._spend(line_end - pos)
        match = CHUNK_LINE_RE.fullmatch(buf, pos, line_end)
        if match is None:
            raise HttpFramingError(f"illegal chunk header: {bytes(buf[pos:line_end][:80])!r}")
        size = int(match[1], 16)
        if size:
            self._state = _CHUNK_DATA
            self._remaining = size
        else:
            self._state = _TRAILER
        return line_end

    def _trailer(self, buf: bytes | bytearray, pos: int) -> int:
        """The trailer section after the last chunk: checked as h11 does, never kept."""
        first = buf[pos]
        if first == 0x0A:  # no trailers (bare LF)
            self._spend(1)
            self._finish()
            return pos + 1
        if first == 0x0D and buf[pos + 1 : pos + 2] == b"\n":  # no trailers: the common end
            self._spend(2)
            self._finish()
            return pos + 2
        match = BLANK_RE.search(buf, pos + self._scan)
        if match is None:
            return self._wait(buf, pos)
        section_end = match.end()
        self._scan = 0
        self._spend(section_end - pos)
        check_fields(framing_fields(header_fields(split_lines(bytes(buf[pos:section_end])))))
        self._finish()
        return section_end

    def _add_body(self, buf: bytes | bytearray, pos: int, take: int) -> int:
        """Keep ``take`` body bytes, up to ``max_body``: reaching it ends the call."""
        room = self.max_body - self._size
        if take >= room:  # the cap: the rest is never read
            take = room
            self._close = True
            self._state = _DONE
        if take:
            self._body.append(bytes(buf[pos : pos + take]))  # (all of a bytes ``buf``: no copy)
            self._size += take
        if self._state == _DONE:
            self._finish()
        return pos + take

    def _finish(self) -> Response:
        """The answer is complete (or cut): its body joined, its connection judged."""
        self._state = _DONE
        body = self._body
        response = self._response
        if body:
            response.body = body[0] if len(body) == 1 else b"".join(body)
        self.reusable = not self._close
        return response
