// The ExecuTorch adapter against the real ExecuTorch runtime (the executorch
// wheel's headers and libexecutorch.so): every kvcore code maps to the
// ExecuTorch code of the same name, messages reach ExecuTorch's log through
// its PAL, and Results convert both ways.
#include <gtest/gtest.h>

#include <executorch/runtime/platform/platform.h>
#include <executorch/runtime/platform/runtime.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "kvcore/registry/registry_storage.h"
#include "kvcore/adapters/executorch.h"
#include "kvcore/core/sequence_cache.h"

namespace kvcore {
namespace {

namespace etr = ::executorch::runtime;

// Every code kvcore defines, listed from DESIGN.md section 3.
const Error kAllCodes[] = {Error::Ok,
                           Error::Internal,
                           Error::InvalidState,
                           Error::NotSupported,
                           Error::InvalidArgument,
                           Error::RegistrationAlreadyRegistered,
                           Error::NotFound,
                           Error::MemoryAllocationFailed,
                           Error::OutOfResources};

// ExecuTorch codes kvcore has no equivalent for (from ExecuTorch's error.h).
const etr::Error kForeignCodes[] = {etr::Error::EndOfMethod,
                                    etr::Error::AlreadyLoaded,
                                    etr::Error::NotImplemented,
                                    etr::Error::InvalidType,
                                    etr::Error::OperatorMissing,
                                    etr::Error::RegistrationExceedingMaxKernels,
                                    etr::Error::AccessFailed,
                                    etr::Error::InvalidProgram,
                                    etr::Error::InvalidExternalData,
                                    etr::Error::DelegateInvalidCompatibility,
                                    etr::Error::DelegateMemoryAllocationFailed,
                                    etr::Error::DelegateInvalidHandle};

// What ExecuTorch's runtime logged, captured through its PAL.
std::vector<std::string>& logged() {
  static std::vector<std::string> lines;
  return lines;
}
void capture_log(et_timestamp_t, et_pal_log_level_t level, const char*, const char*, size_t,
                 const char* message, size_t length) {
  logged().push_back(std::string(1, static_cast<char>(level)) + ":" + std::string(message, length));
}

class ExecuTorchAdapter : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    etr::runtime_init();
    ASSERT_TRUE(etr::register_pal(etr::PalImpl::create(&capture_log, __FILE__)));
  }
  void SetUp() override { logged().clear(); }

  static bool log_contains(const char* needle) {
    for (const std::string& line : logged())
      if (line.find(needle) != std::string::npos) return true;
    return false;
  }
};

CacheConfig flat_config(int capacity) {
  CacheConfig cfg;
  cfg.capacity = capacity;
  cfg.n_layers = 1;
  cfg.layers = {LayerConfig{LayerPolicy::flat(), 1, 4, 0}};
  return cfg;
}

TEST_F(ExecuTorchAdapter, EveryCodeMapsToTheExecuTorchCodeOfTheSameName) {
  for (Error code : kAllCodes) {
    const etr::Error et = et::to_executorch(code);
    EXPECT_EQ(static_cast<std::uint32_t>(et), static_cast<std::uint32_t>(code));
    // ExecuTorch spells its own names "Error::<Name>".
    EXPECT_EQ(std::string(etr::to_string(et)), std::string("Error::") + to_string(code));
    EXPECT_TRUE(et::has_kvcore_code(et));
    EXPECT_EQ(et::from_executorch(et).code(), code);
  }
}

TEST_F(ExecuTorchAdapter, ForeignExecuTorchCodesBecomeInternalNamingTheCode) {
  for (etr::Error code : kForeignCodes) {
    EXPECT_FALSE(et::has_kvcore_code(code));
    Status s = et::from_executorch(code);
    EXPECT_EQ(s.code(), Error::Internal);
    EXPECT_NE(std::strstr(s.message().c_str(), etr::to_string(code)), nullptr) << s.message().c_str();
  }
}

