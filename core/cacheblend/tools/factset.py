"""A generated fictional-fact lookup set: hundreds of questions the model cannot know the answer to.

Each question is asked over ``passages`` short passages, every one describing an invented
organisation with the same sentence pattern (founding year, founder, city, emblem) among
descriptive filler sentences. The distractor passages are thus as alike as possible: the
failure this set exposes is a blend answering another passage's value, or another attribute of
the right passage. Variety that matters for blending is drawn per question from a seeded RNG:
passage lengths (1-6 filler sentences, ~50-150 tokens), the order of the fact sentences inside
a passage (the asked fact at its start, middle or end), and the target passage's place among
the passages.

Splits: ``dev`` and ``report`` draw their names from disjoint syllable pools and different
seeds, so no entity, founder or city of one split appears in the other. Tune on ``dev`` only.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

SPLITS = {"dev": 1, "report": 2}

_KINDS = ["Society", "Institute", "Guild", "Company", "Museum", "Orchestra", "Academy", "Foundation"]
_FIRST = ["Mara", "Tobin", "Elsa", "Corin", "Ilse", "Benno", "Runa", "Aldo", "Vera", "Hugo",
          "Nadia", "Oskar", "Lotte", "Emil", "Greta", "Silas", "Petra", "Anton", "Livia", "Jonas"]
_EMBLEMS = ["heron", "lantern", "anchor", "fox", "oak leaf", "bell", "otter", "compass", "owl",
            "key", "swan", "wheel", "badger", "star", "harp", "falcon", "acorn", "ship", "hare", "crown"]
# Disjoint syllable pools per split: every generated name belongs to exactly one split.
_SYLLABLES = {
    "dev": (["Bran", "Quil", "Dun", "Kor", "Ash", "Pel", "Vant", "Ell", "Car", "Mins",
             "Orl", "Fair", "Grey", "Lor", "Hath", "Wren"],
            ["mere", "dale", "wick", "ford", "holt", "stead", "brook", "more"]),
    "report": (["Sil", "Oak", "Pud", "Thorn", "Bram", "Iron", "Tess", "Stone", "Mar", "Hol",
                "Ven", "Cas", "Rud", "Sorn", "Tal", "Bex"],
               ["ton", "by", "well", "croft", "ley", "wood", "gate", "ham"]),
}
_FILLER = [
    "The {n} publishes a short report every spring.",
    "Visitors to the {n} are welcomed by volunteers at the door.",
    "Over the years the {n} has moved its archive twice.",
    "Members of the {n} meet on the first Monday of each month.",
    "The {n} keeps a small collection of old maps and letters.",
    "A garden behind the offices of the {n} is open to the public.",
    "Several local schools take part in the programmes of the {n}.",
    "The {n} is funded mostly by gifts from its members.",
    "Each winter the {n} holds a dinner for its oldest supporters.",
    "The building used by the {n} was once a warehouse.",
]
_FACTS = {
    "year": ("The {n} was founded in {v}.", "In which year was the {n} founded?"),
    "founder": ("Its founder was {v}.", "Who founded the {n}?"),
    "city": ("The {n} is based in the city of {v}.", "In which city is the {n} based?"),
    "emblem": ("The emblem of the {n} is a {v}.", "What is the emblem of the {n}?"),
}


@dataclass(frozen=True)
class Entity:
    name: str
    year: str
    founder: str
    city: str
    emblem: str

    def value(self, attribute: str) -> str:
        return getattr(self, attribute)


@dataclass(frozen=True)
class FactQuestion:
    """passages: the prompt's passages in order; target: index of the one holding the answer;
    answers: accepted gold strings (an answer is right if it contains one, case-insensitive)."""

    question: str
    answers: list[str]
    passages: list[str]
    target: int
    attribute: str


def entities(split: str, count: int) -> list[Entity]:
    """``count`` distinct organisations of ``split`` (names, founders and cities unique in it)."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {', '.join(SPLITS)}; got {split!r}")
    heads, tails = _SYLLABLES[split]
    places = [h + t for h in heads for t in tails]  # 128 names per split
    if count * 3 > len(places):
        raise ValueError(f"at most {len(places) // 3} entities per split, got {count}")
    rng = random.Random(SPLITS[split] * 7919)
    rng.shuffle(places)
    out = []
    for i in range(count):
        name, surname, city = places[3 * i : 3 * i + 3]
        out.append(Entity(
            name=f"{name} {rng.choice(_KINDS)}",
            year=str(rng.randrange(1702, 1990)),
            founder=f"{rng.choice(_FIRST)} {surname}",
            city=city,
            emblem=rng.choice(_EMBLEMS),
        ))
    return out


def passage_text(entity: Entity, rng: random.Random) -> str:
    """The entity's four fact sentences in a random order, among 1-6 filler sentences."""
    facts = [tpl.format(n=entity.name, v=entity.value(a)) for a, (tpl, _) in _FACTS.items()]
    rng.shuffle(facts)
    filler = [s.format(n=entity.name) for s in rng.sample(_FILLER, rng.randint(1, 6))]
    sentences = facts + filler
    rng.shuffle(sentences)
    return " ".join(sentences)


def questions(split: str = "dev", count: int = 300, passages: int = 6, pool: int = 40) -> list[FactQuestion]:
    """``count`` questions over ``passages`` passages each, drawn from ``pool`` entities of ``split``.

    Each entity has one fixed passage text (so chunk KV is shared across questions, as in RAG);
    a question picks a target entity, an attribute, ``passages - 1`` distractors and the target's
    place, all from a seeded RNG: the same arguments give the same set on every machine.
    """
    if passages < 1 or count < 0:
        raise ValueError(f"need passages >= 1 and count >= 0, got passages={passages}, count={count}")
    ents = entities(split, pool)
    texts = {e.name: passage_text(e, random.Random(f"{split}:{e.name}")) for e in ents}
    rng = random.Random(SPLITS[split])
    out = []
    for _ in range(count):
        chosen = rng.sample(ents, passages)
        target = rng.randrange(passages)
        attribute = rng.choice(list(_FACTS))
        ent = chosen[0]
        chosen[0], chosen[target] = chosen[target], ent
        value = ent.value(attribute)
        answers = [value, value.split()[-1]] if attribute == "founder" else [value]
        out.append(FactQuestion(
            question=_FACTS[attribute][1].format(n=ent.name),
            answers=answers,
            passages=[texts[e.name] for e in chosen],
            target=target,
            attribute=attribute,
        ))
    return out


def correct(answer: str, answers: list[str]) -> bool:
    """Whether ``answer`` contains any gold string (case-insensitive)."""
    return any(a.lower() in answer.lower() for a in answers)
