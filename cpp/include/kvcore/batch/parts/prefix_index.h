// PrefixIndex: the prefix keys of each sequence and the lookup of a prompt's
// blocks. A sequence's key chain names each full block by its token ids and
// the key before it (BlockKey::chain), starting from its prefix namespace's
// root (BlockKey::root: blocks of different namespaces never match); committed tokens extend it, and each
// block it fills is keyed in every group that holds it (the pools find blocks
// by key). A sequence stops keying when its rows no longer follow from its
// token ids alone (tokens not given, a removed head or hole) and, after a
// rewind or a fork, picks its chain up again where a block boundary's key is
// still known. adopt_prefix() finds the longest run of a prompt's keys every
// group can serve.
#pragma once

#include <cstdint>
#include <cstring>
#include <memory>
#include <new>
#include <utility>

#include "kvcore/batch/block_pool.h"
#include "kvcore/batch/parts/block_group.h"
#include "kvcore/core/buffer.h"
#include "kvcore/core/result.h"

namespace kvcore {

class PrefixIndex {
 public:
  /// Tables for `max_seqs` sequences, blocks of `block_size` tokens, prompts
  /// of up to `stride` blocks and `n_groups` block groups.
  /// MemoryAllocationFailed: nothing is assigned.
  Status create(int max_seqs, int block_size, int stride, int n_groups) noexcept {
    auto chains = internal::Buffer<Chain>::make(max_seqs);
    auto partial = internal::Buffer<std::int32_t>::make(static_cast<std::int64_t>(max_seqs) * block_size);
    auto prompt = internal::Buffer<BlockKey>::make(stride);
    auto keyed_tokens = internal::Buffer<std::int32_t>::make(static_cast<std::int64_t>(stride) * block_size);
    auto held_from = internal::Buffer<int>::make(n_groups > 0 ? n_groups : 1);
    auto sinks_held = internal::Buffer<int>::make(n_groups > 0 ? n_groups : 1);
    KVCORE_CHECK_OR_RETURN_ERROR(chains && partial && prompt && keyed_tokens && held_from && sinks_held,
                                 MemoryAllocationFailed, "cannot allocate the sequence tables of %d sequences",
                                 max_seqs);
    chains_ = std::move(chains);
    partial_ = std::move(partial);
    prompt_ = std::move(prompt);
    keyed_tokens_ = std::move(keyed_tokens);
    prompt_blocks_ = 0;
    held_from_ = std::move(held_from);
    sinks_held_ = std::move(sinks_held);
    block_size_ = block_size;
    return Error::Ok;
  }

  /// `seq` keys from scratch in the default namespace (0): no block, no token.
  void reset(int seq) noexcept { chains_[seq] = Chain{}; }
  /// `seq`, holding no position, keys in prefix namespace `ns` from now on.
  void set_namespace(int seq, std::uint64_t ns) noexcept {
    Chain& c = chains_[seq];
    c.ns = ns;
    if (c.hashed_blocks == 0) c.chain = BlockKey::root(ns);
  }
  /// The prefix namespace `seq` keys in.
  std::uint64_t namespace_of(int seq) const noexcept { return chains_[seq].ns; }
  /// `seq`'s rows no longer follow from its token ids: it keys nothing more.
  void stop(int seq) noexcept { chains_[seq].hashing = false; }

