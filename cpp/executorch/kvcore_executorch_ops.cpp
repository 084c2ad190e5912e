// kvcore_executorch_ops: ExecuTorch's `kvcache::update_and_attend.out` kernel,
// backed by kvcore (AttendSession: kvcore's planner and byte layer), registered
// with EXECUTORCH_LIBRARY into the runtime this library is linked against (the
// executorch wheel's libexecutorch.so). Loading the library registers the
// kernel: dlopen(RTLD_GLOBAL) into a process running ExecuTorch's Python
// runtime, or link it (whole) into a C++ runner.
//
// The op's schema (the out variant of executorch/extension/llm/cache/update_and_attend.py):
//   kvcache::update_and_attend.out(Tensor q, Tensor k, Tensor v, Tensor position,
//       SymInt layer_id, float scale, ScalarType out_dtype, *, Tensor(a!) out) -> Tensor(a!)
//
// The cache the op serves is process-global and configured through the C API
// below (kvcore_et_configure, from the program's kvcore metadata: see
// python/kvcore/integrations/executorch_runtime.py). Errors are returned to the
// runtime as ExecuTorch Errors (ctx.fail: the method's execute returns it) with
// kvcore's message sent to ET_LOG and kept for kvcore_et_last_error().
//
// Supported now: batch 1; q/k/v and out in float32, float16 or bfloat16; K/V stored
// as float32, float16, bfloat16, int8 (ExecuTorch's QuantizedKVCache rule) or fp8;
// Flat, Ring (with sinks), Chunked and Shared layers. Built with -fno-exceptions
// -fno-rtti; a step allocates nothing. Attention runs on the session's own worker
// threads (kvcore_et_set_threads; default one per processor online), started when
// the cache is configured; the op itself is called by one runtime thread at a time.
#include <executorch/extension/kernel_util/make_boxed_from_unboxed_functor.h>
#include <executorch/runtime/core/exec_aten/util/tensor_util.h>
#include <executorch/runtime/kernel/kernel_includes.h>
#include <executorch/runtime/platform/log.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <new>

#include "attend_session.h"
#include "kvcore/adapters/executorch.h"

#define KVCORE_ET_API extern "C" __attribute__((visibility("default")))

