"""Incremental decoder for the kernel's Server-Sent Events stream (sans-I/O).

Feed it bytes as they arrive; it returns the ``data`` payloads of the events that
are complete, as bytes (the JSON parser takes bytes and checks their UTF-8 itself).
Comments (``: ping``) and fields other than ``data`` are ignored. Multi-line data is
joined with ``\\n`` as the SSE standard says, and CRLF or CR line endings are accepted.

Why two paths: the kernel (sse-starlette) sends every frame as one event of one line,
``data: <json>`` and a blank line, with CRLF line endings, by the thousand per second.
Such events are cut out of a read whole, one split of the buffer on the blank line and
one slice each, instead of line by line (about a third of this decoder's CPU per event);
anything else (a comment, another field, multi-line data, another line ending, an event
begun in an earlier read) goes line by line from there, which is the standard's
algorithm. ``tests/unit/test_sse.py`` checks that both give the same payloads for any
stream cut anywhere.
"""

from __future__ import annotations


class SSEDecoder:
    """Bytes in, complete ``data`` payloads (bytes) out."""

    __slots__ = ("_buffer", "_data")

    def __init__(self) -> None:
        self._buffer = b""  # bytes not handled yet
        self._data: list[bytes] = []  # the data lines of an event begun, line by line

    @property
    def empty(self) -> bool:
        """Nothing held: the next byte fed begins an event."""
        return not self._buffer and not self._data

    def feed(self, chunk: bytes) -> list[bytes]:
        buffer = self._buffer + chunk if self._buffer else chunk
        if self._data:
            return self._lines(buffer)
        blank = b"\r\n\r\n" if b"\r" in buffer else b"\n\n"
        events = buffer.split(blank)
        rest = events.pop()
        out: list[bytes] = []
        for i, event in enumerate(events):
            if event.startswith(b"data: ") and b"\n" not in event and b"\r" not in event:
                out.append(event[6:])
            else:
                out += self._lines(blank.join(events[i:]) + blank + rest)
                return out
        if b"\n" in rest or b"\r" in rest:  # lines of an event not complete yet, or of one
            out += self._lines(rest)  # ended otherwise (a blank line of another kind)
        else:
            self._buffer = rest  # part of a line: handled again with the next read
        return out

    def _lines(self, buffer: bytes) -> list[bytes]:
        """The standard's algorithm, line by line."""
        hold = b""
        if b"\r" in buffer:
            if buffer.endswith(b"\r"):  # maybe the first half of a CRLF
                buffer, hold = buffer[:-1], b"\r"
            buffer = buffer.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        lines = buffer.split(b"\n")
        self._buffer = lines.pop() + hold
        out: list[bytes] = []
        data = self._data
        for line in lines:
            if not line:
                if data:
                    out.append(b"\n".join(data))
                    data.clear()
            elif line.startswith(b"data:"):
                value = line[5:]
                data.append(value[1:] if value.startswith(b" ") else value)
            # comments and other fields (event:, id:, retry:) carry nothing for us
        return out

    def close(self) -> list[bytes]:
        """End of stream: a final event without its blank line still counts."""
        out = self.feed(b"\n\n") if (self._buffer or self._data) else []
        self._buffer = b""
        return out
