// AttendSession (the state behind kvcore_executorch_ops' update_and_attend kernel)
// against a brute-force reference: every layer kind (Flat, Ring with sinks, Ring,
// Chunked, Shared), GQA, a value dim other than the key dim, chunked prefills,
// decodes past every window, rewinds; no allocation per step; refusals change
// nothing; with threads, every kind and type against the single-thread session
// (bit for bit while only query items are split, within float rounding once key
// ranges are merged). Built without ExecuTorch (the session knows nothing of it),
// under -fno-exceptions -fno-rtti.
#include <gtest/gtest.h>

#include <atomic>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "attend_session.h"
#include "support/counting_new.h"

namespace {

using kvcore::CacheConfig;
using kvcore::Error;
using kvcore::LayerConfig;
using kvcore::LayerPolicy;
using kvcore::et::AttendSession;

constexpr int kHeads = 4, kKvHeads = 2, kDim = 4, kVDim = 3, kMaxStep = 4, kCapacity = 200;

CacheConfig five_kinds() {
  CacheConfig c;
  c.capacity = kCapacity;
  c.n_layers = 5;
  c.max_step = kMaxStep;
  for (LayerPolicy p : {LayerPolicy::flat(), LayerPolicy::ring(5, 2), LayerPolicy::chunked(4),
                        LayerPolicy::shared(1), LayerPolicy::ring(6)}) {
    c.layers.push_back(LayerConfig{p, kKvHeads, kDim, kVDim});
  }
  return c;
}

// Every position's K/V of a layer ([pos][head][dim]), as the model wrote them.
struct History {
  std::vector<float> k, v;
  void truncate(int n) {
    k.resize(static_cast<std::size_t>(n) * kKvHeads * kDim);
    v.resize(static_cast<std::size_t>(n) * kKvHeads * kVDim);
  }
};

// Softmax attention of q ([H][T][D]) at positions P.. over what `policy` lets each see, in double.
std::vector<float> reference(const LayerPolicy& policy, const History& h, const std::vector<float>& q, int P,
                             int T, float scale) {
  std::vector<float> out(static_cast<std::size_t>(kHeads) * T * kVDim);
  for (int hq = 0; hq < kHeads; ++hq) {
    const int kh = hq / (kHeads / kKvHeads);
    for (int t = 0; t < T; ++t) {
      const int qpos = P + t;
      std::vector<double> w(static_cast<std::size_t>(qpos + 1), 0.0);
      double best = -1e300;
      for (int k = 0; k <= qpos; ++k) {
        if (!policy.sees(qpos, k)) continue;
        double dot = 0;
        for (int e = 0; e < kDim; ++e)
          dot += static_cast<double>(q[(static_cast<std::size_t>(hq) * T + t) * kDim + e]) *
                 h.k[(static_cast<std::size_t>(k) * kKvHeads + kh) * kDim + e];
        w[k] = dot * scale;
        if (w[k] > best) best = w[k];
      }
      double sum = 0;
      std::vector<double> o(kVDim, 0.0);
      for (int k = 0; k <= qpos; ++k) {
        if (!policy.sees(qpos, k)) continue;
        const double e = std::exp(w[k] - best);
        sum += e;
        for (int d = 0; d < kVDim; ++d) o[d] += e * h.v[(static_cast<std::size_t>(k) * kKvHeads + kh) * kVDim + d];
      }
      for (int d = 0; d < kVDim; ++d)
        out[(static_cast<std::size_t>(hq) * T + t) * kVDim + d] = static_cast<float>(o[d] / sum);
    }
  }
  return out;
}

// Values as `type` stores them: float32 as is, float16 / bfloat16 rounded.
float as_stored(kvcore::DType type, float x) {
  unsigned char b[4];
  kvcore::quant_detail::store(type, b, 0, x);
  return kvcore::quant_detail::load(type, b, 0);
}

struct Driver {
  kvcore::DType kv_dtype = kvcore::DType::Float32;  // the session's storage
  kvcore::DType io = kvcore::DType::Float32;        // q/k/v in and the output out
  CacheConfig config = five_kinds();
  std::unique_ptr<AttendSession> session;
  std::vector<History> history = std::vector<History>(5);
  std::mt19937 rng{40};
  std::uniform_real_distribution<float> uniform{-1.0f, 1.0f};
  // Per-step buffers, sized once so that a step allocates nothing here either.
  std::vector<float> q = std::vector<float>(kHeads * kMaxStep * kDim), k = std::vector<float>(kKvHeads * kMaxStep * kDim),
                     v = std::vector<float>(kKvHeads * kMaxStep * kVDim), out = std::vector<float>(kHeads * kMaxStep * kVDim);
  std::vector<unsigned char> q_io = std::vector<unsigned char>(4 * q.size()), k_io = std::vector<unsigned char>(4 * k.size()),
                             v_io = std::vector<unsigned char>(4 * v.size()), out_io = std::vector<unsigned char>(4 * out.size());
  std::vector<std::int64_t> pos = std::vector<std::int64_t>(kMaxStep);
  float scale = 0.5f;
  int last_T = 0;  // the tokens of the last layer served: out holds kHeads x last_T x kVDim values
  std::uint64_t session_news = 0;  // operator new calls inside the session's steps and rewinds

