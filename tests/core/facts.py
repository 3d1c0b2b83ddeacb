"""A fictional-fact lookup set for the real-model tests: facts the model cannot know.

Each passage describes one invented town: a fact sentence among descriptive sentences drawn
(deterministically) from a pool, so no two passages share long identical spans.
"""

import random
from typing import NamedTuple

POOL = [
    "{t} sits on a low hill above a wide valley of barley fields.",
    "Most houses in {t} are built of grey stone with steep slate roofs.",
    "A narrow road winds from {t} down to the coast in long switchbacks.",
    "The people of {t} are known for their patience and their dry humour.",
    "In winter the lanes of {t} are quiet, and smoke rises from every chimney.",
    "Travellers reach {t} by an old coach road lined with poplars.",
    "Several families in {t} still keep bees in painted wooden hives.",
    "The town hall of {t} has a small museum of farm tools on its ground floor.",
    "Local musicians in {t} play fiddles at weddings that last until dawn.",
    "A weekly newspaper printed in {t} reports on weather, harvests and births.",
    "Children in {t} learn to swim in a cold pond behind the old mill.",
    "The main square of {t} is shaded by three enormous chestnut trees.",
    "Every spring the orchards around {t} turn white with blossom.",
    "Walkers praise the footpaths of {t} for their views of distant mountains.",
    "An old stone well in {t} is said never to have run dry.",
    "The inn of {t} serves a thick soup of beans and smoked pork.",
    "Shepherds bring their flocks through {t} twice a year.",
    "The library of {t} keeps a collection of handwritten weather diaries.",
    "Fog often gathers in the streets of {t} on autumn mornings.",
    "A retired teacher in {t} gives free lessons in astronomy.",
]

FACTS = [
    ("Brannock", "The lighthouse of {t} was painted {v} in 1904.", "What colour was the lighthouse of Brannock painted?", ["green"]),
    ("Quillmere", "The mayor of {t} is a retired sailor named {v}.", "What is the name of the mayor of Quillmere?", ["Odile Farrant"]),
    ("Tessaly Vale", "The only bridge in {t} has {v} arches.", "How many arches does the bridge in Tessaly Vale have?", ["seven", "7"]),
    ("Dunmarrow", "The market in {t} is famous for selling {v}.", "What is the market in Dunmarrow famous for selling?", ["blue cheese"]),
    ("Korrin Bay", "Fishermen of {t} mostly catch {v}.", "What do the fishermen of Korrin Bay mostly catch?", ["mackerel"]),
    ("Ashgrove", "The school in {t} was founded by {v}.", "Who founded the school in Ashgrove?", ["Helena Brisk"]),
    ("Pellworth", "The river through {t} is called the {v}.", "What is the river through Pellworth called?", ["Sorrel"]),
    ("Vantmoor", "The clock tower of {t} is {v} metres tall.", "How tall is the clock tower of Vantmoor?", ["forty", "40"]),
    ("Ellisford", "The yearly fair in {t} takes place in {v}.", "In which month is the yearly fair in Ellisford?", ["November"]),
    ("Carrowdale", "The church bell of {t} was cast in the city of {v}.", "In which city was the church bell of Carrowdale cast?", ["Ghent"]),
    ("Minsk Hollow", "The baker of {t} is known for a pie made with {v}.", "What is the pie of the baker of Minsk Hollow made with?", ["rhubarb"]),
    ("Orlen Cross", "The train station of {t} opened in the year {v}.", "In which year did the train station of Orlen Cross open?", ["1887"]),
    ("Fairhollow", "The football club of {t} plays in {v} shirts.", "What colour are the shirts of the football club of Fairhollow?", ["orange"]),
    ("Greyhaven", "The oldest tree in {t} is a {v} planted by monks.", "What kind of tree is the oldest tree in Greyhaven?", ["yew"]),
    ("Lorrimer", "The founder of {t} was a merchant called {v}.", "Who was the founder of Lorrimer?", ["Anselm Pike"]),
    ("Hatherby", "The bakery in {t} opens at {v} every morning.", "At what time does the bakery in Hatherby open?", ["five", "5"]),
    ("Wrenfield", "The castle ruins near {t} belonged to the {v} family.", "Which family owned the castle ruins near Wrenfield?", ["Marlowe"]),
    ("Stonecrop", "The pond in {t} is home to a pair of {v}.", "What animals live in the pond of Stonecrop?", ["swans", "swan"]),
    ("Bramblecote", "The chief export of {t} is {v}.", "What is the chief export of Bramblecote?", ["wool"]),
    ("Ironmere", "The mine at {t} closed in {v}.", "When did the mine at Ironmere close?", ["1962"]),
    ("Silverdell", "The annual race in {t} is run on {v}.", "On what is the annual race in Silverdell run?", ["stilts"]),
    ("Oakhurst", "The doctor of {t} is a woman named {v}.", "What is the name of the doctor of Oakhurst?", ["Mira Castell"]),
    ("Puddlestone", "The inn at {t} is called the {v}.", "What is the inn at Puddlestone called?", ["Crooked Lantern"]),
    ("Thornbury Edge", "The town's emblem in {t} is a {v}.", "What is the emblem of Thornbury Edge?", ["heron"]),
]


