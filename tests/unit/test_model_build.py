"""The tiny model builds offline, byte for byte the same, in the shape vLLM expects."""

from __future__ import annotations

import hashlib
import json
import struct
import tomllib
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tracedpush.model import build as mb

pytest.importorskip("tokenizers")

REPO = Path(__file__).resolve().parents[2]
# Plain English prose written for this test, never seen by the word list or the corpus.
HELD_OUT = REPO / "tests" / "data" / "english_prose.txt"


def _digests(d: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(d.iterdir())}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return mb.build_model(tmp_path_factory.mktemp("a") / "tiny")


def test_two_builds_are_identical(model_dir: Path, tmp_path: Path) -> None:
    other = mb.build_model(tmp_path / "tiny")
    assert _digests(model_dir) == _digests(other)
    assert set(_digests(model_dir)) == {
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "tracedpush.json",
    }


def test_config_is_the_specified_qwen2(model_dir: Path) -> None:
    cfg = json.loads((model_dir / "config.json").read_text())
    assert cfg["architectures"] == ["Qwen2ForCausalLM"]
    assert cfg["model_type"] == "qwen2"
    assert (cfg["hidden_size"], cfg["num_hidden_layers"]) == (128, 4)
    assert (cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]) == (4, 2, 32)
    assert cfg["vocab_size"] == 16384
    assert cfg["max_position_embeddings"] >= 16384  # a 16k-token prompt fits
    assert cfg["torch_dtype"] == "bfloat16"


def test_kv_bytes_per_token(model_dir: Path) -> None:
    assert mb.SPEC.kv_bytes_per_token == 4 * 2 * 32 * 2 * 2 == 1024
    manifest = mb.read_manifest(model_dir)
    assert manifest["kv_bytes_per_token"] == 1024
    assert manifest["files"] == {k: v for k, v in _digests(model_dir).items() if k != mb.MANIFEST}


def test_safetensors_header_and_bf16_weights(model_dir: Path) -> None:
    raw = (model_dir / "model.safetensors").read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    assert header.pop("__metadata__") == {"format": "pt"}
    assert {k: tuple(v["shape"]) for k, v in header.items()} == mb.tensor_shapes()
    assert all(v["dtype"] == "BF16" for v in header.values())
    assert max(v["data_offsets"][1] for v in header.values()) == len(raw) - 8 - n
    q = header["model.layers.0.self_attn.q_proj.weight"]
    start, end = (8 + n + o for o in q["data_offsets"])
    values = (np.frombuffer(raw[start:end], "<u2").astype("<u4") << 16).view("<f4")
    assert 0.015 < values.std() < 0.025  # seeded init with std 0.02, not zeros or garbage
    norm = header["model.norm.weight"]
    start, end = (8 + n + o for o in norm["data_offsets"])
    assert set(np.frombuffer(raw[start:end], "<u2").tolist()) == {0x3F80}  # bf16 1.0


def test_bf16_rounds_to_nearest_even() -> None:
    values = np.array([1.0, -2.5, 1.00390625, 1.01171875, 3.0e-3], dtype=np.float32)
    got = np.frombuffer(mb._bf16_bytes(values), "<u2").tolist()
    # 1.00390625 is halfway between 1.0 and 1.0078125: ties to even (1.0).
    # 1.01171875 is halfway between 1.0078125 and 1.015625: ties to even (1.015625).
    assert got[:4] == [0x3F80, 0xC020, 0x3F80, 0x3F82]
    assert abs((np.array([got[4]], "<u4") << 16).view("<f4")[0] - 3.0e-3) < 2e-5


def test_tokenizer_round_trips_and_compresses(model_dir: Path) -> None:
    from tokenizers import Tokenizer

    from tracedpush.model.corpus import paragraphs

    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    assert tok.get_vocab_size() == 16384
    assert [tok.token_to_id(t) for t in mb.SPECIAL_TOKENS] == [0, 1, 2]
    text = " ".join(paragraphs(7, 50)) + "\nÜnïcode, 12345 and\ttabs {json: [1, 2]}"
    ids = tok.encode(text).ids
    assert tok.decode(ids) == text
    assert max(ids) < 16384
    assert len(text) / len(ids) > 3.5  # whole words, not one token per byte
    chat = "<|im_start|>user\nhi<|im_end|>\n"
    assert tok.encode(chat).ids[0] == tok.token_to_id("<|im_start|>")