  // `threads` workers; min_task_work 0 cuts even these tiny shapes into one task per worker.
  explicit Driver(kvcore::DType kv = kvcore::DType::Float32, kvcore::DType in_out = kvcore::DType::Float32,
                  int threads = 1, std::size_t min_task_work = AttendSession::kMinTaskWork)
      : kv_dtype(kv), io(in_out) {
    auto made = AttendSession::create(config, kHeads, kv_dtype, threads);
    EXPECT_TRUE(made.ok());
    session = std::move(made).get();
    session->set_min_task_work(min_task_work);
    for (History& h : history) {
      h.k.reserve(static_cast<std::size_t>(kCapacity) * kKvHeads * kDim);
      h.v.reserve(static_cast<std::size_t>(kCapacity) * kKvHeads * kVDim);
    }
  }

  // Random values the I/O type holds exactly, and their bytes in it.
  void fill(std::vector<float>& x, std::vector<unsigned char>& bytes, std::size_t n) {
    for (std::size_t i = 0; i < n; ++i) {
      x[i] = as_stored(io, uniform(rng));
      kvcore::quant_detail::store(io, bytes.data(), i, x[i]);
    }
  }

  // One layer of a forward of T tokens at P; appends its K/V ([H][T][D] -> [pos][H][D]) to the history.
  kvcore::Status layer(int l, int P, int T) {
    last_T = T;
    fill(q, q_io, static_cast<std::size_t>(kHeads) * T * kDim);
    fill(k, k_io, static_cast<std::size_t>(kKvHeads) * T * kDim);
    fill(v, v_io, static_cast<std::size_t>(kKvHeads) * T * kVDim);
    for (int t = 0; t < T; ++t) pos[static_cast<std::size_t>(t)] = P + t;
    const std::uint64_t before = kvcore_test::operator_news();
    const kvcore::Status s = session->update_and_attend(l, io, q_io.data(), kHeads, k_io.data(), v_io.data(),
                                                        pos.data(), 1, T, scale, io, out_io.data());
    session_news += kvcore_test::operator_news() - before;
    for (std::size_t i = 0; i < static_cast<std::size_t>(kHeads) * T * kVDim; ++i)
      out[i] = kvcore::quant_detail::load(io, out_io.data(), i);
    return s;
  }

  // Appends one token's row ([H][dim] values) as the storage keeps it.
  void keep(std::vector<float>& to, const std::vector<float>& row, int dim) {
    if (!kvcore::is_quantized(kv_dtype)) {
      for (float x : row) to.push_back(as_stored(kv_dtype, x));
      return;
    }
    unsigned char stored[256];
    float back[64];
    kvcore::quantize_row(kv_dtype, kKvHeads, dim, kvcore::DType::Float32, row.data(), stored);
    kvcore::dequantize_rows(kv_dtype, kKvHeads, dim, stored, 1, kvcore::DType::Float32, back);
    to.insert(to.end(), back, back + kKvHeads * dim);
  }

  void record(int l, int T) {
    History& h = history[static_cast<std::size_t>(l)];
    std::vector<float> kr, vr;
    for (int t = 0; t < T; ++t) {
      kr.clear();
      vr.clear();
      for (int hh = 0; hh < kKvHeads; ++hh) {
        for (int e = 0; e < kDim; ++e) kr.push_back(k[(static_cast<std::size_t>(hh) * T + t) * kDim + e]);
        for (int e = 0; e < kVDim; ++e) vr.push_back(v[(static_cast<std::size_t>(hh) * T + t) * kVDim + e]);
      }
      keep(h.k, kr, kDim);
      keep(h.v, vr, kVDim);
    }
  }

