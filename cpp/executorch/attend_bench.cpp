// attend_bench: the kernel's session (attend_session.h) at Gemma 3 270M's attention
// shapes (18 layers, 5 sliding of window 512 to 1 global, 4 query heads, 1 KV head of
// 256), one sequence: a prefill of 1024 tokens in chunks of 64, then the time of a decode
// step (every layer's update_and_attend) at 1K and 4K context, for float32 and int8 K/V.
// Not run by CI: cmake --build BUILD --target kvcore_attend_bench && BUILD/cpp/executorch/kvcore_attend_bench
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "attend_session.h"

int main() {
  using kvcore::DType;
  using kvcore::LayerConfig;
  using kvcore::LayerPolicy;
  constexpr int kLayers = 18, kHeads = 4, kDim = 256, kChunk = 64;
  for (DType kv : {DType::Float32, DType::QInt8}) {
    kvcore::CacheConfig c;
    c.capacity = 8192;
    c.n_layers = kLayers;
    c.max_step = kChunk;
    for (int l = 0; l < kLayers; ++l) {
      c.layers.push_back(LayerConfig{l % 6 == 5 ? LayerPolicy::flat() : LayerPolicy::ring(512), 1, kDim, 0});
    }
    auto made = kvcore::et::AttendSession::create(c, kHeads, kv);
    if (!made.ok()) {
      std::fprintf(stderr, "%s\n", made.status().message().c_str());
      return 1;
    }
    auto session = std::move(made).get();
    std::vector<float> q(kHeads * kChunk * kDim, 0.01f), k(kChunk * kDim, 0.02f), v(kChunk * kDim, 0.03f);
    std::vector<float> out(kHeads * kChunk * kDim);
    std::vector<std::int64_t> pos(kChunk);
    int length = 0;
    auto step = [&](int T) {
      for (int t = 0; t < T; ++t) pos[static_cast<std::size_t>(t)] = length + t;
      for (int l = 0; l < kLayers; ++l) {
        if (!session->update_and_attend(l, q.data(), kHeads, k.data(), v.data(), pos.data(), 1, T, 0.0625f, out.data())
                 .ok()) {
          std::fprintf(stderr, "step failed\n");
        }
      }
      length += T;
    };
    auto ms_since = [](std::chrono::steady_clock::time_point t0) {
      return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    };
    auto t0 = std::chrono::steady_clock::now();
    while (length < 1024) step(kChunk);
    std::printf("%-8s prefill of 1024 tokens (chunks of %d): %.0f ms\n", kvcore::to_string(kv), kChunk, ms_since(t0));
    for (int context : {1024, 4096}) {
      while (length < context) step(kChunk);
      t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < 32; ++i) step(1);
      std::printf("%-8s decode step at %d: %.2f ms (%d layers); K/V arena %.1f MiB\n", kvcore::to_string(kv), context,
                  ms_since(t0) / 32, kLayers, static_cast<double>(session->arena_bytes()) / 1048576.0);
    }
  }
  return 0;
}
