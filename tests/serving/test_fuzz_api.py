"""The server fuzzed from its own OpenAPI schema (schemathesis, bounded), on loopback, tiny model.

Every operation in ``/openapi.json`` gets schema-conforming bodies (positive) and bodies that break
the schema (negative). The server must never answer 5xx, every error must be OpenAI's error body
(``{"error": {"message", "type", ...}}``), a body outside the schema must be refused, and afterwards
the server must be idle and answer a normal request as it did before the fuzzing.

The model is a tiny random Llama with a 64-token context, so that no generated ``max_tokens``
(any integer) can make one request long: generation stops at the context window. Hypothesis runs
derandomized: the same requests every run.
"""

import json

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from live_server import TINY, health, running, wait_for
from schemathesis import GenerationMode

from cacheblend import BlendConfig, BlendEngine

EXAMPLES = 16  # per operation and mode with a body; routes without input get 3
CONTEXT = 64


@pytest.fixture(scope="module")
def fuzz_url(bundled_dir):
    import torch
    from tiny_models import COMMON
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tok = AutoTokenizer.from_pretrained(str(bundled_dir))
    torch.manual_seed(0)
    config = LlamaConfig(**dict(COMMON, vocab_size=len(tok), num_hidden_layers=2, max_position_embeddings=CONTEXT),
                         bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    engine = BlendEngine(LlamaForCausalLM(config).eval(), tok, config=BlendConfig())
    with running(engine, model_names=[TINY]) as url:
        yield url


def _normal(url: str) -> str:
    body = {"model": TINY, "messages": [{"role": "user", "content": "Say something about rivers."}],
            "max_tokens": 5, "temperature": 0}
    out = httpx.post(url + "/chat/completions", json=body, timeout=60)
    assert out.status_code == 200, out.text
    return out.json()["choices"][0]["message"]["content"]


def _check(case, response, mode: GenerationMode, seen: dict) -> None:
    label = f"{case.method} {case.path} ({mode.value}) body={json.dumps(case.body, default=str)[:300]}"
    status = response.status_code
    seen[status] = seen.get(status, 0) + 1
    assert status < 500, f"{label} -> {status}: {response.text[:500]}"
    if status >= 400:
        assert response.headers.get("content-type", [""])[0].startswith("application/json"), label
        error = response.json().get("error")
        assert isinstance(error, dict), f"{label}: not an OpenAI error body: {response.text[:300]}"
        assert isinstance(error.get("message"), str) and error["message"], label
        assert isinstance(error.get("type"), str) and error["type"], label
    if mode == GenerationMode.NEGATIVE and not case.meta.generation.mode.is_positive:
        assert status >= 400, f"{label}: a body outside the schema was accepted ({status})"
        seen["refused outside the schema"] = seen.get("refused outside the schema", 0) + 1


def _fuzz(operation, mode: GenerationMode, seen: dict, examples: int) -> int:
    calls = []

    @settings(max_examples=examples, deadline=None, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(case=operation.as_strategy(generation_mode=mode))
    def run(case):
        response = case.call(timeout=60)
        calls.append(1)
        _check(case, response, mode, seen)

    run()
    return len(calls)


def test_fuzzed_from_its_openapi_schema_no_5xx_openai_errors_and_healthy_after(fuzz_url):
    before = _normal(fuzz_url)
    root = fuzz_url.removesuffix("/v1")
    schema = schemathesis.openapi.from_url(root + "/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert {f"{op.method.upper()} {op.path}" for op in operations} >= {
        "POST /v1/chat/completions", "POST /v1/completions", "POST /v1/documents", "GET /v1/models"}
    seen: dict = {}  # status -> responses, and how many bodies outside the schema were refused
    calls = {}
    for op in operations:
        with_input = op.body or any(True for _ in op.iter_parameters())
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE) if with_input else (GenerationMode.POSITIVE,):
            calls[f"{op.method.upper()} {op.path} {mode.value}"] = _fuzz(op, mode, seen, EXAMPLES if op.body else 3)
    print("requests per operation:", calls, "statuses:", seen)
    assert all(n >= EXAMPLES // 2 for name, n in calls.items() if name.startswith("POST")), calls
    assert seen.get(200, 0) > 0 and seen["refused outside the schema"] >= EXAMPLES

    wait_for(lambda: health(fuzz_url)["active"] == 0 and health(fuzz_url)["queued"] == 0, timeout=30)
    assert _normal(fuzz_url) == before


@pytest.mark.parametrize("method,path,status", [
    ("GET", "/v1/nothing", 404), ("POST", "/v1", 404), ("PATCH", "/v1/models", 405), ("GET", "/v1/completions", 405),
])
def test_routes_and_methods_outside_the_schema_answer_openai_errors(fuzz_url, method, path, status):
    """What schemathesis does not send: unknown routes and methods (Starlette's own errors)."""
    out = httpx.request(method, fuzz_url.removesuffix("/v1") + path)
    assert out.status_code == status
    error = out.json()["error"]
    assert error["type"] == "invalid_request_error" and error["message"] and error["code"]
