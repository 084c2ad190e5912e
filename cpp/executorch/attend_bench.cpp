// attend_bench: the kernel's session (attend_session.h) at Gemma 3 270M's attention
// shapes (18 layers, 5 sliding of window 512 to 1 global, 4 query heads, 1 KV head of
// 256), one sequence, float32 or int8 K/V: one session attending on 1 thread and one on
// THREADS (argument; default 0: one per processor online), fed the same tokens and timed
// turn about (the order flipping each turn) so that the machine's load falls on both
// alike: prefill of 1024 tokens in chunks of 64, then decode steps (every layer's
// update_and_attend) at 1K, 4K and 8K context, the median of ROUNDS (default 64) steps.
// Not run by CI: cmake --build BUILD --target kvcore_attend_bench &&
//   BUILD/cpp/executorch/kvcore_attend_bench [THREADS [ROUNDS [int8]]]
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "attend_session.h"

namespace {

constexpr int kLayers = 18, kHeads = 4, kDim = 256, kChunk = 64;

struct Runner {
  std::unique_ptr<kvcore::et::AttendSession> session;
  int length = 0;
};

}  // namespace

int main(int argc, char** argv) {
  using kvcore::DType;
  using kvcore::LayerConfig;
  using kvcore::LayerPolicy;
  const int many = argc > 1 ? std::atoi(argv[1]) : 0;
  const int rounds = argc > 2 ? std::atoi(argv[2]) : 64;
  const DType kv = argc > 3 && std::strcmp(argv[3], "int8") == 0 ? DType::QInt8 : DType::Float32;
  kvcore::CacheConfig c;
  c.capacity = 8192 + kChunk;
  c.n_layers = kLayers;
  c.max_step = kChunk;
  for (int l = 0; l < kLayers; ++l) {
    c.layers.push_back(LayerConfig{l % 6 == 5 ? LayerPolicy::flat() : LayerPolicy::ring(512), 1, kDim, 0});
  }
  Runner run[2];
  for (int i = 0; i < 2; ++i) {
    auto made = kvcore::et::AttendSession::create(c, kHeads, kv, i == 0 ? 1 : many);
    if (!made.ok()) {
      std::fprintf(stderr, "%s\n", made.status().message().c_str());
      return 1;
    }
    run[i].session = std::move(made).get();
  }
  std::vector<float> q(kHeads * kChunk * kDim, 0.01f), k(kChunk * kDim, 0.02f), v(kChunk * kDim, 0.03f);
  std::vector<float> out(kHeads * kChunk * kDim);
  std::vector<std::int64_t> pos(kChunk);
  auto step = [&](Runner& r, int T) {
    for (int t = 0; t < T; ++t) pos[static_cast<std::size_t>(t)] = r.length + t;
    const auto t0 = std::chrono::steady_clock::now();
    for (int l = 0; l < kLayers; ++l) {
      if (!r.session->update_and_attend(l, q.data(), kHeads, k.data(), v.data(), pos.data(), 1, T, 0.0625f, out.data())
               .ok()) {
        std::fprintf(stderr, "step failed\n");
      }
    }
    r.length += T;
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  };
  double prefill[2] = {0, 0};
  for (int s = 0; run[0].length < 1024; ++s) {
    for (int j = 0; j < 2; ++j) prefill[(s + j) % 2] += step(run[(s + j) % 2], kChunk);
  }
  std::printf("%s K/V, threads %d and %d: prefill of 1024 tokens (chunks of %d): %.0f and %.0f ms\n",
              kvcore::to_string(kv), run[0].session->threads(), run[1].session->threads(), kChunk, prefill[0],
              prefill[1]);
  for (int context : {1024, 4096, 8128}) {
    for (int s = 0; run[0].length < context; ++s) {
      for (int j = 0; j < 2; ++j) step(run[(s + j) % 2], kChunk);
    }
    std::vector<double> ms[2];
    for (int i = 0; i < rounds; ++i) {
      for (int j = 0; j < 2; ++j) {
        Runner& r = run[(i + j) % 2];
        ms[(i + j) % 2].push_back(step(r, 1));
        (void)r.session->rewind(r.length - 1);
        --r.length;
      }
    }
    for (auto& m : ms) std::sort(m.begin(), m.end());
    std::printf("  decode step at %d: %.2f and %.2f ms (median of %d, %d layers)\n", context,
                ms[0][ms[0].size() / 2], ms[1][ms[1].size() / 2], rounds, kLayers);
  }
  return 0;
}
