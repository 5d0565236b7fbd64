"""The compute-thread governor: fewer threads while neighbours hold cores, back when they leave, no flapping."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from sluicegate.backends.cpu_threads import NeighbourLoad, ThreadGovernor, runnable_neighbours, usable_cores


class Feed:
    """A scripted run queue and a clock that moves one sampling interval per pick."""

    def __init__(self) -> None:
        self.seen = 0
        self.now = 0.0
        self.runnable: int | None = 0  # other processes' threads runnable at the instant of asking
        self.passers: list[int] = []  # looks that see extra threads running by (consumed one per look)

    def look(self) -> int | None:
        extra = self.passers.pop(0) if self.passers else 0
        return None if self.runnable is None else self.runnable + extra

    def idle(self, seconds: float) -> None:
        self.now += seconds

    def sample(self) -> int:
        return self.seen

    def clock(self) -> float:
        self.now += 0.1
        return self.now


def governor(feed: Feed, *, threads: int = 2, cores: int = 2) -> ThreadGovernor:
    return ThreadGovernor(threads, cores=cores, interval_s=0.1, sample=feed.sample, clock=feed.clock,
                          runnable=feed.look, sleep=lambda s: None)


def settle(gov: ThreadGovernor, picks: int = 20) -> int:
    for _ in range(picks):
        n = gov.pick()
    return n


def test_all_threads_while_the_machine_is_idle() -> None:
    feed = Feed()
    gov = governor(feed)
    assert settle(gov) == 2
    assert gov.changes == 0


def test_one_busy_neighbour_takes_a_thread_and_giving_it_back_restores_it() -> None:
    feed = Feed()
    gov = governor(feed)
    feed.seen = 1
    assert settle(gov) == 1
    feed.seen = 0
    assert settle(gov) == 2
    assert gov.changes == 2


def test_never_below_one_thread_however_many_neighbours() -> None:
    feed = Feed()
    gov = governor(feed)
    feed.seen = 5
    assert settle(gov) == 1


def test_a_short_burst_does_not_flap_the_count() -> None:
    feed = Feed()
    gov = governor(feed)
    for i in range(200):  # a neighbour runnable one sample in five: 0.2 of a core on average
        feed.seen = 1 if i % 5 == 0 else 0
        gov.pick()
    assert gov.threads == 2
    assert gov.changes == 0


def test_hysteresis_holds_the_lower_count_until_the_neighbour_has_mostly_gone() -> None:
    feed = Feed()
    gov = governor(feed)
    feed.seen = 1
    settle(gov)
    for i in range(200):  # half a core busy on average: between the two thresholds
        feed.seen = i % 2
        gov.pick()
    assert gov.threads == 1


def test_larger_machines_give_up_one_thread_per_busy_neighbour() -> None:
    feed = Feed()
    gov = governor(feed, threads=8, cores=8)
    feed.seen = 3
    assert settle(gov) == 5
    feed.seen = 0
    assert settle(gov, 40) == 8


def test_the_configured_maximum_holds_on_an_idle_machine() -> None:
    feed = Feed()
    gov = governor(feed, threads=2, cores=8)
    feed.seen = 3
    assert settle(gov) == 2  # 5 cores left: still only 2 asked for


def test_samples_are_taken_at_most_once_per_interval() -> None:
    calls = []
    gov = ThreadGovernor(2, cores=2, interval_s=10.0, sample=lambda: calls.append(1) or 1, clock=lambda: 5.0)
    for _ in range(100):
        gov.pick()
    assert len(calls) == 1


def test_an_unreadable_run_queue_keeps_the_count() -> None:
    gov = ThreadGovernor(2, cores=2, sample=lambda: None)
    assert settle(gov) == 2


def steps(gov: ThreadGovernor, n: int) -> int:
    """`n` steps back to back (each picked for, then done)."""
    for _ in range(n):
        threads = gov.pick()
        gov.done()
    return threads


def test_a_neighbour_that_ran_while_the_server_idled_and_stopped_takes_no_thread() -> None:
    feed = Feed()
    gov = governor(feed)
    assert steps(gov, 5) == 2
    feed.idle(20.0)
    feed.seen, feed.runnable = 2, 0  # the window read two busy cores; nothing of theirs runs now
    assert gov.pick() == 2
    assert gov.busy == 0.0
    feed.seen = 0
    assert steps(gov, 5) == 2
    assert gov.changes == 0


def test_a_neighbour_that_started_while_the_server_idled_takes_its_thread_at_once() -> None:
    feed = Feed()
    gov = governor(feed)
    assert steps(gov, 5) == 2
    feed.idle(20.0)
    feed.seen, feed.runnable = 1, 1  # a CPU-bound process began during the idle spell and runs on
    assert gov.pick() == 1  # the moving average alone (0.3 of a core after one sample) would keep two


def test_a_thread_passing_by_at_the_first_look_is_not_taken_for_a_neighbour() -> None:
    feed = Feed()
    gov = governor(feed)
    steps(gov, 5)
    feed.idle(20.0)
    feed.seen, feed.runnable, feed.passers = 2, 0, [1]  # a kernel thread runnable at the first look only
    assert gov.pick() == 2
    feed.idle(20.0)
    gov.done()
    feed.idle(20.0)
    feed.passers = [1] * gov.looks  # runnable at every look: a neighbour after all
    assert gov.pick() == 1


def test_the_same_window_without_the_idle_spell_takes_a_thread() -> None:
    feed = Feed()  # the contrast: a busy window in the middle of work counts, whatever runs at the instant
    gov = governor(feed)
    steps(gov, 5)
    feed.seen, feed.runnable = 2, 0
    assert steps(gov, 1) == 1


def test_a_client_that_sent_a_burst_and_went_quiet_gives_the_thread_back_at_the_next_window() -> None:
    """The burst that ends an idle spell is sent by a client on the same machine: runnable at the look, quiet a
    moment later. The next window measures that and replaces the look (averaged in, the look kept the thread
    away for five windows: a burst's first answers at 1.7x the step time)."""
    feed = Feed()
    gov = governor(feed)
    steps(gov, 5)
    feed.idle(20.0)
    feed.seen, feed.runnable = 0, 1  # the client is sending its burst at the look
    assert gov.pick() == 1  # the first step of the burst (its prefill): no `done` yet, so no idle spell next
    assert gov.pick() == 2  # the window since: no neighbour used the cores
    assert gov.changes == 2
    feed.seen = 1  # a neighbour that does hold a core after the look still takes its thread, as before
    assert settle(gov) == 1


def test_a_neighbour_still_running_after_the_idle_spell_keeps_its_thread() -> None:
    feed = Feed()
    gov = governor(feed)
    feed.seen, feed.runnable = 1, 1
    assert steps(gov, 20) == 1
    feed.idle(20.0)
    assert gov.pick() == 1
    gov.done()
    assert steps(gov, 20) == 1


def test_the_first_step_after_an_idle_spell_samples_at_once() -> None:
    calls = []
    t = [5.0]
    gov = ThreadGovernor(2, cores=2, interval_s=10.0, sample=lambda: calls.append(1) or 0, clock=lambda: t[0],
                         runnable=lambda: 0)
    gov.pick()
    gov.done()
    t[0] += 0.05  # shorter than idle_s: no new sample inside the interval
    gov.pick()
    gov.done()
    assert len(calls) == 1
    t[0] += 1.0
    gov.pick()
    assert len(calls) == 2


@pytest.mark.skipif(not os.path.exists("/proc/loadavg"), reason="needs Linux /proc to read the run queue")
def test_runnable_neighbours_sees_a_spinning_process() -> None:
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        start = _cpu_ticks(busy.pid)
        while _cpu_ticks(busy.pid) - start < 5:  # it is running (however long the machine took to start it)
            time.sleep(0.01)
        seen = [runnable_neighbours() for _ in range(20)]
    finally:
        busy.kill()
        busy.wait()
    assert all(n is not None for n in seen)
    assert max(n or 0 for n in seen) >= 1


def test_usable_cores_respects_the_affinity_mask() -> None:
    assert 1 <= usable_cores() <= len(os.sched_getaffinity(0))


def _cpu_ticks(pid: int) -> int:
    with open(f"/proc/{pid}/stat", "rb") as f:
        stat = f.read()
    fields = stat[stat.rfind(b")") + 2:].split()
    return int(fields[11]) + int(fields[12])


def _machine_busy_ticks() -> int:
    with open("/proc/stat", "rb") as f:
        cpu = f.readline().split()
    return sum(int(x) for i, x in enumerate(cpu[1:9]) if i not in (3, 4))


@pytest.mark.skipif(not os.path.exists("/proc/stat"), reason="needs Linux /proc to read CPU time")
def test_a_busy_process_counts_as_a_neighbour_and_this_process_does_not() -> None:
    clock = [0.0]
    hz = os.sysconf("SC_CLK_TCK")
    machine0, own0 = _machine_busy_ticks(), _cpu_ticks(os.getpid())
    load = NeighbourLoad(clock=lambda: clock[0])
    assert load() is None  # the first call only takes the reading
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        start, t0 = _cpu_ticks(busy.pid), time.monotonic()
        while _cpu_ticks(busy.pid) - start < 30:  # wait until it has run 0.3 s (however long that takes)
            pass  # this process spins too: its own time must not count
        used = (_cpu_ticks(busy.pid) - start) / hz
        clock[0] = time.monotonic() - t0
        cores = load()
    finally:
        busy.kill()
        busy.wait()
    machine, own = (_machine_busy_ticks() - machine0) / hz, (_cpu_ticks(os.getpid()) - own0) / hz
    assert cores is not None
    # the neighbour's CPU time is in what it reports (ticks are 10 ms: allow two of them) ...
    assert cores * clock[0] >= used - 0.02
    # ... and ours is not: what it reports is at most the machine's busy time less ours (this test's readings
    # bracket its own, so allow a few ticks). Other processes on a shared machine may add to both sides.
    assert own >= 0.1  # we did spin
    assert cores * clock[0] <= machine - own + 0.05