namespace {

using ::executorch::aten::ScalarType;
using ::executorch::aten::SizesType;
using ::executorch::aten::Tensor;
using ::executorch::runtime::Error;
using ::executorch::runtime::KernelRuntimeContext;
using kvcore::Status;
using kvcore::et::AttendSession;

std::unique_ptr<AttendSession> g_session;  // the cache the op serves (null: not configured)
int g_threads = 0;                         // attention workers of caches configured (0: processors online)
kvcore::Message g_last_error;              // the message of the last failure, for kvcore_et_last_error()

// Keeps `status`'s message, logs it (ET_LOG, Error) and returns its ExecuTorch code.
Error report(const Status& status) noexcept {
  g_last_error = status.message();
  return kvcore::et::to_executorch(status);
}

// kvcore's element type of an ExecuTorch scalar type: float32, float16, bfloat16; else false.
bool element_type(ScalarType type, kvcore::DType* out) noexcept {
  switch (type) {
    case ScalarType::Float: *out = kvcore::DType::Float32; return true;
    case ScalarType::Half: *out = kvcore::DType::Float16; return true;
    case ScalarType::BFloat16: *out = kvcore::DType::BFloat16; return true;
    default: return false;
  }
}

Status check_tensor(const Tensor& t, const char* name, int dims, kvcore::DType* type) noexcept {
  KVCORE_CHECK_OR_RETURN_ERROR(element_type(t.scalar_type(), type), NotSupported,
                               "update_and_attend: %s is %s: kvcore's kernel takes float32, float16 or bfloat16",
                               name, ::executorch::runtime::toString(t.scalar_type()));
  KVCORE_CHECK_OR_RETURN_ERROR(t.dim() == dims, InvalidArgument, "update_and_attend: %s has %d dims, needs %d",
                               name, static_cast<int>(t.dim()), dims);
  KVCORE_CHECK_OR_RETURN_ERROR(::executorch::runtime::tensor_is_default_dim_order(t), NotSupported,
                               "update_and_attend: %s is not contiguous in its default dim order", name);
  return kvcore::Error::Ok;
}

// Checks the op's operands against the session, resizes `out`, runs the layer.
Status run(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& position, std::int64_t layer_id,
           double scale, ScalarType out_dtype, Tensor& out) noexcept {
  KVCORE_CHECK_OR_RETURN_ERROR(g_session != nullptr, InvalidState,
                               "update_and_attend: no kvcore cache is configured: call kvcore_et_configure "
                               "(KernelLibrary.configure in kvcore.integrations.executorch_runtime) with the "
                               "program's metadata before running it");
  AttendSession& s = *g_session;
  KVCORE_CHECK_OR_RETURN_ERROR(layer_id >= 0 && layer_id < s.n_layers(), InvalidArgument,
                               "update_and_attend: layer_id = %d: must be in [0, n_layers = %d) of the configured "
                               "cache",
                               static_cast<long long>(layer_id), s.n_layers());
  kvcore::DType q_type, k_type, v_type, out_type;
  KVCORE_RETURN_IF_ERROR(check_tensor(q, "q", 4, &q_type));
  KVCORE_RETURN_IF_ERROR(check_tensor(k, "k", 4, &k_type));
  KVCORE_RETURN_IF_ERROR(check_tensor(v, "v", 4, &v_type));
  KVCORE_RETURN_IF_ERROR(check_tensor(out, "out", 4, &out_type));
  KVCORE_CHECK_OR_RETURN_ERROR(q_type == k_type && k_type == v_type, NotSupported,
                               "update_and_attend: q, k, v of %s, %s, %s: kvcore's kernel takes one type for all three",
                               kvcore::to_string(q_type), kvcore::to_string(k_type), kvcore::to_string(v_type));
  KVCORE_CHECK_OR_RETURN_ERROR(out.scalar_type() == out_dtype, InvalidArgument,
                               "update_and_attend: out_dtype %s but out is %s",
                               ::executorch::runtime::toString(out_dtype),
                               ::executorch::runtime::toString(out.scalar_type()));
  KVCORE_CHECK_OR_RETURN_ERROR(q.size(0) == 1 && k.size(0) == 1 && v.size(0) == 1, NotSupported,
                               "update_and_attend: batch %d: kvcore's kernel serves one sequence (batch 1)",
                               static_cast<int>(q.size(0)));
  const int layer = static_cast<int>(layer_id);
  const kvcore::LayerConfig& lc = s.layer_config(layer);
  const int T = static_cast<int>(q.size(2));
  KVCORE_CHECK_OR_RETURN_ERROR(
      k.size(1) == lc.n_kv_heads && k.size(2) == T && k.size(3) == lc.head_dim && q.size(3) == lc.head_dim &&
          v.size(1) == lc.n_kv_heads && v.size(2) == T && v.size(3) == lc.value_dim(),
      InvalidArgument,
      "update_and_attend: layer %d: q [1, %d, %d, %d], k [1, %d, %d, %d], v [1, %d, %d, %d] do not match the "
      "configured n_kv_heads = %d, head_dim = %d, v_head_dim = %d",
      layer, static_cast<int>(q.size(1)), T, static_cast<int>(q.size(3)), static_cast<int>(k.size(1)),
      static_cast<int>(k.size(2)), static_cast<int>(k.size(3)), static_cast<int>(v.size(1)),
      static_cast<int>(v.size(2)), static_cast<int>(v.size(3)), lc.n_kv_heads, lc.head_dim, lc.value_dim());
  KVCORE_CHECK_OR_RETURN_ERROR(position.dim() == 2 && position.size(0) == T && position.size(1) >= 1 &&
                                   ::executorch::runtime::tensor_is_default_dim_order(position),
                               InvalidArgument,
                               "update_and_attend: position must be a contiguous [q_len = %d, n] tensor", T);
  KVCORE_CHECK_OR_RETURN_ERROR(position.scalar_type() == ScalarType::Long, NotSupported,
                               "update_and_attend: position is %s: kvcore's kernel takes int64 positions",
                               ::executorch::runtime::toString(position.scalar_type()));
  const SizesType sizes[4] = {1, static_cast<SizesType>(q.size(1)), static_cast<SizesType>(T),
                              static_cast<SizesType>(lc.value_dim())};
  const Error resized = ::executorch::runtime::resize_tensor(out, {sizes, 4});
  KVCORE_CHECK_OR_RETURN_ERROR(resized == Error::Ok, InvalidArgument,
                               "update_and_attend: out cannot be resized to [1, %d, %d, %d] (its upper bound "
                               "is smaller)",
                               static_cast<int>(sizes[1]), T, lc.value_dim());
  return s.update_and_attend(layer, q_type, q.const_data_ptr(), static_cast<int>(q.size(1)), k.const_data_ptr(),
                             v.const_data_ptr(), position.const_data_ptr<std::int64_t>(),
                             static_cast<int>(position.size(1)), T, static_cast<float>(scale), out_type,
                             out.mutable_data_ptr());
}

/// `kvcache::update_and_attend.out`: writes this forward's K/V of `layer_id`
/// into kvcore's cache and attends `q` over what each query may see, into `out`
/// ([1, H_q, q_len, v_head_dim], of out_dtype). A failure sets the context's failure
/// state to kvcore's code (InvalidArgument, InvalidState, NotSupported,
/// OutOfResources ...) and logs kvcore's message; the forward's step is aborted
/// (a complete forward is committed by the next one's layer 0, so a program
/// calling a layer the configured cache does not have changes nothing).
Tensor& update_and_attend_out(KernelRuntimeContext& ctx, const Tensor& q, const Tensor& k, const Tensor& v,
                              const Tensor& position, std::int64_t layer_id, double scale, ScalarType out_dtype,
                              Tensor& out) {
  const Status status = run(q, k, v, position, layer_id, scale, out_dtype, out);
  if (!status.ok()) {
    if (g_session) g_session->abort_forward();  // the forward changes nothing (the session aborts its own)
    ctx.fail(report(status));
  }
  return out;
}

}  // namespace

