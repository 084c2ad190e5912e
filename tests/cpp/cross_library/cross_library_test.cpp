// One registry across shared libraries built with -fvisibility=hidden: the
// runner library defines the storage (KVCORE_DEFINE_SHARED_REGISTRY), the
// backend library reaches it (KVCORE_SHARED_REGISTRY). The local_* pair is
// the control: the same source without the macros gets one registry each.
#include <gtest/gtest.h>

#include "xlib.h"

namespace {

constexpr int kOk = 0x00;
constexpr int kNotFound = 0x20;

TEST(CrossLibrary, TheBackendFindsTheCacheTheRunnerInstalled) {
  ASSERT_EQ(kvcore_xlib_runner_install_sequence("xlib/shared", 12), kOk);
  EXPECT_EQ(kvcore_xlib_backend_capacity("xlib/shared"), 12);
  EXPECT_EQ(kvcore_xlib_runner_capacity("xlib/shared"), 12);
  EXPECT_EQ(kvcore_xlib_backend_registry_address(), kvcore_xlib_runner_registry_address());
  // Erasing from either side is seen by the other.
  EXPECT_EQ(kvcore_xlib_backend_erase("xlib/shared"), kOk);
  EXPECT_EQ(kvcore_xlib_runner_capacity("xlib/shared"), -1);
  EXPECT_EQ(kvcore_xlib_runner_erase("xlib/shared"), kNotFound);
}

TEST(CrossLibrary, ABuilderRegisteredInOneLibraryBuildsForTheOther) {
  ASSERT_EQ(kvcore_xlib_runner_register_counting_builder("xlib", "counted"), kOk);
  const int runner_before = kvcore_xlib_runner_builds_made();
  const int backend_before = kvcore_xlib_backend_builds_made();
  ASSERT_EQ(kvcore_xlib_backend_build_and_install("xlib", "counted", "xlib/built", 7), kOk);
  EXPECT_EQ(kvcore_xlib_runner_builds_made(), runner_before + 1);  // the runner's code ran
  EXPECT_EQ(kvcore_xlib_backend_builds_made(), backend_before);
  EXPECT_EQ(kvcore_xlib_runner_capacity("xlib/built"), 7);
  EXPECT_EQ(kvcore_xlib_runner_erase("xlib/built"), kOk);
}

TEST(CrossLibrary, WithoutTheMacrosHiddenVisibilityGivesEachLibraryItsOwnRegistry) {
  ASSERT_EQ(kvcore_xlib_local_a_install_sequence("xlib/local", 5), kOk);
  EXPECT_EQ(kvcore_xlib_local_a_capacity("xlib/local"), 5);
  EXPECT_EQ(kvcore_xlib_local_b_capacity("xlib/local"), -1);
  EXPECT_NE(kvcore_xlib_local_a_registry_address(), kvcore_xlib_local_b_registry_address());
  EXPECT_NE(kvcore_xlib_local_a_registry_address(), kvcore_xlib_runner_registry_address());
  EXPECT_EQ(kvcore_xlib_runner_capacity("xlib/local"), -1);
  EXPECT_EQ(kvcore_xlib_local_a_erase("xlib/local"), kOk);
}

}  // namespace
