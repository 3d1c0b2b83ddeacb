"""The OpenAI request bodies the server accepts, validated into one ``Parsed`` request.

Errors are ``APIError`` with OpenAI's error body (``{"error": {message, type, param, code}}``).

Documents (vLLM's convention, ``documents=[{"title": ..., "text": ...}]``) go to the chat template
when it has a ``documents`` slot; otherwise they are placed as a context block at the start of the
last user message: each document as ``title\\ntext`` (or just its text), separated and followed by
a blank line. Either way the texts are warmed first, so the engine's finder sees them as chunks.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..generation.decode import Sampling

_UNSUPPORTED_CHAT = ("tools", "tool_choice", "functions", "function_call", "audio", "prediction")
_UNSUPPORTED_COMPLETION = ("suffix",)
_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}


class APIError(Exception):
    """An error answered in OpenAI's format."""

    def __init__(self, status: int, message: str, *, kind: str = "invalid_request_error",
                 code: str | None = None, param: str | None = None, headers: dict | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.kind, self.code, self.param = status, message, kind, code, param
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


def bad(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, param=param, code=code)


def unsupported(what: str, param: str) -> APIError:
    return bad(f"this server does not support {what}", param=param, code="unsupported_parameter")


@dataclass
class Parsed:
    model: str
    prompt: str
    max_tokens: int | None
    sampling: Sampling
    stop: list[str]
    recompute_ratio: float | str | None  # "auto": the adaptive budget
    stream: bool
    include_usage: bool
    documents: list[str] = field(default_factory=list)


def parse_chat(body: Any, tokenizer: Any) -> Parsed:
    """A /v1/chat/completions body -> Parsed (the chat template rendered, documents placed)."""
    body = _object(body)
    for name in _UNSUPPORTED_CHAT:
        if body.get(name) not in (None, [], {}):
            raise unsupported(f"'{name}' (tool and function calling)" if "tool" in name or "function" in name
                              else f"'{name}'", name)
    if body.get("logprobs"):
        raise unsupported("'logprobs'", "logprobs")
    fmt = body.get("response_format")
    if fmt is not None and (not isinstance(fmt, dict) or fmt.get("type") != "text"):
        raise unsupported("'response_format' other than text", "response_format")
    messages = _messages(body.get("messages"))
    docs = _documents(body.get("documents"))
    if not getattr(tokenizer, "chat_template", None):
        raise bad("this model has no chat template; use /v1/completions", "messages")
    prompt = _render(tokenizer, messages, docs)
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    param = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    return _common(body, prompt, docs, max_tokens, param)


def parse_completion(body: Any) -> Parsed:
    """A /v1/completions body -> Parsed (documents, if any, as a context block before the prompt)."""
    body = _object(body)
    for name in _UNSUPPORTED_COMPLETION:
        if body.get(name) is not None:
            raise unsupported(f"'{name}'", name)
    if body.get("echo"):
        raise unsupported("'echo'", "echo")
    if body.get("logprobs") is not None:
        raise unsupported("'logprobs'", "logprobs")
    if body.get("best_of") not in (None, 1):
        raise unsupported("best_of > 1", "best_of")
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if not isinstance(prompt, str) or not prompt:
        raise bad("'prompt' must be a non-empty string (token-id prompts and batches are not supported)", "prompt")
    docs = _documents(body.get("documents"))
    return _common(body, _context_block(docs) + prompt, docs, body.get("max_tokens", 16), "max_tokens")


def parse_documents(body: Any) -> list[str]:
    """A /v1/documents body: ``{"documents": [str | {"text": ..., "title": ...}]}`` -> texts."""
    docs = _documents(_object(body).get("documents"))
    if not docs:
        raise bad("'documents' must be a non-empty list of strings or {'text': ...} objects", "documents")
    return [d["text"] for d in docs]


# -- pieces ---------------------------------------------------------------------------------------
def _object(body: Any) -> dict:
    if not isinstance(body, dict):
        raise bad("the request body must be a JSON object")
    return body


def _common(body: dict, prompt: str, docs: list[dict], max_tokens: Any, param: str) -> Parsed:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise bad("'model' is required", "model")
    if body.get("n") not in (None, 1):
        raise unsupported("n > 1 (several choices per request)", "n")
    if max_tokens is not None:
        max_tokens = _number(max_tokens, param, 1, None, integer=True)
    temperature = _number(body.get("temperature", 1.0), "temperature", 0.0, 2.0)
    top_p = _number(body.get("top_p", 1.0), "top_p", 0.0, 1.0)
    if top_p == 0:
        raise bad("'top_p' must be > 0", "top_p")
    seed = body.get("seed")
    if seed is not None:
        seed = _number(seed, "seed", -(2**63), 2**63 - 1, integer=True)
    ratio = body.get("recompute_ratio")
    if isinstance(ratio, str):  # "auto": the adaptive budget (BlendConfig.with_ratio)
        if ratio != "auto":
            raise bad(f"'recompute_ratio' must be a number in [0, 1] or \"auto\", got {ratio!r}", "recompute_ratio")
    elif ratio is not None:
        ratio = _number(ratio, "recompute_ratio", 0.0, 1.0)
    stream = body.get("stream") or False
    if not isinstance(stream, bool):
        raise bad("'stream' must be a boolean", "stream")
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise bad("'stream_options' must be an object", "stream_options")
    return Parsed(
        model=model,
        prompt=prompt,
        max_tokens=max_tokens,
        sampling=Sampling(temperature=temperature, top_p=top_p, seed=seed),
        stop=_stop(body.get("stop")),
        recompute_ratio=ratio,
        stream=stream,
        include_usage=bool(options.get("include_usage")),
        documents=[d["text"] for d in docs],
    )


def _number(value: Any, param: str, lo: float | None, hi: float | None, integer: bool = False):
    kinds = (int,) if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds):
        raise bad(f"'{param}' must be {'an integer' if integer else 'a number'}, got {value!r}", param)
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        raise bad(f"'{param}' must be in [{lo}, {hi if hi is not None else 'inf'}], got {value!r}", param)
    return value


