#!/usr/bin/env python3
"""Write a tiny random-weight Llama in Hugging Face format (for vLLM) under .cache/engines/models.

Run with the vLLM venv's python (needs numpy, safetensors, tokenizers, transformers)::

    .cache/engines/vllm-venv/bin/python engines/scripts/make_tiny_hf_llama.py [--out DIR] [--force]

Deterministic (seeded, see tiny_llama_spec.py). Cached: if DIR already holds a model built from the
same spec version, nothing is rewritten. Prints the model directory as its last line.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import tiny_llama_spec as spec

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_OUT = ROOT / ".cache" / "engines" / "models" / "tiny-llama-hf"
STAMP = ".tiny-llama-spec"


def build_tokenizer(out: Path) -> None:
    """Save a SentencePiece-like (Unigram + byte fallback) fast tokenizer with a chat template."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    pieces, scores, _ = spec.vocab()
    unigram = models.Unigram(list(zip(pieces, scores, strict=True)), unk_id=0, byte_fallback=True)
    tok = Tokenizer(unigram)
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=False)
    tok.decoder = decoders.Sequence(
        [
            decoders.Replace("▁", " "),
            decoders.ByteFallback(),
            decoders.Fuse(),
            decoders.Strip(" ", 1, 0),
        ]
    )
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in spec.SPECIALS])
    bos_id = pieces.index(spec.BOS)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{spec.BOS} $A", pair=f"{spec.BOS} $A {spec.BOS} $B", special_tokens=[(spec.BOS, bos_id)]
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=spec.BOS,
        eos_token=spec.EOS,
        unk_token=spec.UNK,
        pad_token=spec.UNK,
        additional_special_tokens=[spec.IM_START, spec.IM_END],
        add_bos_token=True,
        clean_up_tokenization_spaces=False,
        model_max_length=spec.MAX_POSITIONS,
    )
    fast.chat_template = spec.CHAT_TEMPLATE
    fast.save_pretrained(str(out))
    # transformers 5 writes the template to chat_template.jinja; older readers (and humans) look in
    # tokenizer_config.json, so put it there too, with a class name every version knows.
    cfg_path = out / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg.update(chat_template=spec.CHAT_TEMPLATE, tokenizer_class="PreTrainedTokenizerFast", add_bos_token=True)
    cfg_path.write_text(json.dumps(cfg, indent=2, ensure_ascii=False) + "\n")
    if len(fast) != len(pieces):
        raise SystemExit(f"tokenizer size {len(fast)} != vocab size {len(pieces)}")


def build_config(n_vocab: int) -> dict[str, object]:
    """Return the Hugging Face LlamaConfig dict."""
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": n_vocab,
        "hidden_size": spec.HIDDEN,
        "intermediate_size": spec.INTERMEDIATE,
        "num_hidden_layers": spec.N_LAYERS,
        "num_attention_heads": spec.N_HEADS,
        "num_key_value_heads": spec.N_KV_HEADS,
        "head_dim": spec.HEAD_DIM,
        "hidden_act": "silu",
        "max_position_embeddings": spec.MAX_POSITIONS,
        "rms_norm_eps": spec.RMS_EPS,
        "rope_theta": spec.ROPE_THETA,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "mlp_bias": False,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "pad_token_id": 0,
        "torch_dtype": "float32",
    }


def main() -> int:
    """Generate (or reuse) the model directory."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--force", action="store_true", help="rebuild even if cached")
    args = ap.parse_args()
    out: Path = args.out.resolve()

    stamp = out / STAMP
    if not args.force and stamp.is_file() and stamp.read_text().strip() == spec.SPEC_VERSION:
        print(out)
        return 0

    from safetensors.numpy import save_file

    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    pieces, _, _ = spec.vocab()
    build_tokenizer(tmp)
    (tmp / "config.json").write_text(json.dumps(build_config(len(pieces)), indent=2) + "\n")
    gen = {"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0}
    (tmp / "generation_config.json").write_text(json.dumps(gen, indent=2) + "\n")
    save_file(spec.weights(), str(tmp / "model.safetensors"), metadata={"format": "pt"})
    (tmp / STAMP).write_text(spec.SPEC_VERSION + "\n")
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    print(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
