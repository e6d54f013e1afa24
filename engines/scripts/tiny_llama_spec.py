"""Shared, numpy-only recipe for the tiny random-weight Llama used by the engine tests.

Both generators (``make_tiny_hf_llama.py`` for vLLM, ``make_tiny_gguf.py`` for llama.cpp) build
the same vocabulary and the same weights from here, so the two engines serve "the same" model.

Design notes:

* Vocabulary: SentencePiece-style pieces (``▁`` marks a word start) with byte-fallback tokens
  ``<0x00>``..``<0xFF>``; every non-special, non-byte piece is printable ASCII, so any sampled
  token decodes to valid UTF-8 text on its own.
* Weights: random (seeded), except that residual dimension 0 carries a constant ``+1`` from the
  embeddings (and no layer writes to it), and the LM head gives "bad" tokens (control tokens
  such as EOS, byte tokens) a large negative weight on that dimension. Their logits are then
  ~ -30 below the others: the model never samples EOS or a partial UTF-8 byte, so every request
  runs to ``max_tokens`` and every streamed chunk carries text.
* head_dim is 64: vLLM's CPU attention backend crashes with head_dim 16.
"""

from __future__ import annotations

import numpy as np

SPEC_VERSION = "4"
SEED = 1234

HIDDEN = 128
N_HEADS = 2
N_KV_HEADS = 2
HEAD_DIM = HIDDEN // N_HEADS  # 64
N_LAYERS = 2
INTERMEDIATE = 256
MAX_POSITIONS = 4096
RMS_EPS = 1e-5
ROPE_THETA = 10000.0

# GGUF / SentencePiece token types.
TT_NORMAL, TT_UNKNOWN, TT_CONTROL, TT_USER_DEFINED, TT_UNUSED, TT_BYTE = 1, 2, 3, 4, 5, 6

UNK, BOS, EOS = "<unk>", "<s>", "</s>"
IM_START, IM_END = "<|im_start|>", "<|im_end|>"
SPECIALS = [UNK, BOS, EOS, IM_START, IM_END]

# ChatML: recognised by llama.cpp's built-in template detection and rendered by HF/vLLM via jinja.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

WORDS = """
the of and to a in is it you that he was for on are with as I his they be at one have this from or
had by hot word but what some we can out other were all there when up use your how said an each she
which do their time if will way about many then them write would like so these her long make thing
see him two has look more day could go come did number sound no most people my over know water than
call first who may down side been now find any new work part take get place made live where after
back little only round man year came show every good me give our under name very through just form
sentence great think say help low line differ turn cause much mean before move right boy old too
same tell does set three want air well also play small end put home read hand port large spell add
even land here must big high such follow act why ask men change went light kind off need house
picture try us again animal point mother world near build self earth father hello token stream model
request queue server engine batch slot fair
""".split()  # noqa: SIM905

PUNCT = list(".,!?;:'\"()-")


def vocab() -> tuple[list[str], list[float], list[int]]:
    """Return (pieces, scores, token_types) of the tiny SentencePiece-style vocabulary."""
    pieces: list[str] = []
    scores: list[float] = []
    types: list[int] = []

    def add(piece: str, score: float, ttype: int) -> None:
        if piece in pieces:
            return
        pieces.append(piece)
        scores.append(score)
        types.append(ttype)

    for s in SPECIALS:
        add(s, 0.0, TT_UNKNOWN if s == UNK else TT_CONTROL)
    for b in range(256):
        add(f"<0x{b:02X}>", 0.0, TT_BYTE)
    add("▁", -3.0, TT_NORMAL)
    for i, w in enumerate(WORDS):
        add("▁" + w, -1.0 - 0.001 * i, TT_NORMAL)
    for c in [chr(c) for c in range(33, 127)]:
        add(c, -6.0, TT_NORMAL)
    for p in PUNCT:
        add("▁" + p, -5.0, TT_NORMAL)
    return pieces, scores, types


def bad_token_ids() -> list[int]:
    """Token ids the model must never sample (control, unknown and byte tokens)."""
    _, _, types = vocab()
    return [i for i, t in enumerate(types) if t != TT_NORMAL]


def weights(n_layers: int = N_LAYERS) -> dict[str, np.ndarray]:
    """Seeded float32 weights, keyed by Hugging Face Llama parameter names, shaped (out, in)."""
    rng = np.random.default_rng(SEED)
    pieces, _, _ = vocab()
    n_vocab = len(pieces)

    def rnd(*shape: int, std: float = 0.02) -> np.ndarray:
        return (rng.standard_normal(shape) * std).astype(np.float32)

    # Pre-norm layers each add roughly the same variance to the residual stream whatever its size:
    # scale the output projections so a deep model (llama.cpp's speed knob) keeps the residual, and
    # so the bad-token margin, of the 2-layer model. n_layers == N_LAYERS gives std 0.02.
    out_std = 0.02 * float(np.sqrt(N_LAYERS / n_layers))
    w: dict[str, np.ndarray] = {}
    emb = rnd(n_vocab, HIDDEN, std=0.05)
    emb[:, 0] = 1.0  # constant residual component used to suppress bad tokens in the LM head
    w["model.embed_tokens.weight"] = emb
    for layer in range(n_layers):
        p = f"model.layers.{layer}."
        w[p + "input_layernorm.weight"] = np.ones(HIDDEN, dtype=np.float32)
        w[p + "post_attention_layernorm.weight"] = np.ones(HIDDEN, dtype=np.float32)
        w[p + "self_attn.q_proj.weight"] = rnd(N_HEADS * HEAD_DIM, HIDDEN, std=0.1)
        w[p + "self_attn.k_proj.weight"] = rnd(N_KV_HEADS * HEAD_DIM, HIDDEN, std=0.1)
        w[p + "self_attn.v_proj.weight"] = rnd(N_KV_HEADS * HEAD_DIM, HIDDEN, std=0.1)
        o = rnd(HIDDEN, N_HEADS * HEAD_DIM, std=out_std)
        o[0, :] = 0.0  # never write to residual dim 0
        w[p + "self_attn.o_proj.weight"] = o
        w[p + "mlp.gate_proj.weight"] = rnd(INTERMEDIATE, HIDDEN, std=0.1)
        w[p + "mlp.up_proj.weight"] = rnd(INTERMEDIATE, HIDDEN, std=0.1)
        down = rnd(HIDDEN, INTERMEDIATE, std=out_std)
        down[0, :] = 0.0
        w[p + "mlp.down_proj.weight"] = down
    w["model.norm.weight"] = np.ones(HIDDEN, dtype=np.float32)
    head = rnd(n_vocab, HIDDEN, std=0.3)
    head[:, 0] = 0.0
    head[bad_token_ids(), 0] = -3.0
    w["lm_head.weight"] = head
    return w
