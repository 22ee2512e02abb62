"""Build the tiny Qwen2 test model: seeded random bf16 weights and a locally trained tokenizer.

Nothing is downloaded and nothing depends on the clock, so every build writes the same
bytes (each file's sha256 is recorded in ``tracedpush.json``). Weights come from SHAKE-256
keyed on the tensor name rather than a PRNG library, so the stream cannot change with a
NumPy release; bf16 is produced from float32 bit patterns with round-to-nearest-even, so
torch is not needed and a build takes about a second.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import struct
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from tracedpush import envs
from tracedpush.model.corpus import paragraphs

MODEL_NAME = "tiny-qwen2"
# Bump when the manifest's layout changes (code changes are caught by builder_digest()).
FORMAT_VERSION = 1
MANIFEST = "tracedpush.json"
ENV_DIR = "TRACEDPUSH_MODEL_DIR"

ENDOFTEXT, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
SPECIAL_TOKENS = (ENDOFTEXT, IM_START, IM_END)  # ids 0, 1, 2

# ChatML, as Qwen2 uses; lets /v1/chat/completions work. String or list-of-parts content.
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' }}"
    "{%- if message['content'] is string %}{{- message['content'] }}"
    "{%- else %}{%- for part in message['content'] %}"
    "{%- if part['type'] == 'text' %}{{- part['text'] }}{%- endif %}"
    "{%- endfor %}{%- endif %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

# transformers' Qwen2Tokenizer pre-tokenization (digits split one by one).
QWEN2_PRETOKENIZE_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

Log = Callable[[str], None]


@dataclass(frozen=True)
class TinyQwen2Spec:
    """Shape of the model; KV cache size per token follows from it."""

    hidden_size: int = 128
    num_hidden_layers: int = 4
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 32
    intermediate_size: int = 256
    vocab_size: int = 16384
    # 32k positions: a 16,384-token prompt plus its output fits with room to spare. The
    # launcher still serves with --max-model-len 4096 unless told otherwise.
    max_position_embeddings: int = 32768
    rope_theta: float = 1000000.0  # Qwen2's value for its 32k-context models
    rms_norm_eps: float = 1e-6
    init_std: float = 0.02
    seed: int = 20240611
    corpus_paragraphs: int = 4000

    @property
    def kv_bytes_per_token(self) -> int:
        """Layers x KV heads x head_dim x (K and V) x 2 bytes (bf16)."""
        return self.num_hidden_layers * self.num_key_value_heads * self.head_dim * 2 * 2


SPEC = TinyQwen2Spec()


def default_model_dir() -> Path:
    """``$TRACEDPUSH_MODEL_DIR``, else ``$XDG_CACHE_HOME``/tracedpush/models/tiny-qwen2.

    ``$XDG_CACHE_HOME`` defaults to ~/.cache: a user-level cache, so every checkout and the
    CI clone on one machine share one build.
    """
    env = os.environ.get(ENV_DIR)
    if env:
        return Path(env).expanduser()
    return envs.user_cache("models", MODEL_NAME)


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def read_manifest(model_dir: Path) -> dict | None:
    """The model's ``tracedpush.json``, or None if absent or unreadable."""
    try:
        return json.loads((Path(model_dir) / MANIFEST).read_text())
    except (OSError, ValueError):
        return None


def builder_digest() -> str:
    """sha256 of what decides the model's bytes: this module, the corpus and its word list.

    Recorded in the manifest: a build made by different code or words is stale and gets
    rebuilt, with no version number to remember to bump.
    """
    from tracedpush.model import corpus

    h = hashlib.sha256()
    for source in (Path(__file__), Path(corpus.__file__), corpus.WORDS_FILE):
        h.update(source.read_bytes())
    return h.hexdigest()


def is_complete(model_dir: Path) -> bool:
    """True if ``model_dir`` holds a build by this code whose files match their sha256."""
    manifest = read_manifest(model_dir)
    if not manifest or manifest.get("format_version") != FORMAT_VERSION:
        return False
    if manifest.get("builder_sha256") != builder_digest():
        return False
    files = manifest.get("files") or {}
    try:
        return bool(files) and all(
            _sha256(Path(model_dir) / name) == digest for name, digest in files.items()
        )
    except OSError:
        return False


# --- weights -------------------------------------------------------------------------


def _bf16_bytes(values: np.ndarray) -> bytes:
    """float32 -> bf16 (round to nearest even), little-endian bytes."""
    bits = np.ascontiguousarray(values, dtype="<f4").view("<u4").astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    return rounded.astype("<u2").tobytes()


