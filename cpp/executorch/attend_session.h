// AttendSession: one sequence's K/V behind ExecuTorch's `kvcache::update_and_attend`
// op, planned by kvcore (SequenceCache) and stored in kvcore's byte layer (KVPool,
// arena mode) as float32, float16, bfloat16 or a quantized format (QInt8: ExecuTorch's
// QuantizedKVCache rule; Fp8E4M3), attending in float32. q/k/v come in and the
// output goes out as float32, float16 or bfloat16. It knows nothing of ExecuTorch:
// the kernel (kvcore_executorch_ops.cpp) hands it raw pointers, and tests drive it alone.
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
//
// Attention reads the visible K/V rows in blocks of 32, once per layer and step
// (online softmax over the blocks in position order, per query head and token),
// dequantizing or widening a block into a small workspace when it is not float32.
// Everything is allocated by create(); a step allocates nothing.
// Not thread-safe: one runtime thread drives a session.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <new>

#include "kvcore/core/config.h"
#include "kvcore/core/result.h"
#include "kvcore/core/sequence_cache.h"
#include "kvcore/core/status.h"
#include "kvcore/core/step.h"
#include "kvcore/pool/dtype.h"
#include "kvcore/pool/kv_pool.h"
#include "kvcore/pool/quantize.h"