  /// Folds a committed step's tokens (T of them; none when !given) into the
  /// sequence's keys; each block they fill is keyed in every group holding it,
  /// or traded for the copy of its content a group already keeps
  /// (BlockPool::name_or_share).
  void hash_tokens(int seq, const std::int32_t* tokens, int T, bool given, BlockGroup* groups,
                   int n_groups) noexcept {
    Chain& c = chains_[seq];
    if (!c.hashing) return;
    if (!given) {
      c.hashing = false;
      return;
    }
    std::int32_t* partial = partial_of(seq);
    int j = 0;
    if (c.partial > 0) {  // the block being filled first
      while (j < T && c.partial < block_size_) partial[c.partial++] = tokens[j++];
      if (c.partial < block_size_) return;
      BlockKey key = BlockKey::chain(c.chain, partial, block_size_);
      name_blocks(seq, &key, 1, groups, n_groups);
      c.partial = 0;
    }
    // Then whole blocks straight from `tokens`, a batch at a time: keyed, then
    // named together (their key table slots and records loaded at once).
    BlockKey keys[kMaxLookAhead];
    const int ahead = look_ahead(block_size_);
    while (T - j >= block_size_) {
      int k = 0;
      for (BlockKey chain = c.chain; k < ahead && T - j >= block_size_; ++k, j += block_size_)
        keys[k] = chain = BlockKey::chain(chain, tokens + j, block_size_);
      name_blocks(seq, keys, k, groups, n_groups);
    }
    for (; j < T; ++j) partial[c.partial++] = tokens[j];
  }

  /// hash_tokens, with the usual case inline: tokens that do not fill the
  /// block being filled only wait in it.
  void append_tokens(int seq, const std::int32_t* tokens, int T, bool given, BlockGroup* groups,
                     int n_groups) noexcept {
    Chain& c = chains_[seq];
    if (!c.hashing) return;
    if (given && c.partial + T < block_size_) {
      std::int32_t* partial = partial_of(seq) + c.partial;
      for (int j = 0; j < T; ++j) partial[j] = tokens[j];
      c.partial += T;
      return;
    }
    hash_tokens(seq, tokens, T, given, groups, n_groups);
  }

  /// After `seq`'s length went down to n: the keys of what is left, when known.
  void rewind(int seq, int n, const BlockGroup* groups, int n_groups) noexcept {
    Chain& c = chains_[seq];
    if (!c.hashing) return;
    if (n >= c.hashed_blocks * block_size_) {
      c.partial = n - c.hashed_blocks * block_size_;
      return;
    }
    c.hashing = restore(seq, seq, n, groups, n_groups);
  }

  /// dst, forked from src's positions [0, upto), keys on from src's keys;
  /// `src_whole`: src removed nothing (else its rows depend on more than tokens).
  void inherit(int src, int dst, int upto, bool src_whole, const BlockGroup* groups, int n_groups) noexcept {
    const Chain& s = chains_[src];
    Chain& d = chains_[dst];
    d.ns = s.ns;  // a fork keys in its source's namespace
    d.chain = BlockKey::root(d.ns);
    d.hashing = upto == 0 || (s.hashing && src_whole);  // length 0 always names
    if (!d.hashing) return;
    if (upto >= s.hashed_blocks * block_size_) {
      d.chain = s.chain;
      d.hashed_blocks = s.hashed_blocks;
      d.partial = upto - s.hashed_blocks * block_size_;
      const std::int32_t* from = partial_of(src);
      std::int32_t* to = partial_of(dst);
      for (int j = 0; j < d.partial; ++j) to[j] = from[j];
      return;
    }
    d.hashing = restore(src, dst, upto, groups, n_groups);
  }

