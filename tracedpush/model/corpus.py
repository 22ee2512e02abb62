"""Deterministic English-like text for training the tiny model's tokenizer.

Generated from a fixed word list with a seeded ``random.Random`` (whose integer-seeded
stream is stable across CPython versions), so the tokenizer never depends on a download
and is the same on every machine. Words are drawn with Zipf weights (rank r has weight
1/r), as in real English, so frequent words become single tokens. Workloads can use the
same generator for prompts the tokenizer compresses well (about 2.8 characters a token).
"""

from __future__ import annotations

import random

# Common English words plus the serving vocabulary our prompts talk about.
# Ordered roughly by frequency: the order sets the Zipf weights.
_WORD_TEXT = """
the of and to in is that for it as was with be by on not he this are or his from at which
but have an they you were her she there been one all we their has would when if so no will
more can out other into some could them time these two may then do first any my now such
like our over man me even most made after also did many before must through back years
where much your way well down should because each just those people how too little state
good very make world still own see men work long get here between both life being under
never day same another know while last might us great old year off come since against go
came right used take three small large number part place case point group problem fact
hand high different next early young important few public bad able system program
question during without again around however home water room mother area money story
month lot study book eye job word business issue side kind head house service friend
father power hour game line end member law car city community name president team minute
idea kid body information school face others level office door health person art war
history party result change morning reason research girl guy moment air teacher force
education foot boy age policy process music market sense nation plan college interest
death experience effect use class control care field development role effort rate heart
drug show leader light voice wife police mind price report decision son view relationship
town road arm difference value building action model season society tax director position
player record paper space ground form event official matter center couple site project
activity star table need court oil situation cost industry figure street image phone data
picture practice piece land product doctor wall patient worker news test movie north love
support technology step baby computer type attention film tree source organization hair
window evidence population site though always often something nothing everything every
until although yet whether across above below among toward upon within along behind
request token tokens cache prefill decode transfer latency throughput engine server proxy
trace span network memory block layer model batch queue stream client time second
"""
WORDS: tuple[str, ...] = tuple(dict.fromkeys(_WORD_TEXT.split()))
_WEIGHTS = tuple(1.0 / rank for rank in range(1, len(WORDS) + 1))

_PUNCT = (".", ".", ".", ",", "?", "!", ";", ":")


def sentence(rng: random.Random) -> str:
    """One sentence of 4-18 words, sometimes with a number or a parenthesis."""
    words = rng.choices(WORDS, weights=_WEIGHTS, k=rng.randint(4, 18))
    words[0] = words[0].capitalize()
    if rng.random() < 0.1:
        words.insert(rng.randrange(len(words)), str(rng.randint(0, 999)))
    if rng.random() < 0.1:
        i = rng.randrange(len(words))
        words[i] = f"({words[i]})"
    return " ".join(words) + rng.choice(_PUNCT)


def paragraphs(seed: int, count: int) -> list[str]:
    """``count`` paragraphs of 2-8 sentences each; identical for identical arguments."""
    rng = random.Random(seed)
    return [" ".join(sentence(rng) for _ in range(rng.randint(2, 8))) for _ in range(count)]
