// Error, Status and Result: ExecuTorch-compatible codes, allocation-free
// messages, move-only results and the propagation macros.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>

#include "kvcore/core/error.h"
#include "kvcore/core/plan.h"
#include "kvcore/core/result.h"
#include "kvcore/core/status.h"

namespace kvcore {
namespace {

std::uint32_t code_of(Error e) { return static_cast<std::uint32_t>(e); }

// The numbers come from DESIGN.md section 3 (ExecuTorch's runtime/core/error.h).
TEST(Error, NumericValuesEqualExecuTorch) {
  EXPECT_EQ(code_of(Error::Ok), 0x00u);
  EXPECT_EQ(code_of(Error::Internal), 0x01u);
  EXPECT_EQ(code_of(Error::InvalidState), 0x02u);
  EXPECT_EQ(code_of(Error::NotSupported), 0x10u);
  EXPECT_EQ(code_of(Error::InvalidArgument), 0x12u);
  EXPECT_EQ(code_of(Error::RegistrationAlreadyRegistered), 0x16u);
  EXPECT_EQ(code_of(Error::NotFound), 0x20u);
  EXPECT_EQ(code_of(Error::MemoryAllocationFailed), 0x21u);
  EXPECT_EQ(code_of(Error::OutOfResources), 0x25u);
  static_assert(std::is_same<std::underlying_type<Error>::type, std::uint32_t>::value,
                "ExecuTorch's Error is a uint32_t enum");
}

TEST(Error, ToStringNamesEveryEnumerator) {
  EXPECT_STREQ(to_string(Error::Ok), "Ok");
  EXPECT_STREQ(to_string(Error::Internal), "Internal");
  EXPECT_STREQ(to_string(Error::InvalidState), "InvalidState");
  EXPECT_STREQ(to_string(Error::NotSupported), "NotSupported");
  EXPECT_STREQ(to_string(Error::InvalidArgument), "InvalidArgument");
  EXPECT_STREQ(to_string(Error::RegistrationAlreadyRegistered), "RegistrationAlreadyRegistered");
  EXPECT_STREQ(to_string(Error::NotFound), "NotFound");
  EXPECT_STREQ(to_string(Error::MemoryAllocationFailed), "MemoryAllocationFailed");
  EXPECT_STREQ(to_string(Error::OutOfResources), "OutOfResources");
}

TEST(Error, ToStringOfUnknownValueIsUnknown) {
  EXPECT_STREQ(to_string(static_cast<Error>(0x03)), "Unknown");
  EXPECT_STREQ(to_string(static_cast<Error>(0xffffffffu)), "Unknown");
  static_assert(to_string(Error::NotFound)[0] == 'N', "to_string is constexpr");
}

TEST(Status, DefaultIsOkWithEmptyMessage) {
  Status s;
  EXPECT_TRUE(s.ok());
  EXPECT_EQ(s.code(), Error::Ok);
  EXPECT_STREQ(s.message().c_str(), "");
}

TEST(Status, ConvertsToAndFromError) {
  Status s = Error::NotFound;
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.code(), Error::NotFound);
  EXPECT_STREQ(s.message().c_str(), "");
  Error e = s;
  EXPECT_EQ(e, Error::NotFound);
  Status ok = Error::Ok;
  EXPECT_TRUE(ok.ok());
}

TEST(Status, MakeFormatsPrintfStyle) {
  Status s = Status::make(Error::InvalidArgument, "T = %d: must be <= %s %zu", -3, "max_step",
                          static_cast<std::size_t>(8));
  EXPECT_EQ(s.code(), Error::InvalidArgument);
  EXPECT_STREQ(s.message().c_str(), "T = -3: must be <= max_step 8");
}

TEST(Status, MakeWithoutArgumentsKeepsLiteral) {
  Status s = Status::make(Error::Internal, "plain message");
  EXPECT_STREQ(s.message().c_str(), "plain message");
}

TEST(Status, CopyAndAssignmentCarryTheMessage) {
  Status a = Status::make(Error::InvalidState, "stale step %d", 7);
  Status b(a);
  EXPECT_EQ(b.code(), Error::InvalidState);
  EXPECT_STREQ(b.message().c_str(), "stale step 7");
  Status c;
  c = a;
  EXPECT_EQ(c.code(), Error::InvalidState);
  EXPECT_STREQ(c.message().c_str(), "stale step 7");
  // Assigning a shorter message leaves no tail of the longer one behind.
  c = Status::make(Error::NotFound, "k");
  EXPECT_STREQ(c.message().c_str(), "k");
  c = Error::Ok;
  EXPECT_STREQ(c.message().c_str(), "");
}

TEST(Status, EveryConversionPrintsItsArgumentAsItsOwnType) {
  const long long big = -(1LL << 40);
  Status numbers = Status::make(Error::InvalidArgument, "%d|%u|%x|%02x|%lld|%llu|%zu", -7,
                                4000000000u, 255, 5, big, 18446744073709551615ull,
                                static_cast<std::size_t>(1) << 40);
  EXPECT_STREQ(numbers.message().c_str(),
               "-7|4000000000|ff|05|-1099511627776|18446744073709551615|1099511627776");
  Status mixed = Status::make(Error::InvalidArgument, "%c|%%|%5d|%-4s|%.*s|%s|%x", 'q', 42, "ab", 3,
                              "xyz", std::string_view("view"), -1);
  EXPECT_STREQ(mixed.message().c_str(), "q|%|   42|ab  |xyz|view|ffffffff");
}

TEST(Status, IsSmallAndItsResultsAreSizedLikeTheirValues) {
  static_assert(sizeof(Status) <= 72, "a Status is 72 bytes at most");
  static_assert(sizeof(Result<SeqStepPlan>) <= sizeof(SeqStepPlan) + 16,
                "Result<SeqStepPlan> is its plan and a flag (issue #14's bound)");
  EXPECT_LE(sizeof(Result<int>), sizeof(Status) + 8);
}

TEST(Status, AStringArgumentTooLongIsCutAndTheArgumentsAfterItPrintAsQuestionMarks) {
  const std::string longer(3 * Status::kArgBytes, 'k');
  Status s = Status::make(Error::NotFound, "key '%s' (%d)", longer.c_str(), 42);
  const std::string text = s.message().c_str();
  ASSERT_EQ(text.rfind("key 'kkk", 0), 0u) << text;
  EXPECT_NE(text.find("...' (?)"), std::string::npos) << text;
  EXPECT_LT(text.size(), longer.size());
}

TEST(Status, AnArgumentTheFormatDoesNotNamePrintsNothingAndAMissingOnePrintsAQuestionMark) {
  EXPECT_STREQ(Status::make(Error::Internal, "a %d", 1, 2).message().c_str(), "a 1");
  EXPECT_STREQ(Status::make(Error::Internal, "a %d %d").message().c_str(), "a ? ?");
  // A string given to %d prints as a string, an integer given to %s as a number.
  EXPECT_STREQ(Status::make(Error::Internal, "%d %s", "x", 5).message().c_str(), "x 5");
}

TEST(Status, FormatsArgumentsWhenAskedNotWhenMade) {
  char name[] = "first";
  Status s = Status::make(Error::NotFound, "no '%s'", name);
  std::memcpy(name, "later", 5);  // the argument was copied when the error was made
  EXPECT_STREQ(s.message().c_str(), "no 'first'");
}

#define KVCORE_TEST_36 "0123456789abcdefghijklmnopqrstuvwxyz"

TEST(Status, LongMessageIsTruncatedNeverOverflowed) {
  // A format longer than a Message: cut to kCapacity - 1 characters ending in "...".
  static const char kLong[] = KVCORE_TEST_36 KVCORE_TEST_36 KVCORE_TEST_36 KVCORE_TEST_36
      KVCORE_TEST_36 KVCORE_TEST_36 KVCORE_TEST_36 KVCORE_TEST_36 " %d";
  const Status s = Status::make(Error::OutOfResources, kLong, 42);
  EXPECT_EQ(s.code(), Error::OutOfResources);
  const Message m = s.message();
  const std::size_t n = std::strlen(m.c_str());
  EXPECT_EQ(n, Message::kCapacity - 1);
  EXPECT_EQ(std::string(m.c_str(), n - 3), std::string(kLong, n - 3));
  EXPECT_EQ(std::string(m.c_str() + n - 3), "...");
}

TEST(Status, AMessageThatFillsTheCapacityExactlyIsNotMarkedCut) {
  static const char kExact[] = KVCORE_TEST_36 KVCORE_TEST_36 KVCORE_TEST_36 KVCORE_TEST_36
      KVCORE_TEST_36 KVCORE_TEST_36 KVCORE_TEST_36 "abc";
  static_assert(sizeof(kExact) == Message::kCapacity, "kCapacity - 1 characters and the terminator");
  EXPECT_STREQ(Status::make(Error::Internal, kExact).message().c_str(), kExact);
  // One character more, from an argument, and the end is marked.
  static const char kOneMore[] = KVCORE_TEST_36 KVCORE_TEST_36 KVCORE_TEST_36 KVCORE_TEST_36
      KVCORE_TEST_36 KVCORE_TEST_36 KVCORE_TEST_36 "abc%d";
  const std::string cut = Status::make(Error::Internal, kOneMore, 7).message().c_str();
  EXPECT_EQ(cut, std::string(kExact, Message::kCapacity - 4) + "...");
}

#undef KVCORE_TEST_36

// --- Result ----------------------------------------------------------------

static_assert(!std::is_copy_constructible<Result<int>>::value, "Result is move-only");
static_assert(!std::is_copy_assignable<Result<int>>::value, "Result is move-only");
static_assert(std::is_move_constructible<Result<int>>::value, "Result moves");
static_assert(std::is_move_constructible<Result<std::unique_ptr<int>>>::value,
              "Result holds move-only values");

TEST(Result, HoldsValue) {
  Result<int> r = 42;
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r.error(), Error::Ok);
  EXPECT_EQ(r.get(), 42);
  EXPECT_EQ(*r, 42);
  r.get() = 7;
  EXPECT_EQ(*r, 7);
}

