"""Admission for `pgt serve`: which request may read its body, which waits for a scoring slot, which is sent away.

A request passes two gates, in order of arrival (first come, first served):

1. **Room to read.** Its body's bytes (the declared Content-Length, or the request limit when undeclared) are
   reserved from the worker's budget before one byte of the body is read; a large request also needs a place in
   the queue of large requests admitted but not yet scoring. Until both are free it waits *unread*: its bytes stay
   in its socket, where TCP's flow control holds the client, so a waiting request costs a socket, not memory. Past
   the wait limit it is sent away (HTTP 503 with Retry-After).
2. **A scoring slot** (large requests only; a small one is answered on the event loop as soon as it is read).

A slow sender holds only its own reservation and never a scoring slot, and only until the body deadline (HTTP 408).
So the bodies a worker holds never pass the budget, whatever its clients do. No model import: the server and its
tests drive the same object.
"""

from __future__ import annotations

import asyncio
from collections import deque
from contextlib import asynccontextmanager
from dataclasses import dataclass


class Busy(Exception):
    """No room came within the wait limit: the request is sent away (HTTP 503 with Retry-After)."""


@dataclass
class Ticket:
    """One admitted request's share: the bytes it reserved, and whether it holds a place in the large queue."""
    reserved: int
    queued: bool


class Admission:
    """The gates of one worker (one event loop: no lock). `budget_bytes`: request bodies held at once (reserved while
    read, held while queued and scored); `max_queued`: large requests admitted and not yet scoring; `slots`: large
    requests scored at once."""

    def __init__(self, budget_bytes: int, max_queued: int, slots: int) -> None:
        self.budget_bytes = budget_bytes
        self.max_queued = max_queued
        self.held = 0  # bytes reserved by admitted requests
        self.queued = 0  # large requests admitted, not yet scoring
        self.waiting: deque[tuple[int, bool, asyncio.Future]] = deque()  # (bytes, large, granted), in arrival order
        self.slots = asyncio.Semaphore(slots)

    def _take(self, size: int, large: bool) -> Ticket:
        self.held += size
        self.queued += large
        return Ticket(size, large)

    def _wake(self) -> None:
        """Admit the waiting requests in arrival order. None overtakes one that waits for bytes (a large body is not
        starved by a stream of small ones); a small one may pass a large one that waits only for a place in the
        queue, which it does not need."""
        for entry in list(self.waiting):
            size, large, granted = entry
            if granted.done():  # its task was cancelled a moment ago: it removes itself
                continue
            if self.held + size > self.budget_bytes:
                break
            if large and self.queued >= self.max_queued:
                continue
            self.waiting.remove(entry)
            granted.set_result(self._take(size, large))

    @asynccontextmanager
    async def admitted(self, size: int, large: bool, timeout_s: float):
        """Hold `size` bytes of the budget (and for a large request a place in the queue) for the block; wait for them
        at most `timeout_s`, else Busy. A request larger than the whole budget is the caller's to refuse first."""
        granted = asyncio.get_running_loop().create_future()
        entry = (size, large, granted)
        self.waiting.append(entry)
        self._wake()
        if granted.done():
            ticket = granted.result()
        else:
            try:
                async with asyncio.timeout(timeout_s):
                    ticket = await granted
            except BaseException as exc:  # out of time, or the request's task cancelled while it waited
                if granted.done() and not granted.cancelled():
                    self._leave(granted.result())  # granted as time ran out: handed on
                else:
                    self.waiting.remove(entry)  # still there: only this block removes a cancelled entry
                    self._wake()  # a large request at the head may have held back smaller ones that fit
                if isinstance(exc, TimeoutError):
                    raise Busy(f"no room within {timeout_s:g} s") from None
                raise
        try:
            yield ticket
        finally:
            self._leave(ticket)

    def shrink(self, ticket: Ticket, size: int) -> None:
        """Keep only `size` of a ticket's reservation (a body shorter than reserved: an undeclared length)."""
        if size < ticket.reserved:
            self.held -= ticket.reserved - size
            ticket.reserved = size
            self._wake()

    @asynccontextmanager
    async def scoring(self, ticket: Ticket):
        """A scoring slot for the block; the ticket's place in the queue is given up once it has one."""
        async with self.slots:
            self._dequeue(ticket)
            self._wake()
            yield

    def _dequeue(self, ticket: Ticket) -> None:
        if ticket.queued:
            ticket.queued = False
            self.queued -= 1

    def _leave(self, ticket: Ticket) -> None:
        self.held -= ticket.reserved
        ticket.reserved = 0
        self._dequeue(ticket)
        self._wake()
