"""HTTP/1.1 wire rules of the built-in server, with no I/O (sans-I/O, in the manner of h11).

Why it exists: what the bytes of a request and a response mean is decided here, apart from
sockets, threads and clocks, so that every rule is a function of bytes and values that a
unit test can call (``tests/unit/test_http_rules.py``), and the server (``server.py``, with
the socket reads and writes of one connection in ``connection.py``) only moves bytes and
keeps time. The subset is what a WSGI server needs:

- the request head: where it ends in the received bytes (empty lines before it skipped),
  the request line, the headers, their limits (414, 431), and every refusal as a
  ``ProtocolError`` that carries the status and the code the server answers with;
- the request body's framing: ``Content-Length``, chunked, or none (a request without
  either has an empty body), with the conflicts refused (400, 501);
- a chunked body decoder fed bytes as they arrive (chunk-size lines, the CRLF after each
  chunk's data, trailers), which hands back the bytes past the body (the next request);
- the response head: the status line, the application's headers without the hop-by-hop
  ones, ``Date``, the framing (``Content-Length``, chunked on HTTP/1.1, close on
  HTTP/1.0, none for ``HEAD``, 1xx, 204 and 304) and the ``Connection`` header;
- the server's own answers, JSON like the application's: ``{"error": {"code", "message"}}``;
- and, for the kernel client's streaming calls (``kernel_client.connections``), a response
  head as a client reads it: the status line, the headers, the body's framing
  (``parse_response_head``), under the same rules and h11 as the oracle again.

What is accepted is what RFC 9110/9112 allow, and never more than h11 accepts (the tests
hold the server to h11 as an oracle, ``tests/flow/test_http_oracle.py``): header names
are tokens; a value is visible ASCII, obs-text (0x80-0xFF), SP and HTAB, with no other
control byte (CR, LF, NUL, VT, DEL, ...); the optional whitespace around a value or a list
element is SP and HTAB only; a line ends with CRLF or LF, never with a bare CR; the
request target is visible ASCII; an HTTP/1.1 request has exactly one ``Host`` (any
request at most one), a valid ``uri-host[:port]``; ``Content-Length`` is ASCII digits,
equal if repeated; ``Transfer-Encoding`` is a list whose one coding is ``chunked``
(empty elements refused); a chunk-size line is hex digits, optional extensions and
CRLF, the data is followed by CRLF, trailers are header lines ending with CRLF. A lenient
reading of any of these is how a request is smuggled past a proxy that reads it otherwise.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from email.utils import formatdate
from enum import Enum
from functools import lru_cache
from http import HTTPStatus

MAX_REQUEST_LINE = 8 * 1024
MAX_CHUNK_LINE = 4 * 1024
MAX_TRAILERS = 8 * 1024

CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
"""The interim answer to ``Expect: 100-continue``."""
LAST_CHUNK = b"0\r\n\r\n"
"""The end of a chunked response body (no trailers)."""

_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_HEAD_END = re.compile(rb"\r?\n\r?\n")
_EMPTY_LINES = re.compile(rb"(?:\r?\n)+")
_FORBIDDEN = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")
"""The bytes no line of a head may hold: the control bytes but HTAB (its CRLF or LF is gone)."""
_CONTROL_IN_HEAD = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
"""The same over a whole head, searched once: a control byte but HTAB, LF and CR (a CR is
allowed only in a CRLF, checked apart: a character class is scanned much faster)."""
_TARGET = re.compile(r"[\x21-\x7e]+")
_HOST = re.compile(r"(?:\[[0-9A-Za-z:.]+\]|[0-9A-Za-z._~!$&'()*+,;=%-]*)(?::[0-9]*)?")
"""``uri-host [":" port]`` (RFC 9110 7.2): an IP literal or a reg-name (an empty one too)."""
_DIGITS = re.compile(r"[0-9]{1,18}")
_CHUNK_SIZE = re.compile(rb"([0-9A-Fa-f]{1,15})(?:;[\t\x20-\x7e\x80-\xff]*)?[ \t]*\r\n")
"""A chunk-size line: hex digits, optional extensions (not parsed, no control byte), CRLF;
trailing SP/HTAB as h11 takes them, never whitespace before the size."""
_HOP_BY_HOP = frozenset(("connection", "keep-alive", "transfer-encoding", "upgrade", "te", "trailer"))
_FRAMING_HEADERS = frozenset(("connection", "transfer-encoding", "content-length"))
_TOKENS_SEEN: set[str] = set()  # header names already found valid (a few dozen in practice)
_HOSTS_SEEN: set[str] = set()  # Host values already found valid (the server's few names in practice)


def is_token(name: str) -> bool:
    """Whether ``name`` is an RFC 9110 token (what a header name must be)."""
    return name in _TOKENS_SEEN or _valid_token(name)


def _valid_token(name: str) -> bool:
    if not _TOKEN.fullmatch(name):
        return False
    if len(_TOKENS_SEEN) < 256:  # bounded: names are client input
        _TOKENS_SEEN.add(name)
    return True


Headers = list[tuple[str, str]]


class Framing(str, Enum):
    """How a body is delimited: ``Content-Length`` bytes, chunked, by closing the connection
    (responses only), or no body. A ``str`` enum: a member equals its value (``"chunked"``)."""

    LENGTH = "length"
    CHUNKED = "chunked"
    CLOSE = "close"
    NONE = "none"


class ProtocolError(Exception):
    """The request breaks the wire rules: the server answers ``status`` with the JSON error
    ``code`` and ``message``, then closes the connection."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


