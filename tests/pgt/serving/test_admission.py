"""pgt.serving.admission: the server's gates, driven in process on one event loop (no model, no server)."""

from __future__ import annotations

import asyncio

import pytest

from pgt.serving.admission import Admission, Busy


def run(coroutine):
    return asyncio.run(coroutine)


async def settle() -> None:
    """Let every task that can run, run (a few rounds of the loop)."""
    for _ in range(5):
        await asyncio.sleep(0)


def test_requests_that_fit_are_admitted_at_once_and_give_their_bytes_back():
    async def main():
        gates = Admission(budget_bytes=100, max_queued=2, slots=1)
        async with gates.admitted(60, large=True, timeout_s=1) as first:
            async with gates.admitted(40, large=False, timeout_s=1) as second:
                assert (gates.held, gates.queued) == (100, 1)
                assert (first.reserved, second.reserved) == (60, 40)
            assert (gates.held, gates.queued) == (60, 1)
        assert (gates.held, gates.queued) == (0, 0)

    run(main())


def test_a_request_past_the_budget_waits_unread_then_is_admitted_in_arrival_order():
    """Budget 100: A holds 80; B (30) and then C (10) wait, C although it would fit (no overtaking); A leaves: both
    are admitted, B first."""
    order = []

    async def request(gates, name, size, hold: asyncio.Event):
        async with gates.admitted(size, large=False, timeout_s=5):
            order.append(name)
            await hold.wait()

    async def main():
        gates = Admission(budget_bytes=100, max_queued=4, slots=1)
        release_a, release_rest = asyncio.Event(), asyncio.Event()
        a = asyncio.create_task(request(gates, "A", 80, release_a))
        await settle()
        b = asyncio.create_task(request(gates, "B", 30, release_rest))
        await settle()
        c = asyncio.create_task(request(gates, "C", 10, release_rest))
        await settle()
        assert order == ["A"] and len(gates.waiting) == 2 and gates.held == 80
        release_a.set()
        await settle()
        assert order == ["A", "B", "C"] and gates.held == 40 and not gates.waiting
        release_rest.set()
        await asyncio.gather(a, b, c)
        assert gates.held == 0

    run(main())


def test_a_large_request_needs_a_place_in_the_queue_which_a_scoring_slot_frees():
    """One place in the queue: the second large request waits until the first has a scoring slot; a small request
    needs no place."""
    events = []

    async def large(gates, name, done: asyncio.Event):
        async with gates.admitted(10, large=True, timeout_s=5) as ticket:
            events.append(f"{name} admitted")
            async with gates.scoring(ticket):
                events.append(f"{name} scoring")
                await done.wait()

    async def main():
        gates = Admission(budget_bytes=1000, max_queued=1, slots=1)
        done_first, done_second = asyncio.Event(), asyncio.Event()
        gate_slot = asyncio.Event()
        await gates.slots.acquire()  # the one slot is busy: the first large request stays queued
        first = asyncio.create_task(large(gates, "first", done_first))
        await settle()
        second = asyncio.create_task(large(gates, "second", done_second))
        await settle()
        async with gates.admitted(10, large=False, timeout_s=1):
            events.append("small admitted")
        assert events == ["first admitted", "small admitted"] and gates.queued == 1
        gates.slots.release()
        gate_slot.set()
        await settle()
        assert events[2:] == ["first scoring", "second admitted"]
        done_first.set()
        await settle()
        assert events[-1] == "second scoring"
        done_second.set()
        await asyncio.gather(first, second)
        assert (gates.held, gates.queued) == (0, 0)

    run(main())


def test_a_request_that_finds_no_room_within_the_wait_limit_is_busy_and_leaves_no_trace():
    async def main():
        gates = Admission(budget_bytes=100, max_queued=4, slots=1)
        async with gates.admitted(100, large=False, timeout_s=1):
            with pytest.raises(Busy, match="no room within 0.05 s"):
                async with gates.admitted(1, large=False, timeout_s=0.05):
                    pass
            assert not gates.waiting and gates.held == 100
        assert gates.held == 0

    run(main())


def test_a_waiter_that_gives_up_lets_the_smaller_ones_behind_it_in():
    """A (90 of 100) is held; B (50) waits, C (5) waits behind B; B's client goes away (its task cancelled): C is
    admitted at once, and A's budget is intact."""
    async def main():
        gates = Admission(budget_bytes=100, max_queued=4, slots=1)
        admitted = []

        async def request(name, size):
            async with gates.admitted(size, large=False, timeout_s=10):
                admitted.append(name)
                await asyncio.sleep(10)

        a = asyncio.create_task(request("A", 90))
        await settle()
        b = asyncio.create_task(request("B", 50))
        c = asyncio.create_task(request("C", 5))
        await settle()
        assert admitted == ["A"]
        b.cancel()
        await settle()
        assert admitted == ["A", "C"] and gates.held == 95 and not gates.waiting
        for task in (a, c):
            task.cancel()
        await asyncio.gather(a, b, c, return_exceptions=True)
        assert (gates.held, gates.queued) == (0, 0)

    run(main())


def test_shrink_gives_back_the_unread_part_of_a_reservation():
    """An undeclared length reserves the request limit; once read, only the body's size stays held."""
    async def main():
        gates = Admission(budget_bytes=100, max_queued=4, slots=1)
        async with gates.admitted(100, large=True, timeout_s=1) as ticket:
            gates.shrink(ticket, 30)
            async with gates.admitted(70, large=False, timeout_s=0.1):
                assert gates.held == 100
        assert gates.held == 0

    run(main())
