// BlockKey: a full block's content key, the chained hash of its token ids
// from its prefix namespace's root (docs/design.md section 6, "Prefix reuse").
#pragma once

#include <cstdint>

namespace kvcore {

/// A full block's content key: a 128-bit chained hash of its token ids and of
/// the key of the block before it. Two lanes with independent seeds; the hash
/// table is keyed by `lo` and a hit must match both.
struct BlockKey {
  std::uint64_t lo = 0;
  std::uint64_t hi = 0;

  friend bool operator==(const BlockKey& a, const BlockKey& b) noexcept {
    return a.lo == b.lo && a.hi == b.hi;
  }
  friend bool operator!=(const BlockKey& a, const BlockKey& b) noexcept { return !(a == b); }

  /// The parent key of a sequence's first block in prefix namespace `ns` (a
  /// 64-bit salt: tenant, adapter, model revision, multimodal digest): the
  /// zero key for ns = 0 (the default namespace), else a key no other
  /// namespace has (each lane is a bijection of ns, and no ns != 0 gives the
  /// zero key), so chains of different namespaces never meet.
  static BlockKey root(std::uint64_t ns) noexcept {
    if (ns == 0) return BlockKey{};
    return BlockKey{mix(ns ^ 0x6a09e667f3bcc908ull), mix(ns ^ 0xbb67ae8584caa73bull)};
  }

  /// The key of a block holding `tokens[0, n)` after a block whose key is `parent`
  /// (the first block's parent is root(ns) of the sequence's namespace).
  static BlockKey chain(const BlockKey& parent, const std::int32_t* tokens, int n) noexcept {
    BlockKey k{mix(parent.lo ^ 0x9e3779b97f4a7c15ull), mix(parent.hi ^ 0xc2b2ae3d27d4eb4full)};
    // Two ids per round: one 64-bit word holds both whole, and each lane's
    // round is a bijection of it (an odd multiplier, then mix), so every id
    // bit still reaches every key bit at half the rounds. A block of 32 ids
    // or more goes eight ids at a time to four accumulators per lane, started
    // apart from the key and folded into it in order, so their rounds'
    // latencies overlap (admission hashes whole prompts; in shorter blocks the
    // folds would cost more than that saves). The ids left take a round a
    // pair, a lone last id one of its own, and n, folded in last, tells them
    // apart.
    int i = 0;
    if (n >= 32) {
      std::uint64_t lo[4], hi[4];
      for (int a = 0; a < 4; ++a) {
        lo[a] = mix(k.lo + kSeeds[a]);
        hi[a] = mix(k.hi + kSeeds[a + 4]);
      }
      for (; i + 7 < n; i += 8)
        for (int a = 0; a < 4; ++a) {
          const std::uint64_t w = word(tokens + i + 2 * a);
          lo[a] = mix(lo[a] ^ (w + 0x165667b19e3779f9ull));
          hi[a] = mix(hi[a] ^ (w * 0xff51afd7ed558ccdull + 0x85ebca77c2b2ae63ull));
        }
      for (int a = 0; a < 4; ++a) {
        k.lo = mix(k.lo ^ lo[a]);
        k.hi = mix(k.hi ^ hi[a]);
      }
    }
    for (; i + 1 < n; i += 2) {
      const std::uint64_t w = word(tokens + i);
      k.lo = mix(k.lo ^ (w + 0x165667b19e3779f9ull));
      k.hi = mix(k.hi ^ (w * 0xff51afd7ed558ccdull + 0x85ebca77c2b2ae63ull));
    }
    if (i < n) {
      const std::uint64_t t = static_cast<std::uint32_t>(tokens[i]);
      k.lo = mix(k.lo ^ (t + 0x165667b19e3779f9ull));
      k.hi = mix(k.hi ^ (t * 0xff51afd7ed558ccdull + 0x85ebca77c2b2ae63ull));
    }
    k.lo = mix(k.lo ^ static_cast<std::uint64_t>(n));
    k.hi = mix(k.hi ^ (static_cast<std::uint64_t>(n) << 32));
    return k;
  }

 private:
  // The accumulators' starts (the first eight words of SHA-512's initial
  // hash value): no two of them compute the same function of their ids.
  static constexpr std::uint64_t kSeeds[8] = {0x6a09e667f3bcc908ull, 0xbb67ae8584caa73bull, 0x3c6ef372fe94f82bull,
                                              0xa54ff53a5f1d36f1ull, 0x510e527fade682d1ull, 0x9b05688c2b3e6c1full,
                                              0x1f83d9abfb41bd6bull, 0x5be0cd19137e2179ull};

  // Ids t[0] and t[1] as one word, both whole.
  static std::uint64_t word(const std::int32_t* t) noexcept {
    return static_cast<std::uint32_t>(t[0]) | static_cast<std::uint64_t>(static_cast<std::uint32_t>(t[1])) << 32;
  }

  // splitmix64's finalizer: every input bit reaches every output bit.
  static std::uint64_t mix(std::uint64_t x) noexcept {
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    return x ^ (x >> 31);
  }
};

}  // namespace kvcore