def _bad_request(message: str) -> ProtocolError:
    return ProtocolError(400, "BAD_REQUEST", message)


def _line_too_long() -> ProtocolError:
    return ProtocolError(414, "URI_TOO_LONG", "The request line is too long.")


# ====================================================================== the request head
def take_head(buf: bytes, limit: int, scanned: int = 0) -> tuple[bytes | None, bytes]:
    """Split the request head (request line and headers, through the blank line) off ``buf``.

    Empty lines before a request are skipped. Returns ``(head, rest)``; while the head is
    incomplete, ``(None, buf)`` with those empty lines dropped: call again with more bytes
    appended and ``scanned``, the length of the ``buf`` returned, so that the search
    resumes. A head that outgrows ``limit`` bytes (or its request line
    ``MAX_REQUEST_LINE``) raises ``ProtocolError`` 414 or 431.
    """
    if buf[:1] in (b"\r", b"\n"):
        empty = _EMPTY_LINES.match(buf)  # CRLF or LF, never a lone CR
        if empty:
            buf = buf[empty.end() :]
    start = max(0, scanned - 3)
    end = buf.find(b"\r\n\r\n", start)
    # The usual CRLF head: its blank line is the first end of a head unless a bare LF
    # came earlier (every other end contains "\n\n" or "\n\r" before this one's).
    if end >= 0 and buf.find(b"\n\n", start, end + 1) < 0 and buf.find(b"\n\r", start, end + 1) < 0:
        return buf[: end + 4], buf[end + 4 :]
    match = _HEAD_END.search(buf, start)
    if match:
        return buf[: match.end()], buf[match.end() :]
    if len(buf) > limit:
        if b"\n" not in buf and len(buf) > MAX_REQUEST_LINE:
            raise _line_too_long()
        raise ProtocolError(431, "HEADERS_TOO_LARGE", "The request headers are too large.")
    if len(buf) > MAX_REQUEST_LINE and b"\n" not in buf:
        raise _line_too_long()
    return None, buf


@dataclass(frozen=True)
class BodyFraming:
    """How the request body is delimited: ``length`` bytes, chunked, or none (empty)."""

    length: int | None = None
    chunked: bool = False

    @property
    def kind(self) -> Framing:
        if self.chunked:
            return Framing.CHUNKED
        return Framing.NONE if self.length is None else Framing.LENGTH


@dataclass
class Request:
    """A parsed request head."""

    method: str
    target: str
    """As sent: origin form (``/path?query``), absolute form, or ``*``."""
    path: str
    """Still percent-encoded."""
    query: str
    version: str
    """``HTTP/1.1`` or ``HTTP/1.0``."""
    headers: Headers = field(default_factory=list)
    keep_alive: bool = True
    """What the client asks for (``Connection`` and the version); the response may still close."""
    body: BodyFraming = BodyFraming()
    continue_asked: bool = False
    """An ``Expect: 100-continue`` header was sent (``expects_continue`` says whether it counts)."""

    @property
    def length(self) -> int | None:
        return self.body.length

    @property
    def chunked(self) -> bool:
        return self.body.chunked

    @property
    def expects_continue(self) -> bool:
        """The client waits for ``100 Continue`` before it sends its body."""
        return self.continue_asked and bool(self.body.length or self.body.chunked) and self.version == "HTTP/1.1"


