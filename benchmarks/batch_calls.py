"""LangChain batches end to end: ``batch(questions)`` against ``invoke`` one question after another.

    .venv/bin/python benchmarks/batch_calls.py --prompts 8 --answer-tokens 48 --repeats 2
    .venv/bin/python benchmarks/batch_calls.py --quick     # 2 prompts, 4 tokens, 1 repeat

Warms the passages of ``--prompts`` development fact questions (six passages each), then asks every
question as one RAG prompt (an instruction, the passages, the question) three ways, per repeat:

- ``invoke`` one after another (``ChatCacheBlend``): each answer's prefill, then its decode;
- ``ChatCacheBlend.batch``: it reads the inputs' ``stream()`` in turn (``interleave``): the prefills
  one after another, then the answers decode together in the engine's shared batch;
- ``ChatCacheBlend.batch`` with ``max_concurrency=6``: LangChain's own batch (``invoke`` on 6
  threads, what a cache or ``return_exceptions`` also selects); the answers whose decoding overlaps
  share the engine's steps (``cacheblend.generation.shared``);
- ``CacheBlendLLM.batch``: one ``_generate`` reads every prompt's stream in turn.

Times are wall clock from the call to the last answer, prefills included (the default blend, greedy,
``--answer-tokens`` at most). Prints each way's median, its speedup over one after another, and how
many answers are the same as one after another's (greedy: all, fp32 round-off aside).
"""

from __future__ import annotations

import argparse
import statistics
import time

from runfile import RunRecord, add_common

INSTRUCTION = "Answer briefly from the passages."


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common(ap, quick="2 prompts, 4 answer tokens, 1 repeat")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--answer-tokens", type=int, default=48)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's own)")
    args = ap.parse_args(argv)
    if args.quick:
        args.prompts, args.answer_tokens, args.repeats = 2, 4, 1
    record = RunRecord.start(args)

    import torch

    import cacheblend
    from cacheblend.tools.factset import questions
    from langchain_cacheblend import CacheBlendLLM, ChatCacheBlend

    if args.threads:
        torch.set_num_threads(args.threads)
    engine = cacheblend.shared_engine(args.model)
    qs = questions("dev", args.prompts)
    engine.warm(sorted({p for q in qs for p in q.passages}))
    prompts = ["\n\n".join([INSTRUCTION, *q.passages, f"Question: {q.question}"]) for q in qs]
    chat, llm = ChatCacheBlend(model=args.model, max_tokens=args.answer_tokens), CacheBlendLLM(
        model=args.model, max_tokens=args.answer_tokens)
    ways = {
        "invoke one after another": lambda: [chat.invoke(p).content for p in prompts],
        "ChatCacheBlend.batch (read in turn)": lambda: [m.content for m in chat.batch(prompts)],
        "ChatCacheBlend.batch, 6 threads": lambda: [m.content for m in chat.batch(prompts, {"max_concurrency": 6})],
        "CacheBlendLLM.batch (read in turn)": lambda: llm.batch(prompts),
    }
    seconds: dict[str, list[float]] = {name: [] for name in ways}
    answers: dict[str, list[str]] = {}
    steps: dict[str, int] = {}
    for _ in range(args.repeats):
        for name, run in ways.items():
            before, t = engine.decoder.steps, time.perf_counter()
            answers[name] = run()
            seconds[name].append(time.perf_counter() - t)
            steps[name] = engine.decoder.steps - before
    med = {k: statistics.median(v) for k, v in seconds.items()}
    base = "invoke one after another"
    speedup = {k: med[base] / s for k, s in med.items()}
    same = {k: sum(a == b for a, b in zip(v, answers[base])) for k, v in answers.items()}
    for name in ways:
        print(f"{name}: {med[name]:.2f} s ({speedup[name]:.2f}x), {steps[name]} decode steps, "
              f"{same[name]} of {len(prompts)} answers as one after another", flush=True)
    record.write(args.run_file, {
        "prompts": len(prompts), "prompt_tokens": [engine.count_tokens(p) for p in prompts],
        "answer_tokens": args.answer_tokens, "repeats": args.repeats, "torch_threads": torch.get_num_threads(),
        "seconds": seconds, "median_s": med, "speedup": speedup, "decode_steps": steps, "same_answers": same,
        "answer_chars": {k: [len(a) for a in v] for k, v in answers.items()},
    })


if __name__ == "__main__":
    main()
