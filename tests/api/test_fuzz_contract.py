"""schemathesis against the served OpenAPI document: the server accepts what the document says, and refuses
what it does not (docs/versioning.md, "The document is fuzzed").

Bounded and deterministic, so it runs in every `make test`: about 250 generated requests (a fixed seed, no
example database), on the reference backend over a real socket, with an API key of every scope (so the declared
security is enforced, not off for want of keys).

Positive cases come from the document plus what a config-independent document cannot know about one server:
the model it serves (its name, its vocabulary of 258 ids, its context window: short texts), a webhook URL it
can check without DNS, and a cost cap (at most 4 new tokens, small `n`).
Negative cases come from the document as served, so a request outside it must be refused (413 counts as a
refusal). Every schema-valid request must then be accepted, except the refusals the document's descriptions
name as rules JSON Schema cannot state, each excluded below by name and by the server's error `code`:
`EXCLUDED` lists them. Two are number rules: a whole-number float for an integer (`8.0`, `wrong_type`) and an
integer of over 64 digits (I-JSON); such a case is checked to be refused for exactly that, then sent again with
plain integers and must pass.
"""

from __future__ import annotations

import copy
import itertools
import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, seed, settings
from schemathesis import Case, GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.config._checks import NegativeDataRejectionConfig
from schemathesis.core import NotSet
from schemathesis.specs.openapi.checks import positive_data_acceptance

from sluicegate.config import Config, WebhookConfig
from sluicegate.contract.snapshot import served_document
from sluicegate.store.migrate import upgrade
from sluicegate.tenancy.keys import Scope
from tests.api.auth_helpers import Served, auth, served
from tests.dbs import sqlite_url

MODEL = "reference"
VOCAB_ID = "^(0|[1-9][0-9]?|1[0-9]{2}|2[0-4][0-9]|25[0-7])$"  # the reference model's token ids, 0..257
MAX_NEW = 4
SEED = 20261130
POSITIVE_EXAMPLES = {"POST": 40, "GET": 10, "PATCH": 10, "DELETE": 5}
NEGATIVE_EXAMPLES = {"POST": 25, "GET": 10, "PATCH": 10, "DELETE": 5}

# Refusals of schema-valid requests that the document names as rules JSON Schema cannot state (see each request
# schema's description): error `code` -> (the `param` it must name, or None: checked otherwise; the rule).
EXCLUDED: dict[str, tuple[str | None, str]] = {
    "wrong_type": (None, "whole_number_float: `8.0` for an integer is refused; JSON Schema counts it as one"),
    "number_out_of_range": (None, "huge_integer: I-JSON numbers only, anywhere, free-form objects included"),
    "invalid_json": (None, "huge_integer, as the OpenAI routes spell it (their `code` is our type)"),
    "unknown_function": (None, "a named tool_choice must be one of `tools`: a reference (chat's "
                         "`tool_choice.function.name`, Messages' `tool_choice.name`)"),
    "misplaced_block": (None, "Messages: a block type by role (tool_use the assistant's, tool_result the user's); "
                        "stated by role, the schema defeats schemathesis's negative generation"),
    "duplicate_function": ("tools", "unique tool names: uniqueItems compares whole items, not one field"),
    "unsupported_value": ("messages", "the last message must not be the assistant's: no keyword for the last item"),
    "invalid_strict_schema": (None, "strict: true needs a strict schema (every object closed, every property "
                              "required): a rule about a schema inside the request, as unsupported_schema"),
    "unsupported_schema": (None, "the JSON Schema subset the grammar engine enforces is not itself a JSON Schema"),
    "invalid_cursor": ("after", "a cursor must name a stored prediction of the key: state, not a schema rule"),
    "too_many_endpoints": ("url", "a key's count of webhook endpoints is stored state, not a property of a request"),
    "expires_in_past": ("expires_at", "a time in the future: the schema has no clock"),
    "invalid_name": ("name", "no control characters in a key's name: regex dialects disagree on such a class at a "
                     "line's end, so the schema cannot state it the same for every reader"),
    "key_revoked": ("key_id", "a revoked key cannot change: stored state"),
}
DESCRIBED = ("GenerateRequest", "ChatCompletionRequest", "CompletionRequest", "WebhookEndpointCreate",
             "DetokenizeRequest", "KeyCreate", "KeyUpdate", "MessagesRequest", "CountTokensRequest")
# An address as a literal (a test server resolves no names: a rule of the network, not the schema), in
# TEST-NET-1, which the server is told to allow and which routes nowhere: no event leaves the machine.
WEBHOOK_NET = "192.0.2.0/24"
WEBHOOK_URL = r"^https?://192\.0\.2\.1(:[1-9][0-9]{0,3})?(/[!-~]*)?$"