def parse_request_head(head: bytes, max_headers: int) -> Request:
    """The request line and headers of ``head`` (as ``take_head`` returns it).

    Raises ``ProtocolError``: 400 for a malformed line, header or length (a control byte,
    a bare CR, no ``Host`` or two), 414 for a long request line, 431 beyond
    ``max_headers`` headers, 501 for a transfer coding other than chunked, 505 for an HTTP
    version other than 1.0 and 1.1.
    """
    lines, odd = _head_lines(head)
    if odd:  # so no line holds a CR after this
        _refuse_control_bytes(lines)
    method, target, version = _request_line(lines[0])
    path, query = _split_target(target)
    headers: Headers = []
    framing: Headers = []  # the headers that decide keep-alive and the body's framing
    hosts: list[str] = []
    continue_asked = False
    for line in lines[1:]:
        if not line:
            break
        if len(headers) >= max_headers:
            raise ProtocolError(431, "HEADERS_TOO_LARGE", "The request has too many headers.")
        name, sep, value = line.partition(":")
        if not sep or (name not in _TOKENS_SEEN and not _valid_token(name)):  # refuses obs-fold too
            raise _bad_request("A request header is malformed.")
        header = (name, value.strip(" \t"))
        headers.append(header)
        lower = name.lower()
        if lower in _FRAMING_HEADERS:
            framing.append(header)
        elif lower == "host":
            hosts.append(header[1])
        elif lower == "expect" and header[1].lower() == "100-continue":
            continue_asked = True
    if not framing:  # the common cases first, as the general rules would answer them
        keep_alive, body = version == "HTTP/1.1", _NO_BODY
    elif len(framing) == 1 and framing[0][0].lower() == "content-length" and _plain_length(framing[0][1]):
        keep_alive, body = version == "HTTP/1.1", BodyFraming(length=int(framing[0][1]))
    else:
        keep_alive, body = wants_keep_alive(version, framing), body_framing(version, framing)
    _check_host(version, hosts)
    return Request(
        method,
        target,
        path,
        query,
        version,
        headers,
        keep_alive=keep_alive,
        body=body,
        continue_asked=continue_asked,
    )


_NO_BODY = BodyFraming()


def _head_lines(head: bytes) -> tuple[list[str], bool]:
    """The lines of a head (request or response) without their line ends, and whether it
    holds a control byte (HTAB aside) or a bare CR, which its parser refuses."""
    text = head.decode("latin-1")
    crlf = text.count("\r\n")
    if crlf == text.count("\n"):  # every line ends with CRLF, the common case
        lines = text.split("\r\n")
    else:
        lines = [_strip_cr(line) for line in text.split("\n")]
    return lines, bool(_CONTROL_IN_HEAD.search(text)) or text.count("\r") != crlf


def _refuse_control_bytes(lines: list[str]) -> None:
    """The refusal of a head (its lines, without their line ends) with a control byte or a
    bare CR, worded after the line that holds it (a request line too long is still 414)."""
    if _FORBIDDEN.search(lines[0]) and len(lines[0]) <= MAX_REQUEST_LINE:
        raise _bad_request("The request line is malformed.")
    if any(_FORBIDDEN.search(line) for line in lines[1:]):
        raise _bad_request("A request header is malformed.")


def _strip_cr(line: str) -> str:
    """A line without the CR of its CRLF (one CR: any other is a bare CR, refused later)."""
    return line[:-1] if line.endswith("\r") else line


def _check_host(version: str, hosts: list[str]) -> None:
    """RFC 9112 3.2: 400 for an HTTP/1.1 request without ``Host``, any request with two
    ``Host`` lines (equal or not), or a ``Host`` that is not ``uri-host[:port]``."""
    if len(hosts) > 1:
        raise _bad_request("The request has more than one Host header.")
    if not hosts:
        if version == "HTTP/1.1":
            raise _bad_request("The request has no Host header.")
        return
    host = hosts[0]
    if host in _HOSTS_SEEN:  # a set lookup, not the pattern, for a name seen before (5% of a refusal)
        return
    if not _HOST.fullmatch(host):
        raise _bad_request("The Host header is invalid.")
    if len(_HOSTS_SEEN) < 256:  # bounded: hosts are client input
        _HOSTS_SEEN.add(host)


