"""`TextDeltas` (serving/openai_common.py): a plain text delta's chunk spliced into JSON rendered once must be
byte for byte what the models would have dumped, for both streaming surfaces and any text."""

from __future__ import annotations

import json

import pytest

from sluicegate.protocol.openai_chat import ChatCompletionChunk, ChoiceDelta, ChunkChoice
from sluicegate.protocol.openai_completions import Completion, CompletionChoice
from sluicegate.serving.openai_common import TextDeltas

TEXTS = [
    "", "Hello", ' "quoted" and \\back\\slash', "tab\tnew\nline\rcr", "\x00\x01\x1f\x7f", "é ü ñ 中文 🙂",
    "\u2028\u2029", "</script>", "{\"json\": [1, 2]}", "\ue000sluicegate-text\ue001", "a" * 5000,
]


def chat_chunk(i: int, text: str, *, usage: bool, model: str = "smollm2") -> ChatCompletionChunk:
    fields = {"id": "chatcmpl-req_1", "object": "chat.completion.chunk", "created": 1_700_000_000, "model": model,
              "system_fingerprint": "fp_0123456789",
              "choices": [ChunkChoice(index=i, delta=ChoiceDelta(content=text), logprobs=None, finish_reason=None)]}
    if usage:
        fields["usage"] = None
    return ChatCompletionChunk(**fields)


def completion_chunk(i: int, text: str) -> Completion:
    return Completion(id="cmpl-req_1", object="text_completion", created=1_700_000_000, model="smollm2",
                      system_fingerprint="fp_0123456789", usage=None,
                      choices=[CompletionChoice(index=i, text=text, token_ids=None, logprobs=None, finish_reason=None)])


@pytest.mark.parametrize("usage", [False, True])
def test_chat_deltas_match_the_models_dump(usage: bool) -> None:
    deltas = TextDeltas(lambda i, text: chat_chunk(i, text, usage=usage))
    for i in (0, 3):
        for text in TEXTS:
            got = deltas(i, text)
            assert isinstance(got, str)
            assert got == chat_chunk(i, text, usage=usage).model_dump_json(exclude_unset=True)
            assert json.loads(got)["choices"][0]["delta"] == {"content": text}


def test_completion_deltas_match_the_models_dump() -> None:
    deltas = TextDeltas(completion_chunk)
    for i in (0, 1):
        for text in TEXTS:
            got = deltas(i, text)
            assert got == completion_chunk(i, text).model_dump_json(exclude_unset=True)
            assert json.loads(got)["choices"][0]["text"] == text


def test_a_marker_found_elsewhere_falls_back_to_the_model() -> None:
    """A model name that holds the splice marker would be cut in the wrong place: the model is used instead."""

    def make(i: int, text: str) -> ChatCompletionChunk:
        return chat_chunk(i, text, usage=False, model="\ue000sluicegate-text\ue001")

    got = TextDeltas(make)(0, "hi")
    assert isinstance(got, ChatCompletionChunk)
    assert got.choices[0].delta.content == "hi"
