"""Does llama.cpp compute a token the same way whatever the chunking and the company? Bit for bit.

    .venv/bin/python bench/determinism.py                    # the runner as the server uses it (flash attention)
    .venv/bin/python bench/determinism.py --no-flash-attn    # the same checks with the plain attention kernels

Each check compares float32 logits with `np.array_equal` (no tolerance), through `LlamaCppRunner`:
  chunking   a 900-token prompt prefilled in random chunks of >= 2 tokens vs. in 64-token blocks
  one-token  the same, with one-token pieces among the chunks (what the scheduler never does)
  company    a sequence decoding alone vs. next to neighbouring slots (shorter and longer contexts)
  shared     a prompt chunk in the same step as neighbours' decode tokens vs. alone
  reuse      a prompt whose first blocks were copied from another slot (prefix cache) vs. computed
  decoded    logits after tokens fed one per step (decode) vs. the same tokens prefilled as a prompt
  sweep      (--reuse-sweep N) a prefix reused at every length 1..N (copied, cut there, 8 tokens prefilled
             after it) vs. the same prompt prefilled cold: what token-granular prefix reuse relies on
and then times a 512-token prefill, a decode step of 8 sequences and a lone sequence's decode step (at ~100
positions, and at ~600, where llama.cpp's default f16 keys would take the split-KV path). docs/engine.md quotes
the results.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from sluicegate.backends.base import BatchItem
from sluicegate.backends.llama_cpp import LlamaCppRunner, default_model_path
from sluicegate.testing.decoding import greedy_in_company, prefill_cut


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--flash-attn", action=argparse.BooleanOptionalAction, default=True,
                    help="flash attention on its one-row path, as served (default), or the plain kernels")
    ap.add_argument("--tiled-prefill", action="store_true",
                    help="prompts on the tiled kernel, generated tokens on the one-row path (backends/tiled.py)")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--model", type=Path, default=None, help="another GGUF (default: SmolLM2)")
    ap.add_argument("--reuse-sweep", type=int, default=0, metavar="N", help="also check reuse at lengths 1..N")
    args = ap.parse_args()
    r = LlamaCppRunner(args.model or default_model_path(), n_ctx=2048, n_slots=8, n_batch=512, n_threads=args.threads,
                       flash_attn=args.flash_attn, tiled_prefill=args.tiled_prefill)
    rng = np.random.default_rng(7)
    prompt = [int(t) for t in rng.integers(100, 40_000, size=900)]
    other = [int(t) for t in rng.integers(100, 40_000, size=1800)]
    results: list[tuple[str, int, int, float]] = []
    mode = "flash attention on (the server's default)" if args.flash_attn else "flash attention off"
    mode += ", tiled prefill" if args.tiled_prefill else ""
    print(f"\n{mode}\n", flush=True)
    print("| check | bit-identical | max abs diff |\n|---|---|---|", flush=True)

    def report(name: str, ok: int, total: int, diff: float) -> None:
        results.append((name, ok, total, diff))
        print(f"| {name} | {ok}/{total} | {diff:.3g} |", flush=True)

    def fill(slot: int, ids: list[int], start: int = 0) -> None:
        pos = start
        while pos < len(ids):
            end = min(len(ids), pos + 512)
            r.execute([BatchItem(slot, ids[pos:end], pos, False, prompt=True)])
            pos = end

    def prefill(slot: int, ids: list[int], bounds: list[int]) -> np.ndarray:
        return prefill_cut(r, slot, ids, bounds)

    def blocks(n: int, size: int = 64) -> list[int]:
        return [*range(0, n, size), n]

    # chunking ------------------------------------------------------------------------------------------
    base = prefill(0, prompt, blocks(len(prompt)))

    def random_chunks(sizes: list[int]) -> list[int]:
        bounds = [0]
        while bounds[-1] < len(prompt):
            nxt = min(len(prompt), bounds[-1] + int(rng.choice(sizes)))
            if len(prompt) - nxt == 1:
                nxt = len(prompt)
            bounds.append(nxt)
        return bounds

    variants = (("chunking: random chunks of >= 2 tokens vs 64-token blocks", [2, 7, 33, 64, 100, 250, 512]),
                ("one-token: random chunks including one-token pieces", [1, 1, 7, 64, 250]))
    for label, sizes in variants:
        same, worst, cases = 0, 0.0, 12
        for _ in range(cases):
            got = prefill(0, prompt, random_chunks(sizes))
            same += bool(np.array_equal(base, got))
            worst = max(worst, float(np.max(np.abs(base - got))))
        report(label, same, cases, worst)

    # company ---------------------------------------------------------------------------------------------
    def decode_with(neighbours: dict[int, int], steps: int = 6, at: int = 700) -> list[np.ndarray]:
        prefill(0, prompt[:at], blocks(at, 512))
        for slot, length in neighbours.items():
            r.clear(slot)
            fill(slot, other[:length])
        return greedy_in_company(r, prompt[at], at, neighbours, steps)

    for at in (100, 300, 700):
        alone = decode_with({}, at=at)
        same, worst, n = 0, 0.0, 0
        crowds = ({1: 50}, {1: 1500}, {1: 50, 2: 1500, 3: 200}, {3: 900}, dict.fromkeys(range(1, 8), 400))
        for neighbours in crowds:
            crowded = decode_with(neighbours, at=at)
            for a, b in zip(alone, crowded, strict=True):
                same += bool(np.array_equal(a, b))
                worst = max(worst, float(np.max(np.abs(a - b))))
                n += 1
        report(f"company: decode at position {at}, alone vs with neighbours", same, n, worst)

    # shared ----------------------------------------------------------------------------------------------
    same, worst, n = 0, 0.0, 0
    for start, end in ((0, 64), (512, 640), (640, 700), (832, 900)):
        solo = prefill(0, prompt[:end], [*blocks(start, 512), end])
        for neighbours in ({1: 30}, {1: 30, 2: 1500}):
            r.clear(0)
            if start:
                prefill(0, prompt[:start], blocks(start, 512))
            for slot, length in neighbours.items():
                r.clear(slot)
                fill(slot, other[:length])
            items = [BatchItem(s, [7], length, True) for s, length in neighbours.items()]
            got = r.execute([*items, BatchItem(0, prompt[start:end], start, True, prompt=True)])[-1]
            same += bool(np.array_equal(solo, got))
            worst = max(worst, float(np.max(np.abs(solo - got))))
            n += 1
    report("shared: prompt chunk next to neighbours' decode tokens vs alone", same, n, worst)

    # reuse -----------------------------------------------------------------------------------------------
    same, worst, n = 0, 0.0, 0
    for shared_len, total in ((64, 300), (384, 700), (512, 900)):
        cold = prefill(0, prompt[:total], [*range(0, total, 400), total])
        r.clear(1)
        fill(1, prompt[:shared_len] + other[:300])  # another request with the same first blocks
        r.copy(1, 2)
        r.truncate(2, shared_len)
        got = r.execute([BatchItem(2, prompt[shared_len:total], shared_len, True, prompt=True)])[0]
        same += bool(np.array_equal(cold, got))
        worst = max(worst, float(np.max(np.abs(cold - got))))
        n += 1
    report("reuse: prefix copied from another slot, the rest prefilled vs all prefilled", same, n, worst)

    if args.reuse_sweep:
        r.clear(1)
        fill(1, prompt)  # 512-token chunks
        same, worst = 0, 0.0
        for k in range(1, args.reuse_sweep + 1):
            ids = prompt[:k] + other[:8]
            cold = prefill(0, ids, [0, len(ids)])
            r.copy(1, 2)
            r.truncate(2, k)
            got = r.execute([BatchItem(2, ids[k:], k, True, prompt=True)])[0]
            same += bool(np.array_equal(cold, got))
            worst = max(worst, float(np.max(np.abs(cold - got))))
        report(f"sweep: prefix reused at every length 1..{args.reuse_sweep} vs prefilled cold", same,
               args.reuse_sweep, worst)

    # decoded ---------------------------------------------------------------------------------------------
    at, steps = 400, 80
    prefill(0, prompt[:at], blocks(at, 512))
    seq, decoded = list(prompt[:at]), []
    tok = prompt[at]
    for _ in range(steps):
        seq.append(tok)
        o = r.execute([BatchItem(0, [tok], len(seq) - 1, True)])[0].copy()
        decoded.append(o)
        tok = int(np.argmax(o))
    same, worst = 0, 0.0
    checks = list(range(0, steps, 9))
    for k in checks:
        n_tokens = at + k + 1
        got = prefill(1, seq[:n_tokens], [0, 200, n_tokens])
        same += bool(np.array_equal(decoded[k], got))
        worst = max(worst, float(np.max(np.abs(decoded[k] - got))))
    report("decoded: tokens decoded one by one vs prefilled as a prompt", same, len(checks), worst)

    # timing ----------------------------------------------------------------------------------------------
    t0 = time.perf_counter()
    for _ in range(3):
        prefill(0, prompt[:512], [0, 512])
    pf = 3 * 512 / (time.perf_counter() - t0)
    for s in range(8):
        r.clear(s)
        fill(s, other[s * 100 : s * 100 + 600])
    t0 = time.perf_counter()
    for k in range(10):
        r.execute([BatchItem(s, [7], 600 + k, True) for s in range(8)])
    step = (time.perf_counter() - t0) / 10
    lone = {}
    for at in (100, 600):
        r.clear(0)
        fill(0, other[:at])
        t0 = time.perf_counter()
        for k in range(20):
            r.execute([BatchItem(0, [7], at + k, True)])
        lone[at] = (time.perf_counter() - t0) / 20
    print(f"\nprefill: {pf:.0f} tokens/s (512-token chunks); decode: {step * 1e3:.1f} ms per step of 8 "
          f"sequences at ~600 positions ({8 / step:.0f} tokens/s); one sequence: {lone[100] * 1e3:.1f} ms a step "
          f"at ~100 positions, {lone[600] * 1e3:.1f} ms at ~600")
    r.close()


if __name__ == "__main__":
    main()
