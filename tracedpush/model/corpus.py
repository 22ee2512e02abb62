"""Deterministic English-like text for training the tiny model's tokenizer (and for prompts).

Words come from ``words.txt`` beside this module: English words in frequency order,
derived once from local English text and committed (docs/model.md says how), so the text
never depends on a download or on what the Python installation happens to contain. They
are drawn with Zipf-Mandelbrot weights ``1 / (rank + 2.7)``, as words occur in real
English, so a tokenizer trained on the text gives frequent words one token each and
splits rare ones into pieces. A seeded ``random.Random`` makes the text (and so the
tokenizer) the same on every machine: its integer-seeded stream, and the methods used
here (``random``, ``randint``, ``randrange``, ``choice``, ``choices``), are stable across
CPython versions.

Paragraphs vary as real text does: prose with commas, quotes, parentheses, possessives,
hyphenated pairs and numbers; dialogue; bullet lists; headings; and technical prose with
inline code, flags, paths and links, so Markdown and documentation compress too.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable
from functools import cache
from pathlib import Path

WORDS_FILE = Path(__file__).with_name("words.txt")
ZIPF_OFFSET = 2.7  # Mandelbrot's offset: the top words are less dominant than 1/rank says
_ENDS = (".",) * 12 + ("?", "!", ":", ";")


@cache
def words() -> tuple[str, ...]:
    """The word list, most frequent first (read once)."""
    return tuple(WORDS_FILE.read_text(encoding="utf-8").split())


@cache
def _cum_weights() -> tuple[float, ...]:
    n = len(words())
    return tuple(itertools.accumulate(1.0 / (r + ZIPF_OFFSET) for r in range(1, n + 1)))


def _draw(rng: random.Random, k: int) -> list[str]:
    return rng.choices(words(), cum_weights=_cum_weights(), k=k)


def _cap(word: str) -> str:
    return word[:1].upper() + word[1:]


def _lower(rng: random.Random, k: int) -> list[str]:
    """``k`` lower-case words without apostrophes (for identifiers)."""
    out: list[str] = []
    while len(out) < k:
        out += [w.lower() for w in _draw(rng, k) if w.isalpha()]
    return out[:k]


def _number(rng: random.Random) -> str:
    kind = rng.randrange(6)
    if kind == 0:
        return str(rng.randint(1850, 2030))  # a year
    if kind == 1:
        return f"{rng.randint(0, 99)}.{rng.randint(0, 99)}"
    if kind == 2:
        return f"{rng.randint(1, 100)}%"
    if kind == 3:
        return f"{rng.randint(1, 999):,}" if rng.random() < 0.5 else f"{rng.randint(1, 99999):,}"
    return str(rng.randint(0, 99))


def _code(rng: random.Random) -> str:
    """An identifier, flag, path, call or setting, in backticks or not."""
    a, b, c = _lower(rng, 3)
    kind = rng.randrange(8)
    if kind == 0:
        text = f"{a}_{b}"
    elif kind == 1:
        text = f"--{a}-{b}"
    elif kind == 2:
        text = f"{a}/{b}.{rng.choice(('py', 'md', 'json', 'txt', 'yml', 'sh'))}"
    elif kind == 3:
        text = f"{a}.{b}.{c}"
    elif kind == 4:
        text = f"{a}_{b}()"
    elif kind == 5:
        text = f"{a.upper()}_{b.upper()}={rng.randint(0, 9)}"
    elif kind == 6:
        return f"[{a} {b}]({b}/{c}.md)"
    else:
        text = f"{a} {b}"
    return f"`{text}`" if rng.random() < 0.8 else text


def sentence(rng: random.Random, technical: bool = False) -> str:
    """One sentence of 3-24 words with English-like punctuation."""
    n = rng.randint(3, 24)
    ws = _draw(rng, n)
    ws[0] = _cap(ws[0])
    for i in range(1, n - 1):
        r = rng.random()
        if r < 0.08:
            ws[i] += ","
        elif r < 0.09:
            ws[i], ws[i + 1] = f"({ws[i]}", ws[i + 1] + ")"
        elif r < 0.10:
            ws[i], ws[i + 1] = f'"{ws[i]}', ws[i + 1] + '"'
        elif r < 0.11 and "'" not in ws[i]:
            ws[i] += "'s"
        elif r < 0.12:
            ws[i] = f"{ws[i]}-{ws[i + 1]}"
        elif r < 0.13:
            ws[i] = _number(rng)
        elif r < 0.14:
            ws[i] = _cap(ws[i])
        elif technical and r < 0.22:
            ws[i] = _code(rng)
    return " ".join(ws) + rng.choice(_ENDS)


def _prose(rng: random.Random) -> str:
    return " ".join(sentence(rng) for _ in range(rng.randint(1, 8)))


def _dialogue(rng: random.Random) -> str:
    said = rng.choice(("said", "asked", "replied", "added"))
    name = _cap(_draw(rng, 1)[0])
    return f'"{sentence(rng)}" {said} {name}. {_prose(rng)}'


def _bullets(rng: random.Random) -> str:
    mark = rng.choice(("-", "*", "1."))
    return "\n".join(f"{mark} {sentence(rng, technical=True)}" for _ in range(rng.randint(2, 6)))


def _heading(rng: random.Random) -> str:
    title = " ".join(_draw(rng, rng.randint(1, 5)))
    return f"{'#' * rng.randint(1, 3)} {_cap(title)}"


def _technical(rng: random.Random) -> str:
    return " ".join(sentence(rng, technical=True) for _ in range(rng.randint(1, 6)))


# (cumulative weight, kind): mostly prose, as real text is.
_KINDS: tuple[tuple[float, Callable[[random.Random], str]], ...] = (
    (0.70, _prose),
    (0.78, _dialogue),
    (0.84, _bullets),
    (0.88, _heading),
    (1.00, _technical),
)


def paragraph(rng: random.Random) -> str:
    """One paragraph of a kind drawn by ``_KINDS``."""
    r = rng.random()
    return next(kind for bound, kind in _KINDS if r < bound)(rng)


def paragraphs(seed: int, count: int) -> list[str]:
    """``count`` paragraphs; identical for identical arguments on every machine."""
    rng = random.Random(seed)
    return [paragraph(rng) for _ in range(count)]
