"""Fixed-size KV-cache blocks: allocation, reference counts, prefix caching and copy-on-write.

The cache is one pool of `num_blocks` blocks of `block_size` token positions (kv_cache.PagedKVCache
holds the tensors; this module only does the bookkeeping). A sequence's `block_table` lists its
blocks in order; position p of the sequence lives in block `block_table[p // block_size]`.

Prefix caching: once a block is full and its keys/values are (being) computed, it is registered
under a key made of its tokens and the hash of the blocks before it, so the key names the whole
prefix. A later sequence whose prompt starts with the same tokens takes those blocks (reference
count + 1) instead of computing them again. A block nobody uses any more keeps its key and stays
reusable until a fresh block is needed and none is free: then the least recently released one is
evicted (its key dropped). A prompt position fed an embedding row instead of a token
(`Request.prompt_embeds`) is keyed by the row's content key, never by its placeholder id: same rows
share blocks, different rows do not. Only verified tokens (prompt + output) are ever registered,
never a step's proposed `spec_tokens`.

Blocks are shared by reference count: through the prefix cache, and through `fork` (a child
sequence starts with its parent's table, e.g. beams of a beam search). A sequence never writes into
a block others use, except the partially filled last block of a fork: `append_slots` then gives it a
private copy (copy-on-write) and queues the (source, destination) pair in `pending_copies`; the
model runner copies the keys/values before the next forward writes anything.

`rollback` gives back the slots of a sequence's last fed tokens (rejected proposals): the blocks
it no longer needs are released; it never reaches into a block registered in the prefix cache.

Sliding windows (`window`: the widest of the layers' windows when every layer has one, from the
worker): a query at position p reads keys at positions > p - window in every layer, so a block
whose positions all lie at or before `seq.num_computed - window` (the first position the sequence
will still feed, minus the window) is read by no later query. `slide` releases such blocks while
the sequence runs, so a decoding sequence holds at most ceil(window / block_size) + 1 blocks; its
table keeps its length (positions still map to entries) with `null_block` in their place: the
pool's zero block (kv_cache), which the worker's window masks hide. With one layer of full
attention (`window` None) nothing is released. Queries never go back: a rollback keeps at least
the position after the one the step started at, and a preempted sequence is recomputed from
position 0 with fresh blocks. A released block keeps its prefix-cache key (evictable, as after
`free`): a prefix hit always restores a whole chain of blocks from position 0, whose contents
depend only on their tokens; `allocate` takes only the hits inside the window of its first query.

Recurrent state (`state_slots`: a model with linear-attention layers, `step.Worker.state_slots`):
beside its blocks, a running sequence holds one slot of the worker's recurrent state, taken when it
is allocated (no free slot: it is not admitted, `can_allocate`) and given back with its blocks
(`free`: it finished, or it was preempted and will be recomputed from position 0, its state rebuilt).
A `fork` (a beam) takes a slot of its own and queues the copy of its parent's state into it
(`pending_state_copies`, applied by the worker in order before the next forward, like block
copies). Such a state cannot be restored from the prefix cache or rolled back: the worker's model
runs with the prefix cache off, and `rollback` of a proposal refuses it.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from tritonlm.engine.sequence import Sequence

# Key of a full block: (hash of the previous block's key, or for the first block `_root`: -1, or the
# request's LoRA adapter, whose keys and values differ; its tokens, with an embedding row's content
# key (bytes) in place of its placeholder id).
BlockKey = tuple[int, tuple[int | bytes, ...]]


@dataclass
class BlockStats:
    blocks_total: int
    blocks_used: int  # held by at least one sequence
    blocks_cached: int  # free, but holding a registered prefix (reusable until evicted)
    prefix_queries: int  # prompt tokens looked up in the prefix cache
    prefix_hits: int  # of which found cached


class BlockManager:
    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        enable_prefix_caching: bool = True,
        window: int | None = None,
        state_slots: int = 0,
    ):
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"need at least one block of at least one token, got {num_blocks}×{block_size}")
        if window is not None and window < 1:
            raise ValueError(f"a sliding window covers at least one position, got {window}")
        if state_slots and enable_prefix_caching:
            raise ValueError(
                "a prefix-cache hit cannot restore recurrent state: no prefix cache with state slots"
            )
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.window = window  # no query reads keys this far behind it in any layer (None: some do)
        self.null_block = num_blocks  # a table's entry for a released block: the pool's zero block
        self.ref_count = [0] * num_blocks
        self.block_key: list[BlockKey | None] = [None] * num_blocks
        self.cached: dict[BlockKey, int] = {}  # key -> block holding that prefix
        self.free_plain = list(range(num_blocks - 1, -1, -1))  # unused, no key; a stack (low ids first)
        self.evictable: OrderedDict[int, None] = OrderedDict()  # unused, with a key; oldest first
        self.pending_copies: list[tuple[int, int]] = []  # copy-on-write (src, dst) not yet applied
        self.state_slots = state_slots
        self.free_states = list(range(state_slots - 1, -1, -1))  # a stack (low ids first)
        self.pending_state_copies: list[tuple[int, int]] = []  # forks' (parent slot, child slot)
        self.prefix_queries = 0
        self.prefix_hits = 0

    # -- queries -------------------------------------------------------------------------------
    @property
    def num_free(self) -> int:
        """Blocks that can be handed out now (free ones plus cached ones nobody uses)."""
        return len(self.free_plain) + len(self.evictable)

    def stats(self) -> BlockStats:
        return BlockStats(
            blocks_total=self.num_blocks,
            blocks_used=self.num_blocks - self.num_free,
            blocks_cached=len(self.evictable),
            prefix_queries=self.prefix_queries,
            prefix_hits=self.prefix_hits,
        )

    def blocks_needed(self, seq: Sequence, num_new: int) -> int:
        """Fresh blocks `seq` needs to write `num_new` more tokens (copy-on-write included)."""
        total = -(-(seq.num_computed + num_new) // self.block_size)
        needed = max(total - len(seq.block_table), 0)
        if num_new and self._needs_copy(seq):
            needed += 1
        return needed

    def behind_window(self, position: int) -> int:
        """Leading blocks of a sequence that no query at `position` or later reads in any layer."""
        if self.window is None:
            return 0
        return max(position - self.window + 1, 0) // self.block_size

    def held(self, seq: Sequence) -> int:
        """Blocks `seq` holds (those released behind the window aside)."""
        return sum(1 for block in seq.block_table if block != self.null_block)

    def can_append(self, seq: Sequence, num_new: int) -> bool:
        return self.blocks_needed(seq, num_new) <= self.num_free

    def lookup(self, seq: Sequence) -> list[int]:
        """Blocks that already hold a prefix of `seq`'s tokens (no side effects). At least the last
        token is always left out, since its logits must be computed."""
        if not self.enable_prefix_caching or seq.needs_prompt_logits:
            return []
        hits = []
        parent = _root(seq)
        for i in range((seq.num_tokens - 1) // self.block_size):
            key = self._key(seq, i, parent)
            block = self.cached.get(key)
            if block is None:
                break
            hits.append(block)
            parent = hash(key)
        return hits

    def can_allocate(self, seq: Sequence, hits: list[int], num_new: int) -> bool:
        """Whether `seq` can take the cached blocks `hits` plus blocks for `num_new` tokens after them
        (and a recurrent-state slot, for a model with recurrent layers)."""
        if self.state_slots and not self.free_states:
            return False
        live = hits[self.behind_window(len(hits) * self.block_size) :]
        taken = sum(1 for b in live if self.ref_count[b] == 0)  # cached but unused: counted as free now
        total = -(-(len(hits) * self.block_size + num_new) // self.block_size)
        return taken + total - len(hits) <= self.num_free

    # -- changes -------------------------------------------------------------------------------
    def allocate(self, seq: Sequence, hits: list[int]) -> int:
        """Gives a sequence without blocks the cached blocks `hits` (from `lookup`); returns the
        number of tokens they hold, which become `seq.num_computed`. Hits behind the window of its
        first query are not taken (`null_block` in their place)."""
        assert not seq.block_table, "allocate is for a sequence without blocks"
        if self.state_slots:
            assert seq.state_slot is None, "a sequence holds one state slot"
            seq.state_slot = self.free_states.pop()
        dead = self.behind_window(len(hits) * self.block_size)
        for block in hits[dead:]:
            if self.ref_count[block] == 0:
                del self.evictable[block]
            self.ref_count[block] += 1
        seq.block_table = [self.null_block] * dead + hits[dead:]
        seq.num_computed = len(hits) * self.block_size
        if self.enable_prefix_caching and not seq.needs_prompt_logits:
            self.prefix_queries += seq.num_tokens
            self.prefix_hits += seq.num_computed
        return seq.num_computed

    def append_slots(self, seq: Sequence, num_new: int) -> None:
        """Makes room for `num_new` more tokens after `seq.num_computed`; the caller checked
        `can_append`."""
        if num_new and self._needs_copy(seq):
            index = seq.num_computed // self.block_size
            source = seq.block_table[index]
            copy = self._take_fresh()
            self.pending_copies.append((source, copy))
            self._release(source)
            seq.block_table[index] = copy
        total = -(-(seq.num_computed + num_new) // self.block_size)
        while len(seq.block_table) < total:
            seq.block_table.append(self._take_fresh())

    def cache_full_blocks(self, seq: Sequence, upto: int) -> None:
        """Registers `seq`'s full blocks within its first `upto` tokens in the prefix cache. Called
        when a step is scheduled: the step writes every token's keys/values before any attention
        reads them, so a sequence scheduled later in the same step may already reuse them. Blocks
        past its verified tokens (holding proposals) wait until those are accepted."""
        if not self.enable_prefix_caching:
            return
        upto = min(upto, seq.num_tokens)
        for i in range(len(seq.block_hashes), upto // self.block_size):
            key = self._key(seq, i, seq.block_hashes[i - 1] if i else _root(seq))
            seq.block_hashes.append(hash(key))
            block = seq.block_table[i]
            if block == self.null_block:  # a hit left behind the window: cached already
                continue
            if key not in self.cached and self.block_key[block] is None:
                self.cached[key] = block
                self.block_key[block] = key

    def free(self, seq: Sequence) -> None:
        """Releases all of `seq`'s blocks, last first (so a prefix outlives its continuations)."""
        for block in reversed(seq.block_table):
            if block != self.null_block:
                self._release(block)
        seq.block_table = []
        seq.num_computed = 0
        if seq.state_slot is not None:
            self.free_states.append(seq.state_slot)
            seq.state_slot = None

    def slide(self, seq: Sequence) -> None:
        """Releases `seq`'s blocks behind the window of its next query (`seq.num_computed`): their
        entries become `null_block`. Earlier steps wrote their positions, so those blocks are in the
        prefix cache already (when it is on), and stay there as evictable."""
        dead = min(self.behind_window(seq.num_computed), len(seq.block_table))
        table = seq.block_table
        i = dead - 1  # released blocks are a prefix of the table: stop at the first one
        while i >= 0 and table[i] != self.null_block:
            self._release(table[i])
            table[i] = self.null_block
            i -= 1

    def rollback(self, seq: Sequence, num_tokens: int) -> None:
        """Settles a step's proposals: drops the slots of `seq`'s last `num_tokens` fed tokens (the
        rejected ones; 0 when all were accepted), so `num_computed` goes back by that much and
        blocks no longer needed are released, and clears `seq.spec_tokens`. The accepted tokens
        must already be in `seq.output_ids`."""
        keep = seq.num_computed - num_tokens
        assert 0 <= num_tokens <= seq.num_computed, f"cannot roll {num_tokens} tokens back"
        assert not (num_tokens and self.state_slots), "a recurrent state cannot be rolled back"
        # Registered (or cache-hit) blocks are shared, read-only prefixes: positions after `keep`
        # will be written again, so none of them may lie in such a block.
        assert keep >= len(seq.block_hashes) * self.block_size, "rollback into a prefix-cached block"
        needed = -(-keep // self.block_size)
        while len(seq.block_table) > needed:
            self._release(seq.block_table.pop())
        seq.num_computed = keep
        seq.spec_tokens.clear()

    def fork(self, parent: Sequence, child: Sequence) -> None:
        """The child shares every block of the parent (reference counts + 1) and continues from the
        same point; a write into a shared, partially filled block copies it first."""
        assert not child.block_table, "fork into a sequence without blocks"
        if self.state_slots:
            assert parent.state_slot is not None and self.free_states, "a fork needs a free state slot"
            child.state_slot = self.free_states.pop()
            self.pending_state_copies.append((parent.state_slot, child.state_slot))
        for block in parent.block_table:
            if block != self.null_block:
                self.ref_count[block] += 1
        child.block_table = list(parent.block_table)
        child.num_computed = parent.num_computed
        child.block_hashes = list(parent.block_hashes)

    @property
    def can_fork(self) -> bool:
        """Whether a fork finds what it takes besides shared blocks (a free state slot, if any)."""
        return not self.state_slots or bool(self.free_states)

    def take_pending_state_copies(self) -> list[tuple[int, int]]:
        copies, self.pending_state_copies = self.pending_state_copies, []
        return copies

    def take_pending_copies(self) -> list[tuple[int, int]]:
        copies, self.pending_copies = self.pending_copies, []
        return copies

    def reset_prefix_cache(self) -> None:
        """Forgets every registered prefix (used after a failed step, whose blocks may be garbage).
        Blocks in use keep their contents; only their keys go."""
        for block in self.cached.values():
            self.block_key[block] = None
            if block in self.evictable:
                del self.evictable[block]
                self.free_plain.append(block)
        self.cached.clear()

    # -- internals -----------------------------------------------------------------------------
    def _key(self, seq: Sequence, i: int, parent: int) -> BlockKey:
        start = i * self.block_size
        tokens = seq.token_slice(start, start + self.block_size)
        embeds = seq.request.prompt_embeds
        if embeds is not None:  # rows are keyed by their content, not by their placeholder ids
            return (parent, tuple(embeds.cache_tokens(tokens, start)))
        return (parent, tuple(tokens))

    def _needs_copy(self, seq: Sequence) -> bool:
        """The block the next token goes into is partially filled and shared."""
        offset = seq.num_computed % self.block_size
        index = seq.num_computed // self.block_size
        return offset != 0 and index < len(seq.block_table) and self.ref_count[seq.block_table[index]] > 1

    def _take_fresh(self) -> int:
        if self.free_plain:
            block = self.free_plain.pop()
        else:
            block, _ = self.evictable.popitem(last=False)  # the least recently released prefix
            del self.cached[self.block_key[block]]
            self.block_key[block] = None
        self.ref_count[block] = 1
        return block

    def _release(self, block: int) -> None:
        self.ref_count[block] -= 1
        assert self.ref_count[block] >= 0, f"block {block} released more often than taken"
        if self.ref_count[block] == 0:
            if self.block_key[block] is not None:
                self.evictable[block] = None
            else:
                self.free_plain.append(block)


def _root(seq: Sequence) -> int:
    """The "previous block" of a sequence's first block: its LoRA adapter changes every key and value,
    so prompts with different adapters never share blocks."""
    lora = seq.request.lora
    return -1 if lora is None else hash(("lora", lora.uid))
