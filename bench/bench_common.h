// Pieces every microbenchmark file shares: the input generator, the min/max statistics next to Google Benchmark's
// median (MEASURE.md reports median, min and max) and the machine load recorded at start-up.
#pragma once

#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace vxq::bench {

inline double stat_min(const std::vector<double>& v) { return *std::min_element(v.begin(), v.end()); }
inline double stat_max(const std::vector<double>& v) { return *std::max_element(v.begin(), v.end()); }

// Real time in microseconds, with min and max among the aggregates.
inline void with_min_max(benchmark::internal::Benchmark* b) {
    b->Unit(benchmark::kMicrosecond)->UseRealTime();
    b->ComputeStatistics("min", stat_min)->ComputeStatistics("max", stat_max);
}

// A fast deterministic generator for input pools (xorshift64*) and a uniform float in [-1, 1).
inline uint64_t next(uint64_t& s) {
    s ^= s >> 12;
    s ^= s << 25;
    s ^= s >> 27;
    return s * 2685821657736338717ull;
}
inline float unit(uint64_t& s) { return float(int64_t(next(s) >> 40) - (1 << 23)) / float(1 << 23); }

// /proc/loadavg as one line ("" where it cannot be read).
inline std::string loadavg() {
    std::string s;
    if (FILE* f = std::fopen("/proc/loadavg", "r")) {
        char line[128] = {};
        if (std::fgets(line, sizeof line, f)) s = line;
        std::fclose(f);
    }
    while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
    return s;
}

}  // namespace vxq::bench
