"""The probe suite: awkward requests, each with the status and error type the contract promises.

A probe is data: method, path, headers, body (bytes, or a callable that yields chunks for a streamed body),
and what should come back. Probes come from *providers*, registered per surface:

    from sluicegate.contract.probes import Probe, ProbeOptions, Target, json_body_probes, register

    def my_probes(opts: ProbeOptions) -> list[Probe]:
        target = Target("openai", "/v1/completions", {"model": opts.model, "prompt": "Hi", "max_tokens": 1},
                        tokens="max_tokens", expect=OPENAI_EXPECT)
        return [*json_body_probes(target), Probe("openai:...", "POST", ...)]

    register("openai", my_probes)

`json_body_probes(target)` aims the generic JSON-boundary cases (malformed JSON, wrong types, NaN, misspelt
fields, surrogates, deep nesting, huge prompts in several scripts, huge bodies...) at any JSON route that
continues text. Modules named in `EXTRA_MODULES` are imported by `all_probes()`, so a second surface only has
to exist and call `register` at import.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from sluicegate.contract.outcomes import NATIVE_EXPECT, ProbeExpectation

MARKER = "zqx7-probe-marker"  # placed in probe bodies; a response that contains it echoed the input
WEATHER_SCHEMA: dict[str, Any] = {  # the one tool's arguments schema, in each surface's tool shape
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 8}},
    "required": ["city"],
    "additionalProperties": False,
}
CHUNK = 1 << 20

Body = bytes | Callable[[], Iterator[bytes]] | None
JSON = (("content-type", "application/json"),)


@dataclass(frozen=True, slots=True)
class Probe:
    name: str  # unique, `surface:case`
    method: str
    path: str
    body: Body = (
        None  # bytes, or a callable returning an iterator of chunks (streamed, chunked unless declared)
    )
    headers: tuple[tuple[str, str], ...] = JSON
    expect_status: int = 200
    expect_type: str | None = None  # the envelope's error.type (our contract); None for a success
    note: str = ""
    content_length: int | None = None  # declared length of a streamed body
    marker: bool = False  # the body carries MARKER: the response must not
    checks: tuple[str, ...] = ()  # extra checks the runner knows: warning, echo_request_id, new_request_id

    @property
    def refuses(self) -> bool:
        return self.expect_status >= 400

    @property
    def surface(self) -> str:
        return self.name.split(":", 1)[0]


@dataclass(frozen=True, slots=True)
class ProbeOptions:
    model: str | None = None  # the served model's name, for surfaces whose bodies must name one


ProbeProvider = Callable[[ProbeOptions], Iterable[Probe]]


@dataclass(frozen=True, slots=True)
class Target:
    """A JSON route that continues text: where `json_body_probes` aims its cases."""

    surface: str
    path: str
    base: Mapping[str, Any]  # a minimal valid body that asks for one new token
    tokens: str  # the name of the new-token count field
    prompt: tuple[str | int, ...] = ("prompt",)  # where the text goes inside the body
    model: str | None = "model"  # the model field, if the surface has one
    expect: Mapping[str, tuple[int, str]] = field(default_factory=lambda: dict(NATIVE_EXPECT))

    # `text`, `drop` and `ascii_only` are typed Any so that callers can pass `**{field: value}` for any value.
    def body(self, text: Any = None, drop: Any = (), **fields: Any) -> dict[str, Any]:
        """The base body, `text` (a str) put where the prompt goes, fields in `drop` removed, `fields` set."""
        out: dict[str, Any] = json.loads(json.dumps(self.base))
        for name in drop:
            out.pop(name, None)
        if text is not None:
            node: Any = out
            for key in self.prompt[:-1]:
                node = node[key]
            node[self.prompt[-1]] = text
        out.update(fields)
        return out

    def encode(self, text: Any = None, *, ascii_only: Any = False, drop: Any = (), **fields: Any) -> bytes:
        return json.dumps(self.body(text, drop, **fields), ensure_ascii=ascii_only).encode("utf-8")

    def with_members(self, members: str, drop: Iterable[str] = ()) -> bytes:
        """The base body with raw JSON members appended (what json.dumps cannot write: NaN, duplicates)."""
        text = json.dumps(self.body(drop=drop), ensure_ascii=False)
        return (text[:-1] + (", " if len(text) > 2 else "") + members + "}").encode("utf-8")


def _repeat(piece: bytes, total: int) -> Callable[[], Iterator[bytes]]:
    """A streamed body of `total` bytes: `{"prompt": "xxxx...` (a JSON object too big, never closed)."""

    def chunks() -> Iterator[bytes]:
        head = b'{"prompt": "' + MARKER.encode()
        yield head
        left = total - len(head)
        block = piece * (CHUNK // len(piece))
        while left > 0:
            part = block[:left]
            yield part
            left -= len(part)

    return chunks


# Texts whose token count passes any context window we test against (about 300 KB each, under the 1 MiB
# body limit): a window refusal, not a body-size one.
HUGE_PROMPTS: Mapping[str, str] = {
    "latin": "the quick brown fox jumps over the lazy dog. " * 6_600,
    "cjk": "漢字仮名交じり文と한국어 문장" * 9_000,
    "arabic": "النص العربي الطويل جدا " * 7_000,
    "devanagari": "यह एक बहुत लंबा वाक्य है। " * 5_000,
    "emoji": "👩‍👩‍👧‍👦🇺🇦✨🙂" * 6_000,
}


def json_body_probes(t: Target) -> list[Probe]:
    """The generic JSON-boundary cases, aimed at one text route."""
    s, p = t.surface, t.path
    bad, inv, mt = t.expect["malformed"], t.expect["invalid"], t.expect["media_type"]
    tf = t.tokens

    def probe(case: str, body: Body, outcome: ProbeExpectation | None, note: str, **kw: Any) -> Probe:
        status, etype = outcome if outcome is not None else (200, None)
        return Probe(
            f"{s}:{case}",
            "POST",
            kw.pop("path", p),
            body,
            expect_status=status,
            expect_type=etype,
            note=note,
            **kw,
        )

    out = [
        probe("ok", t.encode(), None, "the minimal valid request"),
        probe("ok_emoji", t.encode("emoji 👩‍👩‍👧 ✨ 🇺🇦 ok"), None, "multi-codepoint emoji"),
        probe("ok_scripts", t.encode("Привет, مرحبا, नमस्ते, 你好, שלום"), None, "several scripts, short"),
        probe("ok_nul", t.encode("a\u0000b"), None, "an escaped NUL is text (decision: accepted)"),
        probe("empty_body", b"", bad, "no body at all"),
        probe("whitespace_body", b" \r\n\t ", bad, "only whitespace"),
        probe("not_json", f"prompt={MARKER}".encode(), bad, "not JSON", marker=True),
        probe("truncated_json", t.encode(MARKER)[:-5], bad, "cut mid-string", marker=True),
        probe("trailing_garbage", t.encode() + b" {}", bad, "a second value after the object"),
        probe("json_array", b"[" + t.encode() + b"]", inv, "an array, not an object"),
        probe("json_string", json.dumps(MARKER).encode(), inv, "a bare string", marker=True),
        probe("json_null", b"null", inv, "null"),
        probe("nan_literal", t.with_members(f'"{tf}": NaN', drop=[tf]), bad, "NaN is not JSON"),
        probe("infinity_literal", t.with_members('"temperature": Infinity'), bad, "Infinity is not JSON"),
        probe("neg_infinity", t.with_members('"temperature": -Infinity'), bad, "-Infinity is not JSON"),
        probe("overflow_number", t.with_members('"temperature": 1e400'), bad, "overflows a double"),
        probe("huge_integer", t.with_members(f'"{tf}": 1' + "0" * 5000, drop=[tf]), bad, "5001 digits"),
        probe("tokens_as_string", t.encode(**{tf: "5"}), inv, '"5" is not a token count'),
        probe("tokens_as_float", t.encode(**{tf: 5.5}), inv, "5.5 is not a token count"),
        probe("tokens_as_bool", t.encode(**{tf: True}), inv, "true is not a token count"),
        probe("tokens_negative", t.encode(**{tf: -1}), inv, "out of range"),
        probe("tokens_zero", t.encode(**{tf: 0}), inv, "out of range"),
        probe("temperature_range", t.encode(temperature=3.0), inv, "temperature above 2"),
        probe("temperature_string", t.encode(temperature="0.5"), inv, "a string for a number"),
        probe(
            "misspelt_field",
            t.encode(drop=[tf], **{tf[:-1]: 5}),
            inv,
            f"{tf[:-1]}: must not run with the default",
        ),
        probe("unknown_field", t.encode(frobnicate=MARKER), inv, "an unknown option", marker=True),
        probe("duplicate_keys", t.with_members(f'"{tf}": 1, "{tf}": 2', drop=[tf]), bad, "which one wins?"),
        probe(
            "lone_surrogate",
            t.encode("\ud800" + MARKER, ascii_only=True),
            bad,
            "an unpaired \\ud800",
            marker=True,
        ),
        probe("lone_surrogate_key", t.with_members('"\\udfff": 1'), bad, "an unpaired surrogate in a key"),
        probe(
            "invalid_utf8",
            t.encode("\ufffd" + MARKER).replace("\ufffd".encode(), b"\xff\xfe"),
            bad,
            "bytes that are not UTF-8",
            marker=True,
        ),
        probe("utf8_bom", b"\xef\xbb\xbf" + t.encode(), bad, "a byte order mark"),
        probe(
            "raw_control_char",
            t.encode("a\u0001b").replace(b"\\u0001", b"\x01"),
            bad,
            "an unescaped control character in a string",
        ),
        probe(
            "deep_nesting_field",
            t.with_members('"temperature": ' + "[" * 65 + "]" * 65),
            bad,
            "65 levels inside a field",
        ),
        probe("content_type_text", t.encode(), mt, "text/plain", headers=(("content-type", "text/plain"),)),
        probe("content_type_missing", t.encode(), mt, "no Content-Type", headers=()),
        probe(
            "content_type_form",
            f"prompt={MARKER}".encode(),
            mt,
            "form-encoded",
            marker=True,
            headers=(("content-type", "application/x-www-form-urlencoded"),),
        ),
        probe(
            "charset_utf16",
            t.encode(),
            mt,
            "JSON declared as UTF-16",
            headers=(("content-type", "application/json; charset=utf-16"),),
        ),
        probe(
            "query_param",
            t.encode(),
            inv,
            "an option in the query string must not be ignored",
            path=f"{p}?{tf}=5",
        ),
        probe(
            "window_exceeded", t.encode(**{tf: 100_000}), t.expect["window"], "prompt + new tokens > window"
        ),
    ]
    if t.model is not None:
        out.append(
            probe(
                "unknown_model",
                t.encode(**{t.model: "no-such-model"}),
                t.expect["no_model"],
                "a model this server does not serve",
            )
        )
    for script, text in HUGE_PROMPTS.items():
        out.append(
            probe(
                f"huge_prompt_{script}",
                t.encode(MARKER + text),
                t.expect["prompt_too_long"],
                f"~{len(text.encode()) // 1000} KB of {script} text: more tokens than any window",
                marker=True,
            )
        )
    out += [
        probe(
            "body_declared_100mb",
            _repeat(b"x", 100 << 20),
            t.expect["too_large"],
            "Content-Length: 100 MiB, then sent in full",
            content_length=100 << 20,
            marker=True,
        ),
        probe(
            "body_chunked_8mb",
            _repeat(b"y", 8 << 20),
            t.expect["too_large"],
            "8 MiB chunked, no Content-Length",
            marker=True,
        ),
        probe("deep_nesting_100k", b"[" * 100_000 + b"]" * 100_000, bad, "100k levels of arrays"),
        probe("deep_nesting_objects", b'{"a":' * 50_000 + b"1" + b"}" * 50_000, bad, "50k levels of objects"),
    ]
    return out


def native_target(opts: ProbeOptions) -> Target:
    base: dict[str, Any] = {"prompt": "Hello", "max_new_tokens": 1}
    return Target("native", "/v1/generate", base, tokens="max_new_tokens")


def native_probes(opts: ProbeOptions) -> list[Probe]:
    """/v1/generate: the generic cases, and the ones only the native schema has."""
    t = native_target(opts)
    inv = t.expect["invalid"]

    def probe(case: str, body: bytes, outcome: ProbeExpectation | None, note: str, **kw: Any) -> Probe:
        status, etype = outcome if outcome is not None else (200, None)
        return Probe(
            f"native:{case}", "POST", t.path, body, expect_status=status, expect_type=etype, note=note, **kw
        )

    return [
        *json_body_probes(t),
        probe("prompt_missing", t.encode(drop=["prompt"]), inv, "the prompt is required"),
        probe("prompt_empty", t.encode(""), inv, "an empty prompt"),
        probe("prompt_number", t.encode(prompt=123), inv, "a number for the prompt"),
        probe("tokens_null", t.encode(max_new_tokens=None), inv, "null is not a token count"),
        probe("top_p_zero", t.encode(top_p=0.0), inv, "top_p must be above 0"),
        probe("seed_negative", t.encode(seed=-1), inv, "seeds are 0..2^63-1"),
        probe("seed_too_big", t.encode(seed=2**64), inv, "seeds are 0..2^63-1"),
        probe("stop_too_many", t.encode(stop=["a", "b", "c", "d", "e"]), inv, "at most 4 stop strings"),
        probe("stop_empty_string", t.encode(stop=[""]), inv, "an empty stop string"),
        probe("stop_not_list", t.encode(stop=MARKER), inv, "a string for the stop list", marker=True),
        probe("model_number", t.encode(model=7), inv, "a number for the model name"),
        probe(
            "top_k_at_temp0",
            t.encode(temperature=0, top_k=5),
            None,
            "accepted, with a warning: top_k does nothing when greedy",
            checks=("warning",),
        ),
        probe(
            "seed_at_temp0",
            t.encode(temperature=0, seed=3),
            None,
            "accepted, with a warning: a seed does nothing when greedy",
            checks=("warning",),
        ),
        probe("long_unknown_key", t.encode(**{"k" * 5000: 1}), inv, "a 5000-character unknown key"),
    ]


def http_probes(opts: ProbeOptions) -> list[Probe]:
    """Any route: unknown paths, wrong methods, operations, request ids."""

    def probe(
        case: str, method: str, path: str, status: int, etype: str | None, note: str, **kw: Any
    ) -> Probe:
        return Probe(
            f"http:{case}",
            method,
            path,
            kw.pop("body", None),
            expect_status=status,
            expect_type=etype,
            note=note,
            headers=kw.pop("headers", ()),
            **kw,
        )

    nf, na = "not_found", "method_not_allowed"
    return [
        probe("healthz", "GET", "/healthz", 200, None, "liveness"),
        probe("readyz", "GET", "/readyz", 200, None, "readiness, model loaded"),
        probe("unknown_path", "GET", "/v1/nope", 404, nf, "no such route"),
        probe(
            "unknown_path_post",
            "POST",
            "/v1/nope",
            404,
            nf,
            "no such route, with a JSON body",
            body=b'{"prompt": "x"}',
            headers=JSON,
        ),
        probe("encoded_traversal", "GET", "/%2e%2e/%2e%2e/etc/passwd", 404, nf, "a percent-encoded ../"),
        probe("long_path", "GET", "/" + "a" * 8000, 404, nf, "an 8000-character path"),
        probe("get_generate", "GET", "/v1/generate", 405, na, "GET on a POST route"),
        probe("delete_generate", "DELETE", "/v1/generate", 405, na, "DELETE on a POST route"),
        probe(
            "put_generate", "PUT", "/v1/generate", 405, na, "PUT on a POST route", body=b"{}", headers=JSON
        ),
        probe("post_healthz", "POST", "/healthz", 405, na, "POST on a GET route"),
        probe(
            "request_id_echo",
            "GET",
            "/healthz",
            200,
            None,
            "a valid X-Request-Id comes back",
            headers=(("x-request-id", "probe-abc.123"),),
            checks=("echo_request_id",),
        ),
        probe(
            "request_id_invalid",
            "GET",
            "/healthz",
            200,
            None,
            "an invalid X-Request-Id is replaced",
            headers=(("x-request-id", "bad id <" + MARKER + ">"),),
            checks=("new_request_id",),
            marker=True,
        ),
        probe(
            "request_id_too_long",
            "GET",
            "/healthz",
            200,
            None,
            "a 300-character X-Request-Id is replaced",
            headers=(("x-request-id", "r" * 300),),
            checks=("new_request_id",),
        ),
    ]


_PROVIDERS: dict[str, ProbeProvider] = {}
# imported by all_probes() when present
EXTRA_MODULES = ("sluicegate.contract.probes_openai", "sluicegate.contract.probes_anthropic",
                 "sluicegate.contract.probes_responses")


def register(surface: str, provider: ProbeProvider) -> ProbeProvider:
    """Add (or replace) the provider of one surface's probes; returns it, so it can be a decorator's body."""
    _PROVIDERS[surface] = provider
    return provider


def surfaces() -> list[str]:
    _load_extras()
    return list(_PROVIDERS)


def _load_extras() -> None:
    for name in EXTRA_MODULES:
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name:  # the module exists but something it imports does not: a real error
                raise


def all_probes(options: ProbeOptions | None = None, only: Iterable[str] | None = None) -> list[Probe]:
    """Every registered surface's probes (or those of `only`), cheap requests first, names unique."""
    _load_extras()
    opts = options or ProbeOptions()
    wanted = list(only) if only is not None else list(_PROVIDERS)
    unknown = [s for s in wanted if s not in _PROVIDERS]
    if unknown:
        raise ValueError(f"no probes for surface(s) {', '.join(unknown)}; known: {', '.join(_PROVIDERS)}")
    out = [p for s in wanted for p in _PROVIDERS[s](opts)]
    names = [p.name for p in out]
    dup = {n for n in names if names.count(n) > 1}
    if dup:
        raise ValueError(f"duplicate probe names: {sorted(dup)}")
    return sorted(out, key=lambda p: callable(p.body) or p.name.split(":", 1)[1].startswith("deep_nesting_"))


register("http", http_probes)
register("native", native_probes)
