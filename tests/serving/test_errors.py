"""Every error answers in OpenAI's format, with the status the OpenAI API uses."""

import httpx
import openai
import pytest
from live_server import TINY, running

USER = [{"role": "user", "content": "hi"}]


def _post(url, path, body=None, content=None, headers=None):
    return httpx.post(url + path, json=body, content=content, headers=headers or {}, timeout=60)


def _error(response, status):
    assert response.status_code == status, response.text
    err = response.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    return err


@pytest.mark.parametrize(
    "body, param, words",
    [
        ({"messages": USER}, "model", "'model' is required"),
        ({"model": TINY}, "messages", "'messages'"),
        ({"model": TINY, "messages": []}, "messages", "non-empty"),
        ({"model": TINY, "messages": [{"content": "x"}]}, "messages[0]", "'role'"),
        ({"model": TINY, "messages": [{"role": "robot", "content": "x"}]}, "messages[0].role", "'robot'"),
        ({"model": TINY, "messages": USER, "temperature": "hot"}, "temperature", "must be a number"),
        ({"model": TINY, "messages": USER, "temperature": 3}, "temperature", "[0.0, 2.0]"),
        ({"model": TINY, "messages": USER, "max_tokens": 0}, "max_tokens", "max_tokens"),
        ({"model": TINY, "messages": USER, "max_completion_tokens": 1.5}, "max_completion_tokens", "integer"),
        ({"model": TINY, "messages": USER, "stop": [1]}, "stop", "'stop'"),
        ({"model": TINY, "messages": USER, "recompute_ratio": 2}, "recompute_ratio", "recompute_ratio"),
        ({"model": TINY, "messages": USER, "recompute_ratio": "fast"}, "recompute_ratio", 'or "auto"'),
        ({"model": TINY, "messages": USER, "documents": [{"title": "t"}]}, "documents[0]", "documents[0]"),
        ({"model": TINY, "messages": USER, "n": 2}, "n", "n > 1"),
        ({"model": TINY, "messages": USER, "tools": [{"type": "function", "function": {"name": "f"}}]},
         "tools", "tool and function calling"),
        ({"model": TINY, "messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA=="}}]}]},
         "messages[0].content", "does not support images"),
    ],
)
def test_bad_chat_requests_are_400_naming_the_problem(tiny_url, body, param, words):
    err = _error(_post(tiny_url, "/chat/completions", body), 400)
    assert err["param"] == param and words in err["message"] and err["type"] == "invalid_request_error"


def test_malformed_json_and_bad_completion_prompt(tiny_url):
    assert "not valid JSON" in _error(_post(tiny_url, "/chat/completions", content=b"{nope"), 400)["message"]
    assert _error(_post(tiny_url, "/completions", {"model": TINY, "prompt": [1, 2]}), 400)["param"] == "prompt"
    assert _error(_post(tiny_url, "/completions", {"model": TINY, "prompt": "x", "n": 3}), 400)["param"] == "n"
    assert _error(_post(tiny_url, "/documents", {"documents": []}), 400)["param"] == "documents"


def test_prompt_over_the_context_window(tiny_url, tiny_engine):
    long = "lorem ipsum " * (tiny_engine.context_window // 2 + 10)
    client = openai.OpenAI(base_url=tiny_url, api_key="unused", max_retries=0)
    for stream in (False, True):
        with pytest.raises(openai.BadRequestError) as info:
            client.chat.completions.create(model=TINY, messages=[{"role": "user", "content": long}], stream=stream)
        assert info.value.code == "context_length_exceeded"
        assert str(tiny_engine.context_window) in info.value.message


def test_unknown_model_is_404(tiny_url):
    client = openai.OpenAI(base_url=tiny_url, api_key="unused", max_retries=0)
    with pytest.raises(openai.NotFoundError) as info:
        client.chat.completions.create(model="gpt-9", messages=USER)
    assert info.value.code == "model_not_found" and "gpt-9" in info.value.message


def test_api_key_is_required_when_set(tiny_engine):
    with running(tiny_engine, model_names=[TINY], api_key="s3cret") as url:
        for key in ("wrong", "s3cret-longer", "s3cre"):
            client = openai.OpenAI(base_url=url, api_key=key, max_retries=0)
            with pytest.raises(openai.AuthenticationError) as info:
                client.models.list()
            assert info.value.code == "invalid_api_key"
        assert _error(httpx.get(url + "/models"), 401)["code"] == "invalid_api_key"  # no key at all
        assert _error(_post(url, "/documents", {"documents": ["x" * 40]}), 401)["code"] == "invalid_api_key"
        ok = openai.OpenAI(base_url=url, api_key="s3cret", max_retries=0)
        assert ok.chat.completions.create(model=TINY, messages=USER, max_tokens=2).usage.completion_tokens >= 1
        assert httpx.get(url.removesuffix("/v1") + "/health").status_code == 200  # health stays open
