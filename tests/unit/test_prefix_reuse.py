"""Token-granular prefix reuse through the engine, on the reference backend with llama.cpp's one-token drift
modelled (`single_token_drift`): reuse is counted exactly, and outputs are those of a cold cache."""

from __future__ import annotations

import random
from collections.abc import Sequence

import numpy as np

from sluicegate.backends.base import BatchItem
from sluicegate.engine import Engine, SchedulerConfig
from tests.unit.test_engine import Runner, engine, req, run

DRIFT = {"single_token_drift": 0.05}
# a reuse granularity beyond any prompt: a cold cache every time
NO_REUSE = SchedulerConfig(block_size=1 << 20, max_waiting=1024)
LETTERS = list(b"abcdefghijklmnopqrstuvwxyz ")


def kv_matches_cache(eng: Engine, runner: Runner) -> None:
    """What the prefix cache says each slot holds is what the runner's KV holds, all computed as prompt (or,
    with exact replies, computed by a runner where that makes no difference)."""
    slots = eng.scheduler.slots
    for slot in range(slots.n_slots):
        n = slots.n_cached(slot)
        assert runner._slots[slot][:n] == slots.tree.tokens(slot), slot
        if not eng.scheduler.exact_replies:
            assert not any(runner._alone[slot][:n]), f"slot {slot} caches tokens computed one at a time"
    slots.tree.check()


def cold(
    prompts: Sequence[list[int]], params: Sequence[dict[str, object]], drift: dict[str, float] = DRIFT,
) -> list[list[int]]:
    with engine(NO_REUSE, n_slots=2, **drift) as (eng, _):
        outs = [run(eng, req(p, **v)) for p, v in zip(prompts, params, strict=True)]
        for c in outs:
            assert c.wait().cached_tokens == 0
        return [c.tokens for c in outs]


def test_the_drift_model_separates_decoded_from_prefilled_tokens() -> None:
    r = Runner(n_slots=2, **DRIFT)
    ids = [256, *b"some prompt", *b"decoded"]
    r.execute([BatchItem(0, ids[:12], 0, False)])
    for i in range(12, len(ids)):  # one token at a time, as decode steps compute them
        last = r.execute([BatchItem(0, ids[i : i + 1], i, True)])
    whole = r.execute([BatchItem(1, ids, 0, True)])
    assert not np.array_equal(last, whole)
    r2 = Runner(n_slots=2, **DRIFT)
    chunks = r2.execute([BatchItem(0, ids[:5], 0, False)]), r2.execute([BatchItem(0, ids[5:], 5, True)])
    assert np.array_equal(chunks[1], whole)  # chunk boundaries alone change nothing


def test_every_shared_prefix_length_is_reused_exactly_and_changes_nothing() -> None:
    base = [256, *(LETTERS[i * 7 % len(LETTERS)] for i in range(300))]
    prompts = [base] + [[*base[:k], *b"0123"] for k in range(1, 301)]
    params: list[dict[str, object]] = [
        {"max_new_tokens": 3, "temperature": 0.0} if k % 2 else
        {"max_new_tokens": 3, "temperature": 0.8, "seed": k} for k in range(len(prompts))
    ]
    expect = cold(prompts, params)
    with engine(None, **DRIFT) as (eng, runner):
        for k, (p, v) in enumerate(zip(prompts, params, strict=True)):
            c = run(eng, req(p, **v))
            final = c.wait()
            assert final.cached_tokens == (0 if k == 0 else k), k  # the shared prefix, to the token
            assert c.tokens == expect[k], k
        assert eng.stats.prefix_hits == 300 and eng.stats.cached_tokens == sum(range(1, 301))
        kv_matches_cache(eng, runner)


def test_multi_turn_history_reuses_earlier_prompts_but_not_replies() -> None:
    system = [256, *b"You are terse. "]
    turns = [b"Hi there.", b"And then?", b"Why so?", b"Bye."]
    with engine(None, **DRIFT) as (eng, runner):
        history: list[int] = list(system)
        prompts, outs = [], []
        previous_prompt = 0
        for user in turns:
            prompt = [*history, *b"<u>", *user, *b"<a>"]
            c = run(eng, req(prompt, max_new_tokens=6, temperature=0.0, ignore_eos=True))
            final = c.wait()
            # everything earlier turns sent as prompt is reused; their replies (decoded) are recomputed
            assert final.cached_tokens == previous_prompt
            prompts.append(prompt)
            outs.append(c.tokens)
            history = [*prompt, *c.tokens]
            previous_prompt = len(prompt)
        kv_matches_cache(eng, runner)
    assert outs == cold(prompts, [{"max_new_tokens": 6, "temperature": 0.0, "ignore_eos": True}] * len(prompts))


