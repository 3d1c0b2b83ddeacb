"""Helpers shared by the LangChain tests (a plain module: conftest files are not importable)."""

import functools
import itertools

from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.documents import Document
from pydoc_data.topics import topics

# Passages of ~100-470 tokens each (SmolLM2 tokenizer); 8 of them index in a few seconds.
TOPICS = ("assert", "booleans", "while", "augassign", "global", "del", "for", "break")

_counter = itertools.count()


def pydoc_documents(names=TOPICS) -> list[Document]:
    return [Document(page_content=topics[name].strip(), metadata={"topic": name}) for name in names]


def fresh_texts(n: int, tag: str) -> list[str]:
    """``n`` short passages (~100 tokens) that no other test has warmed (unique per call).

    None contains a whole pydoc topic: the engine would find a warmed topic inside it and count
    a hit (correctly), so the base text is the "pass" topic with its lines in reverse order.
    """
    run = next(_counter)
    base = "\n".join(reversed(topics["pass"].strip().splitlines()))
    return [f"[{tag} {run}.{i}] {base}" for i in range(n)]


def format_docs(docs) -> str:
    """What LangChain's RAG tutorials put into prompts: page contents joined by blank lines."""
    return "\n\n".join(d.page_content for d in docs)


class TokenRecorder(BaseCallbackHandler):
    """Every on_llm_new_token per run, and every on_llm_end result."""

    def __init__(self):
        self.tokens: dict = {}
        self.results = []

    def on_llm_new_token(self, token, *, run_id, **kwargs):
        self.tokens.setdefault(run_id, []).append(token)

    def on_llm_end(self, response, **kwargs):
        self.results.append(response)

    def texts(self):
        return ["".join(t) for t in self.tokens.values()]

    def pieces(self):
        return [t for run in self.tokens.values() for t in run if t]


def interleaves(pieces, texts) -> bool:
    """True when ``pieces``, in their order, deal out into one run per text whose joins are ``texts``
    (the token callbacks of answers that decoded together)."""

    @functools.cache
    def fits(k, done):  # done[j]: characters of texts[j] dealt so far
        if k == len(pieces):
            return all(d == len(t) for d, t in zip(done, texts))
        piece = pieces[k]
        return any(text.startswith(piece, done[j]) and fits(k + 1, done[:j] + (done[j] + len(piece),) + done[j + 1:])
                   for j, text in enumerate(texts))

    return fits(0, (0,) * len(texts))


SYSTEM_PROMPT = "Answer the question using only this documentation.\n\n{context}"


def rag_chain(retriever, llm, reorder=None):
    """The LangChain tutorial chain: retriever | format_docs | prompt (context in the system
    message) | llm. ``reorder`` (a list -> list function) stands in for a reranker."""
    from langchain_core.prompts import ChatPromptTemplate
    from langchain_core.runnables import RunnableLambda, RunnablePassthrough

    prompt = ChatPromptTemplate.from_messages([("system", SYSTEM_PROMPT), ("human", "{question}")])
    docs = retriever | RunnableLambda(reorder or (lambda d: d))
    return {"context": docs | format_docs, "question": RunnablePassthrough()} | prompt | llm