  /// The longest hit of tokens[0, n) in prefix namespace `ns` every group can
  /// serve and accept(key of its last block) allows (a State group's named
  /// snapshot), in full blocks (the last token is always computed, so at most
  /// (n - 1) / B); its keys are prompt_keys() until the next call. Reads the
  /// groups only (no block is held, no LRU order moves), whatever the groups'
  /// order: a group that needs every block bounds the hit by its first miss,
  /// then the windowed groups are asked from that bound down, each looking a
  /// block up at most once, so a hit their windows serve costs a window's
  /// lookups per group, not the whole prompt's.
  template <class Accept>
  int longest_hit(std::uint64_t ns, const std::int32_t* tokens, int n, const BlockGroup* groups, int n_groups,
                  Accept accept) const noexcept {
    const int candidates = n > 0 ? (n - 1) / block_size_ : 0;
    const int known = known_keys(ns, tokens, candidates);
    int hit = candidates;
    // A batch of blocks at a time: key them, then the two stages of their
    // lookups' prefetches, then the lookups (a large pool's key table and
    // records are far larger than any cache; one block after another, each
    // lookup would wait for two misses in turn).
    const int ahead = look_ahead(block_size_);
    for (int first = 0; first < candidates && hit == candidates; first += ahead) {
      const int end = candidates - first > ahead ? first + ahead : candidates;
      key_blocks(ns, tokens, first > known ? first : known, end);
      for (int i = first; i < end; ++i)
        for (int g = 0; g < n_groups; ++g)
          if (groups[g].needs_every_block()) groups[g].pool().prefetch_find(prompt_[i]);
      for (int i = first; i < end; ++i)
        for (int g = 0; g < n_groups; ++g)
          if (groups[g].needs_every_block()) groups[g].pool().prefetch_found(prompt_[i]);
      for (int i = first; i < end; ++i) {
        if (!every_group_needing_all_holds(prompt_[i], groups, n_groups)) {
          hit = i;  // no hit reaches past a block such a group lacks
          break;
        }
      }
    }
    for (int g = 0; g < n_groups; ++g) {
      held_from_[g] = hit;  // nothing seen held yet
      sinks_held_[g] = 0;
    }
    while (hit > 0) {
      int lacking = -1;
      for (int g = 0; g < n_groups && lacking < 0; ++g)
        if (!groups[g].needs_every_block()) lacking = lacking_block(groups[g], g, hit);
      if (lacking >= 0) {
        hit = lacking;  // every longer hit needs that block too: its window only moves up
        continue;
      }
      if (accept(prompt_[hit - 1])) break;
      --hit;
    }
    return hit;
  }
  int longest_hit(std::uint64_t ns, const std::int32_t* tokens, int n, const BlockGroup* groups,
                  int n_groups) const noexcept {
    return longest_hit(ns, tokens, n, groups, n_groups, [](const BlockKey&) { return true; });
  }

  /// The key of `seq`'s last block when its length ends exactly on a block
  /// it keyed (so the state after length - 1 follows from the keyed tokens).
  bool boundary_key(int seq, int length, BlockKey* out) const noexcept {
    const Chain& c = chains_[seq];
    if (!c.hashing || c.partial != 0 || c.hashed_blocks == 0 ||
        static_cast<std::int64_t>(c.hashed_blocks) * block_size_ != length)
      return false;
    *out = c.chain;
    return true;
  }
  const BlockKey* prompt_keys() const noexcept { return prompt_.get(); }

  /// `seq` (reset) starts with the tokens of positions [0, n) (an imported
  /// sequence) in prefix namespace `ns`: its chain is theirs, and each full
  /// block i of group g that named(g, i) allows (every row of it holds its
  /// position) is keyed.
  template <class Named>
  void imported(int seq, std::uint64_t ns, const std::int32_t* tokens, int n, BlockGroup* groups, int n_groups,
                Named named) noexcept {
    Chain& c = chains_[seq];
    c = Chain{};
    c.ns = ns;
    c.chain = BlockKey::root(ns);
    const int full = n / block_size_;
    for (int i = 0; i < full; ++i) {
      c.chain = BlockKey::chain(c.chain, tokens + static_cast<std::ptrdiff_t>(i) * block_size_, block_size_);
      for (int g = 0; g < n_groups; ++g) {
        const int b = groups[g].block_at(seq, i);
        if (b >= 0 && named(g, i)) groups[g].pool().set_key(b, c.chain, ns, i);
      }
    }
    c.hashed_blocks = full;
    c.partial = n - full * block_size_;
    std::int32_t* partial = partial_of(seq);
    for (int j = 0; j < c.partial; ++j) partial[j] = tokens[full * block_size_ + j];
  }

