"""How many CPU threads llama.cpp's compute should use, step by step, when other processes want the cores too.

llama.cpp's CPU backend (GNU OpenMP in llama-cpp-python 0.3.x) splits every operation of a forward pass over
its threads and waits at a barrier after each one, hundreds of times per step. When another runnable process
takes one of those threads' core, the others spin at the next barrier until the scheduler gives the lost thread
a slice again: a step that takes 10 ms alone takes a second (docs/benchmarks.md, "CPU contention"). One thread
has no barrier to wait at; it loses only the share of a core the neighbour takes.

So the runner asks a `ThreadGovernor` before each step. A few times a second it reads how much CPU time the
machine spent busy (/proc/stat) and how much of it was this process's (/proc/self/stat): the rest, over the
wall time, is how many cores the neighbours used. The thread count is the usable cores minus the busy
neighbours (at least one, at most the configured maximum), smoothed so a short burst (a shell command, a
streaming client on the same machine) does not make it flap.

A window that spans an idle spell of this server says what the neighbours did while it had nothing to
compute, which matters only if they are still at it: another process that ran while this one idled and has
stopped (a second server that just answered, a build that finished) would otherwise cost the next request its
prefill on one thread (2x slower: docs/benchmarks.md, "Compute threads after an idle spell"), and one that
started while it idled would take a few samples to show. So the first step after an idle spell looks at the
run queue instead (`runnable_neighbours`, up to four looks 2 ms apart, the least kept): the average
restarts at the number of other processes' threads runnable then, and the next window (a quarter of a second
later) replaces that look instead of joining it. A client that sends a burst to an idle server is runnable at
the look and gone a moment later; averaged in, the look kept one thread away for about two seconds (five
windows to fall below `up_at`), a burst's whole first answers computed at 1.7x the step time
(docs/benchmarks.md, "Overload"). A CPU-bound neighbour is runnable at every
look and takes its thread at once; one that has gone is forgotten at once. llama.cpp's thread count does not change any
result: each output element is computed by one thread whatever the split (tested token for token in
tests/e2e/test_runner_e2e.py).

Hand-written because no library exposes it: the kernel's CPU accounting is the only direct signal, and llama.cpp's
threadpool API (which could pause threads itself) is not bound by llama-cpp-python.
"""

from __future__ import annotations

import contextlib
import math
import os
import time
from collections.abc import Callable
from pathlib import Path


def usable_cores() -> int:
    """CPUs this process may run on: its affinity mask, capped by a cgroup CPU quota (containers)."""
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        n = os.cpu_count() or 1
    quota = _cgroup_quota()
    if quota is not None:
        n = min(n, max(1, math.ceil(quota)))
    return max(1, n)


def _cgroup_quota() -> float | None:
    """CPUs allowed by the cgroup (v2 `cpu.max`, else v1 `cpu.cfs_quota_us`); None when unlimited."""
    try:
        quota, _, period = Path("/sys/fs/cgroup/cpu.max").read_text().partition(" ")
        if quota.strip() != "max":
            return int(quota) / int(period)
        return None
    except (OSError, ValueError):
        pass
    try:
        q = int(Path("/sys/fs/cgroup/cpu/cpu.cfs_quota_us").read_text())
        p = int(Path("/sys/fs/cgroup/cpu/cpu.cfs_period_us").read_text())
        return q / p if q > 0 and p > 0 else None
    except (OSError, ValueError):
        return None


def runnable_neighbours() -> int | None:
    """Other processes' threads runnable at this instant: the kernel's count of runnable threads
    (/proc/loadavg) minus this process's own (each thread's state in /proc/self/task, looked at before and
    after the count, the larger kept: one of ours that stopped in between is not taken for a neighbour);
    None without /proc."""
    try:
        own = _own_runnable()
        with open("/proc/loadavg", "rb") as f:
            running = int(f.read().split()[3].split(b"/")[0])
        return max(0, running - max(own, _own_runnable()))
    except (OSError, ValueError, IndexError):
        return None


def _own_runnable() -> int:
    own = 0
    for task in os.scandir("/proc/self/task"):
        with contextlib.suppress(OSError):  # a thread that ended between the listing and the read
            with open(f"{task.path}/stat", "rb") as f:
                stat = f.read()
            own += stat[stat.rfind(b")") + 2 : stat.rfind(b")") + 3] == b"R"
    return own


