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
// With more than one thread the layer's work is cut into tasks (attend_partition.h:
// ranges of key blocks, each a partial softmax merged after, then ranges of query
// items) run by the session's own WorkerPool (worker_pool.h), the calling thread
// working too; one thread is the single-task path.
// Everything is allocated by create() / set_threads(); a step allocates nothing.
// Not thread-safe: one runtime thread drives a session (its workers are its own).
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
#include "attend_partition.h"
#include "attend_rows.h"
#include "worker_pool.h"

namespace kvcore {
namespace et {

class AttendSession {
 public:
  /// A session for `config` (kvcore's rules, docs/design.md section 2; State
  /// layers are refused: the op carries attention only) storing K/V as
  /// `kv_dtype` (Float32, Float16, BFloat16, QInt8 or Fp8E4M3), attended by
  /// `n_q_heads` query heads (a positive multiple of every layer's n_kv_heads).
  /// Allocates the planner, one arena holding every layer's rows at full size,
  /// and the per-step workspaces (staged K/V of max_step tokens, the queries of
  /// max_step tokens), then set_threads(`threads`) (0: the processors online).
  /// InvalidArgument: the config breaks a rule (the message names it), has a
  /// State layer, or `kv_dtype` / `n_q_heads` / `threads` is not one of the above.
  /// MemoryAllocationFailed: an allocation failed (nothing kept).
  static Result<std::unique_ptr<AttendSession>> create(const CacheConfig& config, int n_q_heads,
                                                       DType kv_dtype = DType::Float32, int threads = 0) noexcept {
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
    std::size_t stage = 0, qbuf = 0;
    for (int l = 0; l < n; ++l) {
      const LayerConfig& lc = config.layer(l);
      s->shape_[at(l)] = lc;
      // A Shared layer sees what its source sees (the source holds the rows).
      const LayerPolicy& p = lc.policy;
      s->policy_[at(l)] = p.kind == LayerPolicy::Kind::Shared ? config.layer(p.source).policy : p;
      const std::size_t hk = at(lc.n_kv_heads), d = at(lc.head_dim), dv = at(lc.value_dim());
      const std::size_t widest = d > dv ? d : dv;
      if (T * hk * widest * 4 > stage) stage = T * hk * widest * 4;  // 4: the widest element
      if (at(kBlock) * hk * d > s->block_k_) s->block_k_ = at(kBlock) * hk * d;
      if (at(kBlock) * hk * dv > s->block_v_) s->block_v_ = at(kBlock) * hk * dv;
      if (T * hq * d > qbuf) qbuf = T * hq * d;
      if (T * hq * (dv + 2) > s->slot_) s->slot_ = T * hq * (dv + 2);
    }
    s->stage_k_.reset(new (std::nothrow) unsigned char[stage]);
    s->stage_v_.reset(new (std::nothrow) unsigned char[stage]);
    s->q_.reset(new (std::nothrow) float[qbuf]);
    KVCORE_CHECK_OR_RETURN_ERROR(s->stage_k_ && s->stage_v_ && s->q_, MemoryAllocationFailed,
                                 "AttendSession: cannot allocate the step workspaces");
    KVCORE_RETURN_IF_ERROR(s->set_threads(threads));
    return s;
  }

  /// Attends with `threads` workers from now on (0: the processors online; 1: the
  /// calling thread alone, no pool): starts a pool of threads - 1 threads (the previous
  /// pool's are stopped) and allocates each worker's widened K/V block and each key
  /// range's softmax accumulators (max_step x n_q_heads x (2 + v_head_dim) floats).
  /// Configuration time: allocates; no forward may be under way. InvalidArgument:
  /// `threads` outside [0, 256]. InvalidState: a forward is under way.
  /// MemoryAllocationFailed: an allocation or a thread start failed (the session keeps
  /// its previous threads).
  Status set_threads(int threads) noexcept {
    KVCORE_CHECK_OR_RETURN_ERROR(threads >= 0 && threads <= WorkerPool::kMaxWorkers, InvalidArgument,
                                 "threads = %d: must be in [0, %d] (0: one per processor online)", threads,
                                 WorkerPool::kMaxWorkers);
    KVCORE_CHECK_OR_RETURN_ERROR(!in_forward(), InvalidState,
                                 "set_threads(%d) during a forward: change the threads between forwards", threads);
    const int workers = WorkerPool::resolve(threads);
    const std::size_t w = at(workers);
    std::unique_ptr<float[]> kblock(new (std::nothrow) float[w * block_k_]);
    std::unique_ptr<float[]> vblock(new (std::nothrow) float[w * block_v_]);
    std::unique_ptr<float[]> score(new (std::nothrow) float[w * at(kBlock)]);
    std::unique_ptr<float[]> acc(new (std::nothrow) float[w * slot_]);  // also kTasksPerWorker small steps' slots
    KVCORE_CHECK_OR_RETURN_ERROR(kblock && vblock && score && acc, MemoryAllocationFailed,
                                 "AttendSession: cannot allocate the workspaces of %d workers", workers);
    std::unique_ptr<WorkerPool> pool;
    if (workers > 1) {
      KVCORE_ASSIGN_OR_RETURN(pool, WorkerPool::create(workers));
    }
    pool_threads_ = static_cast<std::unique_ptr<WorkerPool>&&>(pool);
    kblock_ = static_cast<std::unique_ptr<float[]>&&>(kblock);
    vblock_ = static_cast<std::unique_ptr<float[]>&&>(vblock);
    score_ = static_cast<std::unique_ptr<float[]>&&>(score);
    acc_ = static_cast<std::unique_ptr<float[]>&&>(acc);
    workers_ = workers;
    return Error::Ok;
  }

