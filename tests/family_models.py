"""Real tokenizers of the model families users run, each with a tiny random model of its architecture.

The tokenizers (Llama 3.1, Llama 2 (the SentencePiece kind Mistral v0.1 uses) and Qwen3) are vendored
unchanged in ``tests/data/tokenizers.tar.xz`` (see its README.md), so the tests need no model hub and
no ``../shared``. "mistral" is the Llama 2 tokenizer with Mistral's chat template and a Mistral model.
"""

import functools
import tarfile
import tempfile
from pathlib import Path

import torch
from tiny_models import COMMON
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM
from transformers import Qwen3Config, Qwen3ForCausalLM

from cacheblend import BlendConfig, BlendEngine

ARCHIVE = Path(__file__).parent / "data" / "tokenizers.tar.xz"
FAMILIES = ["llama3_1", "llama2", "mistral", "qwen3"]

# Mistral-7B-Instruct-v0.1's template: user/assistant turns only (a system message raises).
MISTRAL_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token }}"
    "{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %}"
)
LLAMA3_ROPE = {
    "rope_type": "llama3",
    "rope_theta": 500000.0,
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 256,
}


@functools.cache
def _extracted() -> Path:
    out = Path(tempfile.mkdtemp(prefix="cacheblend-tokenizers-"))
    with tarfile.open(ARCHIVE) as tar:
        # The archive is ours (vendored, reviewed); extraction filters exist from Python 3.11.4 /
        # 3.12 on (Debian 12's python3 is 3.11.2), so they are used where present.
        tar.extractall(out, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    return out


def family_tokenizer(family: str):
    folder = "llama2" if family == "mistral" else family
    tok = AutoTokenizer.from_pretrained(str(_extracted() / folder))
    if family == "mistral":
        tok.chat_template = MISTRAL_TEMPLATE
    return tok


@functools.cache
def _model(family: str):
    tok = family_tokenizer(family)
    torch.manual_seed(1234)
    common = dict(COMMON, vocab_size=len(tok), max_position_embeddings=2048)
    special = dict(bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    if family == "llama3_1":
        model = LlamaForCausalLM(LlamaConfig(**common, **special, rope_parameters=LLAMA3_ROPE))
    elif family == "llama2":
        model = LlamaForCausalLM(LlamaConfig(**common, **special))
    elif family == "mistral":
        model = MistralForCausalLM(MistralConfig(**common, **special, sliding_window=None))
    elif family == "qwen3":
        model = Qwen3ForCausalLM(Qwen3Config(**common, eos_token_id=tok.eos_token_id))
    else:
        raise ValueError(family)
    with torch.no_grad():  # sharper attention than random init gives, as in tiny_models
        for name, p in model.named_parameters():
            if name.endswith(("q_proj.weight", "k_proj.weight")):
                p.mul_(4.0)
    return model.eval()


def family_engine(family: str, chat_template: str | None = None, **config) -> BlendEngine:
    """A fresh engine (fp32 KV) over the family's cached tiny model and a fresh tokenizer."""
    tok = family_tokenizer(family)
    if chat_template is not None:
        tok.chat_template = chat_template
    config.setdefault("kv_dtype", "float32")
    return BlendEngine(_model(family), tok, config=BlendConfig(**config))