TEST(Result, HoldsErrorWithMessage) {
  Result<int> r = Status::make(Error::InvalidArgument, "layer = %d: bad", 9);
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(r.error(), Error::InvalidArgument);
  EXPECT_EQ(r.status().code(), Error::InvalidArgument);
  EXPECT_STREQ(r.message().c_str(), "layer = 9: bad");
}

TEST(Result, HoldsBareError) {
  Result<int> r = Error::NotFound;
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(r.error(), Error::NotFound);
  EXPECT_STREQ(r.message().c_str(), "");
}

TEST(Result, OkWithoutValueBecomesInternal) {
  Result<int> from_error = Error::Ok;
  EXPECT_FALSE(from_error.ok());
  EXPECT_EQ(from_error.error(), Error::Internal);
  Result<int> from_status = Status();
  EXPECT_FALSE(from_status.ok());
  EXPECT_EQ(from_status.error(), Error::Internal);
  EXPECT_STRNE(from_status.message().c_str(), "");
}

TEST(Result, MoveOnlyValueMovesOut) {
  Result<std::unique_ptr<int>> r = std::unique_ptr<int>(new int(5));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r.get(), 5);
  Result<std::unique_ptr<int>> moved(std::move(r));
  ASSERT_TRUE(moved.ok());
  std::unique_ptr<int> p = std::move(moved).get();
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(*p, 5);
}

