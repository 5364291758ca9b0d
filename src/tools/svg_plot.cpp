#include "tools/svg_plot.h"

#include <algorithm>
#include <cmath>
#include <map>

#include <fmt/format.h>

namespace vxq::tools {

namespace {

std::string escape(const std::string& s) {
    std::string o;
    for (char c : s) {
        switch (c) {
            case '<': o += "&lt;"; break;
            case '>': o += "&gt;"; break;
            case '&': o += "&amp;"; break;
            case '"': o += "&quot;"; break;
            default: o += c;
        }
    }
    return o;
}

// Round tick step: 1, 2 or 5 times a power of ten, about n ticks over the span.
double tick_step(double span, int n) {
    const double raw = span / n;
    const double p = std::pow(10.0, std::floor(std::log10(raw)));
    for (double m : {1.0, 2.0, 5.0, 10.0}) {
        if (m * p >= raw) return m * p;
    }
    return 10 * p;
}

// A tick value as printed: within a thousandth of a step of zero is 0, not "-0" or "1.2e-13"
// (ticks are accumulated by repeated addition of the step).
double tick_label(double t, double step) { return std::abs(t) < step * 1e-3 ? 0.0 : t; }

}  // namespace

std::string render_svg(const PlotSpec& spec, const std::vector<PlotPoint>& points) {
    // A log axis is a linear axis over log10(y) whose tick labels print 10^t.
    std::vector<PlotPoint> logged;
    if (spec.log_y) {
        for (PlotPoint p : points) {
            if (!(p.y > 0)) continue;
            p.y = std::log10(p.y);
            if (p.has_error_bar()) {
                p.y_lo = p.y_lo > 0 ? std::log10(p.y_lo) : p.y;
                p.y_hi = p.y_hi > 0 ? std::log10(p.y_hi) : p.y;
            }
            logged.push_back(p);
        }
    }
    const std::vector<PlotPoint>& pts = spec.log_y ? logged : points;
    constexpr double W = 720, H = 460, L = 80, R = 160, T = 50, B = 60;
    double x0 = INFINITY, x1 = -INFINITY, y0 = INFINITY, y1 = -INFINITY;
    for (const auto& p : pts) {
        x0 = std::min(x0, p.x), x1 = std::max(x1, p.x);
        y0 = std::min(y0, p.y), y1 = std::max(y1, p.y);
        if (p.has_error_bar()) y0 = std::min(y0, p.y_lo), y1 = std::max(y1, p.y_hi);
    }
    if (pts.empty()) x0 = y0 = 0, x1 = y1 = 1;
    // All points at one x or one y (a bench run at a single depth, a single point): an axis at
    // least a unit wide around that value rather than a 2e-9-wide one.
    auto pad = [](double lo, double hi) { return hi > lo ? std::max(1e-9, (hi - lo) * 0.08) : std::max(1.0, std::abs(lo) * 0.08); };
    const double xpad = pad(x0, x1), ypad = pad(y0, y1);
    x0 -= xpad, x1 += xpad, y0 -= ypad, y1 += ypad;
    auto X = [&](double x) { return L + (x - x0) / (x1 - x0) * (W - L - R); };
    auto Y = [&](double y) { return H - B - (y - y0) / (y1 - y0) * (H - T - B); };

    std::string s = fmt::format(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" font-family=\"sans-serif\" font-size=\"12\">\n"
        "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
        "<text x=\"{}\" y=\"28\" font-size=\"16\" text-anchor=\"middle\">{}</text>\n",
        W, H, (L + W - R) / 2, escape(spec.title));
    const double xs = tick_step(x1 - x0, 8), ys = spec.log_y ? std::max(1.0, std::round(tick_step(y1 - y0, 6))) : tick_step(y1 - y0, 6);
    for (double t = std::ceil(x0 / xs) * xs; t <= x1; t += xs) {
        s += fmt::format("<line x1=\"{0:.1f}\" y1=\"{1}\" x2=\"{0:.1f}\" y2=\"{2}\" stroke=\"#ddd\"/>"
                         "<text x=\"{0:.1f}\" y=\"{3}\" text-anchor=\"middle\">{4:g}</text>\n",
                         X(t), T, H - B, H - B + 18, tick_label(t, xs));
    }
    for (double t = std::ceil(y0 / ys) * ys; t <= y1; t += ys) {
        s += fmt::format("<line x1=\"{1}\" y1=\"{0:.1f}\" x2=\"{2}\" y2=\"{0:.1f}\" stroke=\"#ddd\"/>"
                         "<text x=\"{3}\" y=\"{0:.1f}\" text-anchor=\"end\" dominant-baseline=\"middle\">{4:g}</text>\n",
                         Y(t), L, W - R, L - 6, spec.log_y ? std::pow(10.0, std::round(t)) : tick_label(t, ys));
    }
    s += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"none\" stroke=\"black\"/>\n", L, T,
                     W - L - R, H - T - B);
    s += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n", (L + W - R) / 2, H - 15, escape(spec.x_label));
    s += fmt::format("<text x=\"18\" y=\"{0}\" text-anchor=\"middle\" transform=\"rotate(-90 18 {0})\">{1}</text>\n",
                     (T + H - B) / 2, escape(spec.y_label));

    static const char* colors[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf"};
    std::map<std::string, std::vector<const PlotPoint*>> series;
    std::vector<std::string> order;
    for (const auto& p : pts) {
        if (!series.count(p.series)) order.push_back(p.series);
        series[p.series].push_back(&p);
    }
    for (size_t si = 0; si < order.size(); ++si) {
        const char* col = colors[si % std::size(colors)];
        auto& v = series[order[si]];
        if (spec.lines && v.size() > 1) {
            std::sort(v.begin(), v.end(), [](auto* a, auto* b) { return a->x < b->x; });
            std::string path;
            for (auto* p : v) path += fmt::format("{}{:.1f},{:.1f}", path.empty() ? "M" : " L", X(p->x), Y(p->y));
            s += fmt::format("<path d=\"{}\" fill=\"none\" stroke=\"{}\" stroke-width=\"2\"/>\n", path, col);
        }
        for (auto* p : v) {
            if (p->has_error_bar()) {
                const double x = X(p->x), lo = Y(p->y_lo), hi = Y(p->y_hi);
                s += fmt::format("<line x1=\"{0:.1f}\" y1=\"{1:.1f}\" x2=\"{0:.1f}\" y2=\"{2:.1f}\" stroke=\"{5}\"/>"
                                 "<line x1=\"{3:.1f}\" y1=\"{1:.1f}\" x2=\"{4:.1f}\" y2=\"{1:.1f}\" stroke=\"{5}\"/>"
                                 "<line x1=\"{3:.1f}\" y1=\"{2:.1f}\" x2=\"{4:.1f}\" y2=\"{2:.1f}\" stroke=\"{5}\"/>",
                                 x, lo, hi, x - 4, x + 4, col);
            }
            s += fmt::format("<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"4\" fill=\"{}\"/>", X(p->x), Y(p->y), col);
            if (!p->label.empty()) {
                s += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" font-size=\"11\">{}</text>", X(p->x) + 6, Y(p->y) - 6, escape(p->label));
            }
            s += "\n";
        }
        if (!order[si].empty()) {
            s += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"10\" height=\"10\" fill=\"{}\"/><text x=\"{}\" y=\"{}\">{}</text>\n",
                             W - R + 14, T + 18 * double(si), col, W - R + 30, T + 18 * double(si) + 9, escape(order[si]));
        }
    }
    return s + "</svg>\n";
}

}  // namespace vxq::tools
