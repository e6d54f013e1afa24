#!/usr/bin/env python3
"""Write a tiny random-weight Llama GGUF (for llama.cpp's llama-server) under .cache/engines/models.

Run with a python that has ``gguf`` + ``numpy`` (the llama.cpp venv has both)::

    .cache/engines/llamacpp-venv/bin/python engines/scripts/make_tiny_gguf.py [--out FILE] [--force]

Same vocabulary and weights as make_tiny_hf_llama.py (see tiny_llama_spec.py), F32 tensors,
SentencePiece ("llama") tokenizer with byte fallback, ChatML chat template. Q/K are not permuted
to GGUF's rotary layout: the weights are random anyway. Deterministic and cached (a sidecar stamp
file records the spec version). Prints the GGUF path as its last line.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import tiny_llama_spec as spec

ROOT = Path(__file__).resolve().parents[2]
MODELS = ROOT / ".cache" / "engines" / "models"

# llama.cpp runs a 2-layer model of this width at ~4000 tok/s: far too fast to observe queueing or
# to kill a stream midway. Per-layer overhead dominates at this size, so depth is the speed knob.
DEFAULT_LAYERS = 64

# Hugging Face parameter name (per layer suffix) -> GGUF tensor name.
LAYER_MAP = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}
TOP_MAP = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}


def gguf_name(hf_name: str) -> str:
    """Map a Hugging Face Llama parameter name to its GGUF tensor name."""
    if hf_name in TOP_MAP:
        return TOP_MAP[hf_name]
    _, _, layer, rest = hf_name.split(".", 3)
    return f"blk.{layer}.{LAYER_MAP[rest]}"


def write_gguf(path: Path, n_layers: int) -> None:
    """Write the model with ``n_layers`` transformer blocks to ``path``."""
    import gguf

    pieces, scores, types = spec.vocab()
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("tiny-random-llama")
    w.add_context_length(spec.MAX_POSITIONS)
    w.add_embedding_length(spec.HIDDEN)
    w.add_block_count(n_layers)
    w.add_feed_forward_length(spec.INTERMEDIATE)
    w.add_head_count(spec.N_HEADS)
    w.add_head_count_kv(spec.N_KV_HEADS)
    w.add_layer_norm_rms_eps(spec.RMS_EPS)
    w.add_rope_dimension_count(spec.HEAD_DIM)
    w.add_rope_freq_base(spec.ROPE_THETA)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_tokenizer_model("llama")
    w.add_token_list(pieces)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(pieces.index(spec.BOS))
    w.add_eos_token_id(pieces.index(spec.EOS))
    w.add_unk_token_id(pieces.index(spec.UNK))
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    w.add_chat_template(spec.CHAT_TEMPLATE)
    for name, arr in spec.weights(n_layers).items():
        w.add_tensor(gguf_name(name), arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main() -> int:
    """Generate (or reuse) the GGUF file."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=DEFAULT_LAYERS, help="transformer blocks (speed knob)")
    ap.add_argument("--out", type=Path, help="default: .cache/engines/models/tiny-llama-L<layers>.gguf")
    ap.add_argument("--force", action="store_true", help="rebuild even if cached")
    args = ap.parse_args()
    out: Path = (args.out or MODELS / f"tiny-llama-L{args.layers}.gguf").resolve()
    stamp = out.with_name(out.name + ".spec")
    if not args.force and out.is_file() and stamp.is_file() and stamp.read_text().strip() == spec.SPEC_VERSION:
        print(out)
        return 0
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    write_gguf(tmp, args.layers)
    os.replace(tmp, out)
    stamp.write_text(spec.SPEC_VERSION + "\n")
    print(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
