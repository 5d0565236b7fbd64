"""Deadline admission's state in the engine (engine/forecast.py holds the model): the measured speed, the
forecast of every request admitted (to observe its error once it ends), the prompts the prefix cache is expected
to serve (engine/reuse.py), the recent arrivals (a burst) and the last probe. Kept under the engine's lock by
its caller (engine/core.py); the speed is written by the engine thread alone."""

from __future__ import annotations

import logging
import math
from collections import deque

from sluicegate.engine.forecast import (
    BURST_S,
    PROBE_S,
    Forecast,
    Judgement,
    Load,
    Shape,
    Throughput,
    Verdict,
    Work,
    judge,
    plan,
    work_of,
)
from sluicegate.engine.reuse import RecentPrompts
from sluicegate.engine.types import EngineRequest, FinishReason

log = logging.getLogger("sluicegate.engine")

_NORMAL = (FinishReason.EOS, FinishReason.LENGTH, FinishReason.STOP)


class DeadlineAdmission:
    """The engine's judge of whether a request can meet its deadline at the present load, with what it keeps to
    judge the next (not serving/admission.py's `Admission`: a request's reservation and gate, passed before
    the engine sees it)."""

    def __init__(self, n_slots: int) -> None:
        self.throughput = Throughput()  # calibrated at load (`Engine.calibrate`), corrected after every step
        # request id -> (when it is forecast to end as of the last admission that counted it, seconds a step, new
        # tokens expected, when it was forecast to end as it was admitted): the forecasts' errors, once it ends
        self._forecasts: dict[str, tuple[float, float, int, float]] = {}
        self.recent = RecentPrompts(2 * n_slots)  # what admission expects the prefix cache to serve
        self._arrivals: deque[float] = deque(maxlen=n_slots + 1)  # when the last requests were judged
        self._last_probe = -math.inf  # when an empty engine last admitted a request the forecast refused

    def judge(self, request: EngineRequest, load: Load, shape: Shape, now: float) -> tuple[Judgement, int]:
        """Judge a request against `load` (engine/forecast.py `judge`); keep the forecast of one admitted. Returns
        the judgement and the prompt tokens it is expected to take from the prefix cache."""
        cached = self.recent.expect(request.prompt_ids, {w.key for w in load.waiting})
        self._arrivals.append(now)
        burst = len(self._arrivals) == self._arrivals.maxlen and now - self._arrivals[0] < BURST_S
        j = judge(self.throughput.speed, load, shape, request, now, probe=now - self._last_probe >= PROBE_S,
                  cached=cached, burst=burst)
        if j.probe:
            self._last_probe = now
            log.info("admitting %s as a probe: the forecast says it does not fit, but the engine is empty",
                     request.request_id)
        if j.verdict is Verdict.FITS:
            self.recent.remember(request.request_id, request.prompt_ids, cached)
            if j.forecast is not None:
                self._replan(load, shape, work_of(request, len(request.prompt_ids) - cached), now, j.forecast)
        return j, cached

    def _replan(self, load: Load, shape: Shape, new: Work, now: float, f: Forecast) -> None:
        """Keep the forecast end of every request in the engine, as admitting `new` changes them (and `new`'s
        own, as admitted, unchanged)."""
        ends, mine = plan(self.throughput.speed, load, shape, now, new)
        for w, end in ends:
            if w.key in self._forecasts:
                self._forecasts[w.key] = (end, *self._forecasts[w.key][1:])
        end = now + f.total_s if mine is None else mine[2]
        self._forecasts[new.key] = (end, f.step_s, new.new, end)

    def forget(self, request_id: str) -> tuple[float, float, int, float] | None:
        """The request has left the engine: drop what was kept of it; returns its forecast, if one was kept."""
        self.recent.forget(request_id)
        return self._forecasts.pop(request_id, None)


def forecast_errors(kept: tuple[float, float, int, float] | None, request: EngineRequest, made: int,
                    reason: FinishReason, now: float) -> tuple[float, float] | None:
    """Forecast / actual latency of a run that ended normally, as last updated and as admitted, each forecast
    taken at the tokens it made (an early end-of-text is not the speed's error); None for any other run."""
    actual = now - request.arrival
    if kept is None or reason not in _NORMAL or not made or actual <= 0:
        return None
    end, step, expected, admitted = kept
    unmade = max(0, expected - made) * step
    return (end - unmade - request.arrival) / actual, (admitted - unmade - request.arrival) / actual
