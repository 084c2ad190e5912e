// AttendSession: one sequence's K/V behind ExecuTorch's `kvcache::update_and_attend`
// op, planned by kvcore (SequenceCache) and stored in kvcore's byte layer (KVPool,
// arena mode), attending in float32. It knows nothing of ExecuTorch: the kernel
// (kvcore_executorch_ops.cpp) hands it raw pointers, and tests can drive it alone.
//
// A forward is one kvcore step: layer 0 begins it (its positions must be the
// sequence's length onwards), every layer is then served once with the same
// tokens. Once every layer is served the forward is complete, and it is
// committed by what comes next: the next forward's layer 0, rewind(), reset() or
// settle(). Until then an error aborts it, so a program calling a layer the
// cache does not have (its metadata disagrees with the cache) changes nothing,
// even after the cache's last layer was served. Layer 0 arriving again before
// the forward completed restarts it (the retry path). An error while a layer is
// served aborts the step: the length is as before the forward.
// Everything is allocated by create(); a step allocates nothing.
// Not thread-safe: one runtime thread drives a session.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <new>

#include "kvcore/core/config.h"
#include "kvcore/core/result.h"
#include "kvcore/core/sequence_cache.h"
#include "kvcore/core/status.h"
#include "kvcore/core/step.h"
#include "kvcore/pool/kv_pool.h"

namespace kvcore {
namespace et {

class AttendSession {
 public:
  /// A session for `config` (kvcore's rules, docs/design.md section 2; State
  /// layers are refused: the op carries attention only). Allocates the planner,
  /// one arena holding every layer's rows at full size (float32), and the
  /// per-step workspaces (staged K/V rows of max_step tokens, one score row).
  /// InvalidArgument: the config breaks a rule (the message names it) or has a
  /// State layer. MemoryAllocationFailed: an allocation failed (nothing kept).
  static Result<std::unique_ptr<AttendSession>> create(const CacheConfig& config) noexcept {
    KVCORE_RETURN_IF_ERROR(validate(config));
    for (int l = 0; l < config.n_layers; ++l) {
      KVCORE_CHECK_OR_RETURN_ERROR(config.layer(l).policy.kind != LayerPolicy::Kind::State, InvalidArgument,
                                   "layer %d is a State layer: update_and_attend carries attention layers only "
                                   "(Flat, Ring, Chunked, Shared)",
                                   l);
    }
    std::unique_ptr<AttendSession> s(new (std::nothrow) AttendSession());
    KVCORE_CHECK_OR_RETURN_ERROR(s != nullptr, MemoryAllocationFailed, "AttendSession: out of memory");
    KVCORE_ASSIGN_OR_RETURN(s->cache_, SequenceCache::create(config));
    KVCORE_ASSIGN_OR_RETURN(const std::size_t arena_bytes, KVPool::required_bytes(config, DType::Float32));
    s->arena_.reset(new (std::nothrow) unsigned char[arena_bytes]);
    KVCORE_CHECK_OR_RETURN_ERROR(s->arena_ != nullptr, MemoryAllocationFailed,
                                 "AttendSession: cannot allocate the %zu-byte K/V arena", arena_bytes);
    s->arena_bytes_ = arena_bytes;
    KVCORE_ASSIGN_OR_RETURN(KVPool pool, KVPool::in_arena(*s->cache_, DType::Float32, s->arena_.get(), arena_bytes));
    s->pool_.reset(new (std::nothrow) KVPool(static_cast<KVPool&&>(pool)));
    KVCORE_CHECK_OR_RETURN_ERROR(s->pool_ != nullptr, MemoryAllocationFailed, "AttendSession: out of memory");
    const int n = config.n_layers;
    s->n_layers_ = n;
    s->max_step_ = s->cache_->max_step();
    s->served_.reset(new (std::nothrow) bool[at(n)]());
    s->policy_.reset(new (std::nothrow) LayerPolicy[static_cast<std::size_t>(n)]);
    s->shape_.reset(new (std::nothrow) LayerConfig[static_cast<std::size_t>(n)]);
    KVCORE_CHECK_OR_RETURN_ERROR(s->served_ && s->policy_ && s->shape_, MemoryAllocationFailed,
                                 "AttendSession: out of memory");
    std::size_t stage_k = 0, stage_v = 0, score = 1;
    for (int l = 0; l < n; ++l) {
      const LayerConfig& lc = config.layer(l);
      s->shape_[at(l)] = lc;
      // A Shared layer sees what its source sees (the source holds the rows).
      const LayerPolicy& p = lc.policy;
      s->policy_[at(l)] = p.kind == LayerPolicy::Kind::Shared ? config.layer(p.source).policy : p;
      const std::size_t T = static_cast<std::size_t>(s->max_step_);
      const std::size_t hk = static_cast<std::size_t>(lc.n_kv_heads) * static_cast<std::size_t>(lc.head_dim);
      const std::size_t hv = static_cast<std::size_t>(lc.n_kv_heads) * static_cast<std::size_t>(lc.value_dim());
      if (T * hk > stage_k) stage_k = T * hk;
      if (T * hv > stage_v) stage_v = T * hv;
      KVCORE_ASSIGN_OR_RETURN(const int rows, s->cache_->rows(p.kind == LayerPolicy::Kind::Shared ? p.source : l));
      if (static_cast<std::size_t>(rows) > score) score = static_cast<std::size_t>(rows);
    }
    s->stage_k_.reset(new (std::nothrow) float[stage_k]);
    s->stage_v_.reset(new (std::nothrow) float[stage_v]);
    s->score_.reset(new (std::nothrow) float[score]);
    KVCORE_CHECK_OR_RETURN_ERROR(s->stage_k_ && s->stage_v_ && s->score_, MemoryAllocationFailed,
                                 "AttendSession: cannot allocate the step workspaces");
    s->stage_k_len_ = stage_k;
    s->stage_v_len_ = stage_v;
    return s;
  }