def _uniform(name: str, shape: tuple[int, ...], std: float, seed: int) -> np.ndarray:
    """Seeded uniform values with standard deviation ``std``, keyed on the tensor name."""
    n = int(np.prod(shape))
    raw = hashlib.shake_256(f"{MODEL_NAME}/{seed}/{name}".encode()).digest(4 * n)
    u = np.frombuffer(raw, dtype="<u4").astype(np.float64) / 2.0**32  # [0, 1)
    return ((u * 2.0 - 1.0) * std * 3.0**0.5).astype(np.float32).reshape(shape)


def tensor_shapes(spec: TinyQwen2Spec = SPEC) -> dict[str, tuple[int, ...]]:
    """Names and shapes of every tensor Qwen2ForCausalLM loads (embeddings are tied)."""
    h, i, hd = spec.hidden_size, spec.intermediate_size, spec.head_dim
    q, kv = spec.num_attention_heads * hd, spec.num_key_value_heads * hd
    shapes: dict[str, tuple[int, ...]] = {
        "model.embed_tokens.weight": (spec.vocab_size, h),
        "model.norm.weight": (h,),
    }
    for layer in range(spec.num_hidden_layers):
        p = f"model.layers.{layer}."
        shapes |= {
            p + "input_layernorm.weight": (h,),
            p + "post_attention_layernorm.weight": (h,),
            p + "self_attn.q_proj.weight": (q, h),
            p + "self_attn.q_proj.bias": (q,),
            p + "self_attn.k_proj.weight": (kv, h),
            p + "self_attn.k_proj.bias": (kv,),
            p + "self_attn.v_proj.weight": (kv, h),
            p + "self_attn.v_proj.bias": (kv,),
            p + "self_attn.o_proj.weight": (h, q),
            p + "mlp.gate_proj.weight": (i, h),
            p + "mlp.up_proj.weight": (i, h),
            p + "mlp.down_proj.weight": (h, i),
        }
    return shapes


def write_safetensors(path: Path, spec: TinyQwen2Spec = SPEC) -> int:
    """Write all weights as one bf16 safetensors file; returns the parameter count.

    The header is written by hand (sorted keys, no timestamps) so it is byte-stable.
    """
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    blobs: list[bytes] = []
    offset = params = 0
    for name, shape in sorted(tensor_shapes(spec).items()):
        if name.endswith("norm.weight"):
            values = np.ones(shape, dtype=np.float32)
        else:
            values = _uniform(name, shape, spec.init_std, spec.seed)
        blob = _bf16_bytes(values)
        header[name] = {
            "dtype": "BF16",
            "shape": list(shape),
            "data_offsets": [offset, offset + len(blob)],
        }
        blobs.append(blob)
        offset += len(blob)
        params += int(np.prod(shape))
    head = json.dumps(header, sort_keys=True, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)  # data starts 8-byte aligned, as safetensors does
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(head)))
        f.write(head)
        for blob in blobs:
            f.write(blob)
    return params


# --- tokenizer -----------------------------------------------------------------------


def train_tokenizer(spec: TinyQwen2Spec = SPEC):
    """Byte-level BPE with ``spec.vocab_size`` entries, trained on the generated corpus."""
    from tokenizers import (
        Regex,
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
        processors,
        trainers,
    )

    tok = Tokenizer(models.BPE())
    # Qwen2's own normalizer and pre-tokenizer: transformers' Qwen2Tokenizer re-applies
    # them when loading, so training with anything else would make counts differ.
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_PRETOKENIZE_REGEX), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=spec.vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(paragraphs(spec.seed, spec.corpus_paragraphs), trainer=trainer)
    if tok.get_vocab_size() > spec.vocab_size:
        raise RuntimeError(f"tokenizer has {tok.get_vocab_size()} > {spec.vocab_size} entries")
    return tok


def _json_bytes(obj: object) -> bytes:
    return (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode()


def _config(spec: TinyQwen2Spec, ids: dict[str, int]) -> dict:
    return {
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        "hidden_size": spec.hidden_size,
        "intermediate_size": spec.intermediate_size,
        "num_hidden_layers": spec.num_hidden_layers,
        "num_attention_heads": spec.num_attention_heads,
        "num_key_value_heads": spec.num_key_value_heads,
        "head_dim": spec.head_dim,
        "vocab_size": spec.vocab_size,
        "max_position_embeddings": spec.max_position_embeddings,
        "hidden_act": "silu",
        "rms_norm_eps": spec.rms_norm_eps,
        # Both spellings: transformers 4.x reads rope_theta, 5.x rope_parameters.
        "rope_theta": spec.rope_theta,
        "rope_parameters": {"rope_theta": spec.rope_theta, "rope_type": "default"},
        "tie_word_embeddings": True,
        "use_sliding_window": False,
        "sliding_window": None,
        "max_window_layers": spec.num_hidden_layers,
        "attention_dropout": 0.0,
        "initializer_range": spec.init_std,
        "use_cache": True,
        "torch_dtype": "bfloat16",
        "bos_token_id": ids[ENDOFTEXT],
        "eos_token_id": ids[ENDOFTEXT],
    }


def _tokenizer_config(spec: TinyQwen2Spec, ids: dict[str, int]) -> dict:
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "added_tokens_decoder": {
            str(ids[t]): {
                "content": t,
                "lstrip": False,
                "normalized": False,
                "rstrip": False,
                "single_word": False,
                "special": True,
            }
            for t in SPECIAL_TOKENS
        },
        "additional_special_tokens": [IM_START, IM_END],
        "bos_token": None,
        "eos_token": ENDOFTEXT,
        "pad_token": ENDOFTEXT,
        "unk_token": None,
        "add_bos_token": False,
        "add_prefix_space": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": spec.max_position_embeddings,
        "chat_template": CHAT_TEMPLATE,
    }


