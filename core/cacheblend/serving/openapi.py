"""The request bodies and error responses of the server's routes, for its OpenAPI schema.

The routes parse their bodies by hand (``protocol.py``: OpenAI's leniencies, clear messages), so
FastAPI cannot derive their schema; without this module ``/openapi.json`` described no request
body at all and a client generator or a schema fuzzer saw routes that take nothing. These JSON
schemas describe what ``protocol.py`` accepts (unknown fields are ignored, as OpenAI clients send
many); a body outside them is answered 400 in OpenAI's error format, also described here.
``tests/serving/test_fuzz_api.py`` fuzzes the server from this schema.
"""

from __future__ import annotations

from typing import Any

_NONEMPTY = {"type": "string", "pattern": r"\S"}  # protocol strips texts; blank ones are refused
_DOCUMENT = {"oneOf": [
    _NONEMPTY,
    {"type": "object", "required": ["text"],
     "properties": {"text": _NONEMPTY, "title": {"type": ["string", "null"]}}},
]}
_DOCUMENTS = {"type": ["array", "null"], "items": _DOCUMENT,
              "description": "passages warmed first and placed as context (vLLM's convention)"}
_TOKENS = {"type": ["integer", "null"], "minimum": 1}


def _sampling(names: list[str]) -> dict[str, Any]:
    """The fields /v1/chat/completions and /v1/completions share (``protocol._common``)."""
    return {
        "model": {"type": "string", "enum": names},
        "max_tokens": _TOKENS,
        "temperature": {"type": ["number", "null"], "minimum": 0, "maximum": 2},
        "top_p": {"type": ["number", "null"], "exclusiveMinimum": 0, "maximum": 1},
        "seed": {"type": ["integer", "null"], "minimum": -(2**63), "maximum": 2**63 - 1},
        "n": {"enum": [1, None]},
        "stop": {"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}, {"type": "null"}]},
        "stream": {"type": ["boolean", "null"]},
        "stream_options": {"type": ["object", "null"], "properties": {"include_usage": {"type": "boolean"}}},
        "recompute_ratio": {"oneOf": [{"type": "number", "minimum": 0, "maximum": 1}, {"enum": ["auto", None]}],
                            "description": "share of tokens recomputed when blending, or \"auto\": the adaptive "
                                           "budget (cacheblend extension)"},
        "documents": _DOCUMENTS,
    }


def chat_body(names: list[str]) -> dict[str, Any]:
    part = {"type": "object", "required": ["type", "text"],
            "properties": {"type": {"const": "text"}, "text": {"type": "string"}}}
    message = {
        "type": "object",
        "required": ["role"],
        "properties": {
            "role": {"enum": ["system", "developer", "user", "assistant"]},
            "content": {"oneOf": [{"type": "string"}, {"type": "array", "items": part}, {"type": "null"}]},
        },
    }
    return _body({
        "type": "object",
        "required": ["model", "messages"],
        "properties": {
            **_sampling(names),
            "messages": {"type": "array", "minItems": 1, "items": message},
            "max_completion_tokens": _TOKENS,
            "logprobs": {"enum": [False, None]},
            "response_format": {"oneOf": [
                {"type": "object", "required": ["type"], "properties": {"type": {"const": "text"}}},
                {"type": "null"},
            ]},
        },
    })


def completion_body(names: list[str]) -> dict[str, Any]:
    prompt = {"oneOf": [{"type": "string", "minLength": 1},
                        {"type": "array", "items": {"type": "string", "minLength": 1}, "minItems": 1, "maxItems": 1}]}
    return _body({
        "type": "object",
        "required": ["model", "prompt"],
        "properties": {
            **_sampling(names),
            "prompt": prompt,
            "echo": {"enum": [False, None]},
            "logprobs": {"type": "null"},
            "best_of": {"enum": [1, None]},
            "suffix": {"type": "null"},
        },
    })


def documents_body() -> dict[str, Any]:
    return _body({
        "type": "object",
        "required": ["documents"],
        "properties": {"documents": {"type": "array", "minItems": 1, "items": _DOCUMENT}},
    })


ERROR = {
    "type": "object",
    "required": ["error"],
    "properties": {"error": {
        "type": "object",
        "required": ["message", "type"],
        "properties": {"message": {"type": "string"}, "type": {"type": "string"},
                       "param": {"type": ["string", "null"]}, "code": {"type": ["string", "null"]}},
    }},
}


def _errors(*statuses: int) -> dict[str, Any]:
    why = {400: "invalid request", 401: "missing or wrong API key", 404: "no such model or route",
           429: "request queue full (Retry-After)"}
    return {str(s): {"description": why[s], "content": {"application/json": {"schema": ERROR}}} for s in statuses}


def _body(schema: dict[str, Any]) -> dict[str, Any]:
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}}


def generation_extra(body: dict[str, Any]) -> dict[str, Any]:
    """``openapi_extra`` of a generation route: its body and its error responses."""
    return {**body, "responses": _errors(400, 401, 404, 429)}


def documents_extra() -> dict[str, Any]:
    return {**documents_body(), "responses": _errors(400, 401, 429)}


def models_extra() -> dict[str, Any]:
    return {"responses": _errors(401)}
