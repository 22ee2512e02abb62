"""Which models the engines serve, and each one's vocabulary size.

A request for a model the engines do not serve would fail on both legs (in push mode
at the same time, so P's prefill is wasted); the proxy answers it with OpenAI's 404
``model_not_found`` instead. It learns the names from the engines' ``GET /v1/models``,
caches them, and asks again on a miss at most once per ``ttl`` seconds (a LoRA loaded
at run time shows up then). If the engines cannot be asked, nothing is refused: the
engines still refuse an unknown model themselves.

The vocabulary size lets the proxy refuse out-of-vocabulary token ids. It comes from
``--vocab-size``, else ``--model-dir``, else the model directory an engine reports as
the model card's ``root`` when that directory is readable here (the case for
``tracedpush up``, where the proxy runs on the engines' machine). Otherwise it is
unknown and the check is skipped.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

MODEL_CACHE_TTL_S = 2.0


@dataclass(frozen=True)
class ModelCard:
    """One entry of an engine's /v1/models answer, as far as the proxy needs it."""

    name: str
    root: str | None = None
    parent: str | None = None  # a LoRA's base model


def cards_from_answer(answer: Any) -> list[ModelCard]:
    """The model cards in a /v1/models answer; ValueError if it is not one."""
    data = answer.get("data") if isinstance(answer, dict) else None
    if not isinstance(data, list):
        raise ValueError("not an OpenAI model list (no 'data' list)")
    cards = []
    for item in data:
        if isinstance(item, dict) and isinstance(item.get("id"), str):
            root, parent = item.get("root"), item.get("parent")
            cards.append(
                ModelCard(
                    item["id"],
                    root if isinstance(root, str) else None,
                    parent if isinstance(parent, str) else None,
                )
            )
    return cards


# ------------------------------------------------------------------------ vocabulary
def _json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _config_vocab(config: Any) -> int | None:
    """``vocab_size`` of config.json, or of its ``text_config`` (multimodal models)."""
    for section in (config, (config or {}).get("text_config")):
        if isinstance(section, dict):
            size = section.get("vocab_size")
            if isinstance(size, int) and not isinstance(size, bool) and size > 0:
                return size
    return None


def _tokenizer_ids(model_dir: Path) -> int | None:
    """The largest token id the tokenizer files define (added tokens included)."""
    ids: list[int] = []
    tokenizer = _json(model_dir / "tokenizer.json")
    if isinstance(tokenizer, dict):
        vocab = (tokenizer.get("model") or {}).get("vocab")
        if isinstance(vocab, dict):
            ids += [v for v in vocab.values() if isinstance(v, int)]
        elif isinstance(vocab, list):  # Unigram: [[piece, score], ...], id = position
            ids.append(len(vocab) - 1)
        added = tokenizer.get("added_tokens") or []
        ids += [t["id"] for t in added if isinstance(t, dict) and isinstance(t.get("id"), int)]
    tokenizer_config = _json(model_dir / "tokenizer_config.json")
    if isinstance(tokenizer_config, dict):
        decoder = tokenizer_config.get("added_tokens_decoder")
        if isinstance(decoder, dict):
            ids += [int(k) for k in decoder if str(k).isdigit()]
    return max(ids) if ids else None


def vocab_size_of(model_dir: Path | str) -> int | None:
    """Token ids a model accepts are ``0 .. vocab_size_of(dir) - 1``; None if unknown.

    Like vLLM (``validate_token_ids``), the larger of the model's vocabulary
    (config.json) and the tokenizer's largest id + 1: either may exceed the other.
    """
    model_dir = Path(model_dir)
    size = _config_vocab(_json(model_dir / "config.json"))
    if size is None:
        return None
    largest = _tokenizer_ids(model_dir)
    return max(size, largest + 1) if largest is not None else size


# --------------------------------------------------------------------------- catalog
Fetch = Callable[[], Awaitable[list[ModelCard] | None]]


