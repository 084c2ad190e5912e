// share(): shared ownership whose control block comes from a nothrow
// allocation (allocation failure itself: allocation_failure_test.cpp).
#include <gtest/gtest.h>

#include <memory>

#include "kvcore/registry/shared.h"

namespace kvcore {
namespace {

struct Counted {
  explicit Counted(int* live) : live(live) { ++*live; }
  ~Counted() { --*live; }
  int* live;
};

TEST(Share, TheLastOwnerDeletesTheObject) {
  int live = 0;
  auto shared = share(std::unique_ptr<Counted>(new Counted(&live)));
  ASSERT_TRUE(shared.ok()) << shared.message().c_str();
  std::shared_ptr<Counted> a = std::move(shared).get();
  std::shared_ptr<Counted> b = a;
  EXPECT_EQ(live, 1);
  EXPECT_EQ(a.use_count(), 2);
  a.reset();
  EXPECT_EQ(live, 1);
  b.reset();
  EXPECT_EQ(live, 0);
}

TEST(Share, ANullObjectIsRefused) {
  auto shared = share(std::unique_ptr<int>());
  EXPECT_EQ(shared.error(), Error::InvalidArgument);
  EXPECT_STREQ(shared.message().c_str(), "share: the object is null");
}

}  // namespace
}  // namespace kvcore