class NeighbourLoad:
    """Cores the other processes used since the last call: the machine's busy CPU time (/proc/stat) minus this
    process's own (/proc/self/stat), over the wall time between the calls; None on the first call or where
    /proc is missing.

    A time average, not a look at the run queue: a process that runs briefly after each of our steps (a
    streaming client reading its token) is runnable at exactly the moments a per-step sample would look, and
    would read as a busy neighbour though it uses a tenth of a core.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._hz = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        self._last: tuple[float, int, int] | None = None

    def _read(self) -> tuple[int, int] | None:
        try:
            with open("/proc/stat", "rb") as f:
                cpu = f.readline().split()
            busy = sum(int(x) for i, x in enumerate(cpu[1:9]) if i not in (3, 4))  # all but idle and iowait
            with open("/proc/self/stat", "rb") as f:
                stat = f.read()
            fields = stat[stat.rfind(b")") + 2:].split()
            return busy, int(fields[11]) + int(fields[12])  # utime + stime
        except (OSError, ValueError, IndexError):
            return None

    def __call__(self) -> float | None:
        now, got = self._clock(), self._read()
        if got is None:
            return None
        last, self._last = self._last, (now, got[0], got[1])
        if last is None or now <= last[0]:
            return None
        others = (got[0] - last[1]) - (got[1] - last[2])
        return max(0.0, others / self._hz / (now - last[0]))


class ThreadGovernor:
    """Picks the compute thread count for the next step (see the module docstring).

    `busy` is an exponentially weighted average of the cores neighbours used (`NeighbourLoad`), sampled at most
    every `interval_s`.
    One thread is given up as soon as the average says a neighbour holds a core (>= `down_at` of one); it is
    taken back only once the average has fallen below `up_at`, so the count changes at most a few times a
    second and not on every passing burst. `done()` marks the end of a step: a `pick` at least `idle_s` after
    it starts a busy spell, samples at once and restarts the average at the neighbours runnable now
    (`runnable`, the least of up to `looks` looks).
    """

    def __init__(
        self, max_threads: int, *, cores: int | None = None, interval_s: float = 0.25, weight: float = 0.3,
        down_at: float = 0.5, up_at: float = 0.2, idle_s: float = 0.1, looks: int = 4, look_gap_s: float = 0.002,
        sample: Callable[[], float | None] | None = None, runnable: Callable[[], int | None] = runnable_neighbours,
        clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.max_threads = max(1, max_threads)
        self.cores = cores if cores is not None else usable_cores()
        self.interval_s, self.weight, self.down_at, self.up_at = interval_s, weight, down_at, up_at
        self.idle_s, self.looks, self.look_gap_s = idle_s, looks, look_gap_s
        self._sample, self._runnable, self._clock = sample or NeighbourLoad(clock), runnable, clock
        self._sleep = sleep
        self._next = 0.0
        self._ended: float | None = None  # when the last step ended (`done`), until the next pick
        self.busy = 0.0  # smoothed runnable neighbours
        self._looked = False  # `busy` is a look at the run queue, not yet a measured window
        self.threads = self.max_threads
        self.changes = 0  # how often the count changed (metrics, tests)

    def _still_running(self) -> int | None:
        """Other processes' threads runnable now, the least of up to `looks` looks `look_gap_s` apart (a look
        that finds none ends it at once): a kernel thread, or a process finishing its last write, is runnable
        for microseconds, a CPU-bound neighbour at every look (seen here: one look in ten after an answer found
        such a passer-by)."""
        running = self._runnable()
        for _ in range(self.looks - 1):
            if not running:
                break
            self._sleep(self.look_gap_s)
            again = self._runnable()
            running = None if again is None else min(running, again)
        return running

    def done(self) -> None:
        """The step picked for has ended: the time until the next `pick` is idle."""
        self._ended = self._clock()

    def pick(self) -> int:
        """The thread count for the step about to run."""
        now = self._clock()
        resumed = self._ended is not None and now - self._ended >= self.idle_s
        self._ended = None
        if now < self._next and not resumed:
            return self.threads
        self._next = now + self.interval_s
        seen = self._sample()
        if seen is None:
            return self.threads
        # The first window after a look at the run queue replaces the look rather than joining the average: the
        # look saw an instant (a client sending the burst that ended the idle spell is runnable then, for a
        # fraction of a second), the window measures the time since.
        self.busy = seen if self._looked else self.busy + self.weight * (seen - self.busy)
        self._looked = False
        if resumed and (running := self._still_running()) is not None:
            self.busy = float(running)  # the window spanned an idle spell: what runs now is what counts
            self._looked = True
        # Neighbours that hold a core each, rounded with hysteresis: a fractional average between up_at and
        # down_at keeps the previous decision.
        held = math.floor(self.busy) + (1 if self.busy - math.floor(self.busy) >= self.down_at else 0)
        free = max(1, min(self.max_threads, self.cores - held))
        if free > self.threads and self.busy - (self.cores - free) >= self.up_at:
            free = self.threads  # not idle enough yet to take a thread back
        if free != self.threads:
            self.threads = free
            self.changes += 1
        return self.threads