def _stop(stop: Any) -> list[str]:
    if stop is None:
        return []
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise bad("'stop' must be a string or a list of strings", "stop")
    return [s for s in stops if s]


def _messages(messages: Any) -> list[dict[str, str]]:
    if not isinstance(messages, list) or not messages:
        raise bad("'messages' must be a non-empty list", "messages")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise bad(f"messages[{i}] must be an object with a 'role'", f"messages[{i}]")
        role = m["role"]
        if role in ("tool", "function") or m.get("tool_calls"):
            raise unsupported("tool and function calling", f"messages[{i}]")
        if role not in _ROLES:
            raise bad(f"messages[{i}].role {role!r} is not one of {sorted(_ROLES)}", f"messages[{i}].role")
        out.append({"role": _ROLES[role], "content": _content(m.get("content"), i)})
    if out[-1]["role"] == "assistant":
        raise bad("the last message must not be from the assistant (continuing a reply is not supported)", "messages")
    return out


def _content(content: Any, i: int) -> str:
    if isinstance(content, str):
        return content
    if content is None:
        return ""
    if not isinstance(content, list):
        raise bad(f"messages[{i}].content must be a string or a list of parts", f"messages[{i}].content")
    texts = []
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text" and isinstance(part.get("text"), str):
            texts.append(part["text"])
        elif kind in ("image_url", "input_image", "image"):
            raise unsupported("images", f"messages[{i}].content")
        else:
            raise unsupported(f"content part type {kind!r} (only text is)", f"messages[{i}].content")
    return "".join(texts)


def _documents(docs: Any) -> list[dict]:
    if docs is None:
        return []
    if not isinstance(docs, list):
        raise bad("'documents' must be a list", "documents")
    out = []
    for i, d in enumerate(docs):
        d = {"text": d} if isinstance(d, str) else d
        text = d.get("text") if isinstance(d, dict) else None
        title = d.get("title") if isinstance(d, dict) else None
        if not isinstance(text, str) or not text.strip() or not isinstance(title, (str, type(None))):
            raise bad(f"documents[{i}] must be a non-empty string or {{'text': str, 'title': str}}", f"documents[{i}]")
        out.append({"title": title or "", "text": text.strip()})
    return out


def _context_block(docs: list[dict]) -> str:
    """Documents as ``title\\ntext`` (or the text alone), each followed by a blank line."""
    return "".join(f"{d['title'].strip()}\n{d['text']}\n\n" if d["title"].strip() else f"{d['text']}\n\n" for d in docs)


def _render(tokenizer: Any, messages: list[dict[str, str]], docs: list[dict]) -> str:
    if docs and "documents" in tokenizer.chat_template:
        return tokenizer.apply_chat_template(messages, documents=docs, tokenize=False, add_generation_prompt=True)
    if docs:
        users = [i for i, m in enumerate(messages) if m["role"] == "user"]
        if not users:
            raise bad("documents need a user message to go with", "documents")
        messages[users[-1]] = {"role": "user", "content": _context_block(docs) + messages[users[-1]]["content"]}
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