  AttendSession(const AttendSession&) = delete;
  AttendSession& operator=(const AttendSession&) = delete;

  /// The op for one layer: writes this forward's K/V of `layer` (`k`: [n_kv_heads,
  /// T, head_dim], `v`: [n_kv_heads, T, v_head_dim], float32, contiguous; ignored
  /// for a Shared layer, which reads its source's rows), then attends `q`
  /// ([n_q_heads, T, head_dim]) over what each query may see (kvcore's
  /// visibility rule) with softmax scale `scale`, into `out` ([n_q_heads, T,
  /// v_head_dim]). `positions[i * position_stride]` is token i's position.
  /// After the last layer the forward is complete; the next forward's layer 0
  /// (or settle, rewind, reset) commits it.
  /// Errors (the forward, under way or complete, is aborted: the length is as
  /// before it): InvalidArgument: `layer` outside [0, n_layers); T outside [1, max_step];
  /// n_q_heads not a positive multiple of the layer's n_kv_heads; on layer 0,
  /// positions not length .. length + T - 1; on a later layer, another T or other
  /// positions than layer 0's. InvalidState: a later layer with no forward under
  /// way (layer 0 begins each), or a layer served twice in one forward.
  /// OutOfResources: the step would pass capacity.
  Status update_and_attend(int layer, const float* q, int n_q_heads, const float* k, const float* v,
                           const std::int64_t* positions, int position_stride, int T, float scale,
                           float* out) noexcept {
    if (layer < 0 || layer >= n_layers_) {
      return fail(Status::make(Error::InvalidArgument, "layer_id = %d: must be in [0, n_layers = %d)", layer,
                               n_layers_));
    }
    if (layer == 0) {
      if (complete_) KVCORE_RETURN_IF_ERROR(settle());
      if (active_) (void)end_step(/*commit=*/false);  // a restarted forward
      KVCORE_RETURN_IF_ERROR(begin(positions, position_stride, T));
    } else {
      KVCORE_CHECK_OR_RETURN_ERROR(active_, InvalidState,
                                   "layer %d served with no forward under way: layer 0 begins each forward",
                                   layer);
      const Status same = check_same_tokens(layer, positions, position_stride, T);
      if (!same.ok()) return fail(same);
      if (served_[at(layer)]) {
        return fail(Status::make(Error::InvalidState, "layer %d served twice in one forward (at position %d)",
                                 layer, step_.position));
      }
    }
    const Status done = serve(layer, q, n_q_heads, k, v, T, scale, out);
    if (!done.ok()) return fail(done);
    served_[at(layer)] = true;
    if (++n_served_ == n_layers_) complete_ = true;  // committed by what comes next
    return Error::Ok;
  }

  /// Commits a complete forward (every layer served); nothing to do otherwise.
  /// Errors: kvcore's commit (none expected for a step it began).
  Status settle() noexcept {
    if (!complete_) return Error::Ok;
    return end_step(/*commit=*/true);
  }

  /// Aborts the forward under way or complete but not yet committed: the
  /// length is as before it. For an error the op met before reaching the session.
  void abort_forward() noexcept {
    if (active_) (void)end_step(/*commit=*/false);
  }