def _plain_length(value: str) -> bool:
    """A ``Content-Length`` value ``body_framing`` takes as it is: ASCII digits, at most 18."""
    return _DIGITS.fullmatch(value) is not None


def _request_line(line: str) -> tuple[str, str, str]:
    if len(line) > MAX_REQUEST_LINE:
        raise _line_too_long()
    parts = line.split(" ")
    if len(parts) != 3 or not _TOKEN.fullmatch(parts[0]) or _FORBIDDEN.search(line):
        raise _bad_request("The request line is malformed.")
    method, target, version = parts
    if not _TARGET.fullmatch(target):  # visible ASCII only: no control or non-ASCII byte
        raise _bad_request("The request target is malformed.")
    if version not in ("HTTP/1.1", "HTTP/1.0"):
        if re.fullmatch(r"HTTP/\d\.\d", version):
            raise ProtocolError(505, "HTTP_VERSION_NOT_SUPPORTED", "Only HTTP/1.0 and HTTP/1.1 are supported.")
        raise _bad_request("The request line is malformed.")
    return method, target, version


def _split_target(target: str) -> tuple[str, str]:
    """The path and the query of a request target."""
    if target.startswith("/"):
        path, _, query = target.partition("?")
        return path, query
    if target == "*":
        return "*", ""
    if target.lower().startswith(("http://", "https://")):
        rest = target.split("://", 1)[1]
        slash = rest.find("/")
        path, _, query = ("/" if slash < 0 else rest[slash:]).partition("?")
        return path, query
    raise _bad_request("The request target is malformed.")


def _values(headers: Headers, name: str) -> list[str]:
    """The comma-separated values of every header called ``name``, each without the optional
    whitespace around it (SP and HTAB only: ``str.strip`` would take VT, NBSP, ... too)."""
    return [v.strip(" \t") for n, value in headers if n.lower() == name for v in value.split(",")]


def body_framing(version: str, headers: Headers) -> BodyFraming:
    """The request body's framing; ``ProtocolError`` when the headers conflict or are invalid.

    ``Transfer-Encoding`` is a list (over all its lines) that must be exactly one
    ``chunked`` (case-insensitive): an empty or malformed element is 400, a coding other
    than chunked (or chunked twice) 501. ``Content-Length`` is ASCII digits, equal if repeated.
    """
    codings = _values(headers, "transfer-encoding")
    lengths = set(_values(headers, "content-length"))
    if codings:
        if lengths:
            raise _bad_request("Content-Length and Transfer-Encoding are both present.")
        if not all(_TOKEN.fullmatch(c) for c in codings):
            raise _bad_request("The Transfer-Encoding header is malformed.")
        if [c.lower() for c in codings] != ["chunked"]:
            raise ProtocolError(501, "NOT_IMPLEMENTED", "Only the chunked transfer coding is supported.")
        if version == "HTTP/1.0":
            raise _bad_request("Chunked bodies need HTTP/1.1.")
        return BodyFraming(chunked=True)
    if not lengths:
        return BodyFraming()
    value = lengths.pop() if len(lengths) == 1 else ""
    if not _plain_length(value):
        raise _bad_request("The Content-Length header is invalid.")
    return BodyFraming(length=int(value))


def wants_keep_alive(version: str, headers: Headers) -> bool:
    """Whether the client asks to keep the connection: never with ``Connection: close``
    (whatever else it lists), else HTTP/1.1, or HTTP/1.0 with ``Connection: keep-alive``."""
    connection = [v.lower() for v in _values(headers, "connection")]
    if "close" in connection:
        return False
    return version == "HTTP/1.1" or "keep-alive" in connection


# ====================================================================== a response, as a client reads it
_STATUS_LINE = re.compile(r"HTTP/(1\.[01]) ([0-9]{3})(?: ([\t\x20-\x7e\x80-\xff]*))?")
"""``HTTP-version SP status-code [SP reason-phrase]``: the reason may be missing (h11 and
``http.client`` read such lines), and only HTTP/1.0 and HTTP/1.1 are spoken."""


class ResponseError(Exception):
    """The response breaks the wire rules: the connection it came on is useless."""


@dataclass(frozen=True)
class ResponseStart:
    """A response head as a client reads it (``parse_response_head``): the status, the
    headers, how the body is delimited, and whether the connection may serve again."""

    version: str
    status: int
    reason: str
    headers: Headers
    framing: Framing
    length: int | None
    keep_alive: bool

    def header(self, name: str) -> str | None:
        """The first value of the header ``name`` (any case), or None."""
        lower = name.lower()
        return next((value for n, value in self.headers if n.lower() == lower), None)


