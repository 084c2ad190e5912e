// kvcore_bench: Google Benchmark's main plus the ratio of each kvcore
// benchmark to its memcpy floor. Extra flag: --kvcore_ratios_out=PATH writes
// those ratios as JSON. Exits 1 when any benchmark failed (the smoke test).
#include <benchmark/benchmark.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "bench_util.h"
#include "floor_ratios.h"
#include "kvcore/version.h"

int main(int argc, char** argv) {
  const char* const kRatiosFlag = "--kvcore_ratios_out=";
  std::string ratios_out;
  std::vector<char*> args;
  for (int i = 0; i < argc; ++i) {
    if (std::strncmp(argv[i], kRatiosFlag, std::strlen(kRatiosFlag)) == 0)
      ratios_out = argv[i] + std::strlen(kRatiosFlag);
    else
      args.push_back(argv[i]);
  }
  int n = static_cast<int>(args.size());
  benchmark::Initialize(&n, args.data());
  if (benchmark::ReportUnrecognizedArguments(n, args.data())) return 1;
  benchmark::AddCustomContext("kvcore_version", KVCORE_VERSION);
  if (std::FILE* f = std::fopen("/proc/loadavg", "r")) {
    char load[128] = {0};
    if (std::fgets(load, sizeof load, f) != nullptr) {
      load[std::strcspn(load, "\n")] = '\0';
      benchmark::AddCustomContext("loadavg", load);
    }
    std::fclose(f);
  }
  kvcore_bench::FloorRatioReporter reporter(ratios_out);
  const std::size_t ran = benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();
  if (ran == 0) {
    std::fprintf(stderr, "no benchmark matched the filter\n");
    return 1;
  }
  return kvcore_bench::failed() || reporter.write_failed() ? 1 : 0;
}
