// Charts from vxq's own JSON outputs, shared by `vxq plot` and `vxq eval`:
//   - KL vs bits (the Pareto view of `vxq eval --json`): resident bits/element on x, mean KL
//     divergence from the reference on a log y axis, one point per method and mode (KL 0, the
//     reference itself, has no place on a log axis and is left out);
//   - decode speed vs context depth (`vxq bench --json`): x depth, y median tokens/s of the tg
//     rows with min-max bars, one line per configuration, A/A rows left out.
// Several files merge into one chart. vxq::Error names the file for malformed input.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tools/svg_plot.h"

namespace vxq::tools {

struct Chart {
    PlotSpec spec;
    std::vector<PlotPoint> points;
};

bool is_eval_json_file(const std::string& path);  // a JSON object with "methods"
Chart kl_vs_bits_chart(const nlohmann::json& eval_json);  // nlohmann::json::exception if malformed
Chart kl_vs_bits_chart(const std::vector<std::string>& eval_json_paths);
Chart speed_vs_depth_chart(const std::vector<std::string>& bench_json_paths);

}  // namespace vxq::tools