  /// The default least work of a task: about 50 us of one core, more than a sleeping
  /// worker takes to wake.
  static constexpr std::size_t kMinTaskWork = std::size_t{1} << 17;

  /// Sets the least work (multiply-adds) worth a task of its own: a layer's attention is
  /// cut into at most work / min_task_work tasks (0: one per worker whatever the size;
  /// tests use it to cut tiny shapes). Default kMinTaskWork.
  void set_min_task_work(std::size_t min_task_work) noexcept { min_task_work_ = min_task_work; }

  /// Workers attending (the calling thread counted).
  int threads() const noexcept { return workers_; }
  /// How the last layer attended was cut into tasks (tests and tuning).
  const AttendPartition& last_partition() const noexcept { return last_partition_; }

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

  Status serve(int layer, DType io_type, const void* q, const void* k, const void* v, int T, float scale,
               DType out_type, void* out) noexcept {
    const LayerConfig& lc = shape_[at(layer)];
    const int hkv = lc.n_kv_heads, d = lc.head_dim, dv = lc.value_dim();
    KVCORE_ASSIGN_OR_RETURN(const SeqStepPlan plan, cache_->plan(layer, step_));
    if (lc.policy.kind != LayerPolicy::Kind::Shared) {
      // Quantized rows are quantized from the input's own type; plain rows are staged in the pool's.
      const DType staged = is_quantized(kv_dtype_) ? io_type : kv_dtype_;
      attend_rows::stage(io_type, k, hkv, T, d, staged, stage_k_.get());
      attend_rows::stage(io_type, v, hkv, T, dv, staged, stage_v_.get());
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

  // One layer's attention, the job of the workers' tasks.
  struct Job {
    AttendSession* self;
    int layer, T;
    const KVViews* views;
    std::size_t k_row_bytes, v_row_bytes;
    float scale;
    std::size_t slot;  // floats of a key range's accumulators
    AttendPartition part;
  };

  static void run_task(void* context, int task, int worker) noexcept {
    const Job& job = *static_cast<const Job*>(context);
    int i0, i1, b0, b1;
    job.part.item_range(task, &i0, &i1);
    job.part.block_range(task, &b0, &b1);
    job.self->attend_part(job, i0, i1, b0, b1, job.part.k_part(task), worker);
  }

  // Softmax attention of each (query head, token) over the rows its position sees, cut into
  // tasks (attend_partition.h) whose key ranges' partial softmaxes are merged in order, then
  // normalized into `out`. One task is the whole layer in one key range.
  void attend(int layer, const KVViews& views, std::size_t k_row_bytes, std::size_t v_row_bytes, int T,
              float scale, DType out_type, unsigned char* out) noexcept {
    const LayerConfig& lc = shape_[at(layer)];
    const std::size_t DV = at(lc.value_dim()), n_acc = at(n_q_heads_) * at(T);
    int blocks = 0;
    for (int s = 0; s < views.n; ++s) blocks += (views.span[s].run.len + kBlock - 1) / kBlock;
    const std::size_t work = n_acc * at(blocks) * at(kBlock) * (at(lc.head_dim) + DV);
    // A key range's slot is this step's accumulators: as many fit as the workers' slots hold.
    const std::size_t stride = n_acc * (DV + 2);
    const std::size_t fit = at(workers_) * slot_ / stride;
    Job job{this, layer, T, &views, k_row_bytes, v_row_bytes, scale, stride,
            AttendPartition::choose(workers_, static_cast<int>(n_acc), blocks, work, min_task_work_,
                                    fit > 1024 ? 1024 : static_cast<int>(fit))};
    last_partition_ = job.part;
    if (job.part.tasks() == 1 || !pool_threads_) {
      for (int t = 0; t < job.part.tasks(); ++t) run_task(&job, t, 0);
    } else {
      pool_threads_->run(job.part.tasks(), &AttendSession::run_task, &job);
    }
    float* acc = acc_.get();
    for (std::size_t i = 0; i < n_acc; ++i) {
      float* a = acc + i * (DV + 2);
      if (job.part.k_parts > 1) AttendPartition::merge(a, job.slot, job.part.k_parts, DV, a);
      // Every query sees at least itself, so each sum is >= 1.
      const float inv = 1.0f / a[1];
      for (std::size_t e = 0; e < DV; ++e) quant_detail::store(out_type, out, i * DV + e, a[2 + e] * inv);
    }
  }

  // Items [i0, i1) (item = head * T + token) over key blocks [b0, b1) (kBlock rows each, in
  // the views' position order), into key-range slot `slot`, with worker `worker`'s buffers:
  // each block is widened once if need be, and each item's running max, sum and weighted
  // values are rescaled once per block (online softmax).
  void attend_part(const Job& job, int i0, int i1, int b0, int b1, int slot, int worker) noexcept {
    const LayerConfig& lc = shape_[at(job.layer)];
    const LayerPolicy& policy = policy_[at(job.layer)];
    const int hkv = lc.n_kv_heads, group = n_q_heads_ / hkv, T = job.T;
    const std::size_t D = at(lc.head_dim), DV = at(lc.value_dim());
    const float minus_inf = -std::numeric_limits<float>::infinity();
    // Per item: running max, running sum, then DV weighted values.
    float* acc = acc_.get() + at(slot) * job.slot;
    for (int i = i0; i < i1; ++i) {
      float* a = acc + at(i) * (DV + 2);
      a[0] = minus_inf;
      a[1] = 0.0f;
      for (std::size_t e = 0; e < DV; ++e) a[2 + e] = 0.0f;
    }
    float* score = score_.get() + at(worker) * at(kBlock);
    float* kbuf = kblock_.get() + at(worker) * block_k_;
    float* vbuf = vblock_.get() + at(worker) * block_v_;
    int b = 0;
    for (int s = 0; s < job.views->n && b < b1; ++s) {
      const KVSpan& span = job.views->span[s];
      for (int r0 = 0; r0 < span.run.len && b < b1; r0 += kBlock, ++b) {
        if (b < b0) continue;
        const int n = span.run.len - r0 < kBlock ? span.run.len - r0 : kBlock;
        const int pos0 = span.run.pos + r0;
        // Skip a block no query of the step sees (a ring's rows the window left behind).
        bool seen = false;
        for (int t = 0; t < T && !seen; ++t) {
          for (int j = 0; j < n && !seen; ++j) seen = policy.sees(step_.position + t, pos0 + j);
        }
        if (!seen) continue;
        const float* kb = attend_rows::as_float(kv_dtype_, span.k + job.k_row_bytes * at(r0), job.k_row_bytes, n, hkv, lc.head_dim, kbuf);
        const float* vb = attend_rows::as_float(kv_dtype_, span.v + job.v_row_bytes * at(r0), job.v_row_bytes, n, hkv, lc.value_dim(), vbuf);
        for (int i = i0; i < i1; ++i) {
          const int h = i / T, qpos = step_.position + i % T;
          const float* qv = q_.get() + at(i) * D;
          const std::size_t kh = at(h / group);
          float best = minus_inf;
          for (int j = 0; j < n; ++j) {
            if (!policy.sees(qpos, pos0 + j)) {
              score[j] = minus_inf;
              continue;
            }
            score[j] = attend_rows::dot(qv, kb + (at(j) * at(hkv) + kh) * D, D) * job.scale;
            if (score[j] > best) best = score[j];
          }
          if (best == minus_inf) continue;  // this query sees none of the block
          float* a = acc + at(i) * (DV + 2);
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
  std::unique_ptr<float[]> kblock_, vblock_;            // per worker: kBlock K and V rows, widened
  std::unique_ptr<float[]> score_;                      // per worker: one query's scores over a block
  std::unique_ptr<float[]> q_;                          // the step's queries, [H_q][T][d]
  std::unique_ptr<float[]> acc_;                        // per key range: accumulators, [H_q][T][2 + dv]
  std::unique_ptr<WorkerPool> pool_threads_;            // null with one worker
  std::size_t block_k_ = 0, block_v_ = 0, slot_ = 0;    // floats of a worker's blocks, of a slot
  std::size_t min_task_work_ = kMinTaskWork;
  AttendPartition last_partition_;
  int workers_ = 1;
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
