// A console reporter that also prints each kvcore benchmark against its
// memcpy floor (same arguments, same bytes) and can write those ratios as
// JSON. Uses the median when repetitions ran, else the single run; wall-clock
// and CPU time both (on a shared machine CPU time is the steadier of the two).
#pragma once

#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace kvcore_bench {

/// kvcore benchmark name prefix -> the floor benchmark measuring the same bytes.
inline const std::vector<std::pair<std::string, std::string>>& floor_pairs() {
  static const std::vector<std::pair<std::string, std::string>> pairs = {
      {"plan_step", "memcpy_step_kv"},
      {"plan_step_shared", "memcpy_step_kv"},
      {"plan_step_faces", "memcpy_step_kv"},
      {"pool_write_step", "memcpy_write_step"},
      {"pool_write_step_mirrored", "memcpy_write_step"},
      {"pool_gather_step", "memcpy_gather_step"},
      {"pool_views_step", "memcpy_gather_step"},
      {"pool_views_step_mirrored", "memcpy_gather_step"},
  };
  return pairs;
}

class FloorRatioReporter : public benchmark::ConsoleReporter {
 public:
  explicit FloorRatioReporter(std::string json_path) : json_path_(std::move(json_path)) {}

  void ReportRuns(const std::vector<Run>& runs) override {
    ConsoleReporter::ReportRuns(runs);
    for (const Run& run : runs) {
      const bool median = run.run_type == Run::RT_Aggregate && run.aggregate_name == "median";
      if (run.run_type == Run::RT_Aggregate && !median) continue;
      const std::string name = run.run_name.str();
      // A median replaces single repetitions; a later single run never replaces a median.
      if (!median && medians_.count(name) != 0) continue;
      if (median) medians_[name] = true;
      if (ns_.count(name) == 0) order_.push_back(name);
      const double to_ns = 1e9 / benchmark::GetTimeUnitMultiplier(run.time_unit);
      ns_[name] = run.GetAdjustedRealTime() * to_ns;
      cpu_ns_[name] = run.GetAdjustedCPUTime() * to_ns;
    }
  }

  void Finalize() override {
    ConsoleReporter::Finalize();
    // Random interleaving shuffles the run order: list by pair, then argument.
    std::stable_sort(order_.begin(), order_.end(), [](const std::string& a, const std::string& b) {
      return sort_key(a) < sort_key(b);
    });
    std::string json = "{\n  \"unit\": \"ns per step\",\n  \"rows\": [";
    bool first = true;
    std::printf("\n%-36s %14s %14s %10s %10s\n", "kvcore vs memcpy floor", "kvcore ns",
                "floor ns", "ratio", "cpu ratio");
    for (const std::string& name : order_) {
      const double ns = ns_[name];
      for (const auto& pair : floor_pairs()) {
        if (name.compare(0, pair.first.size() + 1, pair.first + "/") != 0) continue;
        const std::string floor_name = pair.second + name.substr(pair.first.size());
        const auto floor = ns_.find(floor_name);
        if (floor == ns_.end()) continue;
        const double ratio = ns / floor->second;
        const double cpu_ratio = cpu_ns_[name] / cpu_ns_[floor_name];
        std::printf("%-36s %14.1f %14.1f %10.4f %10.4f\n", name.c_str(), ns, floor->second, ratio,
                    cpu_ratio);
        char row[512];
        std::snprintf(row, sizeof row,
                      "%s\n    {\"benchmark\": \"%s\", \"floor\": \"%s\", \"ns\": %.3f, "
                      "\"floor_ns\": %.3f, \"ratio\": %.6f, \"cpu_ns\": %.3f, "
                      "\"floor_cpu_ns\": %.3f, \"cpu_ratio\": %.6f}",
                      first ? "" : ",", name.c_str(), floor_name.c_str(), ns, floor->second, ratio,
                      cpu_ns_[name], cpu_ns_[floor_name], cpu_ratio);
        json += row;
        first = false;
      }
    }
    json += "\n  ]\n}\n";
    if (json_path_.empty()) return;
    std::FILE* out = std::fopen(json_path_.c_str(), "w");
    if (out == nullptr || std::fputs(json.c_str(), out) < 0) {
      std::fprintf(stderr, "cannot write %s\n", json_path_.c_str());
      write_failed_ = true;
    }
    if (out != nullptr) std::fclose(out);
  }

  bool write_failed() const { return write_failed_; }

 private:
  // (index of the pair whose kvcore prefix names the benchmark, its numeric argument).
  static std::pair<std::size_t, long> sort_key(const std::string& name) {
    std::size_t pair = floor_pairs().size();
    for (std::size_t i = 0; i < floor_pairs().size(); ++i)
      if (name.compare(0, floor_pairs()[i].first.size() + 1, floor_pairs()[i].first + "/") == 0)
        pair = i;
    const std::size_t colon = name.rfind(':');
    if (colon == std::string::npos) return {pair, 0};
    return {pair, std::strtol(name.c_str() + colon + 1, nullptr, 10)};
  }

  std::string json_path_;
  std::map<std::string, double> ns_;
  std::map<std::string, double> cpu_ns_;
  std::vector<std::string> order_;  // names in the order they first ran
  std::map<std::string, bool> medians_;
  bool write_failed_ = false;
};

}  // namespace kvcore_bench
