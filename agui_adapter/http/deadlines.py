"""The deadlines of the connections that wait on the built-in server's I/O thread.

Why it exists: a connection waiting for a request holds no thread (``server.py``), so its
timeout (the request timeout of a new connection, the keep-alive timeout between requests) is
a timer of the I/O thread, which sleeps until the earliest one. A heap of ``(deadline, ticket,
connection)``: setting a new deadline gives the connection a new ticket (``Connection.ticket``)
and makes its older entries stale, which are skipped when they come up and dropped in bulk
when they outnumber the live ones (a connection answered a thousand times in one keep-alive
period leaves no thousand entries). Not thread-safe: the server calls it under its lock.
"""

from __future__ import annotations

import heapq
import itertools

from agui_adapter.http.connection import Connection

FOREVER = float("inf")


class Deadlines:
    """When each waiting connection's wait ends; see the module docstring."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Connection]] = []
        self._tickets = itertools.count(1)

    def __len__(self) -> int:
        """Entries held, stale ones included (bounded by twice the live ones, plus 64)."""
        return len(self._heap)

    def set(self, conn: Connection, deadline: float, live: int) -> None:
        """Make ``deadline`` the connection's only current one; ``live``: how many connections wait."""
        ticket = next(self._tickets)
        conn.ticket = ticket
        heapq.heappush(self._heap, (deadline, ticket, conn))
        if len(self._heap) > 2 * live + 64:
            self._heap = [entry for entry in self._heap if entry[2].ticket == entry[1]]
            heapq.heapify(self._heap)

    @staticmethod
    def cancel(conn: Connection) -> None:
        """The connection no longer waits: its entries are stale."""
        conn.ticket = 0

    def expired(self, now: float) -> list[Connection]:
        """The connections whose current deadline is ``now`` or earlier (their tickets cleared)."""
        heap = self._heap
        out = []
        while heap and heap[0][0] <= now:
            _, ticket, conn = heapq.heappop(heap)
            if conn.ticket == ticket:
                conn.ticket = 0
                out.append(conn)
        return out

    def earliest(self) -> float:
        """The earliest deadline held (maybe a stale one), ``FOREVER`` when none."""
        return self._heap[0][0] if self._heap else FOREVER

    def clear(self) -> None:
        for _, _, conn in self._heap:
            conn.ticket = 0
        self._heap.clear()