def parse_response_head(head: bytes, *, max_headers: int = 100) -> ResponseStart:
    """The status line and headers of a response to a request that is not ``HEAD`` (as
    ``take_head`` splits it off), read by the rules the server holds requests to: a
    header name is a token, no control byte or bare CR, no obs-fold; and RFC 9112 6.3 for
    the body: none for 1xx, 204 and 304, else chunked when ``Transfer-Encoding`` says so
    (exactly ``chunked``: a response with another coding, or with a ``Content-Length``
    too, is refused, as h11 refuses them), else ``Content-Length`` bytes, else up to the
    close. ``ResponseError`` for anything else.
    """
    lines, odd = _head_lines(head)
    if odd:
        raise ResponseError("a control byte in the response head")
    status_line = _STATUS_LINE.fullmatch(lines[0])
    if status_line is None:
        raise ResponseError("a malformed status line")
    version = "HTTP/" + status_line.group(1)
    status = int(status_line.group(2))
    headers: Headers = []
    for line in lines[1:]:
        if not line:
            break
        if len(headers) >= max_headers:
            raise ResponseError("too many response headers")
        name, sep, value = line.partition(":")
        if not sep or (name not in _TOKENS_SEEN and not _valid_token(name)):
            raise ResponseError("a malformed response header")
        headers.append((name, value.strip(" \t")))
    framing, length = _response_framing(status, headers)
    # as h11 decides it: an HTTP/1.0 answer ends its connection whatever it says
    keep_alive = framing is not Framing.CLOSE and version == "HTTP/1.1" and wants_keep_alive(version, headers)
    return ResponseStart(version, status, status_line.group(3) or "", headers, framing, length, keep_alive)


def _response_framing(status: int, headers: Headers) -> tuple[Framing, int | None]:
    codings = _values(headers, "transfer-encoding")
    lengths = set(_values(headers, "content-length"))
    # the headers are checked whatever the status, as h11 checks them
    if codings and ([c.lower() for c in codings] != ["chunked"] or lengths):
        raise ResponseError("a transfer coding other than chunked, or with a length")
    length = None
    if lengths:
        value = lengths.pop() if len(lengths) == 1 else ""
        if not _plain_length(value):
            raise ResponseError("an invalid Content-Length")
        length = int(value)
    if status < 200 or status in (204, 304):
        return Framing.NONE, None
    if codings:
        return Framing.CHUNKED, None
    if length is None:
        return Framing.CLOSE, None
    return Framing.LENGTH, length


# ====================================================================== a chunked request body
def parse_chunk_size(line: bytes) -> int:
    """The size of a chunk-size line (through its CRLF; extensions ignored); ``ProtocolError`` 400.

    Hex digits from the first byte (no whitespace before), optional extensions without
    control bytes, optional SP/HTAB, CRLF (a bare LF is refused, as h11 and waitress do).

    A size line met before is not matched again (``_SIZES``): a stream of like frames, such as
    the kernel's deltas, sends the same few sizes thousands of times."""
    size = _SIZES.get(line)
    if size is not None:
        return size
    match = _CHUNK_SIZE.fullmatch(line)
    if match is None:
        raise _bad_chunk()
    size = int(match.group(1), 16)
    if len(line) <= 10 and len(_SIZES) < 4096:  # plain sizes only, and only so many
        _SIZES[line] = size
    return size


#: size lines already matched -> their size (``parse_chunk_size``; bounded)
_SIZES: dict[bytes, int] = {}


def _bad_chunk() -> ProtocolError:
    return _bad_request("The chunked request body is malformed.")


def _trailer_line(line: bytes) -> bool:
    """A trailer line (through its CRLF): a header line as in the head, or the empty line."""
    if not line.endswith(b"\r\n"):
        return False
    text = line[:-2].decode("latin-1")
    if not text:
        return True
    name, sep, value = text.partition(":")
    return bool(sep) and _TOKEN.fullmatch(name) is not None and not _FORBIDDEN.search(value)


class _Chunk(Enum):
    """Where a chunked body's decoding stands; each line-reading state knows its longest line."""

    SIZE = "size"  # a chunk-size line (and its extensions)
    DATA = "data"  # a chunk's data
    DATA_END = "data-end"  # the CRLF after a chunk's data
    TRAILERS = "trailers"  # the trailer lines after the last chunk, through the blank line
    DONE = "done"

    @property
    def longest_line(self) -> int:
        return _LONGEST_LINE[self]


