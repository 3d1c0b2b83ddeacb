"""Run by test_lc_rag in a NEW process: load a saved CacheBlendFAISS and answer one question.

Prints one JSON line: the blend stats and usage of the answer, how many chunk KV records the
engine held in memory right after loading (0 = nothing was computed at load), and the warnings
that loading raised.
"""

import json
import os
import sys
import warnings

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from lc_helpers import rag_chain  # noqa: E402

from langchain_cacheblend import CacheBlendFAISS, ChatCacheBlend, SentenceTransformerEmbeddings  # noqa: E402


def main(folder: str, question: str, max_tokens: int) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        store = CacheBlendFAISS.load_local(
            folder, SentenceTransformerEmbeddings(), allow_dangerous_deserialization=True
        )
    held_after_load = len(store.engine.kv.stores.memory)
    chain = rag_chain(store.as_retriever(search_kwargs={"k": 4}), ChatCacheBlend(max_tokens=max_tokens))
    message = chain.invoke(question)
    print(json.dumps({
        "answer": message.content,
        "usage": message.usage_metadata,
        "stats": message.response_metadata["blend_stats"],
        "held_after_load": held_after_load,
        "load_warnings": [str(w.message) for w in caught if issubclass(w.category, UserWarning)],
    }))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