EXECUTORCH_LIBRARY(kvcache, "update_and_attend.out", update_and_attend_out);

/// Layer kinds of kvcore_et_configure's `kinds` (kvcore::LayerPolicy::Kind).
/// 0 Flat, 1 Ring (window, sinks), 2 Chunked (window = chunk), 3 Shared (source).
///
/// Configures (or replaces) the cache the op serves: `n_layers` layers, each
/// `kinds[l]` with `windows[l]`, `sinks[l]`, `sources[l]` (null arrays: zeros),
/// `n_kv_heads` x `head_dim` keys and `v_head_dim` (0: head_dim) values per
/// token, attended by `n_q_heads` query heads (a multiple of n_kv_heads);
/// `capacity` positions at most; `max_step` tokens per forward at most (0:
/// min(512, capacity)); K/V stored as `kv_dtype` (kvcore::DType: 0 float32, 1
/// float16, 2 bfloat16, 5 int8 as ExecuTorch's QuantizedKVCache, 6 fp8 e4m3).
/// Allocates every layer's rows now (a ring layer holds window + max_step - 1
/// rows). Returns 0 (Ok) or ExecuTorch's / kvcore's error code (InvalidArgument
/// 0x12: the message, from kvcore_et_last_error(), names the field and the rule;
/// MemoryAllocationFailed 0x21); on error the previous cache is kept.
KVCORE_ET_API int kvcore_et_configure(int n_layers, const int* kinds, const int* windows, const int* sinks,
                                      const int* sources, int n_kv_heads, int head_dim, int v_head_dim,
                                      int n_q_heads, int capacity, int max_step, int kv_dtype) {
  if (n_layers < 1 || n_layers > kvcore::CacheConfig::kMaxLayers || kinds == nullptr) {
    return static_cast<int>(report(Status::make(kvcore::Error::InvalidArgument,
                                                "kvcore_et_configure: n_layers = %d: must be in [1, %d] with "
                                                "a kinds array",
                                                n_layers, kvcore::CacheConfig::kMaxLayers)));
  }
  kvcore::CacheConfig config;
  config.capacity = capacity;
  config.n_layers = n_layers;
  config.max_step = max_step;
  config.initial_capacity = capacity > 0 ? capacity : 1;
  config.layers.resize(static_cast<std::size_t>(n_layers));  // configuration time: may allocate
  for (int l = 0; l < n_layers; ++l) {
    kvcore::LayerConfig& lc = config.layers[static_cast<std::size_t>(l)];
    lc.policy.kind = static_cast<kvcore::LayerPolicy::Kind>(kinds[l]);
    lc.policy.window = windows ? windows[l] : 0;
    lc.policy.sinks = sinks ? sinks[l] : 0;
    lc.policy.source = sources ? sources[l] : 0;
    lc.n_kv_heads = n_kv_heads;
    lc.head_dim = head_dim;
    lc.v_head_dim = v_head_dim;
  }
  auto made = AttendSession::create(config, n_q_heads, static_cast<kvcore::DType>(kv_dtype), g_threads);
  if (!made.ok()) return static_cast<int>(report(made.status()));
  g_session = std::move(made).get();
  g_last_error = kvcore::Message{};
  return 0;
}