TEST(Result, MoveKeepsError) {
  Result<std::unique_ptr<int>> r = Status::make(Error::OutOfResources, "full");
  Result<std::unique_ptr<int>> moved(std::move(r));
  EXPECT_FALSE(moved.ok());
  EXPECT_EQ(moved.error(), Error::OutOfResources);
  EXPECT_STREQ(moved.message().c_str(), "full");
}

struct Counted {
  static int live;
  int v;
  explicit Counted(int x) : v(x) { ++live; }
  Counted(const Counted& o) : v(o.v) { ++live; }
  Counted(Counted&& o) noexcept : v(o.v) { ++live; }
  ~Counted() { --live; }
};
int Counted::live = 0;

TEST(Result, DestroysItsValueExactlyOnce) {
  Counted::live = 0;
  {
    Result<Counted> r = Counted(3);
    EXPECT_EQ(Counted::live, 1);
    Result<Counted> moved(std::move(r));
    EXPECT_EQ(Counted::live, 2);  // the moved-from value is still an object until destroyed
    EXPECT_EQ(moved->v, 3);
  }
  EXPECT_EQ(Counted::live, 0);
  {
    Result<Counted> err = Error::NotFound;  // no value: nothing constructed or destroyed
    EXPECT_EQ(Counted::live, 0);
  }
  EXPECT_EQ(Counted::live, 0);
}