def conversation(
    eng: Engine, turns: Sequence[bytes], temperature: float = 0.0, max_new_tokens: int = 6,
) -> tuple[list[list[int]], list[int]]:
    """Each turn resends the whole history with the replies given: (prompts, cached tokens); turn i seeded i."""
    history: list[int] = [256, *b"You are terse. "]
    prompts, cached = [], []
    for i, user in enumerate(turns):
        prompt = [*history, *user]
        c = run(eng, req(prompt, max_new_tokens=max_new_tokens, temperature=temperature, seed=i, ignore_eos=True))
        cached.append(c.wait().cached_tokens)
        prompts.append(prompt)
        history = [*prompt, *c.tokens]
    return prompts, cached


def cold_conversation(
    turns: Sequence[bytes], temperature: float, drift: dict[str, float],
) -> tuple[list[list[int]], list[int]]:
    with engine(NO_REUSE, n_slots=2, **drift) as (eng, _):
        return conversation(eng, turns, temperature)


TURNS = [b"<u>Hi there.<a>", b"<u>And then?<a>", b"<u>Why so?<a>", b"<u>Bye.<a>"]
SHORT_TURNS = [b"Hi", b"?!", b"?!", b"?!"]  # the reply ends right before the next reply: its state matters most


def test_a_runner_with_exact_decoded_kv_reuses_the_replies_too() -> None:
    """llama.cpp's flash-attention row path computes a decoded token's KV as a prefill would
    (`decoded_kv_exact`): the next turn reuses the whole history but the last reply token (never computed)."""
    for turns, temperature in ((TURNS, 0.0), (SHORT_TURNS, 1.0)):
        with engine(None, decoded_kv_exact=True) as (eng, runner):
            assert eng.scheduler.exact_replies
            prompts, cached = conversation(eng, turns, temperature)
            kv_matches_cache(eng, runner)
        assert cached == [0] + [len(p) + 6 - 1 for p in prompts[:-1]]
        # each turn's prompt holds the replies before it: the same replies as a cold cache gave, token for token
        assert prompts == cold_conversation(turns, temperature, {})[0]


def test_exact_replies_with_speculative_drafts_cache_only_what_the_kv_holds() -> None:
    """Drafts accepted in a verification step are computed and become part of the reply; a step may also compute
    drafts past the token that ends the sequence. The cache must claim exactly the KV's tokens, and a
    conversation must answer as a cold cache without speculation does."""
    turns = [b"<u>Repeat: abcabcabcabc<a>", b"<u>Again: xyzxyzxyz<a>", b"<u>And: abcabc<a>"]
    for max_new in (5, 9, 17):
        with engine(SchedulerConfig(speculative_ngram=4), decoded_kv_exact=True) as (eng, runner):
            prompts, cached = conversation(eng, turns, max_new_tokens=max_new)
            kv_matches_cache(eng, runner)
            assert eng.stats.snapshot()["spec_accepted_tokens"] > 0
        assert cached[1:] == [len(p) + max_new - 1 for p in prompts[:-1]]
        with engine(NO_REUSE, n_slots=2) as (eng, _):
            assert prompts == conversation(eng, turns, max_new_tokens=max_new)[0]


def test_declaring_exact_decoded_kv_where_it_is_not_changes_outputs() -> None:
    """The check above can fail: a runner whose decoded tokens round differently (the drift model) but that
    declares them exact gives other replies than a cold cache once a turn reuses a reply."""
    with engine(None, decoded_kv_exact=True, **DRIFT) as (eng, _):
        prompts, cached = conversation(eng, SHORT_TURNS, 1.0)
    assert cached[1] > len(prompts[0])  # a reply was reused
    assert prompts != cold_conversation(SHORT_TURNS, 1.0, DRIFT)[0]


def test_concurrent_requests_under_eviction_pressure_match_a_cold_cache() -> None:
    rng = random.Random(5)
    stems = [[256, *(rng.choice(LETTERS) for _ in range(rng.randint(1, 120)))] for _ in range(5)]
    prompts = []
    for _ in range(60):
        stem = rng.choice(stems)
        cut = rng.randint(1, len(stem))
        prompts.append([*stem[:cut], *(rng.choice(LETTERS) for _ in range(rng.randint(0, 40)))])
    params: list[dict[str, object]] = [
        {"max_new_tokens": rng.randint(1, 12), "temperature": rng.choice([0.0, 0.9]), "seed": i}
        for i in range(len(prompts))
    ]
    expect = cold(prompts, params)
    # three slots for sixty requests: constant eviction; a small budget chunks prompts at odd places
    cfg = SchedulerConfig(max_batch_tokens=23, min_prefill_chunk=2)
    with engine(cfg, n_slots=3, **DRIFT) as (eng, runner):
        outs = [run(eng, req(p, **v)) for p, v in zip(prompts, params, strict=True)]
        finals = [c.wait() for c in outs]
        assert [c.tokens for c in outs] == expect
        assert eng.stats.prefix_hits > 10 and eng.scheduler.slots.evictions > 0
        assert eng.stats.cached_tokens == sum(f.cached_tokens for f in finals)
        assert all(f.cached_tokens <= max(len(p) - 2, 0) for f, p in zip(finals, prompts, strict=True))
        assert any(op == "copy" for op in runner.kv_ops)
        kv_matches_cache(eng, runner)
