"""Frames that repeat the one before but for their text, recognised on their bytes (sans-I/O).

Why it exists: a kernel's answer streams as thousands of status frames that differ only in
the text of their status message (``result.statusUpdate.status.message.parts[0].text``):
the same task, context, state and metadata, byte for byte, around a new piece of text.
Parsing each into nested dictionaries, and looking each into again, was about half of the
adapter's CPU per event. Here a frame is compared with a *template*, the bytes before and
after the text of an earlier frame; when it has the same bytes around its text, only the text
is parsed (all of a read's texts in one parser call) and the frame is a ``Repeat``: the
template's frame with that text, built on demand (``Repeat.frame``) and looked into once per
template (``run.translation.inspect_frame`` keeps what it made of the template in
``Template.inspected``).

Why the answer is exactly the parser's (``tests/unit/test_repeats.py`` checks it against the
plain parse on any frames, cut anywhere):

- A template is learned from a frame the parser read, and kept only if the parser, given the
  template's bytes around a marker text, gives that frame with the marker as its text and
  nothing else changed. So the bytes before the text leave the parser inside that one
  string, and the string's value is that text.
- A repeat's text bytes hold no ``"`` and do not end in ``\\``: the string ends where the
  template's did, and the bytes after it are the template's, so the frame is the template's
  frame but for the string's value.
- That value is the parser's own reading of ``"<text bytes>"`` (escapes, UTF-8, control
  characters: anything it refuses sends the whole read the plain way).

Anything else (another kind of frame, a text with a quote, a frame the template does not
fit) is parsed whole, as before, and a text frame parsed whole may become the next template.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

#: the text a template is tried with (escapes only: it can't be mistaken for a kernel's text)
_MARKER_BYTES = b"\\u0001agui-adapter\\u0002"
_MARKER = "\x01agui-adapter\x02"
#: how many ``"text":"`` places of a frame are tried as its text's place
_PLACES_TRIED = 4


class Template:
    """A text frame the parser read, and its bytes before and after its text."""

    __slots__ = ("frame", "prefix", "suffix", "event_head", "event_tail", "between", "inspected", "_path")

    def __init__(self, frame: dict[str, Any], prefix: bytes, suffix: bytes) -> None:
        self.frame = frame  # never changed: repeats share it
        self.prefix = prefix
        self.suffix = suffix
        update = frame["result"]["statusUpdate"]
        message = update["status"]["message"]
        #: the dictionaries on the way to the text, and the parts after the first
        self._path = (update, update["status"], message, message["parts"][0], message["parts"][1:])
        #: a repeat's SSE event is ``event_head + text + event_tail`` (the kernel's one-line
        #: events, CRLF line ends); ``between`` is what stands between two repeats' texts
        self.event_head = b"data: " + prefix
        self.event_tail = suffix + b"\r\n\r\n"
        self.between = self.event_tail + self.event_head
        #: what the frames' consumer made of ``frame`` (``run.translation`` keeps its FrameInfo
        #: and what the status message says)
        self.inspected: Any = None


class Repeat:
    """A frame equal to its template's frame but for the status message's text."""

    __slots__ = ("template", "text")

    def __init__(self, template: Template, text: str) -> None:
        self.template = template
        self.text = text

    def status_update(self) -> dict[str, Any]:
        """The frame's ``result.statusUpdate``, new along the text's path, shared elsewhere."""
        update, status, message, part, more = self.template._path
        # copied and set rather than merged ({**d, k: v}): half the cost, once per delta
        part = part.copy()
        part["text"] = self.text
        message = message.copy()
        message["parts"] = [part, *more] if more else [part]
        status = status.copy()
        status["message"] = message
        update = update.copy()
        update["status"] = status
        return update

    def frame(self) -> dict[str, Any]:
        """The whole frame, as the parser would have given it."""
        frame = self.template.frame
        return {**frame, "result": {**frame["result"], "statusUpdate": self.status_update()}}

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Repeat):
            other = other.frame()
        return self.frame() == other

    __hash__ = None  # type: ignore[assignment]  # equal to a dict: unhashable like one

    def __repr__(self) -> str:
        return f"Repeat({self.text!r})"


def text_of(frame: Any) -> str | None:
    """The status message's first text of a status frame, or None when it has none."""
    try:
        text = frame["result"]["statusUpdate"]["status"]["message"]["parts"][0]["text"]
    except (KeyError, IndexError, TypeError):
        return None
    return text if type(text) is str else None


def learn(frame: Any, payload: bytes, loads: Callable[[bytes], Any]) -> Template | None:
    """A template from a parsed text frame and its bytes, if a place of its text checks out."""
    if text_of(frame) is None or b"\n" in payload or b"\r" in payload:  # not a one-line event's
        return None
    start = 0
    for _ in range(_PLACES_TRIED):
        at = payload.find(b'"text":"', start)
        if at < 0:
            return None
        start = at + 8
        end = _string_end(payload, start)
        if end < 0:
            return None
        template = Template(frame, payload[:start], payload[end:])
        try:
            checked = loads(template.prefix + _MARKER_BYTES + template.suffix)
        except ValueError:
            continue
        if checked == Repeat(template, _MARKER).frame():
            return template
    return None


def _string_end(payload: bytes, start: int) -> int:
    """Where the JSON string begun before ``start`` ends (its closing quote), or -1."""
    at = start
    while True:
        at = payload.find(b'"', at)
        if at < 0:
            return -1
        backslashes = 0
        while payload[at - 1 - backslashes] == 0x5C:
            backslashes += 1
        if backslashes % 2 == 0:
            return at
        at += 1


def texts_if_repeats(template: Template, payloads: list[bytes]) -> list[bytes | None]:
    """Each payload's text bytes when it fits the template (None where it does not)."""
    prefix, suffix = template.prefix, template.suffix
    lead, tail = len(prefix), len(suffix)
    out: list[bytes | None] = []
    for payload in payloads:
        end = len(payload) - tail
        if (
            end >= lead
            and payload.startswith(prefix)
            and payload.endswith(suffix)
            and payload.find(b'"', lead, end) < 0
            and (end == lead or payload[end - 1] != 0x5C)
        ):
            out.append(payload[lead:end])
        else:
            out.append(None)
    return out
