"""Signals as a command meets them: SIGTERM handled as Ctrl+C, and short writes that a signal must not cut."""

from __future__ import annotations

import os
import signal
import threading

import pytest

from infra.process import handled_signals, uninterrupted


def handlers() -> dict:
    return {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}


@pytest.mark.parametrize("sent", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT])
def test_a_signal_inside_a_short_write_takes_effect_as_it_ends(sent):
    done = []
    with handled_signals() as caught:
        with pytest.raises(KeyboardInterrupt):
            with uninterrupted():
                os.kill(os.getpid(), sent)
                done.append("first half")
                done.append("second half")  # a handler that ran here would have stopped before this line
        assert done == ["first half", "second half"]
        assert caught.received == sent and caught.exit_code == 128 + sent


def test_a_signal_outside_it_stops_at_once_and_nested_writes_hold_it_to_the_outer_end():
    done = []
    with handled_signals() as caught:
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGTERM)
            done.append("after")
        assert done == [] and caught.received == signal.SIGTERM
        with pytest.raises(KeyboardInterrupt):
            with uninterrupted():
                with uninterrupted():
                    os.kill(os.getpid(), signal.SIGTERM)
                done.append("outer")
        assert done == ["outer"]


def test_the_handlers_come_back_as_they_were_with_or_without_a_signal():
    before = handlers()
    with handled_signals():
        inside = handlers()
        with uninterrupted():
            assert handlers() != inside
        assert handlers() == inside
        with pytest.raises(KeyboardInterrupt), uninterrupted():
            os.kill(os.getpid(), signal.SIGINT)
        assert handlers() == inside
    assert handlers() == before


def test_outside_the_main_thread_it_changes_nothing():
    seen = []

    def write():
        with uninterrupted():
            seen.append(handlers())

    thread = threading.Thread(target=write)
    thread.start()
    thread.join()
    assert seen == [handlers()]