def _bounded(doc: dict[str, Any]) -> dict[str, Any]:
    """The served document plus the served model's facts and the test's cost cap (positive cases only)."""
    doc = copy.deepcopy(doc)
    s = doc["components"]["schemas"]
    for name in ("GenerateRequest", "ChatCompletionRequest", "CompletionRequest", "MessagesRequest",
                 "CountTokensRequest"):
        s[name]["properties"]["model"] = {"const": MODEL}
    s["MessagesRequest"]["properties"]["max_tokens"]["maximum"] = MAX_NEW
    for name in ("MessagesRequest", "CountTokensRequest"):
        s[name]["properties"]["messages"]["maxItems"] = 4
    s["GenerateRequest"]["properties"]["max_new_tokens"]["maximum"] = MAX_NEW
    chat, text = s["ChatCompletionRequest"]["properties"], s["CompletionRequest"]["properties"]
    for field in ("max_tokens", "max_completion_tokens"):
        chat[field]["anyOf"][0]["maximum"] = MAX_NEW
    text["max_tokens"]["maximum"] = MAX_NEW
    text["suffix"] = {"type": "null"}  # the reference model has no fill-in-the-middle tokens
    chat["n"]["maximum"] = text["n"]["maximum"] = 2
    chat["messages"]["maxItems"] = 4
    for props in (chat, text):
        props["logit_bias"]["anyOf"][0]["propertyNames"] = {"pattern": VOCAB_ID}
    for branch in text["prompt"]["anyOf"]:  # token ids below the vocabulary; at most 4 prompts (x n=2)
        if branch.get("type") == "array":
            branch["maxItems"] = 4
            items = branch["items"]
            target = items["items"] if items.get("type") == "array" else items
            if target.get("type") == "integer":
                target["maximum"] = 257
    s["GenerateOptions"]["properties"]["max_new_tokens"]["maximum"] = MAX_NEW
    for name in _reachable(doc, "requestBody") - _reachable(doc, "responses"):
        _cap_strings(s[name], 16)  # the context window (2048 tokens, a byte a token): short texts, few parts
    s["DetokenizeRequest"]["properties"]["tokens"]["items"]["maximum"] = 257
    s["WebhookEndpointCreate"]["properties"]["url"] = {"type": "string", "pattern": WEBHOOK_URL}
    seed = doc["paths"]["/v1/batch-predictions"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    seed["maxItems"] = 4
    return doc


def _refs(node: Any) -> Iterator[str]:
    if isinstance(node, list):
        for v in node:
            yield from _refs(v)
    elif isinstance(node, dict):
        if isinstance(node.get("$ref"), str):
            yield node["$ref"].rsplit("/", 1)[1]
        for v in node.values():
            yield from _refs(v)


def _reachable(doc: dict[str, Any], part: str) -> set[str]:
    """The component schemas the operations' `part` (requestBody, responses) refers to, transitively."""
    todo = [r for item in doc["paths"].values() for op in item.values() if isinstance(op, dict)
            for r in _refs(op.get(part))]
    seen: set[str] = set()
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo += _refs(doc["components"]["schemas"][name])
    return seen


def _cap_strings(node: Any, length: int) -> None:
    """Free text in the positive cases at most `length` characters, arrays at most 4 items (in place)."""
    if isinstance(node, list):
        for v in node:
            _cap_strings(v, length)
    elif isinstance(node, dict):
        if node.get("type") == "string" and not {"enum", "const", "pattern", "format"} & node.keys():
            node["maxLength"] = min(node.get("maxLength", length), length)
        if node.get("type") == "array":
            node["maxItems"] = min(node.get("maxItems", 4), 4)
        for v in node.values():
            _cap_strings(v, length)


def _operations(doc: dict[str, Any], mode: GenerationMode) -> list[tuple[str, Any]]:
    schema = schemathesis.openapi.from_dict(doc)
    schema.config.generation.update(with_security_parameters=False)  # the fixture's key authenticates every case
    schema.config.checks.negative_data_rejection = NegativeDataRejectionConfig(
        expected_statuses=[*schema.config.checks.negative_data_rejection.expected_statuses, "413"])
    operations = [r.ok() for r in schema.get_all_operations()]
    if mode.is_negative:  # only a body or a query string can be made invalid (a path segment is any string)
        operations = [op for op in operations if len(op.body) or len(op.query)]
    return [(f"{mode.value} {op.label}", op) for op in operations]


SERVED = served_document()
CASES = [*_operations(_bounded(SERVED), GenerationMode.POSITIVE), *_operations(SERVED, GenerationMode.NEGATIVE)]
_keys = itertools.count()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Served, dict[str, str]]]:
    url = sqlite_url(Path(tmp_path_factory.mktemp("fuzz")))
    upgrade(url)
    config = Config(webhooks=WebhookConfig(allow_networks=(WEBHOOK_NET,)))
    with served(url, config) as s:
        _, secret = s.key(Scope.GENERATE, Scope.BATCH, Scope.METRICS, Scope.ADMIN)
        yield s, auth(secret)


def _map(value: Any, fn: Callable[[Any], Any]) -> Any:
    """`value` with `fn` applied to every number in it (booleans are not numbers)."""
    if isinstance(value, list):
        return [_map(v, fn) for v in value]
    if isinstance(value, dict):
        return {k: _map(v, fn) for k, v in value.items()}
    return fn(value) if isinstance(value, int | float) and not isinstance(value, bool) else value


