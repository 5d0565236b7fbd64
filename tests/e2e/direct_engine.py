"""Run requests directly through the engine (no HTTP), in its own process; print JSON results.

Used by the fidelity test: what the service returns must equal what the engine computes.
Input (stdin): {"requests": [{"prompt", "max_new_tokens", "temperature", "seed"}], "slots": N}
"""

from __future__ import annotations

import asyncio
import json
import sys

from sluicegate.backends.llama_cpp import LlamaCppRunner, default_model_path
from sluicegate.engine import AsyncEngine, Engine, EngineRequest, SamplingParams


async def run(spec: dict) -> list[dict]:
    runner = LlamaCppRunner(default_model_path(), n_slots=spec.get("slots", 4))
    engine = Engine(runner)
    engine.start()
    client = AsyncEngine(engine)
    results = []
    try:
        for i, r in enumerate(spec["requests"]):
            ids = runner.tokenize(r["prompt"])
            params = SamplingParams(
                max_new_tokens=r["max_new_tokens"], temperature=r["temperature"], seed=r.get("seed"),
            )
            out = await client.generate(EngineRequest(f"direct-{i}", ids, params))
            results.append({
                "token_ids": out.new_token_ids, "text": out.text, "finish_reason": str(out.finish_reason),
                "independent_prompt_tokens": len(ids),
            })
    finally:
        engine.stop()
        runner.close()
    return results


if __name__ == "__main__":
    json.dump(asyncio.run(run(json.load(sys.stdin))), sys.stdout)
