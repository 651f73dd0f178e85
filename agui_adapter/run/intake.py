"""What a run's kernel pump queued, handed to the run's machine (``run.driver``).

Moved out of ``RunDriver`` so the driver keeps to the stream: the bytes of one wake-up are
decoded together and the machine takes all their frames at once (a long backlog a step of
``FRAMES_PER_STEP`` frames at a time, so that its frames and events are freed as they go);
the end of the kernel's stream, its refusal or its loss go to the machine in their place, and
a bare wake-up is nothing to it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from agui_adapter.kernel_client.a2a import FrameReader
from agui_adapter.protocol.events import Event
from agui_adapter.run import effects as fx
from agui_adapter.run.machine import RunMachine
from agui_adapter.run.pump import Chunk, Rejected, StreamEnd, Unavailable

#: How many kernel frames the machine takes at once when a wake-up finds a backlog queued: the
#: parsed frames of a whole backlog (thousands) alive at once cost the cyclic GC dearly.
FRAMES_PER_STEP = 256

#: the driver's ``_carry_out`` (effects performed, events to ``out``, chunks decided yielded)
CarryOut = Callable[[list[fx.Effect], list[Event]], Iterator[bytes]]


def take(
    machine: RunMachine,
    reader: Callable[[], FrameReader],
    items: list[Any],
    out: list[Event],
    now: float,
    carry_out: CarryOut,
    encode: Callable[[list[Event]], bytes],
) -> Iterator[bytes]:
    """What the pump queued in one wake-up: the bytes are decoded together and the machine
    takes all their frames at once; anything else queued is handled in its place. ``reader``: the
    driver's frame reader of the moment (an effect carried out here may reopen the stream)."""
    frames: list[Any] = []
    for item in items:
        match item:
            case Chunk(data=data):
                frames += reader().feed(data)
                if len(frames) < FRAMES_PER_STEP:
                    continue
                # a long backlog is taken a step at a time: its frames and events are freed as they go
                yield from carry_out(machine.frames(frames, now), out)
                frames = []
                if machine.ended:
                    return
                if out:
                    yield encode(out)
                    out.clear()
                continue
            case StreamEnd():
                frames += reader().close()
        if frames:
            yield from carry_out(machine.frames(frames, now), out)
            frames = []
            if machine.ended:
                return
        effects = on_item(machine, item, now)
        if effects is None:
            continue
        yield from carry_out(effects, out)
        if machine.ended:
            return
    if frames:
        effects = machine.frames(frames, now)
        if len(effects) == 1 and type(effects[0]) is fx.Emit:  # the common case: events only
            out.extend(effects[0].events)  # type: ignore[union-attr]
        else:
            yield from carry_out(effects, out)


def on_item(machine: RunMachine, item: Any, now: float) -> list[fx.Effect] | None:
    """What the machine makes of a queued item other than bytes (None: a wake-up only)."""
    match item:
        case StreamEnd():
            return machine.stream_ended(now)
        case Rejected(error=error):
            return machine.kernel_rejected(error, now)
        case Unavailable(error=error):
            return machine.kernel_unavailable(str(error), now)
        case _:  # Wake
            return None
