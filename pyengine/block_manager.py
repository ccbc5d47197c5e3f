"""The paged KV cache's bookkeeping: a block pool with reference counts and a prefix cache.

A request owns a block table (`Request.block_ids`); token at position p lives in slot
`block_ids[p // block_size] * block_size + p % block_size`. A full block whose tokens' K/V
are committed (computed, never a draft) is registered in the prefix cache under a hash
chain key (digest of the previous block's key, this block's tokens): the tokens compare
exactly, and the digest is SHA-256, not Python's hash(), whose collisions on int tuples can be
built on purpose (two prefixes would then share K/V). A freed block keeps its key
while it sits in the free queue, so a later request with the same prefix takes it back;
it is evicted (key dropped) only when the pool hands it out for new tokens. The free queue
is least-recently-freed first, and a request's blocks are freed tail first, so the shared
head of a prompt is the last to be evicted.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict
from typing import Iterator

from .request import Request


def block_digest(parent: bytes | None, tokens: tuple[int, ...]) -> bytes:
    """SHA-256 of the parent block's digest (none for the first block) and this block's token
    ids as int64: the link of the prefix cache's hash chain."""
    h = hashlib.sha256(parent if parent is not None else b"")
    h.update(array("q", tokens).tobytes())
    return h.digest()


class Block:
    __slots__ = ("block_id", "ref_cnt", "key")

    def __init__(self, block_id: int):
        self.block_id = block_id
        self.ref_cnt = 0
        self.key: tuple | None = None  # (parent hash, tokens) when registered in the prefix cache


