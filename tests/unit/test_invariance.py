"""The load-time probe of what a model's numerics keep exact (backends/invariance.py): a runner whose numerics
never depend on the layout passes every check, one that computes a token alone in its slot differently fails the
checks that lay tokens out alone, says by how much, and its declared limits lose what did not hold."""

from __future__ import annotations

from sluicegate.backends.base import BatchItem
from sluicegate.backends.invariance import probe
from sluicegate.backends.reference import ReferenceRunner


def test_a_runner_whose_numerics_never_depend_on_the_layout_keeps_its_declaration() -> None:
    runner = ReferenceRunner(n_slots=8, decoded_kv_exact=True)
    found = probe(runner)
    assert (found.batching, found.chunking, found.decoded, found.drafts, found.why) == (True, True, True, True, "")
    assert found.declare(runner.limits) == runner.limits
    runner.execute([BatchItem(s, [5], 0) for s in range(8)])  # the probe's slots are cleared after: all at 0


def test_a_token_computed_alone_differently_is_found_and_withdrawn() -> None:
    runner = ReferenceRunner(n_slots=8, decoded_kv_exact=True, single_token_drift=0.01)
    found = probe(runner)
    assert found.batching and found.chunking  # one token per slot either way; no piece is one token
    assert not found.decoded and not found.drafts
    assert found.why.startswith("a prompt decoded one token a step: logits differ by up to")
    runner.adopt(found)
    assert runner.withdrawn == ("decoded_kv", "drafts")
    assert runner.limits.batch_invariant and not runner.limits.decoded_kv_exact and not runner.limits.drafts_exact