TEST(ResultDeathTest, GetOnErrorAborts) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        Result<int> r = Error::InvalidArgument;
        std::printf("%d\n", r.get());
      },
      "Result::get\\(\\) on an error");
  EXPECT_DEATH(
      {
        const Result<int> r = Error::InvalidState;
        std::printf("%d\n", *r);
      },
      "Result::get\\(\\) on an error");
  EXPECT_DEATH(
      {
        Result<std::unique_ptr<int>> r = Error::OutOfResources;
        std::unique_ptr<int> p = std::move(r).get();
        std::printf("%p\n", static_cast<void*>(p.get()));
      },
      "Result::get\\(\\) on an error");
}

// --- Propagation macros --------------------------------------------------------

// Counts how far a function got before returning, so each test also proves an
// error returned early and an Ok fell through.
struct Trace {
  int reached_end = 0;
};

Status check_positive(int x, Trace& t) {
  KVCORE_CHECK_OR_RETURN_ERROR(x > 0, InvalidArgument, "x = %d: must be > 0", x);
  ++t.reached_end;
  return Error::Ok;
}

Result<int> check_positive_result(int x, Trace& t) {
  KVCORE_CHECK_OR_RETURN_ERROR(x > 0, OutOfResources, "x = %d", x);
  ++t.reached_end;
  return x * 2;
}

TEST(Macros, CheckOrReturnErrorReturnsCodeAndMessage) {
  Trace t;
  Status bad = check_positive(-4, t);
  EXPECT_EQ(bad.code(), Error::InvalidArgument);
  EXPECT_STREQ(bad.message().c_str(), "x = -4: must be > 0");
  EXPECT_EQ(t.reached_end, 0);
  Status good = check_positive(3, t);
  EXPECT_TRUE(good.ok());
  EXPECT_EQ(t.reached_end, 1);
}

TEST(Macros, CheckOrReturnErrorInResultFunction) {
  Trace t;
  Result<int> bad = check_positive_result(0, t);
  EXPECT_EQ(bad.error(), Error::OutOfResources);
  EXPECT_STREQ(bad.message().c_str(), "x = 0");
  Result<int> good = check_positive_result(5, t);
  ASSERT_TRUE(good.ok());
  EXPECT_EQ(*good, 10);
  EXPECT_EQ(t.reached_end, 1);
}

Status propagate_status(Status in, Trace& t) {
  KVCORE_RETURN_IF_ERROR(in);
  ++t.reached_end;
  return Error::Ok;
}

Status propagate_error(Error in, Trace& t) {
  KVCORE_RETURN_IF_ERROR(in);
  ++t.reached_end;
  return Error::Ok;
}

Status propagate_result(int x, Trace& t) {
  KVCORE_RETURN_IF_ERROR(check_positive_result(x, t));
  ++t.reached_end;
  return Error::Ok;
}

// Result-returning functions propagate too (Status -> Result conversion).
Result<int> propagate_into_result(Error in, Trace& t) {
  KVCORE_RETURN_IF_ERROR(in);
  ++t.reached_end;
  return 1;
}

TEST(Macros, ReturnIfErrorOnStatus) {
  Trace t;
  Status s = propagate_status(Status::make(Error::NotFound, "no key %s", "k"), t);
  EXPECT_EQ(s.code(), Error::NotFound);
  EXPECT_STREQ(s.message().c_str(), "no key k");  // the message travels with the code
  EXPECT_EQ(t.reached_end, 0);
  EXPECT_TRUE(propagate_status(Status(), t).ok());
  EXPECT_EQ(t.reached_end, 1);
}

