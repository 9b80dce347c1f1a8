"""The built-in English-like text the local models' tokenizers are trained on, and prompts are
made of: deterministic for a seed, no download.

    corpus_lines(seed, count) -> [str]   ``count`` lines of one to four sentences each
    sentence(rng) -> str                 one sentence
"""

from __future__ import annotations

import random

CORPUS_LINES = 600
CORPUS_SEED = 20261122

_NAMES = "Alice Bob Carol David Emma Frank Grace Henry Irene Jack Karen Leo Maria Nina".split()
_NOUNS = """river mountain city garden teacher student doctor engineer farmer painter window door
table chair book letter computer network server message memory engine train station bridge road
forest ocean island village market kitchen bread coffee water music song story question answer
problem idea plan machine model cache block layer token request worker scheduler report paper
pencil camera phone clock lamp bottle basket horse dog cat bird fish tree flower stone cloud storm
winter summer autumn spring morning evening night library museum school hospital office factory
""".split()
_ADJECTIVES = """small large quick slow bright dark quiet loud warm cold old new young ancient
modern simple complex careful busy happy tired strange familiar green blue red yellow heavy light
empty full narrow wide gentle rough clever honest patient curious hidden open distant local
""".split()
_VERBS = """found built opened closed carried painted wrote read watched followed visited repaired
moved counted measured cleaned cooked planted answered explained described remembered forgot
noticed ignored shared stored loaded copied checked tested changed started finished reached
""".split()
_ADVERBS = """quickly slowly carefully quietly happily suddenly finally often rarely always never
again together almost nearly gently easily""".split()
_PLACES = """near the river|in the old city|behind the station|under the bridge|at the market|
inside the library|across the field|on the hill|by the window|in the kitchen|at the office|
along the road""".replace("\n", "").split("|")
_TIMES = """yesterday|this morning|last winter|every evening|on Monday|after lunch|before dawn|
in the spring|at noon|later that night|two days ago|during the storm""".replace("\n", "").split("|")


def sentence(rng: random.Random) -> str:
    noun, noun2 = rng.choice(_NOUNS), rng.choice(_NOUNS)
    adj, verb, adv = rng.choice(_ADJECTIVES), rng.choice(_VERBS), rng.choice(_ADVERBS)
    name, place, when = rng.choice(_NAMES), rng.choice(_PLACES), rng.choice(_TIMES)
    n = rng.randint(2, 999)
    forms = (
        f"The {adj} {noun} {verb} the {noun2} {place}.",
        f"{name} {adv} {verb} a {adj} {noun} {when}.",
        f"{when.capitalize()}, {name} {verb} {n} {noun}s {place}.",
        f"Why did the {noun} {verb.removesuffix('ed')} the {adj} {noun2}?",
        f'{name} said: "The {noun2} is {adj}, but the {noun} is not."',
        f"There were {n} {adj} {noun}s and {rng.randint(1, 99)} {noun2}s {place}.",
        f"If the {noun} is {adj}, then {name.lower()}_{noun} = {n} + {rng.randint(0, 9)};",
        f"{name}'s {noun} was {adv} {verb} {when}, and nobody {verb} it again.",
    )
    return rng.choice(forms)


def corpus_lines(seed: int = CORPUS_SEED, count: int = CORPUS_LINES) -> list[str]:
    """The built-in training text: ``count`` lines of one to four sentences each."""
    rng = random.Random(seed)
    return [" ".join(sentence(rng) for _ in range(rng.randint(1, 4))) for _ in range(count)]