TEST_F(ExecuTorchAdapter, AFailingStatusLogsItsMessageThroughExecuTorch) {
  Status s = Status::make(Error::OutOfResources, "step of %d tokens exceeds capacity", 9);
  EXPECT_EQ(et::to_executorch(s), etr::Error::OutOfResources);
  ASSERT_EQ(logged().size(), 1u);
  EXPECT_EQ(logged()[0].substr(0, 2), "E:");
  EXPECT_TRUE(log_contains("OutOfResources: step of 9 tokens exceeds capacity")) << logged()[0];
}

TEST_F(ExecuTorchAdapter, OkAndBareCodesLogNothing) {
  EXPECT_EQ(et::to_executorch(Status()), etr::Error::Ok);
  EXPECT_EQ(et::to_executorch(Status(Error::NotFound)), etr::Error::NotFound);
  EXPECT_TRUE(logged().empty());
}

TEST_F(ExecuTorchAdapter, ResultsConvertBothWays) {
  auto made = SequenceCache::create(flat_config(4));
  ASSERT_TRUE(made.ok());
  std::unique_ptr<SequenceCache> cache = std::move(made).get();

  etr::Result<Step> ok = et::to_executorch(cache->begin_step(3));
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(ok->position, 0);
  EXPECT_EQ(ok->T, 3);

  etr::Result<Step> too_long = et::to_executorch(cache->begin_step(5));
  EXPECT_EQ(too_long.error(), etr::Error::InvalidArgument);
  EXPECT_TRUE(log_contains("T = 5")) << (logged().empty() ? "" : logged()[0]);

  Result<int> back = et::from_executorch(etr::Result<int>(7));
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back.get(), 7);
  Result<int> back_error = et::from_executorch(etr::Result<int>(etr::Error::NotFound));
  EXPECT_EQ(back_error.error(), Error::NotFound);
  Result<int> back_foreign = et::from_executorch(etr::Result<int>(etr::Error::InvalidProgram));
  EXPECT_EQ(back_foreign.error(), Error::Internal);
}

// How an ExecuTorch delegate drives a kvcore cache with ExecuTorch's macros.
etr::Error delegate_step(const std::string& key, int T) {
  std::shared_ptr<CacheBase> cache;
  {
    etr::Result<std::shared_ptr<CacheBase>> found = et::to_executorch(global_caches().find(key));
    ET_CHECK_OK_OR_RETURN_ERROR(found.error(), "no cache for key %s", key.c_str());
    cache = found.get();
  }
  SequenceControl* control = cache->as_control();
  ET_CHECK_OR_RETURN_ERROR(control != nullptr, InvalidState, "cache has no control face");
  etr::Result<Step> step = et::to_executorch(control->begin_step(T));
  ET_CHECK_OK_OR_RETURN_ERROR(step.error(), "begin_step failed");
  ET_CHECK_OK_OR_RETURN_ERROR(et::to_executorch(control->commit(step.get())), "commit failed");
  return etr::Error::Ok;
}

TEST_F(ExecuTorchAdapter, ADelegateUsesExecuTorchMacrosOverKvcoreCalls) {
  auto made = SequenceCache::create(flat_config(4));
  ASSERT_TRUE(made.ok());
  std::shared_ptr<SequenceCache> cache(std::move(made).get());
  const std::string key(global_caches().make_unique_key("et-delegate")->view());
  ASSERT_EQ(global_caches().install(key, cache), Error::Ok);

  EXPECT_EQ(delegate_step(key, 3), etr::Error::Ok);
  EXPECT_EQ(cache->length(), 3);
  EXPECT_EQ(delegate_step(key, 2), etr::Error::OutOfResources);
  EXPECT_EQ(cache->length(), 3);
  EXPECT_TRUE(log_contains("exceed capacity"));
  EXPECT_EQ(delegate_step("et-delegate#missing", 1), etr::Error::NotFound);
  EXPECT_EQ(global_caches().erase(key), Error::Ok);
}

}  // namespace
}  // namespace kvcore
