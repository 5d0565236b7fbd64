"""The exactness guarantee on weight types other than the bundled Q4_1 (backends/invariance.py): the bundled model
requantized to Q4_K_M (what most GGUFs ship as) passes every load-time check as the runner runs it, and fails the
chunking check with ggml's tiled K-quant kernel left on (`GGML_CPU_TILED_MM=1`), which is why the runner turns it
off. (F16 weights are batch-variant on AMD EPYC with AVX2, llamafile's tinyBLAS summing in another order than
ggml's dot product; other CPUs take other kernels, so no test pins that: docs/engine.md.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sluicegate.backends.llama_cpp import default_model_path

PROBE = """
import json, sys
from pathlib import Path
from sluicegate.backends.llama_cpp import LlamaCppRunner
r = LlamaCppRunner(Path(sys.argv[1]), n_ctx=256, n_slots=8, adaptive_threads=False, probe=True)
f = r.earn_invariance()
print(json.dumps({"batching": f.batching, "chunking": f.chunking, "decoded": f.decoded, "drafts": f.drafts,
                  "why": f.why, "exact": r.limits.batch_invariant}))
"""


def quantized(tmp: Path, name: str, ftype: int) -> Path:
    """The bundled model requantized by llama.cpp's own quantizer (`--allow-requantize`)."""
    import llama_cpp as L

    out = tmp / f"smollm2-{name}.gguf"
    params = L.llama_model_quantize_default_params()
    params.ftype, params.allow_requantize, params.nthread = ftype, True, 2
    assert L.llama_model_quantize(str(default_model_path()).encode(), str(out).encode(), params) == 0
    return out


def probe(gguf: Path, **env: str) -> dict[str, object]:
    run = subprocess.run([sys.executable, "-c", PROBE, str(gguf)], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "SLUICEGATE_LLAMA_LOG": "", **env})
    assert run.returncode == 0, run.stderr[-2000:]
    found: dict[str, object] = json.loads(run.stdout.strip().splitlines()[-1])
    return found


@pytest.fixture(scope="module")
def q4_k_m(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return quantized(tmp_path_factory.mktemp("q4km"), "q4_k_m", 15)  # LLAMA_FTYPE_MOSTLY_Q4_K_M


def test_k_quants_are_exact_as_the_runner_runs_them(q4_k_m: Path) -> None:
    found = probe(q4_k_m)
    assert found == {"batching": True, "chunking": True, "decoded": True, "drafts": True, "why": "", "exact": True}


def test_k_quants_on_ggml_tiled_kernel_are_caught_and_declared(q4_k_m: Path) -> None:
    found = probe(q4_k_m, GGML_CPU_TILED_MM="1")
    assert found["chunking"] is False and found["exact"] is False
    assert "logits differ by up to" in str(found["why"])