_LONGEST_LINE = {_Chunk.SIZE: MAX_CHUNK_LINE, _Chunk.DATA_END: 2, _Chunk.TRAILERS: MAX_TRAILERS}


class ChunkedDecoder:
    """A chunked request body, decoded from the bytes fed to it as they arrive.

    ``feed(data)`` adds received bytes; ``read(size)`` returns body data (at most ``size``
    bytes, all that is at hand for -1), ``b""`` once the body is over (the last chunk and
    the trailers, which are dropped), or None when it needs more bytes first; a framing
    error raises ``ProtocolError`` 400. Once over, ``unused`` holds the bytes fed past
    the body (the start of the connection's next request).
    """

    __slots__ = ("_buf", "_pos", "_state", "_left", "_trailer_bytes")

    def __init__(self) -> None:
        self._buf = b""
        self._pos = 0  # where the unread bytes of ``_buf`` start (no copy per chunk taken)
        self._state = _Chunk.SIZE
        self._left = 0
        self._trailer_bytes = 0

    @property
    def done(self) -> bool:
        return self._state is _Chunk.DONE

    @property
    def unused(self) -> bytes:
        """The bytes fed past the end of the body (empty until it is over)."""
        return self._buf[self._pos :] if self.done else b""

    def feed(self, data: bytes) -> None:
        if self._pos:
            self._buf, self._pos = self._buf[self._pos :] + data, 0
        else:
            self._buf += data

    def read(self, size: int = -1) -> bytes | None:
        while True:
            state = self._state
            if state is _Chunk.DONE:
                return b""
            if state is _Chunk.DATA:
                pos = self._pos
                available = len(self._buf) - pos
                if not available:
                    return None
                take = min(self._left, available) if size < 0 else min(size, self._left, available)
                data = self._buf[pos : pos + take]
                self._pos = pos + take
                self._left -= take
                if self._left == 0:
                    self._state = _Chunk.DATA_END
                return data
            line = self._line(state.longest_line)
            if line is None:
                return None
            if state is _Chunk.SIZE:
                self._left = parse_chunk_size(line)
                self._state = _Chunk.DATA if self._left else _Chunk.TRAILERS
            elif state is _Chunk.DATA_END:
                if line != b"\r\n":
                    raise _bad_chunk()
                self._state = _Chunk.SIZE
            else:
                self._trailer_bytes += len(line)
                if self._trailer_bytes > MAX_TRAILERS or not _trailer_line(line):
                    raise _bad_chunk()
                if line == b"\r\n":
                    self._state = _Chunk.DONE

    def read_available(self) -> bytes | None:
        """All the body data at hand, across chunks (``read`` gives one chunk's at a time):
        ``b""`` once the body is over, None when more bytes are needed first."""
        parts: list[bytes] = []
        buf = self._buf
        while True:
            if self._state is _Chunk.DATA_END and buf[self._pos : self._pos + 2] == b"\r\n":
                self._pos += 2  # a chunk's CRLF that ``read`` left: back to the inline case
                self._state = _Chunk.SIZE
            if self._state is _Chunk.SIZE:  # the common case, inline: size line, data, CRLF
                pos = self._pos
                end = buf.find(b"\n", pos, pos + MAX_CHUNK_LINE)
                if end >= 0:
                    size = parse_chunk_size(buf[pos : end + 1])
                    start = end + 1
                    stop = start + size
                    if size and buf[stop : stop + 2] == b"\r\n":
                        parts.append(buf[start:stop])
                        self._pos = stop + 2
                        continue
            data = self.read(-1)
            if data:
                parts.append(data)
                continue
            if parts:
                return b"".join(parts)
            return data

    def _line(self, limit: int) -> bytes | None:
        """Up to and including the next LF, or the first ``limit`` bytes; None until either is here."""
        pos = self._pos
        end = self._buf.find(b"\n", pos, pos + limit)
        if end >= 0:
            end += 1
        elif len(self._buf) - pos >= limit:
            end = pos + limit
        else:
            return None
        self._pos = end
        return self._buf[pos:end]


