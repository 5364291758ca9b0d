// Minimal SVG charts for results people would rather see than read (quality vs bits, speed vs
// context): points with labels, optionally joined per series; linear or log-x axes.
#pragma once

#include <string>
#include <vector>

namespace vxq::tools {

struct PlotPoint {
    double x = 0, y = 0;
    std::string label;   // drawn beside the point (may be empty)
    std::string series;  // points of one series share a colour and are joined when lines = true
};

struct PlotSpec {
    std::string title, x_label, y_label;
    bool lines = false;
};

// The chart as an SVG document.
std::string render_svg(const PlotSpec& spec, const std::vector<PlotPoint>& points);

}  // namespace vxq::tools