def _whole_float(x: Any) -> bool:
    return isinstance(x, float) and x.is_integer()


def _huge(x: Any) -> bool:
    return isinstance(x, int) and abs(x) >= 10**64


def _has(value: Any, test: Callable[[Any], bool]) -> bool:
    found: list[bool] = []
    _map(value, lambda x: found.append(test(x)))
    return any(found)


def _at(body: Any, param: str) -> Any:
    """The value at an error's `param` path (`messages[0].content`, `prompt[1][2]`) in the sent body."""
    node = body
    for name, index in re.findall(r"([^.\[\]]+)|\[(\d+)\]", param):
        node = node[name] if name else node[int(index)]
    return node


# The 5xx answers a request may get from a correct server under load (docs/timeouts.md): shed at admission (the
# queue full, or the deadline it sent forecast to pass before an answer), or expired before its deadline. Any
# other 5xx is a server error. Anthropic's routes answer a shed request 529 with our type as `code`.
LOAD_ANSWERS = {(503, "overloaded"), (503, "wait_exceeds_deadline"), (504, "deadline_exceeded"), (529, "overloaded")}


def _check(case: Case, url: str, headers: dict[str, str]) -> None:
    positive = case.meta is not None and case.meta.generation.mode.is_positive
    if positive and case.headers and "Idempotency-Key" in case.headers:
        case.headers["Idempotency-Key"] = f"fuzz-{next(_keys)}"  # a fresh key: reuse is state, not schema
    response = case.call(base_url=url, headers=headers)
    case.validate_response(response, headers=headers, excluded_checks=[positive_data_acceptance, not_a_server_error])
    if response.status_code >= 500:  # only a load answer: a fuzzed X-Request-Timeout the busy machine cannot meet
        code = response.json()["error"]["code"]
        assert (response.status_code, code) in LOAD_ANSWERS, f"a server error: {response.status_code} {code}"
    if not positive or response.status_code not in (400, 413, 415, 422):
        return
    error = response.json()["error"]
    code, sent = error.get("code"), None if isinstance(case.body, NotSet) else case.body
    assert code in EXCLUDED, f"a schema-valid request was refused: {error} for {json.dumps(sent)[:2000]}"
    param, rule = EXCLUDED[code]
    assert param is None or error["param"] == param, f"{error} is not the excluded rule: {rule}"
    # The two number rules: the case must be refused for exactly that, and pass once the numbers are plain.
    if code == "wrong_type":
        assert _has(_at(sent, error["param"]), _whole_float), f"wrong_type, yet no whole-number float: {error}"
        case.body = _map(sent, lambda x: int(x) if _whole_float(x) else x)
        _check(case, url, headers)
    elif code in ("number_out_of_range", "invalid_json"):  # invalid_json: its OpenAI-route spelling
        assert _has(sent, _huge), f"{code}, yet no integer of over 64 digits: {error}"
        case.body = _map(sent, lambda x: 0 if _huge(x) else x)
        _check(case, url, headers)


# schemathesis's negative mutations draw from the `random` module inside strategies; Hypothesis seeds it per
# example, so the run stays deterministic, but it warns (an error under this suite's filterwarnings).
@pytest.mark.filterwarnings("ignore:Do not use the `random` module:hypothesis.errors.HypothesisDeprecationWarning")
@pytest.mark.parametrize(("label", "operation"), CASES, ids=[label for label, _ in CASES])
def test_server_matches_its_document(label: str, operation: Any, server: tuple[Served, dict[str, str]]) -> None:
    s, headers = server
    mode = GenerationMode.POSITIVE if label.startswith("positive") else GenerationMode.NEGATIVE
    method = label.split()[1]
    examples = (POSITIVE_EXAMPLES if mode.is_positive else NEGATIVE_EXAMPLES)[method]

    @settings(max_examples=examples, derandomize=True, database=None, deadline=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(operation.as_strategy(mode))
    @seed(SEED)  # the examples depend on this seed and the document only, not on this function's source
    def run(case: Case) -> None:
        _check(case, s.url, headers)

    run()


def test_every_exclusion_is_named_in_the_document() -> None:
    """An excluded refusal must be one the document itself announces: its `code` appears in a request schema's
    description (`invalid_json` is the OpenAI routes' spelling of `number_out_of_range`)."""
    schemas = SERVED["components"]["schemas"]
    described = " ".join([*(schemas[n]["description"] for n in DESCRIBED), *(
        p.get("description", "") for item in SERVED["paths"].values() for op in item.values()
        for p in op.get("parameters", []))])
    for code in EXCLUDED:
        assert f"`{'number_out_of_range' if code == 'invalid_json' else code}`" in described, code
    for name in ("GenerateRequest", "ChatCompletionRequest", "CompletionRequest"):
        assert "`8.0`" in schemas[name]["description"], name