  /// Positions cached: the committed length, plus a complete forward's tokens.
  int length() const noexcept { return cache_->length() + (complete_ ? step_.T : 0); }
  /// Layers of the config.
  int n_layers() const noexcept { return n_layers_; }
  /// The most tokens one forward may carry.
  int max_step() const noexcept { return max_step_; }
  /// Largest logical length.
  int capacity() const noexcept { return cache_->capacity(); }
  /// True while a forward is under way (begun by layer 0, not every layer served yet).
  bool in_forward() const noexcept { return active_ && !complete_; }
  /// Bytes of the K/V arena (every layer's rows at full size), allocated once.
  std::size_t arena_bytes() const noexcept { return arena_bytes_; }
  /// The layer's shape (policy as configured, heads, dims). Precondition: 0 <= layer < n_layers.
  const LayerConfig& layer_config(int layer) const noexcept { return shape_[at(layer)]; }

  /// Back to `n` tokens (speculative decoding; a ring layer keeps max_step tokens
  /// of rewind). Commits a complete forward first; aborts one under way. InvalidArgument: n outside [0, length];
  /// InvalidState: a ring or chunked layer no longer holds what a query at n needs.
  Status rewind(int n) noexcept {
    KVCORE_RETURN_IF_ERROR(settle());
    if (active_) (void)end_step(/*commit=*/false);
    return cache_->rewind(n);
  }

  /// Length 0 (the rows are kept and overwritten). Ends a forward under way.
  void reset() noexcept {
    if (active_) (void)end_step(/*commit=*/false);
    cache_->clear();
  }

 private:
  AttendSession() noexcept = default;

  // A layer index (checked non-negative) as an array index.
  static std::size_t at(int i) noexcept { return static_cast<std::size_t>(i); }

  Status begin(const std::int64_t* positions, int stride, int T) noexcept {
    KVCORE_CHECK_OR_RETURN_ERROR(T >= 1 && T <= max_step_, InvalidArgument,
                                 "a forward of %d tokens: must be 1 .. max_step = %d (chunk the prompt)", T,
                                 max_step_);
    const int length = cache_->length();
    for (int i = 0; i < T; ++i) {
      const std::int64_t p = positions[static_cast<std::ptrdiff_t>(i) * stride];
      KVCORE_CHECK_OR_RETURN_ERROR(p == static_cast<std::int64_t>(length) + i, InvalidArgument,
                                   "token %d of the forward is at position %d, but it must be %d: positions "
                                   "continue the sequence's length %d (rewind or reset to go back)",
                                   i, static_cast<long long>(p), length + i, length);
    }
    KVCORE_ASSIGN_OR_RETURN(step_, cache_->begin_step(T));
    active_ = true;
    n_served_ = 0;
    for (int l = 0; l < n_layers_; ++l) served_[at(l)] = false;
    return Error::Ok;
  }

  Status check_same_tokens(int layer, const std::int64_t* positions, int stride, int T) const noexcept {
    KVCORE_CHECK_OR_RETURN_ERROR(T == step_.T, InvalidArgument,
                                 "layer %d carries %d tokens, but layer 0 began this forward with %d", layer,
                                 T, step_.T);
    for (int i = 0; i < T; ++i) {
      const std::int64_t p = positions[static_cast<std::ptrdiff_t>(i) * stride];
      KVCORE_CHECK_OR_RETURN_ERROR(p == static_cast<std::int64_t>(step_.position) + i, InvalidArgument,
                                   "layer %d: token %d is at position %d, but layer 0 placed it at %d", layer,
                                   i, static_cast<long long>(p), step_.position + i);
    }
    return Error::Ok;
  }

  Status serve(int layer, const float* q, int n_q_heads, const float* k, const float* v, int T, float scale,
               float* out) noexcept {
    const LayerConfig& lc = shape_[at(layer)];
    const int hkv = lc.n_kv_heads, d = lc.head_dim, dv = lc.value_dim();
    KVCORE_CHECK_OR_RETURN_ERROR(n_q_heads >= hkv && n_q_heads % hkv == 0, InvalidArgument,
                                 "layer %d: %d query heads: must be a positive multiple of n_kv_heads = %d", layer,
                                 n_q_heads, hkv);
    KVCORE_ASSIGN_OR_RETURN(const SeqStepPlan plan, cache_->plan(layer, step_));
    if (lc.policy.kind != LayerPolicy::Kind::Shared) {
      // [H, T, D] -> rows [T, H, D], the byte layer's row layout.
      const std::size_t D = static_cast<std::size_t>(d), DV = static_cast<std::size_t>(dv);
      for (int h = 0; h < hkv; ++h) {
        for (int t = 0; t < T; ++t) {
          const std::size_t row = static_cast<std::size_t>(t) * static_cast<std::size_t>(hkv) + static_cast<std::size_t>(h);
          const std::size_t in = static_cast<std::size_t>(h) * static_cast<std::size_t>(T) + static_cast<std::size_t>(t);
          for (std::size_t e = 0; e < D; ++e) stage_k_[row * D + e] = k[in * D + e];
          for (std::size_t e = 0; e < DV; ++e) stage_v_[row * DV + e] = v[in * DV + e];
        }
      }
      const std::size_t rows = static_cast<std::size_t>(T) * static_cast<std::size_t>(hkv);
      KVCORE_RETURN_IF_ERROR(pool_->write(layer, plan, stage_k_.get(), rows * D * sizeof(float), stage_v_.get(),
                                          rows * DV * sizeof(float)));
    }
    KVCORE_ASSIGN_OR_RETURN(const KVViews views, pool_->views(layer, plan));
    attend(layer, views, q, n_q_heads, T, scale, out);
    return Error::Ok;
  }

