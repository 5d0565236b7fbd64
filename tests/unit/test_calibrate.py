"""The step model's measurement (engine/calibrate.py): decode steps timed at several batch sizes, at a chat
answer's position, on the runner itself."""

from __future__ import annotations

import time
from collections.abc import Sequence

from sluicegate.backends.base import BatchItem, Logits
from sluicegate.backends.reference import ReferenceRunner
from sluicegate.engine.calibrate import POSITION, batch_sizes, measure

ONE, MORE = 0.002, 0.02  # seconds: a decode step of one sequence, and of two or more (a lower bound each)


class StepShaped(ReferenceRunner):
    """Decode steps of one sequence sleep `ONE`, of more `MORE`: the jump a CPU shows from one sequence to two
    (the one-row kernels), which a straight line from 1 to n smooths away. Records each decode's positions."""

    def __init__(self) -> None:
        super().__init__(n_slots=16, n_ctx=256)
        self.decoded: list[list[int]] = []

    def execute(self, batch: Sequence[BatchItem]) -> Logits:
        if not any(i.prompt for i in batch):
            self.decoded.append([i.start_pos for i in batch])
            time.sleep(ONE if len(batch) == 1 else MORE)
        return super().execute(batch)


def test_the_powers_of_two_and_the_slot_count_are_timed() -> None:
    assert batch_sizes(1) == [1]
    assert batch_sizes(2) == [1, 2]
    assert batch_sizes(16) == [1, 2, 4, 8, 16]
    assert batch_sizes(12) == [1, 2, 4, 8, 12]


def test_a_step_that_jumps_at_two_sequences_is_forecast_as_measured() -> None:
    r = StepShaped()
    c = measure(r, repeats=2)
    assert [b for b, _ in c.between] == [2, 4, 8]
    # every batch of two or more sleeps MORE: a line from step_1 to step_16 would say 0.0032 s at two
    assert all(c.step(b) >= MORE for b in range(2, 17))
    assert c.step(1) >= ONE
    assert {len(p) for p in r.decoded} == {1, 2, 4, 8, 16}
    assert min(min(p) for p in r.decoded) == POSITION  # timed where a chat answer decodes, not at position 4
    # every slot left empty for the engine: a prompt from position 0 is accepted in each (the runner refuses
    # a start that is not where its slot ends)
    r.execute([BatchItem(s, [5], 0, prompt=True) for s in range(16)])