def encode_chunk(data: bytes, head: bytes = b"") -> bytes:
    """``data`` as one chunk of a chunked response body, after ``head`` (the response head
    when this is the first write). Empty data would end the body: send nothing instead."""
    return b"".join((head, b"%x\r\n" % len(data), data, b"\r\n"))


# ====================================================================== the response head
@dataclass
class ResponseHead:
    """The head of a response to ``request``, its framing decided (see ``plan_response``).

    The server may still clear ``keep_alive`` (it is draining, or the request's body was
    not read) before ``encode``, which writes the ``Connection`` header accordingly.
    """

    status: str
    headers: Headers
    """The application's headers as sent: hop-by-hop ones and an invalid length dropped."""
    framing: Framing
    length: int
    """The body's length with ``length`` framing."""
    keep_alive: bool
    version: str
    """The request's version."""

    @property
    def no_body(self) -> bool:
        return self.framing is Framing.NONE

    def encode(self, date: str) -> bytes:
        lines = [f"HTTP/1.1 {self.status}"]
        lines += [f"{name}: {value}" for name, value in self.headers]
        lines.append(f"Date: {date}")
        if self.framing is Framing.CHUNKED:
            lines.append("Transfer-Encoding: chunked")
        if not self.keep_alive:
            lines.append("Connection: close")
        elif self.version == "HTTP/1.0":
            lines.append("Connection: keep-alive")
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def plan_response(status: str, headers: Iterable[tuple[str, str]], request: Request) -> ResponseHead:
    """The framing and keep-alive of the response ``status``/``headers`` (a WSGI status line
    and header list) to ``request``.

    A ``Content-Length`` keeps the connection alive; without one the body is chunked on
    HTTP/1.1 and ends with the connection on HTTP/1.0. ``HEAD``, 1xx, 204 and 304 have no
    body. ``Connection: close`` from the application closes; the other hop-by-hop headers
    are the server's and dropped. A line break in a header raises ``ValueError``.
    """
    code = int(status[:3])
    keep_alive = request.keep_alive
    sent: Headers = []
    length: int | None = None
    for name, value in headers:
        if "\n" in value or "\r" in value or "\n" in name or "\r" in name:
            raise ValueError(f"a line break in the response header {name!r}")
        lower = name.lower()
        if lower in _HOP_BY_HOP:
            if lower == "connection" and "close" in value.lower():
                keep_alive = False
            continue
        if lower == "content-length":
            if not value.strip().isdigit():
                continue  # an invalid length is dropped: the body is then chunked
            length = int(value)
        sent.append((name, value))
    framing: Framing
    if request.method == "HEAD" or 100 <= code < 200 or code in (204, 304):
        framing = Framing.NONE
    elif length is not None:
        framing = Framing.LENGTH
    elif request.version == "HTTP/1.1":
        framing = Framing.CHUNKED
    else:
        framing, keep_alive = Framing.CLOSE, False
    return ResponseHead(status, sent, framing, length or 0, keep_alive, request.version)


# ====================================================================== the server's own answers
@lru_cache(maxsize=4)
def _date_of_second(second: int) -> str:
    return formatdate(second, usegmt=True)


def http_date(timestamp: float) -> str:
    """The ``Date`` header value of a Unix time (computed once a second)."""
    return _date_of_second(int(timestamp))


def error_body(code: str, message: str, *, ensure_ascii: bool = True) -> bytes:
    """The JSON error body, ``{"error": {"code", "message"}}``, as ``json.dumps`` with compact
    separators writes it (``ensure_ascii`` as there: the server's own answers escape what is
    not ASCII, the application's, in the client's language, do not). Made from its two
    strings, without the encoder object ``json`` makes per call: every refusal writes one."""
    quote = json.encoder.encode_basestring_ascii if ensure_ascii else json.encoder.encode_basestring
    return f'{{"error":{{"code":{quote(code)},"message":{quote(message)}}}}}'.encode()


def error_response(status: int, code: str, message: str, date: str, extra: Iterable[tuple[str, str]] = ()) -> bytes:
    """A whole response of the server's own, a JSON error, after which the connection closes."""
    body = error_body(code, message)
    lines = [
        f"HTTP/1.1 {status} {HTTPStatus(status).phrase}",
        "Content-Type: application/json; charset=utf-8",
        f"Content-Length: {len(body)}",
        "Cache-Control: no-store",
        f"Date: {date}",
    ]
    lines += [f"{k}: {v}" for k, v in extra]
    lines.append("Connection: close")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body
