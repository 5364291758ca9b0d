#include "tools/eval_plot.h"

#include <fmt/format.h>

namespace vxq::tools {

std::vector<PlotPoint> kl_vs_bits_points(const nlohmann::json& j) {
    std::vector<PlotPoint> pts;
    for (const auto& m : j.at("methods")) {
        for (const auto& [mode, e] : m.at("modes").items()) {
            const double kl = e.at("kl").at("mean").get<double>();
            if (kl <= 0) continue;
            pts.push_back({e.at("bits_per_element").get<double>(), kl, m.at("method").get<std::string>(), mode});
        }
    }
    return pts;
}

PlotSpec kl_vs_bits_spec(const std::string& model_name) {
    PlotSpec s;
    s.title = fmt::format("{}: KL divergence from the f16 cache vs KV bits", model_name);
    s.x_label = "resident bits/element";
    s.y_label = "mean KL per token (nats, log scale)";
    s.log_y = true;
    return s;
}

}  // namespace vxq::tools