namespace kvcore {
namespace et {

class AttendSession {
 public:
  /// A session for `config` (kvcore's rules, docs/design.md section 2; State
  /// layers are refused: the op carries attention only) storing K/V as
  /// `kv_dtype` (Float32, Float16, BFloat16, QInt8 or Fp8E4M3), attended by
  /// `n_q_heads` query heads (a positive multiple of every layer's n_kv_heads).
  /// Allocates the planner, one arena holding every layer's rows at full size,
  /// and the per-step workspaces (staged K/V of max_step tokens, the queries and
  /// the softmax accumulators of max_step tokens, one widened block of K/V rows).
  /// InvalidArgument: the config breaks a rule (the message names it), has a
  /// State layer, or `kv_dtype` / `n_q_heads` is not one of the above.
  /// MemoryAllocationFailed: an allocation failed (nothing kept).
  static Result<std::unique_ptr<AttendSession>> create(const CacheConfig& config, int n_q_heads,
                                                       DType kv_dtype = DType::Float32) noexcept {
    KVCORE_RETURN_IF_ERROR(validate(config));
    KVCORE_CHECK_OR_RETURN_ERROR(is_compute_type(kv_dtype) || is_quantized(kv_dtype), InvalidArgument,
                                 "kv_dtype %s (%d): must be float32, float16, bfloat16, qint8 or fp8_e4m3",
                                 to_string(kv_dtype), static_cast<int>(kv_dtype));
    for (int l = 0; l < config.n_layers; ++l) {
      const LayerConfig& lc = config.layer(l);
      KVCORE_CHECK_OR_RETURN_ERROR(lc.policy.kind != LayerPolicy::Kind::State, InvalidArgument,
                                   "layer %d is a State layer: update_and_attend carries attention layers only "
                                   "(Flat, Ring, Chunked, Shared)",
                                   l);
      KVCORE_CHECK_OR_RETURN_ERROR(n_q_heads >= 1 && n_q_heads % lc.n_kv_heads == 0, InvalidArgument,
                                   "n_q_heads = %d: must be a positive multiple of layer %d's n_kv_heads = %d",
                                   n_q_heads, l, lc.n_kv_heads);
    }
    std::unique_ptr<AttendSession> s(new (std::nothrow) AttendSession());
    KVCORE_CHECK_OR_RETURN_ERROR(s != nullptr, MemoryAllocationFailed, "AttendSession: out of memory");
    KVCORE_ASSIGN_OR_RETURN(s->cache_, SequenceCache::create(config));
    KVCORE_ASSIGN_OR_RETURN(const std::size_t arena_bytes, KVPool::required_bytes(config, kv_dtype));
    s->arena_.reset(new (std::nothrow) unsigned char[arena_bytes]);
    KVCORE_CHECK_OR_RETURN_ERROR(s->arena_ != nullptr, MemoryAllocationFailed,
                                 "AttendSession: cannot allocate the %zu-byte K/V arena", arena_bytes);
    s->arena_bytes_ = arena_bytes;
    KVCORE_ASSIGN_OR_RETURN(KVPool pool, KVPool::in_arena(*s->cache_, kv_dtype, s->arena_.get(), arena_bytes));
    s->pool_.reset(new (std::nothrow) KVPool(static_cast<KVPool&&>(pool)));
    KVCORE_CHECK_OR_RETURN_ERROR(s->pool_ != nullptr, MemoryAllocationFailed, "AttendSession: out of memory");
    const int n = config.n_layers;
    s->n_layers_ = n;
    s->n_q_heads_ = n_q_heads;
    s->kv_dtype_ = kv_dtype;
    s->max_step_ = s->cache_->max_step();
    s->served_.reset(new (std::nothrow) bool[at(n)]());
    s->policy_.reset(new (std::nothrow) LayerPolicy[at(n)]);
    s->shape_.reset(new (std::nothrow) LayerConfig[at(n)]);
    KVCORE_CHECK_OR_RETURN_ERROR(s->served_ && s->policy_ && s->shape_, MemoryAllocationFailed,
                                 "AttendSession: out of memory");
    const std::size_t T = at(s->max_step_), hq = at(n_q_heads);
    std::size_t stage = 0, block_k = 0, block_v = 0, qbuf = 0, acc = 0;
    for (int l = 0; l < n; ++l) {
      const LayerConfig& lc = config.layer(l);
      s->shape_[at(l)] = lc;
      // A Shared layer sees what its source sees (the source holds the rows).
      const LayerPolicy& p = lc.policy;
      s->policy_[at(l)] = p.kind == LayerPolicy::Kind::Shared ? config.layer(p.source).policy : p;
      const std::size_t hk = at(lc.n_kv_heads), d = at(lc.head_dim), dv = at(lc.value_dim());
      const std::size_t widest = d > dv ? d : dv;
      if (T * hk * widest * 4 > stage) stage = T * hk * widest * 4;  // 4: the widest element
      if (at(kBlock) * hk * d > block_k) block_k = at(kBlock) * hk * d;
      if (at(kBlock) * hk * dv > block_v) block_v = at(kBlock) * hk * dv;
      if (T * hq * d > qbuf) qbuf = T * hq * d;
      if (T * hq * (dv + 2) > acc) acc = T * hq * (dv + 2);
    }
    s->stage_k_.reset(new (std::nothrow) unsigned char[stage]);
    s->stage_v_.reset(new (std::nothrow) unsigned char[stage]);
    s->kblock_.reset(new (std::nothrow) float[block_k]);
    s->vblock_.reset(new (std::nothrow) float[block_v]);
    s->score_.reset(new (std::nothrow) float[kBlock]);
    s->q_.reset(new (std::nothrow) float[qbuf]);
    s->acc_.reset(new (std::nothrow) float[acc]);
    KVCORE_CHECK_OR_RETURN_ERROR(s->stage_k_ && s->stage_v_ && s->kblock_ && s->vblock_ && s->score_ && s->q_ && s->acc_,
                                 MemoryAllocationFailed,
                                 "AttendSession: cannot allocate the step workspaces");
    return s;
  }

  AttendSession(const AttendSession&) = delete;
  AttendSession& operator=(const AttendSession&) = delete;

