"""Prompt tokens against llama-server: the same GGUF and the same chat template file, 22 conversations.

    LLAMA_SERVER=/path/to/llama-server .venv/bin/python bench/template_tokens.py \
        --model gemma-3-270m-q4_k_m.gguf --template tests/data/chat_templates/gemma-3.jinja

Both servers get `--chat-template-file` the same file (llama-server with `--jinja`). For each conversation:
llama-server's `POST /apply-template` then `POST /tokenize` (`parse_special: true`, `add_special: true`: the
rendered text loses its BOS, which tokenising puts back), against our `POST /tokenize` with the same messages.
Where the tokens are equal, a greedy reply of `--max-tokens` from each (`/v1/chat/completions`, temperature 0)
is compared too. The last conversation holds a control token's written form in the user's text: there the two
differ by design (docs/models.md: a client's text never becomes a control token). Prints the markdown table in
docs/benchmarks.md, *Prompt tokens against llama-server*.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.common import free_port, fresh_data_dir, launch, serve_command

CALL = {"id": "call_1", "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}


def conversations() -> list[tuple[str, list[dict[str, Any]]]]:
    u = lambda text: {"role": "user", "content": text}  # noqa: E731
    a = lambda text: {"role": "assistant", "content": text}  # noqa: E731
    s = lambda text: {"role": "system", "content": text}  # noqa: E731
    return [
        ("one user turn", [u("Hi")]),
        ("system prompt", [s("You are a pirate."), u("Where is the treasure?")]),
        ("system ending in a newline", [s("Be brief.\n"), u("Hi")]),
        ("system ending in two newlines", [s("Be brief.\n\n"), u("Hi")]),
        ("two turns", [u("2+2?"), a("4"), u("And 3+3?")]),
        ("three turns and a system", [s("Answer in French."), u("Hello"), a("Bonjour"), u("Thanks"), a("De rien"),
                                      u("Bye")]),
        ("newlines inside", [u("line one\nline two\n\nline four")]),
        ("ends in a newline", [u("a question?\n")]),
        ("leading and trailing spaces", [u("   padded   ")]),
        ("tabs and CRLF", [u("a\tb\r\nc\r\n")]),
        ("accents and CJK", [u("héllo wörld, 日本語のテキスト")]),
        ("emoji with joiners", [u("family: 👩‍👩‍👧 flag: 🇺🇦 sparkle ✨")]),
        ("right to left", [u("مرحبا بالعالم")]),
        ("code block", [u("```python\ndef f(x):\n    return x * 2\n```\nWhat does it do?")]),
        ("JSON in the text", [u('{"a": [1, 2, {"b": null}], "c": "d"}')]),
        ("a long message", [u(" ".join(f"word{i}" for i in range(400)))]),
        ("assistant reply with newlines", [u("List two."), a("1. one\n2. two\n"), u("More?")]),
        ("a single character", [u(".")]),
        ("tool turn", [u("Weather in Oslo?"), {"role": "assistant", "content": None, "tool_calls": [CALL]},
                       {"role": "tool", "tool_call_id": "call_1", "content": "12 C, rain"}]),
        ("tool turn with text", [u("Weather?"), {"role": "assistant", "content": "Checking.", "tool_calls": [CALL]},
                                 {"role": "tool", "tool_call_id": "call_1", "content": "12 C"}]),
        ("tool turn, then the user", [u("Weather?"), {"role": "assistant", "content": None, "tool_calls": [CALL]},
                                      {"role": "tool", "tool_call_id": "call_1", "content": "12 C"},
                                      a("It is 12 C."), u("Thanks!")]),
        ("control text typed by the user (differs by design)", [u("say <end_of_turn> please")]),
    ]


def peer_tokens(url: str, messages: list[dict[str, Any]]) -> list[int] | str:
    r = httpx.post(f"{url}/apply-template", json={"messages": messages}, timeout=60)
    if r.status_code != 200:
        return f"{r.status_code}: {r.text[:120]}"
    prompt = r.json()["prompt"]
    t = httpx.post(f"{url}/tokenize", json={"content": prompt, "parse_special": True, "add_special": True},
                   timeout=60)
    return list(t.json()["tokens"])


def our_tokens(url: str, messages: list[dict[str, Any]]) -> list[int] | str:
    r = httpx.post(f"{url}/tokenize", json={"messages": messages}, timeout=60)
    if r.status_code != 200:
        return f"{r.status_code}: {r.text[:120]}"
    return list(r.json()["tokens"])


def reply(url: str, messages: list[dict[str, Any]], max_tokens: int) -> str:
    r = httpx.post(f"{url}/v1/chat/completions", timeout=120, json={
        "model": "default", "messages": messages, "max_tokens": max_tokens, "temperature": 0})
    if r.status_code == 404 or "model_not_found" in r.text:
        model = httpx.get(f"{url}/v1/models", timeout=10).json()["data"][0]["id"]
        r = httpx.post(f"{url}/v1/chat/completions", timeout=120, json={
            "model": model, "messages": messages, "max_tokens": max_tokens, "temperature": 0})
    return str(r.json()["choices"][0]["message"]["content"]) if r.status_code == 200 else f"HTTP {r.status_code}"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--template", type=Path, required=True)
    ap.add_argument("--max-tokens", type=int, default=24)
    ap.add_argument("--log", type=Path, default=Path("/tmp/template_tokens.log"))
    ap.add_argument("--ours-args", default="", help="more `serve` arguments for ours, space-separated")
    ap.add_argument("--peer-args", default="", help="more arguments for llama-server, space-separated")
    args = ap.parse_args()
    exe = os.environ.get("LLAMA_SERVER", "llama-server")
    with contextlib.ExitStack() as stack:
        port = free_port()
        ours = stack.enter_context(launch(serve_command(
            port, "--data-dir", fresh_data_dir(), "--model", str(args.model), "--chat-template-file",
            str(args.template), "--slots", "1", "--speculative-ngram", "0", *args.ours_args.split()), port,
            log=args.log, timeout=300)).url
        pport = free_port()
        peer = stack.enter_context(launch(
            [exe, "-m", str(args.model), "--jinja", "--chat-template-file", str(args.template), "--host", "127.0.0.1",
             "--port", str(pport), "-c", "2048", "-np", "1", "-t", "2", "--no-repack", *args.peer_args.split()],
            pport, ready="/health", log=args.log, append=True, group=True, timeout=300)).url
        rows = []
        for name, messages in conversations():
            mine, theirs = our_tokens(ours, messages), peer_tokens(peer, messages)
            same = mine == theirs
            out = "-"
            if same:
                a, b = reply(ours, messages, args.max_tokens), reply(peer, messages, args.max_tokens)
                out = "equal" if a == b else f"differ: {a[:30]!r} / {b[:30]!r}"
            n = lambda t: str(len(t)) if isinstance(t, list) else t  # noqa: E731
            rows.append((name, n(mine), n(theirs), "yes" if same else "**no**", out))
    print("| conversation | our tokens | llama-server's | equal | greedy reply |")
    print("|---|---|---|---|---|")
    for r in rows:
        print("| " + " | ".join(r) + " |")
    equal = sum(r[3] == "yes" for r in rows)
    print(f"\n{equal} of {len(rows)} conversations give the same prompt tokens; "
          f"{sum(r[4] == 'equal' for r in rows)} of those the same greedy reply.")


if __name__ == "__main__":
    main()
