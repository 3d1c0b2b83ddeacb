"""LangChain's standard test suites for chat models, run offline on the real bundled model.

Tool calling, structured output, JSON mode and non-text inputs are declared unsupported (the
model is a 135M text-only chat model and the engine parses no tool calls); the suites then skip
those tests themselves, except two unit tests that return early as passed: those are skipped here
with their reason. Usage metadata, including ``cache_read``, is declared supported and
exercised with a warmed passage.
"""

import pytest
from langchain_core.messages import AIMessage, AIMessageChunk
from langchain_tests.integration_tests import ChatModelIntegrationTests
from langchain_tests.unit_tests import ChatModelUnitTests
from pydoc_data.topics import topics

from langchain_cacheblend import ChatCacheBlend
from lc_standard import skip_standard

pytestmark = pytest.mark.real_model

PASSAGE = topics["pass"].strip()


class _Config:
    @property
    def chat_model_class(self):
        return ChatCacheBlend

    @property
    def has_tool_calling(self):
        return False  # bind_tools is overridden only to raise a clear NotImplementedError

    @property
    def has_structured_output(self):
        return False

    @property
    def supports_json_mode(self):
        return False

    @property
    def supported_usage_metadata_details(self):
        return {"invoke": ["cache_read_input"], "stream": ["cache_read_input"]}

    @property
    def model_override_value(self):
        # A real, different model id: the bundled model's safetensors folder (loads a 2nd engine).
        from cacheblend.models import bundled

        return str(bundled.converted_dir())


class TestChatCacheBlendUnit(_Config, ChatModelUnitTests):
    # These two return early, as passed, when the class declares the feature unsupported.
    _skips = skip_standard({
        "test_bind_tool_pydantic": "no tool calling: bind_tools raises NotImplementedError (the engine parses no "
                                   "tool calls)",
        "test_with_structured_output": "no structured output (has_structured_output is False)",
    })


class TestChatCacheBlendIntegration(_Config, ChatModelIntegrationTests):
    @property
    def chat_model_params(self):
        # The suites' answers need a few tokens, not the default 256: a dozen keep them fast on
        # CPU. (Not set for the unit suite: it passes max_tokens itself next to these params.)
        return {"max_tokens": 12}

    def invoke_with_cache_read_input(self, *, stream: bool = False) -> AIMessage:
        """A prompt holding a warmed passage: its tokens are read from the cache."""
        from cacheblend import shared_engine

        shared_engine().warm([PASSAGE])
        model = ChatCacheBlend(max_tokens=8)
        messages = [("system", f"Documentation:\n\n{PASSAGE}"), ("human", "What does pass do?")]
        if not stream:
            message = model.invoke(messages)
        else:
            message = None
            for chunk in model.stream(messages):
                message = chunk if message is None else message + chunk
            assert isinstance(message, AIMessageChunk)
        assert message.usage_metadata["input_token_details"]["cache_read"] > 0
        return message