  /// The op for one layer: writes this forward's K/V of `layer` (`k`: [n_kv_heads,
  /// T, head_dim], `v`: [n_kv_heads, T, v_head_dim], contiguous, of `io_type`;
  /// ignored for a Shared layer, which reads its source's rows), then attends `q`
  /// ([n_q_heads, T, head_dim], `io_type`) over what each query may see (kvcore's
  /// visibility rule) with softmax scale `scale`, in float32, into `out`
  /// ([n_q_heads, T, v_head_dim], `out_type`). `io_type` and `out_type`: Float32,
  /// Float16 or BFloat16. `positions[i * position_stride]` is token i's position.
  /// After the last layer the forward is complete; the next forward's layer 0
  /// (or settle, rewind, reset) commits it.
  /// Errors (the forward, under way or complete, is aborted: the length is as
  /// before it): InvalidArgument: `layer` outside [0, n_layers); T outside [1,
  /// max_step]; `n_q_heads` other than the session's; a type outside the three;
  /// on layer 0, positions not length .. length + T - 1; on a later layer,
  /// another T or other positions than layer 0's; with a quantized kv_dtype, K/V
  /// holding inf or NaN. InvalidState: a later layer with no forward under way
  /// (layer 0 begins each), or a layer served twice in one forward.
  /// OutOfResources: the step would pass capacity.
  Status update_and_attend(int layer, DType io_type, const void* q, int n_q_heads, const void* k, const void* v,
                           const std::int64_t* positions, int position_stride, int T, float scale, DType out_type,
                           void* out) noexcept {
    if (layer < 0 || layer >= n_layers_) {
      return fail(Status::make(Error::InvalidArgument, "layer_id = %d: must be in [0, n_layers = %d)", layer,
                               n_layers_));
    }
    if (!is_compute_type(io_type) || !is_compute_type(out_type)) {
      return fail(Status::make(Error::InvalidArgument,
                               "layer %d: q/k/v of %s, output of %s: each must be float32, float16 or bfloat16",
                               layer, to_string(io_type), to_string(out_type)));
    }
    if (n_q_heads != n_q_heads_) {
      return fail(Status::make(Error::InvalidArgument, "layer %d: %d query heads, but the cache was configured for %d",
                               layer, n_q_heads, n_q_heads_));
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
    const Status done = serve(layer, io_type, q, k, v, T, scale, out_type, out);
    if (!done.ok()) return fail(done);
    served_[at(layer)] = true;
    if (++n_served_ == n_layers_) complete_ = true;  // committed by what comes next
    return Error::Ok;
  }

  /// update_and_attend() with float32 q/k/v and output.
  Status update_and_attend(int layer, const float* q, int n_q_heads, const float* k, const float* v,
                           const std::int64_t* positions, int position_stride, int T, float scale,
                           float* out) noexcept {
    return update_and_attend(layer, DType::Float32, q, n_q_heads, k, v, positions, position_stride, T, scale,
                             DType::Float32, out);
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
  /// Query heads of every layer.
  int n_q_heads() const noexcept { return n_q_heads_; }
  /// The storage format of the K/V rows.
  DType kv_dtype() const noexcept { return kv_dtype_; }
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
  /// of rewind). Commits a complete forward first; aborts one under way. InvalidArgument:
  /// n outside [0, length]; InvalidState: a ring or chunked layer no longer holds what
  /// a query at n needs.
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
  // Rows attended at a time: widened together, one softmax rescale per query.
  static constexpr int kBlock = 32;

  AttendSession() noexcept = default;

  // A count or index (checked non-negative) as a size.
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

  // [H, T, dim] of `in` -> rows [T, H, dim] of `to` at `out` (converting the elements).
  static void stage_rows(DType in, const void* src, int heads, int T, int dim, DType to, unsigned char* out) noexcept {
    const unsigned char* from = static_cast<const unsigned char*>(src);
    for (int h = 0; h < heads; ++h) {
      for (int t = 0; t < T; ++t) {
        const std::size_t row = at(t) * at(heads) + at(h), input = at(h) * at(T) + at(t);
        for (int e = 0; e < dim; ++e) {
          quant_detail::store(to, out, row * at(dim) + at(e), quant_detail::load(in, from, input * at(dim) + at(e)));
        }
      }
    }
  }

  Status serve(int layer, DType io_type, const void* q, const void* k, const void* v, int T, float scale,
               DType out_type, void* out) noexcept {
    const LayerConfig& lc = shape_[at(layer)];
    const int hkv = lc.n_kv_heads, d = lc.head_dim, dv = lc.value_dim();
    KVCORE_ASSIGN_OR_RETURN(const SeqStepPlan plan, cache_->plan(layer, step_));
    if (lc.policy.kind != LayerPolicy::Kind::Shared) {
      // Quantized rows are quantized from the input's own type; plain rows are staged in the pool's.
      const DType staged = is_quantized(kv_dtype_) ? io_type : kv_dtype_;
      stage_rows(io_type, k, hkv, T, d, staged, stage_k_.get());
      stage_rows(io_type, v, hkv, T, dv, staged, stage_v_.get());
      const std::size_t k_bytes = at(T) * at(hkv) * at(d) * element_size(staged);
      const std::size_t v_bytes = at(T) * at(hkv) * at(dv) * element_size(staged);
      if (is_quantized(kv_dtype_)) {
        KVCORE_RETURN_IF_ERROR(pool_->write_values(layer, plan, staged, stage_k_.get(), k_bytes, stage_v_.get(), v_bytes));
      } else {
        KVCORE_RETURN_IF_ERROR(pool_->write(layer, plan, stage_k_.get(), k_bytes, stage_v_.get(), v_bytes));
      }
    }
    KVCORE_ASSIGN_OR_RETURN(const KVViews views, pool_->views(layer, plan));
    const int from = lc.policy.kind == LayerPolicy::Kind::Shared ? lc.policy.source : layer;
    KVCORE_ASSIGN_OR_RETURN(const PoolLayer rows, pool_->layer(from));
    // The queries as float32, [H_q][T][d].
    const std::size_t nq = at(n_q_heads_) * at(T) * at(d);
    for (std::size_t i = 0; i < nq; ++i) q_[i] = quant_detail::load(io_type, static_cast<const unsigned char*>(q), i);
    attend(layer, views, rows.k_row_bytes, rows.v_row_bytes, T, scale, out_type, static_cast<unsigned char*>(out));
    return Error::Ok;
  }

  // `n` consecutive rows of a span as float32 values: in place when the pool stores float32,
  // else widened or dequantized into `buf` (n x heads x dim floats).
  const float* rows_as_float(const unsigned char* rows, std::size_t row_bytes, int n, int heads, int dim,
                             float* buf) const noexcept {
    if (kv_dtype_ == DType::Float32) return reinterpret_cast<const float*>(rows);
    if (is_quantized(kv_dtype_)) {
      dequantize_rows(kv_dtype_, heads, dim, rows, n, DType::Float32, buf);
    } else {
      const std::size_t per_row = at(heads) * at(dim);
      for (int r = 0; r < n; ++r) {
        for (std::size_t i = 0; i < per_row; ++i) buf[at(r) * per_row + i] = quant_detail::load(kv_dtype_, rows + row_bytes * at(r), i);
      }
    }
    return buf;
  }

  static float dot(const float* a, const float* b, std::size_t n) noexcept {
    float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;  // four chains the compiler can vectorize
    std::size_t e = 0;
    for (; e + 4 <= n; e += 4) {
      s0 += a[e] * b[e];
      s1 += a[e + 1] * b[e + 1];
      s2 += a[e + 2] * b[e + 2];
      s3 += a[e + 3] * b[e + 3];
    }
    for (; e < n; ++e) s0 += a[e] * b[e];
    return (s0 + s1) + (s2 + s3);
  }

  // Softmax attention of each (query head, token) over the rows its position sees, blocks of
  // kBlock rows at a time in the order the views give them (position order): each block is
  // widened once if need be, and each query's running max, sum and weighted values are
  // rescaled once per block (online softmax).
  void attend(int layer, const KVViews& views, std::size_t k_row_bytes, std::size_t v_row_bytes, int T,
              float scale, DType out_type, unsigned char* out) noexcept {
    const LayerConfig& lc = shape_[at(layer)];
    const LayerPolicy& policy = policy_[at(layer)];
    const int hkv = lc.n_kv_heads, hq = n_q_heads_, group = hq / hkv;
    const std::size_t D = at(lc.head_dim), DV = at(lc.value_dim());
    const std::size_t n_acc = at(hq) * at(T);
    const float minus_inf = -std::numeric_limits<float>::infinity();
    // Per (head, token): running max, running sum, then DV weighted values.
    float* acc = acc_.get();
    for (std::size_t i = 0; i < n_acc; ++i) {
      float* a = acc + i * (DV + 2);
      a[0] = minus_inf;
      a[1] = 0.0f;
      for (std::size_t e = 0; e < DV; ++e) a[2 + e] = 0.0f;
    }
    float* score = score_.get();
    for (int s = 0; s < views.n; ++s) {
      const KVSpan& span = views.span[s];
      for (int r0 = 0; r0 < span.run.len; r0 += kBlock) {
        const int n = span.run.len - r0 < kBlock ? span.run.len - r0 : kBlock;
        const int pos0 = span.run.pos + r0;
        // Skip a block no query of the step sees (a ring's rows the window left behind).
        bool seen = false;
        for (int t = 0; t < T && !seen; ++t) {
          for (int j = 0; j < n && !seen; ++j) seen = policy.sees(step_.position + t, pos0 + j);
        }
        if (!seen) continue;
        const float* kb = rows_as_float(span.k + k_row_bytes * at(r0), k_row_bytes, n, hkv, lc.head_dim, kblock_.get());
        const float* vb = rows_as_float(span.v + v_row_bytes * at(r0), v_row_bytes, n, hkv, lc.value_dim(), vblock_.get());
        for (int t = 0; t < T; ++t) {
          const int qpos = step_.position + t;
          for (int h = 0; h < hq; ++h) {
            const float* qv = q_.get() + (at(h) * at(T) + at(t)) * D;
            const std::size_t kh = at(h / group);
            float best = minus_inf;
            for (int j = 0; j < n; ++j) {
              if (!policy.sees(qpos, pos0 + j)) {
                score[j] = minus_inf;
                continue;
              }
              score[j] = dot(qv, kb + (at(j) * at(hkv) + kh) * D, D) * scale;
              if (score[j] > best) best = score[j];
            }
            if (best == minus_inf) continue;  // this query sees none of the block
            float* a = acc + (at(h) * at(T) + at(t)) * (DV + 2);
            if (best > a[0]) {
              const float shrink = std::exp(a[0] - best);  // exp(-inf) = 0 on the first block seen
              a[1] *= shrink;
              for (std::size_t e = 0; e < DV; ++e) a[2 + e] *= shrink;
              a[0] = best;
            }
            for (int j = 0; j < n; ++j) {
              if (score[j] == minus_inf) continue;
              const float w = std::exp(score[j] - a[0]);
              a[1] += w;
              const float* vv = vb + (at(j) * at(hkv) + kh) * DV;
              for (std::size_t e = 0; e < DV; ++e) a[2 + e] += w * vv[e];
            }
          }
        }
      }
    }
    // Every query sees at least itself, so each sum is >= 1.
    for (std::size_t i = 0; i < n_acc; ++i) {
      const float* a = acc + i * (DV + 2);
      const float inv = 1.0f / a[1];
      for (std::size_t e = 0; e < DV; ++e) quant_detail::store(out_type, out, i * DV + e, a[2 + e] * inv);
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
  std::unique_ptr<unsigned char[]> stage_k_, stage_v_;  // a step's K/V rows, [T][H][dim]
  std::unique_ptr<float[]> kblock_, vblock_;            // kBlock K and V rows, widened
  std::unique_ptr<float[]> score_;                      // one query's scores over a block
  std::unique_ptr<float[]> q_;                          // the step's queries, [H_q][T][d]
  std::unique_ptr<float[]> acc_;                        // softmax accumulators, [H_q][T][2 + dv]
  DType kv_dtype_ = DType::Float32;
  int n_layers_ = 0;
  int n_q_heads_ = 0;
  int max_step_ = 0;
  int n_served_ = 0;
  bool active_ = false;    // a step is begun (layer 0 served or serving)
  bool complete_ = false;  // ... and every layer served: committed by what comes next
  Step step_;
};

}  // namespace et
}  // namespace kvcore
