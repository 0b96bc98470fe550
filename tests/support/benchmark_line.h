// What every app's `benchmark` line holds (core/train/benchmark.cpp), checked the same way for each app.
#pragma once

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <string>

#include "tests/support/json_lines.h"

namespace kuafu::testing {

// The shared fields are there, with figures that hang together: throughput from the median step, MFU
// from the model FLOP rate and the measured matrix-product rate.
inline void expect_benchmark_line(const nlohmann::json& line, const std::string& app, const std::string& items,
                                  int64_t items_per_row) {
  ASSERT_TRUE(line.is_object()) << line.dump();
  for (const char* key : {"app", "config", "parameters", "batch", "threads", "precision", "optimizer",
                          "memory_strategy", "activation_checkpointing", "step_time_ms_median", "step_time_ms_min",
                          "step_time_ms_max", "model_tflops", "matmul_gflops", "mfu", "peak_mem_mb",
                          "resident_before_model_mb", "peak_in_use_mb", "in_use_before_model_mb"}) {
    EXPECT_TRUE(line.contains(key)) << key << " missing from " << line.dump();
  }
  ASSERT_TRUE(line.contains(items + "_per_s")) << line.dump();
  EXPECT_EQ(line.value("app", ""), app);
  const double median_s = line.value("step_time_ms_median", 0.0) / 1e3;
  ASSERT_GT(median_s, 0);
  EXPECT_LE(line.value("step_time_ms_min", 0.0), line.value("step_time_ms_median", 0.0));
  EXPECT_GE(line.value("step_time_ms_max", 0.0), line.value("step_time_ms_median", 0.0));
  const double items_per_s = line[items + "_per_s"].get<double>();
  EXPECT_NEAR(items_per_s, line.value("batch", 0) * items_per_row / median_s, 1e-6 * items_per_s);
  const double model_flops = line.value("model_tflops", 0.0) * 1e12;
  EXPECT_NEAR(line.value("mfu", 0.0), model_flops / (line.value("matmul_gflops", 0.0) * 1e9), 1e-9);
  EXPECT_GT(line.value("mfu", 0.0), 0);
}

}  // namespace kuafu::testing
