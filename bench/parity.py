"""Prompt token counts on /v1/completions, ours against llama.cpp's llama-server, for the same text.

    .venv/bin/python bench/parity.py

Both servers load the same GGUF; each prompt is sent with max_tokens 1 and the usage's prompt_tokens compared.
A ChatML prompt must be read with its control tokens by both (docs/serving.md).
"""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.concurrency import model_of, server

PROMPTS = {
    "ChatML": "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nWhat is the capital "
              "of France?<|im_end|>\n<|im_start|>assistant\n",
    "plain": "The capital of France is",
    "end-of-text inside": "First document.<|endoftext|>Second document.",
}


def counts(url: str) -> dict[str, int]:
    model = model_of(url)
    out = {}
    for name, text in PROMPTS.items():
        r = httpx.post(f"{url}/v1/completions", json={"model": model, "prompt": text, "max_tokens": 1,
                                                       "temperature": 0}, timeout=120)
        r.raise_for_status()
        out[name] = int(r.json()["usage"]["prompt_tokens"])
    return out


def main() -> None:
    log = Path("/tmp/sluicegate-parity.log")
    with contextlib.ExitStack() as stack:
        ours = counts(stack.enter_context(server("sluicegate", 1, log)))
        peer = counts(stack.enter_context(server("llama-server", 1, log)))
    print("| prompt | sluicegate | llama-server |\n|---|---|---|")
    for name in PROMPTS:
        print(f"| {name} | {ours[name]} | {peer[name]} |")


if __name__ == "__main__":
    main()