  /// `seq` adopted a hit of `blocks` blocks of the last longest_hit(): its
  /// chain goes on from there.
  void adopted(int seq, int blocks) noexcept {
    Chain& c = chains_[seq];
    const std::uint64_t ns = c.ns;
    c = Chain{};
    c.ns = ns;
    c.hashed_blocks = blocks;
    c.chain = blocks > 0 ? prompt_[blocks - 1] : BlockKey::root(ns);
  }

 private:
  // Prefix keys of one sequence: the first hashed_blocks blocks have known keys
  // (the last is `chain`), then `partial` tokens of the current block wait in
  // partial_of(seq). `ns`: the prefix namespace its chain starts from.
  struct Chain {
    std::uint64_t ns = 0;
    bool hashing = true;
    int hashed_blocks = 0;
    int partial = 0;
    BlockKey chain;
  };

  std::int32_t* partial_of(int seq) noexcept { return partial_.get() + static_cast<std::ptrdiff_t>(seq) * block_size_; }

  // Blocks looked up or named together: up to kMaxLookAhead misses in flight
  // at once, and at most about 512 tokens keyed past a lookup's first miss
  // (hashing a large block takes longer than its misses anyway).
  static constexpr int kMaxLookAhead = 16;
  static int look_ahead(int block_size) noexcept {
    const int blocks = 512 / block_size;
    return blocks < 1 ? 1 : blocks > kMaxLookAhead ? kMaxLookAhead : blocks;
  }

  // `seq`'s next `n` blocks are full, keys[0, n) their chained keys: each is
  // keyed in every group holding it, or traded for the copy of its content a
  // group already keeps (BlockPool::name_or_share); every miss first.
  void name_blocks(int seq, const BlockKey* keys, int n, BlockGroup* groups, int n_groups) noexcept {
    Chain& c = chains_[seq];
    for (int k = 0; k < n; ++k)
      for (int g = 0; g < n_groups; ++g) {
        const int b = groups[g].block_at(seq, c.hashed_blocks + k);
        if (b >= 0) groups[g].pool().prefetch_keying(b, keys[k]);
      }
    for (int k = 0; k < n; ++k, ++c.hashed_blocks)
      for (int g = 0; g < n_groups; ++g) {
        const int b = groups[g].block_at(seq, c.hashed_blocks);
        if (b < 0) continue;
        const int kept = groups[g].pool().name_or_share(b, keys[k], c.ns, c.hashed_blocks);
        if (kept != b) groups[g].set_block(seq, c.hashed_blocks, kept);
      }
    c.chain = keys[n - 1];
  }

  // Keys blocks [from, end) of `tokens` in namespace `ns` into prompt_ (the
  // blocks before `from` keyed already), keeping their tokens.
  void key_blocks(std::uint64_t ns, const std::int32_t* tokens, int from, int end) const noexcept {
    BlockKey chain = from > 0 ? prompt_[from - 1] : BlockKey::root(ns);
    for (int i = from; i < end; ++i) {
      const std::int32_t* block = tokens + static_cast<std::ptrdiff_t>(i) * block_size_;
      chain = BlockKey::chain(chain, block, block_size_);
      prompt_[i] = chain;
      std::memcpy(keyed_tokens_.get() + static_cast<std::ptrdiff_t>(i) * block_size_, block,
                  sizeof(std::int32_t) * static_cast<std::size_t>(block_size_));
    }
    if (end > prompt_blocks_) prompt_blocks_ = end;
  }

