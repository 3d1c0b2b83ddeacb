"""LangChain's ChatOpenAI and LlamaIndex's OpenAILike, unchanged, pointed at the server (real model)."""

import httpx
import pytest
from live_server import metric, running
from pydoc_data.topics import topics

pytestmark = pytest.mark.real_model

TOPICS = ("assert", "del", "global", "break")  # ~100-470 tokens each
SYSTEM = "Answer the question using only this documentation.\n\n{context}"
FERRY = [
    "The Tane River ferry connects Brask to the village of Millhaven. A crossing takes eleven minutes "
    "and costs two copper marks; the ferrymaster Agnes Dunmore is the third generation to run it.",
    "The Orrin Guild is a cooperative of glassblowers in Brask, best known for cobalt-blue bottles that "
    "it exports to the coastal cities of the south. Apprentices train for seven years.",
]


@pytest.fixture(scope="module")
def real_url(real_engine):
    with running(real_engine) as url:
        yield url


def _warm(url, texts):
    """What an indexing job does: push its chunks to the server's store."""
    r = httpx.post(url + "/documents", json={"documents": texts}, timeout=300)
    assert r.status_code == 200, r.text


def test_langchain_chat_openai_rag_chain_reads_cached_chunks_in_any_order(real_url, real_engine):
    from langchain_core.prompts import ChatPromptTemplate
    from langchain_core.runnables import RunnableLambda, RunnablePassthrough
    from langchain_openai import ChatOpenAI

    docs = [topics[t].strip() for t in TOPICS]
    _warm(real_url, docs)
    llm = ChatOpenAI(base_url=real_url, api_key="unused", model=real_engine.name, temperature=0, max_tokens=6,
                     stream_usage=True)
    prompt = ChatPromptTemplate.from_messages([("system", SYSTEM), ("human", "{question}")])

    def chain(order):  # an LCEL RAG chain; ``order`` stands in for retriever + reranker
        context = RunnableLambda(lambda _: "\n\n".join(order))
        return {"context": context, "question": RunnablePassthrough()} | prompt | llm

    question = "What does the assert statement do when optimization is requested?"
    first = chain(docs).invoke(question)
    second = chain(docs[::-1]).invoke(question)
    streamed = None
    for piece in chain([docs[2], docs[0], docs[3], docs[1]]).stream(question):
        streamed = piece if streamed is None else streamed + piece
    context = sum(real_engine.count_tokens(d) for d in docs)
    for answer in (first, second, streamed):
        assert answer.content.strip()
        assert answer.usage_metadata["input_token_details"]["cache_read"] > 0.8 * context
        assert answer.usage_metadata["input_tokens"] > context


def test_llama_index_openai_like_query_engine(real_url, real_engine):
    from llama_index.core import Document, SummaryIndex
    from llama_index.core.schema import MetadataMode
    from llama_index.llms.openai_like import OpenAILike

    llm = OpenAILike(model=real_engine.name, api_base=real_url, api_key="unused", is_chat_model=True,
                     context_window=real_engine.context_window, max_tokens=24, temperature=0)
    index = SummaryIndex.from_documents([Document(text=t) for t in FERRY])
    nodes = list(index.docstore.docs.values())
    _warm(real_url, [n.get_content(metadata_mode=MetadataMode.LLM) for n in nodes])
    hits, misses = metric(real_url, "chunk_hits_total"), metric(real_url, "chunk_misses_total")
    answer = index.as_query_engine(llm=llm, response_mode="compact").query("Who runs the Tane River ferry?")
    assert str(answer).strip()
    assert metric(real_url, "chunk_hits_total") - hits == len(nodes)
    assert metric(real_url, "chunk_misses_total") == misses
