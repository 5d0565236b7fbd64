"""`IdlePoll` (store/polling.py): an idle store poller backs off, and any work found brings it back to poll_s."""

from __future__ import annotations

from sluicegate.store.polling import IDLE_FACTOR, IdlePoll


def test_idle_looks_double_the_wait_up_to_the_cap() -> None:
    poll = IdlePoll(0.5)
    waits = [poll.after(False) for _ in range(7)]
    assert waits == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0, 4.0]
    assert poll.max_s == 0.5 * IDLE_FACTOR


def test_work_found_resets_the_wait() -> None:
    poll = IdlePoll(1.0)
    for _ in range(5):
        poll.after(False)
    assert poll.after(True) == 1.0
    assert poll.after(False) == 1.0  # the first idle look after work waits poll_s
    assert poll.after(False) == 2.0


def test_a_factor_of_one_is_a_fixed_poll() -> None:
    poll = IdlePoll(0.2, factor=1)
    assert {poll.after(False) for _ in range(5)} == {0.2}
