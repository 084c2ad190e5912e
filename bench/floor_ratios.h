// A console reporter that also prints each kvcore benchmark against its
// memcpy floor (same arguments, same bytes) and can write those ratios as
// JSON. Uses the median when repetitions ran, else the single run.
#pragma once

#include <benchmark/benchmark.h>

#include <cstdio>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace kvcore_bench {

/// kvcore benchmark name prefix -> the floor benchmark measuring the same bytes.
inline const std::vector<std::pair<std::string, std::string>>& floor_pairs() {
  static const std::vector<std::pair<std::string, std::string>> pairs = {
      {"plan_step", "memcpy_step_kv"},
      {"pool_write_step", "memcpy_write_step"},
      {"pool_gather_step", "memcpy_gather_step"},
      {"pool_views_step", "memcpy_gather_step"},
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
      ns_[name] = run.GetAdjustedRealTime() / benchmark::GetTimeUnitMultiplier(run.time_unit) * 1e9;
    }
  }

  void Finalize() override {
    ConsoleReporter::Finalize();
    std::string json = "{\n  \"unit\": \"ns per step\",\n  \"rows\": [";
    bool first = true;
    std::printf("\n%-36s %14s %14s %10s\n", "kvcore vs memcpy floor", "kvcore ns", "floor ns",
                "ratio");
    for (const std::string& name : order_) {
      const double ns = ns_[name];
      for (const auto& pair : floor_pairs()) {
        if (name.compare(0, pair.first.size() + 1, pair.first + "/") != 0) continue;
        const std::string floor_name = pair.second + name.substr(pair.first.size());
        const auto floor = ns_.find(floor_name);
        if (floor == ns_.end()) continue;
        const double ratio = ns / floor->second;
        std::printf("%-36s %14.1f %14.1f %10.4f\n", name.c_str(), ns, floor->second, ratio);
        char row[512];
        std::snprintf(row, sizeof row,
                      "%s\n    {\"benchmark\": \"%s\", \"floor\": \"%s\", \"ns\": %.3f, "
                      "\"floor_ns\": %.3f, \"ratio\": %.6f}",
                      first ? "" : ",", name.c_str(), floor_name.c_str(), ns, floor->second,
                      ratio);
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
  std::string json_path_;
  std::map<std::string, double> ns_;
  std::vector<std::string> order_;  // names in the order they first ran
  std::map<std::string, bool> medians_;
  bool write_failed_ = false;
};

}  // namespace kvcore_bench
