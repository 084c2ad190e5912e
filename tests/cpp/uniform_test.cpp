// support/uniform.h: the draws the random tests make are fixed by the engine's
// output, which the standard specifies, and the arithmetic written there, so
// they are the same with every standard library. The expected values below are
// computed by hand from std::mt19937's first outputs for its default seed 5489
// (3499211612, 581869302, 3890346734, 3586334585: the sequence whose 10000th
// output the standard fixes at 4123659995), not by the functions under test.
#include <gtest/gtest.h>

#include <array>
#include <cstdint>
#include <random>
#include <vector>

#include "support/uniform.h"

namespace {

using kvcore_test::below;
using kvcore_test::uniform_int;

TEST(Uniform, TheEngineIsTheOneTheStandardSpecifies) {
  std::mt19937 rng;  // seed 5489
  for (int i = 1; i < 10000; ++i) rng();
  EXPECT_EQ(rng(), 4123659995u);
}

TEST(Uniform, DrawsAreTheEnginesWordsModuloTheRange) {
  std::mt19937 rng;
  EXPECT_EQ(uniform_int(rng, 0, 9), 2);            // 3499211612 % 10
  EXPECT_EQ(uniform_int(rng, 1, 6), 1 + 0);        // 581869302 % 6 = 0
  EXPECT_EQ(uniform_int(rng, -5, 5), -5 + 10);     // 3890346734 % 11 = 10
  EXPECT_EQ(uniform_int(rng, 100, 100), 100);      // one value: 3586334585 % 1
}

TEST(Uniform, AWordInTheLastPartialRunIsRejected) {
  // n = 3 * 2^30: 2^32 % n = 2^30, so words >= 2^32 - 2^30 = 3221225472 are redrawn.
  std::mt19937 rng;
  EXPECT_EQ(below(rng, 3221225472ull), 581869302u);  // 3499211612 rejected, then the second word
  std::mt19937 again;
  EXPECT_EQ(below(again, 1ull << 32), 3499211612u);  // the whole word range: nothing rejected
}

TEST(Uniform, SixtyFourBitEnginesRejectBelowTwoToTheSixtyFourModN) {
  // mt19937_64's first output for its default seed 5489 is 14514284786278117030.
  std::mt19937_64 rng;
  EXPECT_EQ(below(rng, 10), 14514284786278117030ull % 10);
  std::mt19937_64 big;
  // n = 2^63 + 1: 2^64 mod n = 2^63 - 1, below which a word is redrawn; the first word is above it.
  EXPECT_EQ(below(big, (1ull << 63) + 1), 14514284786278117030ull % ((1ull << 63) + 1));
}

TEST(Uniform, EveryValueOfASmallRangeComesUpAndNoOtherDoes) {
  std::mt19937 rng(7);
  std::array<int, 7> seen{};
  for (int i = 0; i < 7000; ++i) {
    const int x = uniform_int(rng, -3, 3);
    ASSERT_GE(x, -3);
    ASSERT_LE(x, 3);
    ++seen[static_cast<std::size_t>(x + 3)];
  }
  // 1000 expected each, standard deviation sqrt(7000 / 7 * 6 / 7) = 29.3: +-150 is 5.1
  // sigma (about 2e-6 for any of the 7 counts by luck), so a count outside is a bias.
  // The seed is fixed, so the counts are too, on every library.
  for (int n : seen) {
    EXPECT_GT(n, 850);
    EXPECT_LT(n, 1150);
  }
  // The full int range (2^32 values: nothing rejected) does not overflow: 5489's first word
  // 3499211612 above INT32_MIN.
  std::mt19937 fresh;
  EXPECT_EQ(uniform_int(fresh, INT32_MIN, INT32_MAX), static_cast<int>(-2147483648LL + 3499211612LL));
}

TEST(Uniform, ShuffleIsFisherYatesFromTheLastElementDown) {
  std::mt19937 rng;
  std::vector<int> v{0, 1, 2, 3};
  kvcore_test::shuffle(v.begin(), v.end(), rng);
  // i = 3: j = 3499211612 % 4 = 0 -> {3, 1, 2, 0}; i = 2: j = 581869302 % 3 = 0 -> {2, 1, 3, 0};
  // i = 1: j = 3890346734 % 2 = 0 -> {1, 2, 3, 0}.
  EXPECT_EQ(v, (std::vector<int>{1, 2, 3, 0}));
}

TEST(Uniform, FloatsAreAWordModuloTwoTo24ScaledIntoTheRange) {
  std::mt19937 rng;
  // 3499211612 % 2^24 = 9550684 (the low 24 bits; below() takes the word modulo 2^24).
  const float want = -3.0f + 6.0f * (9550684.0f / 16777216.0f);
  EXPECT_EQ(kvcore_test::uniform_float(rng, -3.0f, 3.0f), want);
}

}  // namespace