  // Softmax attention of each (head, token) over the rows its position sees, in
  // the order the views give them (position order), float32 throughout.
  void attend(int layer, const KVViews& views, const float* q, int n_q_heads, int T, float scale,
              float* out) noexcept {
    const LayerConfig& lc = shape_[at(layer)];
    const LayerPolicy& policy = policy_[at(layer)];
    const std::size_t hkv = static_cast<std::size_t>(lc.n_kv_heads);
    const std::size_t D = static_cast<std::size_t>(lc.head_dim), DV = static_cast<std::size_t>(lc.value_dim());
    const int group = n_q_heads / lc.n_kv_heads;
    float* score = score_.get();
    for (int h = 0; h < n_q_heads; ++h) {
      const std::size_t kh = static_cast<std::size_t>(h / group);
      for (int t = 0; t < T; ++t) {
        const int qpos = step_.position + t;
        const std::size_t qi = static_cast<std::size_t>(h) * static_cast<std::size_t>(T) + static_cast<std::size_t>(t);
        const float* qv = q + qi * D;
        float* o = out + qi * DV;
        float best = -std::numeric_limits<float>::infinity();
        std::size_t j = 0;
        for (int s = 0; s < views.n; ++s) {
          const KVSpan& span = views.span[s];
          const float* keys = reinterpret_cast<const float*>(span.k);
          for (int r = 0; r < span.run.len; ++r, ++j) {
            if (!policy.sees(qpos, span.run.pos + r)) {
              score[j] = -std::numeric_limits<float>::infinity();
              continue;
            }
            const float* kv = keys + (static_cast<std::size_t>(r) * hkv + kh) * D;
            float dot = 0.0f;
            for (std::size_t e = 0; e < D; ++e) dot += qv[e] * kv[e];
            score[j] = dot * scale;
            if (score[j] > best) best = score[j];
          }
        }
        for (std::size_t e = 0; e < DV; ++e) o[e] = 0.0f;
        float sum = 0.0f;
        j = 0;
        for (int s = 0; s < views.n; ++s) {
          const KVSpan& span = views.span[s];
          const float* values = reinterpret_cast<const float*>(span.v);
          for (int r = 0; r < span.run.len; ++r, ++j) {
            if (score[j] == -std::numeric_limits<float>::infinity()) continue;
            const float w = std::exp(score[j] - best);
            sum += w;
            const float* vv = values + (static_cast<std::size_t>(r) * hkv + kh) * DV;
            for (std::size_t e = 0; e < DV; ++e) o[e] += w * vv[e];
          }
        }
        // Every query sees at least itself, so sum >= 1.
        const float inv = 1.0f / sum;
        for (std::size_t e = 0; e < DV; ++e) o[e] *= inv;
      }
    }
  }

  Status end_step(bool commit) noexcept {
    active_ = false;
    complete_ = false;
    n_served_ = 0;
    return commit ? cache_->commit(step_) : cache_->abort(step_);
  }

  Status fail(const Status& error) noexcept {
    if (active_) (void)end_step(/*commit=*/false);
    return error;
  }

  std::unique_ptr<SequenceCache> cache_;
  std::unique_ptr<unsigned char[]> arena_;
  std::size_t arena_bytes_ = 0;
  std::unique_ptr<KVPool> pool_;
  std::unique_ptr<bool[]> served_;
  std::unique_ptr<LayerPolicy[]> policy_;  // the visibility rule each layer attends by
  std::unique_ptr<LayerConfig[]> shape_;
  std::unique_ptr<float[]> stage_k_, stage_v_, score_;
  std::size_t stage_k_len_ = 0, stage_v_len_ = 0;
  int n_layers_ = 0;
  int max_step_ = 0;
  int n_served_ = 0;
  bool active_ = false;    // a step is begun (layer 0 served or serving)
  bool complete_ = false;  // ... and every layer served: committed by what comes next
  Step step_;
};

}  // namespace et
}  // namespace kvcore
