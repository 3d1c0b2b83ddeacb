"""Many clients at once: batched answers equal one-by-one answers; disconnects and a full queue."""

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest
from live_server import TINY, health, metric, running, wait_for

from cacheblend.generation.decode import Sampling
from cacheblend.serving.app import SchedulerLimits
from cacheblend.serving.jobs import Job
from cacheblend.serving.scheduler import Scheduler

CLIENTS, PER_CLIENT = 8, 4


def _ask(client, i):
    words = " ".join(f"item{j}" for j in range(3 * i))  # prompts of different lengths
    out = client.chat.completions.create(
        model=TINY, messages=[{"role": "user", "content": f"Question {i}: {words}"}],
        max_tokens=8 + i % 5, temperature=0,
    )
    return out.choices[0].message.content, out.usage.completion_tokens


def test_concurrent_clients_get_the_answers_of_sequential_requests(tiny_url):
    client = openai.OpenAI(base_url=tiny_url, api_key="unused", max_retries=0)
    jobs = list(range(CLIENTS * PER_CLIENT))
    alone = [_ask(client, i) for i in jobs]
    steps, rows = metric(tiny_url, "decode_steps_total"), metric(tiny_url, "decode_rows_total")

    def one_client(c):
        own = openai.OpenAI(base_url=tiny_url, api_key="unused", max_retries=0)
        return [(i, _ask(own, i)) for i in jobs[c::CLIENTS]]

    with ThreadPoolExecutor(CLIENTS) as pool:
        together = dict(pair for part in pool.map(one_client, range(CLIENTS)) for pair in part)
    assert [together[i] for i in jobs] == alone
    batched = (metric(tiny_url, "decode_rows_total") - rows) / (metric(tiny_url, "decode_steps_total") - steps)
    assert batched > 2  # the steps really advanced several sequences at once


def _long_stream(url):
    client = openai.OpenAI(base_url=url, api_key="unused", max_retries=0)
    return client.chat.completions.create(
        model=TINY, messages=[{"role": "user", "content": "go on forever"}], max_tokens=6000, temperature=0, stream=True
    )


def test_a_client_that_disconnects_mid_stream_frees_its_slot(tiny_url):
    rows = metric(tiny_url, "decode_rows_total")
    stream = _long_stream(tiny_url)
    for _, chunk in zip(range(3), stream):
        pass
    assert health(tiny_url)["active"] == 1
    stream.close()
    wait_for(lambda: health(tiny_url)["active"] == 0, timeout=5)
    assert metric(tiny_url, "decode_rows_total") - rows < 3000  # stopped long before max_tokens


def test_a_full_queue_answers_429_with_retry_after(tiny_engine):
    """One slot, one queue place: a running stream holds the slot, a second request waits in the
    queue, a third is refused; when the stream's client leaves, the waiting request is served."""
    with running(tiny_engine, model_names=[TINY], limits=SchedulerLimits(max_batch=1, max_queue=1)) as url:
        stream = _long_stream(url)
        next(iter(stream))
        waiting = {}
        thread = threading.Thread(target=lambda: waiting.update(out=httpx.post(url + "/chat/completions", json={
            "model": TINY, "messages": [{"role": "user", "content": "short"}], "max_tokens": 3}, timeout=60)))
        thread.start()
        wait_for(lambda: health(url)["queued"] == 1)
        refused = httpx.post(url + "/chat/completions", json={"model": TINY, "messages": [{"role": "user", "content": "x"}]})
        assert refused.status_code == 429 and refused.headers["retry-after"] == "1"
        assert refused.json()["error"]["code"] == "queue_full"
        with pytest.raises(openai.RateLimitError):
            openai.OpenAI(base_url=url, api_key="u", max_retries=0).completions.create(model=TINY, prompt="x")
        assert thread.is_alive()  # still queued behind the stream
        stream.close()
        thread.join(timeout=30)
        assert waiting["out"].status_code == 200 and waiting["out"].json()["usage"]["completion_tokens"] >= 1
        assert metric(url, "requests_total") >= 3


def _decode_steps_for_jobs_arriving_together(engine, budget: int, jobs: int = 4, tokens: int = 3):
    """Holds the model thread with a call while ``jobs`` requests queue up, releases it, and
    returns (decode steps, completion tokens per job) once every job is done."""
    scheduler = Scheduler(engine, max_batch=8, max_prefill_tokens=budget)
    gate = threading.Event()

    async def main():
        held = asyncio.ensure_future(scheduler.call(gate.wait))
        queues = [scheduler.submit(Job(prompt=f"Request {i}: " + "word " * (5 + 3 * i), max_tokens=tokens,
                                       sampling=Sampling(), stop=[])) for i in range(jobs)]
        await asyncio.sleep(0.2)
        gate.set()
        await held
        done = []
        for events in queues:
            while (event := await asyncio.wait_for(events.get(), 60)).kind not in ("done", "error"):
                pass
            assert event.kind == "done", event.error
            done.append(event.stats.completion_tokens)
        return done

    scheduler.start()
    try:
        completions = asyncio.run(main())
    finally:
        scheduler.stop()
    text = scheduler.metrics.render({})
    steps = next(int(float(line.split()[1])) for line in text.splitlines() if line.startswith("cacheblend_decode_steps_total "))
    return steps, completions


def test_requests_arriving_together_are_all_prefilled_before_the_next_decode_step(tiny_engine):
    """Prefills go first within the round's token budget: four waiting requests are admitted
    before any decode step, so three tokens each take two batched steps. With a budget of one
    token, one request is admitted per round and the batch steps between admissions."""
    steps, completions = _decode_steps_for_jobs_arriving_together(tiny_engine, budget=4096)
    assert completions == [3, 3, 3, 3]
    assert steps == 2
    steps, completions = _decode_steps_for_jobs_arriving_together(tiny_engine, budget=1)
    assert completions == [3, 3, 3, 3]
    assert steps == 5  # admit, step, admit, step, ...: the last request waited three decode steps
    with pytest.raises(ValueError, match="max_prefill_tokens"):
        Scheduler(tiny_engine, max_prefill_tokens=0)