class BlockManager:
    """Block pool, block tables and prefix cache (pure Python, no tensors).

    Parameters
    ----------
    num_blocks : int
        Number of KV blocks in the pool.
    block_size : int
        Tokens per block.
    enable_prefix_caching : bool
        Share full blocks of identical prefixes between requests.
    """

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True):
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {num_blocks}")
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.free_queue: OrderedDict[int, None] = OrderedDict((i, None) for i in range(num_blocks))
        self.cached: dict[tuple, int] = {}  # key -> block id
        self.num_prefix_queries = 0
        self.num_prefix_hits = 0  # in tokens

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_queue)

    @property
    def usage(self) -> float:
        return 1.0 - len(self.free_queue) / self.num_blocks

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    # ---- prefix cache -------------------------------------------------------------------

    def _block_keys(self, req: Request, start: int, stop: int) -> Iterator[tuple[int, tuple]]:
        """(i, key) of blocks start <= i < stop of req.all_token_ids, made as they are asked for:
        the hash chain is cached on req (req.block_hashes), so a key costs its own block's tokens,
        not the blocks before it (a long context's keys were rebuilt from block 0 at every fill)."""
        bs = self.block_size
        toks = req.all_token_ids
        start = min(start, len(req.block_hashes))   # every block before start has its digest
        parent = req.block_hashes[start - 1] if start > 0 else None
        for i in range(start, stop):
            key = (parent, tuple(toks[i * bs:(i + 1) * bs]))
            if i == len(req.block_hashes):
                req.block_hashes.append(block_digest(parent, key[1]))
            parent = req.block_hashes[i]
            yield i, key

    def get_computed_blocks(self, req: Request) -> tuple[list[int], int]:
        """Blocks of the longest cached prefix of req's tokens, and the number of tokens they hold.

        At most num_tokens - 1 tokens come from the cache: the last one must be computed to
        produce logits.
        """
        if not self.enable_prefix_caching:
            return [], 0
        num_full = (req.num_tokens - 1) // self.block_size
        hits = []
        for _, key in self._block_keys(req, 0, num_full):
            bid = self.cached.get(key)
            if bid is None:
                break
            hits.append(bid)
        return hits, len(hits) * self.block_size

    def prompt_blocks_filled(self, req: Request, num_computed: int, num_new: int) -> list[tuple]:
        """Prefix-cache keys of the blocks of req's prompt (or recompute) that a step computing
        num_new tokens from num_computed fills up (empty without prefix caching)."""
        if not self.enable_prefix_caching:
            return []
        bs = self.block_size
        stop = min(num_computed + num_new, req.num_tokens) // bs
        return [key for _, key in self._block_keys(req, num_computed // bs, stop)]

    def next_block_key(self, req: Request, num_hit_blocks: int) -> tuple | None:
        """The key of req's first block past its cached prefix (num_hit_blocks blocks), or None
        when that block would not be cached (past its last full block before the last token)."""
        if not self.enable_prefix_caching or num_hit_blocks >= (req.num_tokens - 1) // self.block_size:
            return None
        return next(key for _, key in self._block_keys(req, num_hit_blocks, num_hit_blocks + 1))

    def record_prefix_lookup(self, num_tokens: int, num_hit: int) -> None:
        """Count an admitted request's prefix lookup (num_tokens looked up, num_hit from the
        cache) in the hit-rate statistics: once per admission, not per attempt."""
        if self.enable_prefix_caching:
            self.num_prefix_queries += num_tokens
            self.num_prefix_hits += num_hit

    def cache_blocks(self, req: Request, num_committed_tokens: int) -> None:
        """Register req's full blocks among its first num_committed_tokens tokens."""
        if not self.enable_prefix_caching:
            return
        num_full = min(num_committed_tokens // self.block_size, len(req.block_ids))
        if num_full <= req.num_hashed_blocks:
            return
        for i, key in self._block_keys(req, req.num_hashed_blocks, num_full):
            if i < req.num_hashed_blocks:
                continue   # registered already (its digest was missing: made above, in order)
            block = self.blocks[req.block_ids[i]]
            if block.key is None and key not in self.cached:
                block.key = key
                self.cached[key] = block.block_id
            # else: the same content is already cached in another block; this one stays private
        req.num_hashed_blocks = num_full

    # ---- allocation ---------------------------------------------------------------------

    def allocate_slots(self, req: Request, num_new_tokens: int, computed_blocks: list[int] = (),
                       num_lookahead_tokens: int = 0) -> bool:
        """Give req blocks for num_new_tokens more tokens (plus lookahead slots for drafts).

        computed_blocks are prefix-cache hits for a request that holds no blocks yet. Returns
        False, changing nothing, when the pool is short.
        """
        if computed_blocks and req.block_ids:
            raise ValueError("computed_blocks are only for a request that holds no blocks yet")
        num_computed = len(computed_blocks) * self.block_size if computed_blocks else req.num_computed_tokens
        total = self.blocks_needed(num_computed + num_new_tokens + num_lookahead_tokens)
        num_new_blocks = total - len(req.block_ids) - len(computed_blocks)
        num_revived = sum(1 for b in computed_blocks if self.blocks[b].ref_cnt == 0)
        if num_new_blocks + num_revived > len(self.free_queue):
            return False
        for bid in computed_blocks:
            block = self.blocks[bid]
            if block.ref_cnt == 0:
                del self.free_queue[bid]
            block.ref_cnt += 1
        if computed_blocks:
            req.block_ids.extend(computed_blocks)
            req.num_hashed_blocks = len(computed_blocks)
        for _ in range(num_new_blocks):
            bid, _ = self.free_queue.popitem(last=False)
            block = self.blocks[bid]
            if block.key is not None:  # evict from the prefix cache
                del self.cached[block.key]
                block.key = None
            block.ref_cnt = 1
            req.block_ids.append(bid)
        return True

    def free(self, req: Request) -> None:
        """Drop req's references; blocks with no reference left go to the free queue, tail first."""
        for bid in reversed(req.block_ids):
            block = self.blocks[bid]
            block.ref_cnt -= 1
            if block.ref_cnt < 0:
                raise RuntimeError(f"block {bid} freed twice")
            if block.ref_cnt == 0:
                self.free_queue[bid] = None
        req.block_ids = []
        req.num_hashed_blocks = 0

    def reset_prefix_cache(self) -> None:
        for block in self.blocks:
            block.key = None
        self.cached.clear()

    def check(self, live: list[Request]) -> None:
        """Assert the pool's invariants given the requests that hold blocks (for tests)."""
        refs = [0] * self.num_blocks
        for req in live:
            for bid in req.block_ids:
                refs[bid] += 1
        for block in self.blocks:
            assert block.ref_cnt == refs[block.block_id], (block.block_id, block.ref_cnt, refs[block.block_id])
            assert (block.ref_cnt == 0) == (block.block_id in self.free_queue), block.block_id
            if block.key is not None:
                assert self.cached[block.key] == block.block_id
        assert len(self.cached) == sum(b.key is not None for b in self.blocks)