def _tokens_per_word(tok: Any, text: str) -> float:
    return len(tok.encode(text).ids) / len(text.split())


def test_about_one_and_a_fifth_tokens_per_english_word(model_dir: Path) -> None:
    """Real English prose it never saw costs about 1.2 tokens a word (docs/model.md)."""
    from tokenizers import Tokenizer

    from tracedpush.model.corpus import paragraphs

    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    prose = HELD_OUT.read_text(encoding="utf-8")
    assert len(prose.split()) > 900
    assert _tokens_per_word(tok, prose) <= 1.3
    assert _tokens_per_word(tok, " ".join(paragraphs(7, 400))) <= 1.5  # numbers, code


def test_word_list_is_part_of_the_builder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A changed word list changes the tokenizer, so it must make existing builds stale."""
    from tracedpush.model import corpus

    words = corpus.words()
    assert len(words) > 10_000 and words[:3] == ("the", "to", "a")
    assert len(set(words)) == len(words) and all(w.strip() == w for w in words)
    before = mb.builder_digest()
    other = tmp_path / "words.txt"
    other.write_text(corpus.WORDS_FILE.read_text(encoding="utf-8") + "zebra\n")
    monkeypatch.setattr(corpus, "WORDS_FILE", other)
    assert mb.builder_digest() != before


def test_word_list_ships_in_the_wheel() -> None:
    """words.txt is not a module: without package-data the wheel would leave it out."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert "words.txt" in project["tool"]["setuptools"]["package-data"]["tracedpush.model"]


def test_complete_build_is_left_alone(model_dir: Path) -> None:
    assert mb.is_complete(model_dir)
    before = (model_dir / "model.safetensors").stat().st_mtime_ns
    assert mb.build_model(model_dir) == model_dir
    assert (model_dir / "model.safetensors").stat().st_mtime_ns == before


def test_build_by_other_code_is_stale(model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(mb, "builder_digest", lambda: "0" * 64)
    assert not mb.is_complete(model_dir)


def test_incomplete_build_is_rebuilt(tmp_path: Path) -> None:
    d = mb.build_model(tmp_path / "m")
    (d / "tokenizer.json").write_text("{}")
    assert not mb.is_complete(d)
    mb.build_model(d)
    assert mb.is_complete(d)


def test_refuses_to_replace_a_foreign_directory(tmp_path: Path) -> None:
    (tmp_path / "mine.txt").write_text("keep me")
    with pytest.raises(FileExistsError):
        mb.build_model(tmp_path, force=True)
    assert (tmp_path / "mine.txt").read_text() == "keep me"


def test_ensure_model_passes_other_models_through(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    assert mb.ensure_model(tmp_path) == tmp_path.absolute()
    assert not (tmp_path / mb.MANIFEST).exists()


def test_default_dir_honours_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(mb.ENV_DIR, str(tmp_path / "x"))
    assert mb.default_model_dir() == tmp_path / "x"
    monkeypatch.delenv(mb.ENV_DIR)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert mb.default_model_dir() == tmp_path / "tracedpush" / "models" / "tiny-qwen2"


def test_cli_build_and_info(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from tracedpush.cli import main

    assert main(["model", "build", str(tmp_path / "m")]) == 0
    assert main(["model", "build", str(tmp_path / "m")]) == 0
    out = capsys.readouterr().out
    assert "already holds a complete" in out
    assert main(["model", "info", str(tmp_path / "m")]) == 0
    assert "1024 bytes per token" in capsys.readouterr().out
    assert main(["model", "info", str(tmp_path / "nothing")]) == 1


def test_chat_template_and_transformers_agree(model_dir: Path) -> None:
    """vLLM loads the tokenizer through transformers (as Qwen2Tokenizer): same ids, ChatML."""
    transformers = pytest.importorskip("transformers")
    from tokenizers import Tokenizer

    tok = transformers.AutoTokenizer.from_pretrained(str(model_dir))
    raw = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    text = "The prefill engine sends 4096 tokens of KV cache to decode, über schnell."
    assert tok(text)["input_ids"] == raw.encode(text).ids
    assert tok.eos_token == "<|endoftext|>"
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    assert prompt == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    parts = [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]
    assert tok.apply_chat_template(parts, tokenize=False) == "<|im_start|>user\nhi<|im_end|>\n"