/// Attends with `threads` workers (the calling runtime thread and threads - 1 threads of
/// the cache's own; 0: one per processor online, the default; 1: no threads), for the
/// configured cache (its threads restarted now) and those configured later. Returns 0,
/// or InvalidArgument (0x12: threads outside [0, 256]), InvalidState (0x2: a forward is
/// under way) or MemoryAllocationFailed (0x21); on error nothing changes.
KVCORE_ET_API int kvcore_et_set_threads(int threads) {
  if (g_session) {
    const Status status = g_session->set_threads(threads);
    if (!status.ok()) return static_cast<int>(report(status));
  } else if (threads < 0 || threads > kvcore::et::WorkerPool::kMaxWorkers) {
    return static_cast<int>(report(Status::make(kvcore::Error::InvalidArgument,
                                                "threads = %d: must be in [0, %d] (0: one per processor online)",
                                                threads, kvcore::et::WorkerPool::kMaxWorkers)));
  }
  g_threads = threads;
  return 0;
}

/// The least work (multiply-adds) worth a task of its own in the configured cache's
/// attention (0: one task per worker whatever the size, as tests use to cut a tiny model's
/// layers; default kvcore::et::AttendSession::kMinTaskWork). 0, InvalidState (0x2) when no
/// cache is configured, or InvalidArgument (0x12) for a negative count.
KVCORE_ET_API int kvcore_et_set_min_task_work(long long multiply_adds) {
  if (!g_session) {
    return static_cast<int>(report(Status::make(kvcore::Error::InvalidState,
                                                "kvcore_et_set_min_task_work(%lld): no cache configured", multiply_adds)));
  }
  if (multiply_adds < 0) {
    return static_cast<int>(report(Status::make(kvcore::Error::InvalidArgument,
                                                "kvcore_et_set_min_task_work(%lld): must be >= 0", multiply_adds)));
  }
  g_session->set_min_task_work(static_cast<std::size_t>(multiply_adds));
  return 0;
}

/// Attention workers of the configured cache (the calling thread counted), or of the next
/// one configured when none is (0: one per processor online).
KVCORE_ET_API int kvcore_et_threads(void) { return g_session ? g_session->threads() : g_threads; }

/// Length 0: the next forward starts at position 0. 0, or InvalidState (0x2)
/// when no cache is configured.
KVCORE_ET_API int kvcore_et_reset(void) {
  if (!g_session) {
    return static_cast<int>(report(Status::make(kvcore::Error::InvalidState, "kvcore_et_reset: no cache configured")));
  }
  g_session->reset();
  return 0;
}

/// Back to `length` tokens (speculative decoding's rewind). 0, or kvcore's code
/// (InvalidArgument: outside [0, length]; InvalidState: a ring layer no longer
/// holds that history, or no cache configured); nothing changes on error.
KVCORE_ET_API int kvcore_et_rewind(int length) {
  if (!g_session) {
    return static_cast<int>(report(Status::make(kvcore::Error::InvalidState, "kvcore_et_rewind: no cache configured")));
  }
  const Status status = g_session->rewind(length);
  return status.ok() ? 0 : static_cast<int>(report(status));
}

/// Positions cached (a complete forward's included), or -1 when no cache is configured.
KVCORE_ET_API int kvcore_et_length(void) { return g_session ? g_session->length() : -1; }

/// Bytes of the configured cache's K/V arena (allocated once, in its kv_dtype), or 0 when none.
KVCORE_ET_API long long kvcore_et_nbytes(void) {
  return g_session ? static_cast<long long>(g_session->arena_bytes()) : 0;
}

/// The message of the last failure (configure, rewind or the op), "" when the
/// last configure succeeded and nothing failed since. Valid until the next call.
KVCORE_ET_API const char* kvcore_et_last_error(void) { return g_last_error.c_str(); }

/// Drops the configured cache (its memory goes back); the op then fails with
/// InvalidState until kvcore_et_configure is called again.
KVCORE_ET_API void kvcore_et_release(void) { g_session.reset(); }
