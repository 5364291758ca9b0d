// Minimal SVG charts for results people would rather see than read (quality vs bits, speed vs
// context): points with labels, optionally joined per series; linear or log-y axes.
#pragma once

#include <cmath>
#include <limits>
#include <string>
#include <vector>

namespace vxq::tools {

struct PlotPoint {
    double x = 0, y = 0;
    std::string label;   // drawn beside the point (may be empty)
    std::string series;  // points of one series share a colour and are joined when lines = true
    // Optional error bar from y_lo to y_hi (e.g. min-max over repetitions); NaN: none.
    double y_lo = std::numeric_limits<double>::quiet_NaN();
    double y_hi = std::numeric_limits<double>::quiet_NaN();
    bool has_error_bar() const { return std::isfinite(y_lo) && std::isfinite(y_hi); }
};

struct PlotSpec {
    std::string title, x_label, y_label;
    bool lines = false;
    bool log_y = false;  // log10 y axis; points with y <= 0 are left out
};

// The chart as an SVG document.
std::string render_svg(const PlotSpec& spec, const std::vector<PlotPoint>& points);

}  // namespace vxq::tools