  // How many of the first `blocks` blocks of `tokens` in namespace `ns` the
  // last lookups already keyed (prompt_): a scheduler asks lookup_prefix and
  // then adopt_prefix of one prompt, and keys follow from the tokens alone, so
  // comparing the tokens is enough (far cheaper than hashing them again).
  int known_keys(std::uint64_t ns, const std::int32_t* tokens, int blocks) const noexcept {
    if (ns != prompt_ns_) {
      prompt_ns_ = ns;
      prompt_blocks_ = 0;
      return 0;
    }
    const int most = blocks < prompt_blocks_ ? blocks : prompt_blocks_;
    const std::size_t bytes = sizeof(std::int32_t) * static_cast<std::size_t>(block_size_);
    int i = 0;
    while (i < most && std::memcmp(keyed_tokens_.get() + static_cast<std::ptrdiff_t>(i) * block_size_,
                                   tokens + static_cast<std::ptrdiff_t>(i) * block_size_, bytes) == 0)
      ++i;
    prompt_blocks_ = i;  // past a differing block the kept keys are another prompt's
    return i;
  }

  // The highest block a hit of `hit` blocks needs of windowed group `group`
  // (index g) that the group lacks, or -1. Blocks [held_from_[g], hit) and
  // [0, sinks_held_[g]) were seen held by earlier calls of this lookup (the
  // hit only goes down), so no block is looked up twice; a lacking sink is
  // reported first (it is below the window, and bounds the hit lower).
  int lacking_block(const BlockGroup& group, int g, int hit) const noexcept {
    const NeededBlocks need = group.rule().needed(hit);
    const int sinks_end = need.sink_blocks < hit ? need.sink_blocks : hit;
    const int window_from = need.window_from > sinks_end ? need.window_from : sinks_end;
    for (int i = sinks_held_[g]; i < sinks_end; ++i) {
      if (group.pool().find(prompt_[i]) < 0) return i;
      sinks_held_[g] = i + 1;
    }
    if (held_from_[g] > hit) held_from_[g] = hit;
    for (int i = held_from_[g] - 1; i >= window_from; --i) {
      if (group.pool().find(prompt_[i]) < 0) return i;
      held_from_[g] = i;
    }
    return -1;
  }

  // Does every group that needs each block of a hit hold a block keyed `key`?
  static bool every_group_needing_all_holds(const BlockKey& key, const BlockGroup* groups, int n_groups) noexcept {
    for (int g = 0; g < n_groups; ++g)
      if (groups[g].needs_every_block() && groups[g].pool().find(key) < 0) return false;
    return true;
  }

  // Sets dst's keys to src's at position n when they are known: n on a block
  // boundary whose last block still carries its key in some group.
  bool restore(int src, int dst, int n, const BlockGroup* groups, int n_groups) noexcept {
    Chain& d = chains_[dst];
    d.partial = 0;
    if (n % block_size_ != 0) return false;
    d.hashed_blocks = n / block_size_;
    if (n == 0) {
      d.chain = BlockKey::root(d.ns);
      return true;
    }
    for (int g = 0; g < n_groups; ++g) {
      const int b = groups[g].block_at(src, d.hashed_blocks - 1);
      if (b >= 0 && groups[g].pool().keyed(b)) {
        d.chain = groups[g].pool().key(b);
        return true;
      }
    }
    return false;
  }

  int block_size_ = 1;
  internal::Buffer<Chain> chains_;
  internal::Buffer<std::int32_t> partial_;  // [seq][B]: tokens of the block being filled
  // Scratch of longest_hit(), a lookup that changes nothing the cache shows.
  mutable internal::Buffer<BlockKey> prompt_;  // a prompt's block keys, the first prompt_blocks_ known
  mutable internal::Buffer<std::int32_t> keyed_tokens_;  // [stride][B]: the tokens prompt_ keys
  mutable int prompt_blocks_ = 0;
  mutable std::uint64_t prompt_ns_ = 0;  // the namespace prompt_ keys in
  mutable internal::Buffer<int> held_from_;    // [group]: blocks [this, hit) seen held
  mutable internal::Buffer<int> sinks_held_;   // [group]: sink blocks [0, this) seen held
};

}  // namespace kvcore