def passage(index: int) -> str:
    town, template, _, answers = FACTS[index]
    rng = random.Random(index)
    filler = [s.format(t=town) for s in rng.sample(POOL, 6)]
    fact = template.format(t=town, v=answers[0])
    return " ".join(filler[:3] + [fact] + filler[3:])


def question(index: int) -> tuple[str, list[str]]:
    _, _, q, answers = FACTS[index]
    return q, answers


def correct(answer: str, answers: list[str]) -> bool:
    return any(a.lower() in answer.lower() for a in answers)


ORDER = (5, 11, 0, 17, 3, 8)  # offsets from the question's passage: the fact is third
REORDERED = ORDER[::-1]  # the same six passages in another order: the fact is fourth
PREFIX = "Answer briefly from the passages."


class Lookups(NamedTuple):
    """Per setting: ``kl``, KL(full prefill || setting) along each full-prefill answer; ``kept``, how
    many of the questions full prefill answers correctly the setting still answers correctly;
    ``same``, on how many its greedy answer starts with full prefill's. ``full_ok``: how many full
    prefill answers correctly."""

    kl: dict[str, list[float]]
    kept: dict[str, int]
    same: dict[str, int]
    full_ok: int


def lookups(engine, settings: dict, answer_tokens: int = 24) -> Lookups:
    """The 24 lookups on ``engine``, its whole pool warmed here in one call. ``settings`` maps a name
    to (passage order, ``engine.prefill`` keywords), e.g. ``(ORDER, {"recompute_ratio": 0.0})`` for
    full reuse of the same records. Answers are decoded together (``engine.generate_many``: the
    answers share each step's read of the weights; docs/runs/decode_many.json: 2.75x on 8 answers), and
    each question's teacher-forced passes are one batched forward (``continuation_logits_many``)."""
    import torch

    from cacheblend.generation.decode import continuation_logits_many
    from cacheblend.tools.quality import mean_kl

    texts = [passage(i) for i in range(len(FACTS))]
    engine.warm(texts)
    n = len(FACTS)

    def req(i, order):
        return dict(chunks=[texts[(i + k) % n] for k in order], query=question(i)[0], prefix=PREFIX)

    fulls = [engine.prefill(**req(i, ORDER), recompute_ratio=1.0) for i in range(n)]
    answers = engine.generate_many(fulls, max_new_tokens=answer_tokens)
    ok = [correct(a.text, question(i)[1]) for i, a in enumerate(answers)]
    kl, kept, same = {name: [] for name in settings}, dict.fromkeys(settings, 0), dict.fromkeys(settings, 0)
    undecided = []  # (setting, question, prefill): full prefill right, greedy decoding starts elsewhere
    for i in range(n):
        ids = answers[i].token_ids
        pres = {name: engine.prefill(**req(i, order), **kw) for name, (order, kw) in settings.items()}
        # one batched teacher-forced pass for full prefill and every setting: the KLs and the greedy starts
        full, *rest = continuation_logits_many([fulls[i], *pres.values()], ids)
        p = torch.log_softmax(full, dim=-1)  # [T+1, vocab]
        fulls[i] = None  # its KV is no longer needed
        for (name, pre), logits in zip(pres.items(), rest):
            kl[name].append(mean_kl(p, torch.log_softmax(logits, dim=-1)))
            starts = logits[: len(ids)].argmax(-1).tolist() == list(ids)  # greedy decoding starts with ``ids``
            same[name] += starts
            kept[name] += ok[i] and starts  # the same start holds the reference's right answer
            if ok[i] and not starts:
                undecided.append((name, i, pre))
    decoded = engine.generate_many([pre for _, _, pre in undecided], max_new_tokens=answer_tokens)
    for (name, i, _), answer in zip(undecided, decoded):
        kept[name] += correct(answer.text, question(i)[1])
    return Lookups(kl, kept, same, sum(ok))