def _model_files(spec: TinyQwen2Spec, out: Path, log: Log) -> dict[str, object]:
    """Write every file except the manifest into ``out``; returns manifest facts."""
    log(f"training byte-level BPE tokenizer (vocab {spec.vocab_size}) on generated text")
    tok = train_tokenizer(spec)
    ids = {t: tok.token_to_id(t) for t in SPECIAL_TOKENS}
    (out / "tokenizer.json").write_bytes(tok.to_str(pretty=True).encode() + b"\n")
    (out / "tokenizer_config.json").write_bytes(_json_bytes(_tokenizer_config(spec, ids)))
    (out / "config.json").write_bytes(_json_bytes(_config(spec, ids)))
    gen = {"bos_token_id": ids[ENDOFTEXT], "eos_token_id": [ids[ENDOFTEXT], ids[IM_END]]}
    (out / "generation_config.json").write_bytes(_json_bytes(gen))
    log("writing seeded bf16 weights (model.safetensors)")
    params = write_safetensors(out / "model.safetensors", spec)
    return {"parameters": params, "special_token_ids": ids}


def _write_model(spec: TinyQwen2Spec, out: Path, log: Log) -> None:
    facts = _model_files(spec, out, log)
    files = {p.name: _sha256(p) for p in sorted(out.iterdir())}
    manifest = {
        "name": MODEL_NAME,
        "format_version": FORMAT_VERSION,
        "builder_sha256": builder_digest(),
        "architecture": "Qwen2ForCausalLM",
        "dtype": "bfloat16",
        "spec": asdict(spec),
        "kv_bytes_per_token": spec.kv_bytes_per_token,
        "kv_bytes_per_token_formula": (
            f"{spec.num_hidden_layers} layers x {spec.num_key_value_heads} KV heads x "
            f"{spec.head_dim} head_dim x 2 (K and V) x 2 bytes (bf16)"
        ),
        **facts,
        "files": files,
    }
    (out / MANIFEST).write_bytes(_json_bytes(manifest))


def _is_ours_or_empty(model_dir: Path) -> bool:
    return not any(model_dir.iterdir()) or (model_dir / MANIFEST).exists()


def build_model(
    model_dir: Path | str | None = None,
    *,
    force: bool = False,
    spec: TinyQwen2Spec = SPEC,
    log: Log | None = None,
) -> Path:
    """Build the model into ``model_dir`` (default: ``default_model_dir()``); returns it.

    A complete current build is left alone unless ``force``. The files are written to a
    sibling temporary directory and renamed into place, so a reader (or a concurrent
    build) never sees half a model. Refuses to replace a non-empty directory that is not
    a tracedpush model.
    """
    log = log or (lambda msg: None)
    model_dir = Path(model_dir or default_model_dir()).expanduser().absolute()
    if not force and is_complete(model_dir):
        log(f"{model_dir} already holds a complete {MODEL_NAME} build")
        return model_dir
    if model_dir.exists() and not (model_dir.is_dir() and _is_ours_or_empty(model_dir)):
        raise FileExistsError(f"{model_dir} exists and is not a tracedpush model; not replacing")
    model_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = model_dir.parent / f".{model_dir.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        _write_model(spec, tmp, log)
        if model_dir.exists():
            if not force and is_complete(model_dir):  # a concurrent build finished first
                return model_dir
            shutil.rmtree(model_dir)
        os.replace(tmp, model_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    log(f"wrote {model_dir} (KV cache: {spec.kv_bytes_per_token} bytes per token)")
    return model_dir


def ensure_model(model_dir: Path | str | None = None, log: Log | None = None) -> Path:
    """The model directory to serve, building the tiny model first if absent (for the launcher).

    A directory that holds some other model (a ``config.json`` but no ``tracedpush.json``)
    is returned untouched, so ``--model /path/to/any/model`` goes through this too.
    """
    path = Path(model_dir or default_model_dir()).expanduser().absolute()
    if (path / "config.json").exists() and not (path / MANIFEST).exists():
        return path
    return build_model(path, log=log)
