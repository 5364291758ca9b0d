// The Pareto view of `vxq eval`: resident bits/element on x, mean KL divergence from the
// reference on y (log axis), one point per method and mode. Drawn from eval's JSON, so
// `vxq eval --plot` and `vxq plot eval.json ...` (merging several runs) give the same chart.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tools/svg_plot.h"

namespace vxq::tools {

// Points of one `vxq eval --json` document; methods with KL 0 (the reference itself) have no
// place on a log axis and are left out. nlohmann::json::exception on a malformed document.
std::vector<PlotPoint> kl_vs_bits_points(const nlohmann::json& eval_json);
PlotSpec kl_vs_bits_spec(const std::string& model_name);

}  // namespace vxq::tools
