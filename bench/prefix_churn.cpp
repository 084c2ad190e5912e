// Prefix hit rate under churn (issue 23): many requests sharing prefixes
// through a BatchCache whose pool is too small to keep every prefix cached.
// Requests come from a few system prompts (8 blocks each), each with a few
// variants (2 more blocks), then their own question (1 to 3 blocks and some
// tokens); `slots` of them run at once, each prefilled in max_step chunks
// (token ids given) and decoded for a while, then released, and the next
// request adopts the longest cached prefix of its prompt. Printed: prefix hit
// tokens over prompt tokens, and over the tokens a request could share with an
// earlier one (its system prompt and variant), for several pool sizes.
//
// Standalone (not part of the suite; no timing): build it against any
// checkout's headers to compare versions, e.g. main's before this change:
//   g++ -std=c++17 -O2 -Icpp/include bench/prefix_churn.cpp -o /tmp/churn && /tmp/churn
//   mkdir -p /tmp/main && git archive main cpp/include | tar -x -C /tmp/main
//   g++ -std=c++17 -O2 -I/tmp/main/cpp/include bench/prefix_churn.cpp -o /tmp/churn_main && /tmp/churn_main
#include <cstdint>
#include <cstdio>
#include <vector>

#include "kvcore/batch/batch_cache.h"

namespace {

constexpr int kB = 16, kMaxStep = 64, kSlots = 8, kFamilies = 12, kVariants = 4, kDecode = 32;

struct Rng {
  std::uint64_t s;
  std::uint32_t next() {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<std::uint32_t>(s >> 33);
  }
  int below(int n) { return static_cast<int>(next() % static_cast<std::uint32_t>(n)); }
};

struct Request {
  std::vector<std::int32_t> prompt;
  int shareable = 0;  // tokens of its system prompt and variant
};

Request make_request(Rng& rng, int serial) {
  // Skewed families: family f with weight 1 / (f + 1).
  int family = 0;
  for (int pick = rng.below(1000); family < kFamilies - 1; ++family) {
    const int weight = 1000 / (family + 1) / 3;
    if (pick < weight) break;
    pick -= weight;
  }
  const int variant = rng.below(kVariants);
  Request r;
  for (int i = 0; i < 8 * kB; ++i) r.prompt.push_back(1000 * family + i);
  for (int i = 0; i < 2 * kB; ++i) r.prompt.push_back(100000 + 1000 * (family * kVariants + variant) + i);
  r.shareable = static_cast<int>(r.prompt.size());
  const int own = (1 + rng.below(3)) * kB + rng.below(kB);
  for (int i = 0; i < own; ++i) r.prompt.push_back(1000000 + 1000 * serial + i);
  return r;
}

struct Result {
  long hit = 0, prompt = 0, shareable = 0;
};

Result run(int num_blocks, int n_requests) {
  kvcore::CacheConfig cfg;
  cfg.capacity = 512;
  cfg.max_step = kMaxStep;
  cfg.n_layers = 1;
  cfg.layers.push_back(kvcore::LayerConfig{kvcore::LayerPolicy::flat(), 1, 8, 0});
  cfg.batch.block_size = kB;
  cfg.batch.max_seqs = kSlots;
  cfg.batch.num_blocks = num_blocks;
  auto created = kvcore::BatchCache::create(cfg);
  if (!created.ok()) {
    std::printf("create: %s\n", created.message().c_str());
    return {};
  }
  kvcore::BatchCache& cache = **created;
  Rng rng{12345};
  std::vector<Request> req(kSlots);
  std::vector<int> decoded(kSlots, 0);
  int started = 0, finished = 0;
  Result out;
  auto admit = [&](int s) {
    req[static_cast<std::size_t>(s)] = make_request(rng, started++);
    decoded[static_cast<std::size_t>(s)] = 0;
    const Request& r = req[static_cast<std::size_t>(s)];
    (void)cache.add_sequence(s);
    const int hit = *cache.adopt_prefix(s, r.prompt.data(), static_cast<int>(r.prompt.size()));
    out.hit += hit;
    out.prompt += static_cast<long>(r.prompt.size());
    out.shareable += r.shareable;
  };
  for (int s = 0; s < kSlots; ++s) admit(s);
  std::vector<kvcore::StepEntry> entries;
  std::vector<std::int32_t> decode_token(kSlots, 7);
  while (finished < n_requests) {
    entries.clear();
    for (int s = 0; s < kSlots; ++s) {
      const Request& r = req[static_cast<std::size_t>(s)];
      const int L = cache.sequence(s)->length;
      const int left = static_cast<int>(r.prompt.size()) - L;
      if (left > 0) {
        entries.push_back({s, left < kMaxStep ? left : kMaxStep, r.prompt.data() + L});
      } else {
        entries.push_back({s, 1, &decode_token[static_cast<std::size_t>(s)]});
      }
    }
    auto step = cache.begin_step(entries.data(), static_cast<int>(entries.size()));
    if (!step.ok()) {
      std::printf("begin_step: %s\n", step.message().c_str());
      return {};
    }
    (void)cache.commit(*step);
    for (int s = 0; s < kSlots; ++s) {
      const Request& r = req[static_cast<std::size_t>(s)];
      if (cache.sequence(s)->length <= static_cast<int>(r.prompt.size())) continue;
      if (++decoded[static_cast<std::size_t>(s)] < kDecode) continue;
      (void)cache.release_sequence(s);
      ++finished;
      admit(s);
    }
  }
  return out;
}

}  // namespace

int main() {
  std::printf("%d requests at a time, B = %d, system prompts of 8 blocks x %d, %d variants of 2 blocks each\n", kSlots, kB,
              kFamilies, kVariants);
  std::printf("%8s %22s %28s\n", "blocks", "hit / prompt tokens", "hit / shareable tokens");
  for (int blocks : {136, 160, 192, 256, 384}) {
    const Result r = run(blocks, 3000);
    if (r.prompt == 0) return 1;
    std::printf("%8d %21.1f%% %27.1f%%\n", blocks, 100.0 * static_cast<double>(r.hit) / static_cast<double>(r.prompt),
                100.0 * static_cast<double>(r.hit) / static_cast<double>(r.shareable));
  }
  return 0;
}
