"""The simulated engine's prefix cache: which prompt blocks it can skip prefilling, counted as vLLM does.

vLLM hashes each full block of a prompt's tokens together with the hash of the block before it, so a block
matches only when its whole prefix matches too, and keeps computed blocks until they are evicted least
recently used first. This does the same over the simulator's deterministic tokenizer (4 characters a token,
`tokens.count_tokens`): a block is `block_tokens` tokens, i.e. `4 * block_tokens` characters of the prompt
the engine sees (a chat is rendered first). As in vLLM:

- only full blocks are cached, and a hit is at most `prompt tokens - 1` (the last token is always
  computed, so the request has logits to sample from);
- `queries` counts a prompt's tokens and `hits` its tokens found cached, each time a request is admitted
  (a readmission after preemption asks again);
- eviction frees a chain's tail before its head (blocks are touched tail first), so a cached block's
  prefix stays cached as long as it does.

Unlike vLLM the cache has its own capacity (`prefix_cache_blocks`), apart from the KV blocks the running
requests hold; 0 turns it off.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict

CHARS_PER_TOKEN = 4  # the simulator's tokenizer (`tokens.count_tokens`)


def block_hashes(prompt: str, prompt_tokens: int, block_tokens: int) -> list[bytes]:
    """The chained hashes of the prompt's cacheable full blocks (at most `prompt_tokens - 1` tokens)."""
    block_chars = block_tokens * CHARS_PER_TOKEN
    full = min(len(prompt) // block_chars, max(0, prompt_tokens - 1) // block_tokens)
    hashes: list[bytes] = []
    parent = b""
    for i in range(full):
        digest = hashlib.blake2b(parent, digest_size=16)
        digest.update(prompt[i * block_chars : (i + 1) * block_chars].encode())
        parent = digest.digest()
        hashes.append(parent)
    return hashes


class PrefixCache:
    """An LRU set of block hashes with vLLM's query and hit counts (in tokens)."""

    def __init__(self, capacity_blocks: int, block_tokens: int = 16) -> None:
        self.capacity_blocks = capacity_blocks
        self.block_tokens = block_tokens
        self._blocks: OrderedDict[bytes, None] = OrderedDict()  # least recently used first
        self.queries = 0
        self.hits = 0

    @property
    def enabled(self) -> bool:
        return self.capacity_blocks > 0

    def __len__(self) -> int:
        return len(self._blocks)

    def lookup(self, prompt: str, prompt_tokens: int) -> int:
        """Tokens of the prompt's prefix found cached (0 when off); counts the query and the hit."""
        if not self.enabled:
            return 0
        matched = []
        for block in block_hashes(prompt, prompt_tokens, self.block_tokens):
            if block not in self._blocks:
                break
            matched.append(block)
        self._touch(matched)
        hit = len(matched) * self.block_tokens
        self.queries += prompt_tokens
        self.hits += hit
        return hit

    def insert(self, prompt: str, prompt_tokens: int) -> None:
        """The prompt was prefilled: its full blocks are cached now (evicting the least recently used)."""
        if not self.enabled:
            return
        self._touch(block_hashes(prompt, prompt_tokens, self.block_tokens))
        while len(self._blocks) > self.capacity_blocks:
            self._blocks.popitem(last=False)

    def _touch(self, chain: list[bytes]) -> None:
        """Mark the chain used, tail first, so its head is the most recent and is evicted last."""
        for block in reversed(chain):
            self._blocks[block] = None
            self._blocks.move_to_end(block)
