"""Incremental decoder for the kernel's Server-Sent Events stream (sans-I/O).

Feed it bytes as they arrive; it returns the ``data`` payloads of the events that
are complete. Comments (``: ping``) and fields other than ``data`` are ignored.
Multi-line data is joined with ``\\n`` as the SSE standard says, and CRLF or CR
line endings are accepted.
"""

from __future__ import annotations


class SSEDecoder:
    """Bytes in, complete ``data`` payloads (str) out."""

    __slots__ = ("_buffer", "_data")

    def __init__(self) -> None:
        self._buffer = b""
        self._data: list[bytes] = []

    def feed(self, chunk: bytes) -> list[str]:
        buffer = self._buffer + chunk if self._buffer else chunk
        hold = b""
        if b"\r" in buffer:
            if buffer.endswith(b"\r"):  # maybe the first half of a CRLF
                buffer, hold = buffer[:-1], b"\r"
            buffer = buffer.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        lines = buffer.split(b"\n")
        self._buffer = lines.pop() + hold
        out: list[str] = []
        data = self._data
        for line in lines:
            if not line:
                if data:
                    out.append(b"\n".join(data).decode("utf-8"))
                    data.clear()
            elif line.startswith(b"data:"):
                value = line[5:]
                data.append(value[1:] if value.startswith(b" ") else value)
            # comments and other fields (event:, id:, retry:) carry nothing for us
        return out

    def close(self) -> list[str]:
        """End of stream: a final event without its blank line still counts."""
        out = self.feed(b"\n\n") if (self._buffer or self._data) else []
        self._buffer = b""
        return out
