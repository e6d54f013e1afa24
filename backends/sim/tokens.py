"""Deterministic stand-ins for a tokenizer, a chat template and a sampler.

No model runs here: only the lengths and the determinism matter. The rules are simple on purpose so that
tests and benchmarks can predict them:

- prompt tokens = ceil(characters / 4), at least 1 (roughly what BPE tokenizers give for English);
- a chat conversation is rendered as `<|role|>\\ncontent\\n` per message plus `<|assistant|>\\n`, then
  counted like a prompt;
- each generated token is one word with a leading space, drawn from a small vocabulary by a
  `random.Random` seeded from (request seed, prompt), or (config seed, prompt) when the request has none,
  so the same request always gets the same answer.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

_WORDS = (
    "the of and to in is that it for was on are as with be at by this had not but from or have an they "
    "which one you were all we her she there would their will when who him been has more if no out do so "
    "can what up said about other into than its time only could new them man some these then two first "
    "may any like now my such make over our even most me state after also made many did must before "
    "back see through way where get much go well your know should down work year because come people"
)
_VOCABULARY: tuple[str, ...] = tuple(_WORDS.split())

EOS_TOKEN_ID = 2
EOS_TEXT = "</s>"
_FIRST_WORD_ID = 1000


@dataclass(frozen=True, slots=True)
class Token:
    """One generated token as engines report it."""

    id: int
    text: str
    logprob: float
    special: bool = False


def count_tokens(text: str) -> int:
    """Prompt length in tokens: ceil(len(text) / 4), at least 1."""
    return max(1, math.ceil(len(text) / 4))


def render_chat(messages: Iterable[tuple[str, str]]) -> str:
    """Render (role, content) pairs to the one prompt string the engine sees."""
    parts = [f"<|{role}|>\n{content}\n" for role, content in messages]
    parts.append("<|assistant|>\n")
    return "".join(parts)


class TokenSampler:
    """Draws a request's tokens; the same seed and prompt give the same sequence."""

    def __init__(self, prompt: str, *, request_seed: int | None, config_seed: int) -> None:
        key = f"request:{request_seed}" if request_seed is not None else f"config:{config_seed}"
        # A str seed is hashed with SHA-512 by `random`, so this is stable across processes.
        self._rng = random.Random(f"{key}\x00{prompt}")

    def next_token(self, eos_probability: float) -> Token:
        """The next token; EOS with probability `eos_probability` (pass 0.0 for ignore_eos)."""
        if eos_probability > 0.0 and self._rng.random() < eos_probability:
            return Token(id=EOS_TOKEN_ID, text=EOS_TEXT, logprob=self._logprob(), special=True)
        index = self._rng.randrange(len(_VOCABULARY))
        return Token(id=_FIRST_WORD_ID + index, text=" " + _VOCABULARY[index], logprob=self._logprob())

    def _logprob(self) -> float:
        return -round(self._rng.random() * 2.5, 4)


def find_stop(text: str, new_from: int, stops: Sequence[str]) -> tuple[int, str] | None:
    """The earliest stop string that ends after offset `new_from` of `text`: (start offset, string).

    Only matches overlapping the newly added text are looked for, since older text was already checked.
    """
    best: tuple[int, str] | None = None
    for stop in stops:
        if not stop:
            continue
        at = text.find(stop, max(0, new_from - len(stop) + 1))
        if at >= 0 and (best is None or at < best[0]):
            best = (at, stop)
    return best


class StopBufferedText:
    """Turns token texts into stream deltas that never show part of a stop string.

    vLLM holds back the last `len(longest stop) - 1` characters while streaming, because they might be
    the start of a stop string that the final text must not contain.
    """

    def __init__(self, stops: Sequence[str]) -> None:
        self._hold = max((len(s) for s in stops), default=1) - 1
        self._text = ""
        self._sent = 0

    def push(self, piece: str) -> str:
        """Add a token's text; return what may be sent now."""
        self._text += piece
        upto = max(self._sent, len(self._text) - self._hold)
        delta = self._text[self._sent : upto]
        self._sent = upto
        return delta

    def finish(self, piece: str, cut_at: int | None) -> str:
        """Add the last token's text; return all that is left, cut before `cut_at` (a stop string's start)."""
        self._text += piece
        end = len(self._text) if cut_at is None else cut_at
        delta = self._text[self._sent : end] if end > self._sent else ""
        self._sent = max(self._sent, end)
        return delta