  // A whole forward, each layer's output checked against the reference.
  void forward(int T) {
    const int P = session->length();
    for (int l = 0; l < config.n_layers; ++l) checked_layer(l, P, T);
  }

  // One layer of a forward of T tokens at P, its output checked against the reference.
  void checked_layer(int l, int P, int T) {
    {
      const LayerPolicy& p = config.layers[static_cast<std::size_t>(l)].policy;
      ASSERT_TRUE(layer(l, P, T).ok()) << "layer " << l << " at " << P;
      const bool shared = p.kind == LayerPolicy::Kind::Shared;
      if (!shared) record(l, T);
      const int src = shared ? p.source : l;
      const std::vector<float> want =
          reference(config.layers[static_cast<std::size_t>(src)].policy, history[static_cast<std::size_t>(src)], q, P, T, scale);
      // The output rounded to the I/O type: float32 to 1e-5, 16-bit types to their precision.
      const double tolerance = io == kvcore::DType::Float32 ? 1e-5 : io == kvcore::DType::Float16 ? 2e-3 : 1e-2;
      for (std::size_t i = 0; i < want.size(); ++i)
        ASSERT_NEAR(out[i], want[i], tolerance) << "layer " << l << " at " << P << ", T " << T << ", i " << i;
    }
  }

  void rewind(int n) {
    const std::uint64_t before = kvcore_test::operator_news();
    ASSERT_TRUE(session->rewind(n).ok());
    session_news += kvcore_test::operator_news() - before;
    for (History& h : history)
      if (!h.k.empty()) h.truncate(n);
  }
};

struct Types {
  kvcore::DType kv, io;
};

class AttendSessionTypes : public ::testing::TestWithParam<Types> {};

// Every storage format with float32 in and out, and 16-bit I/O over 16-bit and int8 storage: the
// reference attends (in double) over the K/V exactly as the storage keeps them.
INSTANTIATE_TEST_SUITE_P(
    KvAndIo, AttendSessionTypes,
    ::testing::Values(Types{kvcore::DType::Float32, kvcore::DType::Float32},
                      Types{kvcore::DType::BFloat16, kvcore::DType::Float32},
                      Types{kvcore::DType::Float16, kvcore::DType::Float32},
                      Types{kvcore::DType::QInt8, kvcore::DType::Float32},
                      Types{kvcore::DType::Fp8E4M3, kvcore::DType::Float32},
                      Types{kvcore::DType::BFloat16, kvcore::DType::BFloat16},
                      Types{kvcore::DType::QInt8, kvcore::DType::BFloat16},
                      Types{kvcore::DType::Float16, kvcore::DType::Float16}),
    [](const ::testing::TestParamInfo<Types>& info) {
      return std::string(kvcore::to_string(info.param.kv)) + "_kv_" + kvcore::to_string(info.param.io) + "_io";
    });

TEST_P(AttendSessionTypes, EveryKindEqualsTheReferenceThroughPrefillsDecodesAndRewindsWithoutAllocating) {
  Driver d(GetParam().kv, GetParam().io);
  for (int T : {4, 3, 2, 4}) d.forward(T);  // a chunked prefill of 13 tokens
  for (int i = 0; i < 20; ++i) d.forward(1);  // decodes past every window: rings and chunks wrap
  d.rewind(d.session->length() - kMaxStep);   // a ring keeps max_step tokens of rewind
  for (int T : {2, 1, 3, 1, 1}) d.forward(T);  // decoding again from there
  d.rewind(d.session->length() - 1);
  for (int i = 0; i < 6; ++i) d.forward(1);
  EXPECT_EQ(d.session_news, 0u) << "a step allocated";
  EXPECT_GT(kvcore_test::operator_news(), 0u);  // the counter sees allocations (the create's)
  EXPECT_EQ(d.session->length(), 13 + 20 - kMaxStep + 8 - 1 + 6);
}

TEST(AttendSession, ALayerOutOfRangeAfterTheLastLayerChangesNothing) {
  Driver d;
  d.forward(3);
  for (int l = 0; l < 5; ++l) ASSERT_TRUE(d.layer(l, 3, 2).ok());
  EXPECT_EQ(d.session->length(), 5);  // complete: committed by what comes next
  const kvcore::Status refused = d.layer(5, 3, 2);  // a program with more layers than the cache
  EXPECT_EQ(refused.code(), Error::InvalidArgument);
  EXPECT_STREQ(refused.message().c_str(), "layer_id = 5: must be in [0, n_layers = 5)");
  EXPECT_EQ(d.session->length(), 3);
  d.forward(2);  // the same positions again, checked against the reference
  EXPECT_EQ(d.session->length(), 5);
}

TEST(AttendSession, RefusedCallsNameTheRuleAndChangeNothing) {
  Driver d;
  d.forward(2);
  kvcore::Status s = d.layer(0, 3, 1);
  EXPECT_EQ(s.code(), Error::InvalidArgument);
  EXPECT_STREQ(s.message().c_str(),
               "token 0 of the forward is at position 3, but it must be 2: positions continue the sequence's length 2 "
               "(rewind or reset to go back)");
  s = d.layer(0, 2, kMaxStep);  // fine: begins a forward
  ASSERT_TRUE(s.ok());
  s = d.layer(1, 2, 2);  // another T than layer 0's
  EXPECT_EQ(s.code(), Error::InvalidArgument);
  EXPECT_STREQ(s.message().c_str(), "layer 1 carries 2 tokens, but layer 0 began this forward with 4");
  EXPECT_EQ(d.session->length(), 2);
  EXPECT_FALSE(d.session->in_forward());  // aborted
  s = d.layer(2, 2, 1);
  EXPECT_EQ(s.code(), Error::InvalidState);
  EXPECT_STREQ(s.message().c_str(), "layer 2 served with no forward under way: layer 0 begins each forward");
  ASSERT_TRUE(d.layer(0, 2, 1).ok());
  ASSERT_TRUE(d.layer(1, 2, 1).ok());
  s = d.layer(1, 2, 1);
  EXPECT_EQ(s.code(), Error::InvalidState);
  EXPECT_STREQ(s.message().c_str(), "layer 1 served twice in one forward (at position 2)");
  EXPECT_EQ(d.session->length(), 2);
  // Too many tokens, then too many query heads for the layer's groups.
  std::vector<float> big(static_cast<std::size_t>(kHeads) * (kMaxStep + 1) * kDim);
  std::vector<std::int64_t> pos = {2, 3, 4, 5, 6};
  s = d.session->update_and_attend(0, big.data(), kHeads, big.data(), big.data(), pos.data(), 1, kMaxStep + 1, 1.0f,
                                   big.data());
  EXPECT_EQ(s.code(), Error::InvalidArgument);
  EXPECT_STREQ(s.message().c_str(), "a forward of 5 tokens: must be 1 .. max_step = 4 (chunk the prompt)");
  s = d.session->update_and_attend(0, big.data(), 3, big.data(), big.data(), pos.data(), 1, 1, 1.0f, big.data());
  EXPECT_EQ(s.code(), Error::InvalidArgument);
  EXPECT_STREQ(s.message().c_str(), "layer 0: 3 query heads, but the cache was configured for 4");
  EXPECT_EQ(d.session->length(), 2);
  EXPECT_FALSE(d.session->in_forward());
  d.forward(1);  // and it goes on, equal to the reference
}

TEST(AttendSession, ALayerZeroAgainRestartsTheForward) {
  Driver d;
  d.forward(2);
  ASSERT_TRUE(d.layer(0, 2, 3).ok());
  ASSERT_TRUE(d.layer(1, 2, 3).ok());
  EXPECT_TRUE(d.session->in_forward());
  d.forward(1);  // the retry: layer 0 again, with another T; every layer checked
  EXPECT_EQ(d.session->length(), 3);
}

TEST(AttendSession, ConfigsItCannotServeAreRefused) {
  CacheConfig c = five_kinds();
  c.layers[2].policy = LayerPolicy::state(4);
  c.layers[2].n_kv_heads = c.layers[2].head_dim = c.layers[2].v_head_dim = 0;
  auto made = AttendSession::create(c, kHeads);
  ASSERT_FALSE(made.ok());
  EXPECT_EQ(made.status().code(), Error::InvalidArgument);
  EXPECT_STREQ(made.status().message().c_str(),
               "layer 2 is a State layer: update_and_attend carries attention layers only (Flat, Ring, Chunked, Shared)");
  c = five_kinds();
  c.layers[1].policy.window = 0;
  auto bad = AttendSession::create(c, kHeads);
  ASSERT_FALSE(bad.ok());
  EXPECT_STREQ(bad.status().message().c_str(), "layers[1].policy.window = 0: a Ring layer needs window >= 1");
}

// One unit in the last place of `type` for values of magnitude below 1 (0 for float32): a
// float result a rounding away from another may round to the neighbouring 16-bit value.
double ulp_below_one(kvcore::DType type) {
  return type == kvcore::DType::BFloat16 ? 1.0 / 256 : type == kvcore::DType::Float16 ? 1.0 / 2048 : 0.0;
}

// A threaded session and a single-thread one fed the same values (same seed), each layer
// checked against the reference and then by `compare` (one, many, how many's layer was cut)
// against each other. Returns how many layers were cut into several key ranges.
template <typename Compare>
int lockstep(const Types& types, int threads, int decodes, Compare compare) {
  Driver one(types.kv, types.io, 1);
  Driver many(types.kv, types.io, threads, /*min_task_work=*/0);
  EXPECT_EQ(many.session->threads(), threads);
  int key_split = 0;
  auto both = [&](int T) {
    const int P = one.session->length();
    for (int l = 0; l < one.config.n_layers; ++l) {
      one.checked_layer(l, P, T);
      many.checked_layer(l, P, T);
      EXPECT_EQ(one.session->last_partition().tasks(), 1);
      compare(one, many, many.session->last_partition());
      if (many.session->last_partition().k_parts > 1) ++key_split;
    }
  };
  for (int T : {4, 3, 2, 4}) both(T);
  for (int i = 0; i < decodes; ++i) both(1);
  one.rewind(one.session->length() - 3);
  many.rewind(many.session->length() - 3);
  for (int T : {2, 1, 3}) both(T);
  EXPECT_EQ(many.session_news, 0u) << "a threaded step allocated";
  EXPECT_EQ(many.session->length(), one.session->length());
  return key_split;
}

class ThreadedTypes : public ::testing::TestWithParam<Types> {};

INSTANTIATE_TEST_SUITE_P(
    KvAndIo, ThreadedTypes,
    ::testing::Values(Types{kvcore::DType::Float32, kvcore::DType::Float32},
                      Types{kvcore::DType::BFloat16, kvcore::DType::Float32},
                      Types{kvcore::DType::Float16, kvcore::DType::Float16},
                      Types{kvcore::DType::QInt8, kvcore::DType::Float32},
                      Types{kvcore::DType::QInt8, kvcore::DType::BFloat16},
                      Types{kvcore::DType::Fp8E4M3, kvcore::DType::Float32},
                      Types{kvcore::DType::BFloat16, kvcore::DType::BFloat16}),
    [](const ::testing::TestParamInfo<Types>& info) {
      return std::string(kvcore::to_string(info.param.kv)) + "_kv_" + kvcore::to_string(info.param.io) + "_io";
    });

// A layer whose rows are one key block (a span of at most 32 rows) is cut only across the
// query items (heads x tokens), which changes no arithmetic: its output equals bit for bit.
TEST_P(ThreadedTypes, SplittingOnlyTheQueriesEqualsOneThreadBitForBit) {
  int query_only = 0;
  lockstep(GetParam(), 3, 40, [&](const Driver& one, const Driver& many, const kvcore::et::AttendPartition& cut) {
    if (cut.k_parts > 1) return;
    ASSERT_GT(cut.q_parts, 1);
    ++query_only;
    const std::size_t bytes = static_cast<std::size_t>(kHeads) * one.last_T * kVDim * kvcore::element_size(one.io);
    ASSERT_EQ(std::memcmp(one.out_io.data(), many.out_io.data(), bytes), 0)
        << "at length " << one.session->length();
  });
  EXPECT_GT(query_only, 50);
}

// Past 32 positions the flat layer (and the sink ring's two spans) is cut into key ranges
// whose partial softmaxes are merged: the sums of the weights and weighted values are
// re-associated. Values and outputs are within [-1, 1] and the weights positive, so each
// re-associated float32 sum of at most n = length terms moves by at most about n * eps of
// its size (the recursive summation bound), and the normalized output by about 2 n eps;
// a 16-bit output may then round to its neighbour, one unit in its last place.
TEST_P(ThreadedTypes, SplittingTheKeysEqualsOneThreadWithinFloatRounding) {
  for (int threads : {2, 4}) {
    const int key_split = lockstep(GetParam(), threads, 150, [](const Driver& one, const Driver& many,
                                                                 const kvcore::et::AttendPartition&) {
      const double tolerance = 2.0 * one.session->length() * FLT_EPSILON + ulp_below_one(one.io);
      for (std::size_t i = 0; i < static_cast<std::size_t>(kHeads) * one.last_T * kVDim; ++i)
        ASSERT_NEAR(many.out[i], one.out[i], tolerance) << "at length " << one.session->length() << ", i " << i;
    });
    EXPECT_GT(key_split, 300) << threads << " threads";  // the flat layer from 33 rows on, the sink ring's spans
  }
}

TEST(AttendSessionThreads, ThreadCountsAreCheckedAndRefusalsKeepTheThreads) {
  Driver d(kvcore::DType::Float32, kvcore::DType::Float32, 2, 0);
  EXPECT_EQ(d.session->threads(), 2);
  kvcore::Status s = d.session->set_threads(-1);
  EXPECT_EQ(s.code(), Error::InvalidArgument);
  EXPECT_STREQ(s.message().c_str(), "threads = -1: must be in [0, 256] (0: one per processor online)");
  s = d.session->set_threads(257);
  EXPECT_EQ(s.code(), Error::InvalidArgument);
  EXPECT_EQ(d.session->threads(), 2);
  ASSERT_TRUE(d.layer(0, 0, 2).ok());  // a forward under way
  s = d.session->set_threads(3);
  EXPECT_EQ(s.code(), Error::InvalidState);
  EXPECT_STREQ(s.message().c_str(), "set_threads(3) during a forward: change the threads between forwards");
  EXPECT_EQ(d.session->threads(), 2);
  EXPECT_TRUE(d.session->in_forward());  // the refusal did not abort it
  d.session->abort_forward();
  {
    kvcore_test::FailNothrowNewAfter none(0);
    s = d.session->set_threads(4);
  }
  EXPECT_EQ(s.code(), Error::MemoryAllocationFailed);
  EXPECT_EQ(d.session->threads(), 2);
  d.forward(3);  // still attending, equal to the reference
  ASSERT_TRUE(d.session->set_threads(1).ok());
  EXPECT_EQ(d.session->threads(), 1);
  ASSERT_TRUE(d.session->set_threads(0).ok());  // one per processor online
  EXPECT_EQ(d.session->threads(), kvcore::et::WorkerPool::resolve(0));
  EXPECT_GE(d.session->threads(), 1);
  d.forward(2);
  auto refused = AttendSession::create(five_kinds(), kHeads, kvcore::DType::Float32, 300);
  ASSERT_FALSE(refused.ok());
  EXPECT_STREQ(refused.status().message().c_str(), "threads = 300: must be in [0, 256] (0: one per processor online)");
}

// Every task of every job runs exactly once, whichever worker claims it, job after job
// (a worker waking late for a finished job must claim nothing of the next).
TEST(WorkerPool, RunsEveryTaskOfEveryJobOnce) {
  auto made = kvcore::et::WorkerPool::create(4);
  ASSERT_TRUE(made.ok());
  auto pool = std::move(made).get();
  EXPECT_EQ(pool->workers(), 4);
  struct Counts {
    std::atomic<int> runs[7];
    std::atomic<int> bad_worker{0};
  } counts;
  auto task = [](void* context, int t, int worker) {
    Counts& c = *static_cast<Counts*>(context);
    c.runs[t].fetch_add(1);
    if (worker < 0 || worker >= 4) c.bad_worker.fetch_add(1);
  };
  for (int job = 0; job < 2000; ++job) {
    const int n = 1 + job % 7;
    for (auto& r : counts.runs) r.store(0);
    pool->run(n, task, &counts);
    for (int t = 0; t < 7; ++t) ASSERT_EQ(counts.runs[t].load(), t < n ? 1 : 0) << "job " << job << ", task " << t;
  }
  EXPECT_EQ(counts.bad_worker.load(), 0);
  auto refused = kvcore::et::WorkerPool::create(0);
  ASSERT_FALSE(refused.ok());
  EXPECT_STREQ(refused.status().message().c_str(), "threads = 0: must be in [1, 256]");
}

}  // namespace