@dataclass(frozen=True)
class Lookup:
    known: bool | None  # None: the engines could not be asked
    served: tuple[str, ...] = ()
    vocab_size: int | None = None
    fetched: bool = False  # it waited for the engines' /v1/models (own or shared refresh)
    read_vocab: bool = False  # it waited for the model's vocabulary to be read

    @property
    def waited(self) -> bool:
        """The request waited for the catalog (the proxy's ``proxy.models`` span)."""
        return self.fetched or self.read_vocab


class ModelCatalog:
    """The served models, refreshed on a miss at most once per ``ttl`` seconds."""

    def __init__(self, *, vocab_size: int | None = None, ttl: float = MODEL_CACHE_TTL_S) -> None:
        self.fixed_vocab = vocab_size  # --vocab-size / --model-dir: wins over learned sizes
        self.ttl = ttl
        self.cards: dict[str, ModelCard] | None = None  # None: the last refresh failed
        self.refreshed_at: float | None = None  # monotonic time of the last attempt
        self.refreshes = 0
        self._vocab_by_root: dict[str, int | None] = {}
        self._inflight: asyncio.Future[None] | None = None

    async def lookup(self, name: str, fetch: Fetch) -> Lookup:
        fetched = False
        if self.cards is None or name not in self.cards:
            fetched = await self._refresh_if_stale(fetch)
        if self.cards is None:
            return Lookup(known=None, vocab_size=self.fixed_vocab, fetched=fetched)
        served = tuple(sorted(self.cards))
        if name not in self.cards:
            return Lookup(known=False, served=served, fetched=fetched)
        vocab, read = await self._vocab(name)
        return Lookup(True, served, vocab, fetched=fetched, read_vocab=read)

    async def warm(self, fetch: Fetch) -> None:
        """Learn the served models and their vocabularies before the first request (the
        proxy's start), so no request waits for them. A failed warm-up (engines not up
        yet, or asking needs a client's key) leaves the next request free to ask."""
        await self._refresh_if_stale(fetch)
        if self.cards is None:
            self.refreshed_at = None
            return
        for name in list(self.cards):
            await self._vocab(name)

    async def _refresh_if_stale(self, fetch: Fetch) -> bool:
        """Refresh the catalog unless it was within the TTL; True if this waited for one."""
        if self._inflight is not None:  # concurrent misses share one refresh
            await asyncio.shield(self._inflight)
            return True
        now = time.monotonic()
        if self.refreshed_at is not None and now - self.refreshed_at < self.ttl:
            return False
        self.refreshed_at = now
        self._inflight = asyncio.get_running_loop().create_future()
        try:
            cards = await fetch()
            self.refreshes += 1
            self.cards = None if cards is None else {c.name: c for c in cards}
        finally:
            self._inflight.set_result(None)
            self._inflight = None
        return True

    async def _vocab(self, name: str) -> tuple[int | None, bool]:
        """`name`'s vocabulary size, and whether this call read it from its directory."""
        if self.fixed_vocab is not None or self.cards is None:
            return self.fixed_vocab, False
        card = self.cards.get(name)
        if card is not None and card.parent in self.cards and not self._is_model_dir(card.root):
            card = self.cards[card.parent]  # a LoRA adapter: its base model's vocabulary
        if card is None or card.root is None:
            return None, False
        read = card.root not in self._vocab_by_root
        if read:
            size = await asyncio.to_thread(self._read_vocab, card.root)
            self._vocab_by_root[card.root] = size
            if size is not None:
                log.info("model %s: vocabulary of %d token ids (from %s)", name, size, card.root)
        return self._vocab_by_root[card.root], read

    @staticmethod
    def _is_model_dir(root: str | None) -> bool:
        return root is not None and (Path(root) / "config.json").is_file()

    @staticmethod
    def _read_vocab(root: str) -> int | None:
        path = Path(root)
        return vocab_size_of(path) if path.is_dir() else None