TEST(Macros, ReturnIfErrorOnError) {
  Trace t;
  EXPECT_EQ(propagate_error(Error::InvalidState, t).code(), Error::InvalidState);
  EXPECT_EQ(t.reached_end, 0);
  EXPECT_TRUE(propagate_error(Error::Ok, t).ok());
  EXPECT_EQ(t.reached_end, 1);
}

TEST(Macros, ReturnIfErrorOnResult) {
  Trace t;
  Status s = propagate_result(-1, t);
  EXPECT_EQ(s.code(), Error::OutOfResources);
  EXPECT_STREQ(s.message().c_str(), "x = -1");
  EXPECT_EQ(t.reached_end, 0);
  EXPECT_TRUE(propagate_result(2, t).ok());
  EXPECT_EQ(t.reached_end, 2);  // once inside check_positive_result, once after
}

TEST(Macros, ReturnIfErrorIntoResult) {
  Trace t;
  Result<int> r = propagate_into_result(Error::NotSupported, t);
  EXPECT_EQ(r.error(), Error::NotSupported);
  EXPECT_EQ(t.reached_end, 0);
  EXPECT_TRUE(propagate_into_result(Error::Ok, t).ok());
  EXPECT_EQ(t.reached_end, 1);
}

Result<int> doubled(int x, Trace& t) {
  KVCORE_ASSIGN_OR_RETURN(int v, check_positive_result(x, t));
  ++t.reached_end;
  return v + 1;
}

Status assign_existing(int x, int& out) {
  Trace t;
  KVCORE_ASSIGN_OR_RETURN(out, check_positive_result(x, t));
  return Error::Ok;
}

Result<std::unique_ptr<int>> make_ptr(bool ok) {
  if (!ok) return Status::make(Error::MemoryAllocationFailed, "no memory");
  return std::unique_ptr<int>(new int(11));
}

Result<int> deref_ptr(bool ok) {
  KVCORE_ASSIGN_OR_RETURN(std::unique_ptr<int> p, make_ptr(ok));
  return *p;
}

TEST(Macros, AssignOrReturnDeclaresNewVariable) {
  Trace t;
  Result<int> good = doubled(4, t);
  ASSERT_TRUE(good.ok());
  EXPECT_EQ(*good, 9);
  EXPECT_EQ(t.reached_end, 2);
  Result<int> bad = doubled(-2, t);
  EXPECT_EQ(bad.error(), Error::OutOfResources);
  EXPECT_STREQ(bad.message().c_str(), "x = -2");
  EXPECT_EQ(t.reached_end, 2);
}

TEST(Macros, AssignOrReturnIntoExistingVariable) {
  int out = -1;
  EXPECT_TRUE(assign_existing(6, out).ok());
  EXPECT_EQ(out, 12);
  out = -1;
  EXPECT_EQ(assign_existing(0, out).code(), Error::OutOfResources);
  EXPECT_EQ(out, -1);  // untouched on error
}

TEST(Macros, AssignOrReturnMovesMoveOnlyValues) {
  Result<int> good = deref_ptr(true);
  ASSERT_TRUE(good.ok());
  EXPECT_EQ(*good, 11);
  Result<int> bad = deref_ptr(false);
  EXPECT_EQ(bad.error(), Error::MemoryAllocationFailed);
  EXPECT_STREQ(bad.message().c_str(), "no memory");
}

Status two_assigns(int a, int b, int& sum) {
  Trace t;
  KVCORE_ASSIGN_OR_RETURN(int x, check_positive_result(a, t));
  KVCORE_ASSIGN_OR_RETURN(int y, check_positive_result(b, t));
  sum = x + y;
  return Error::Ok;
}

TEST(Macros, AssignOrReturnTwiceInOneScope) {
  int sum = 0;
  EXPECT_TRUE(two_assigns(1, 2, sum).ok());
  EXPECT_EQ(sum, 6);
  EXPECT_EQ(two_assigns(1, -2, sum).code(), Error::OutOfResources);
}

}  // namespace
}  // namespace kvcore
