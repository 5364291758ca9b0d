// vxq plot: an SVG chart from a tab-separated table (e.g. scripts/quality_table.sh's output).
#include <fstream>
#include <memory>
#include <sstream>

#include <fmt/format.h>

#include "core/error.h"
#include "tools/commands.h"
#include "tools/common.h"
#include "tools/svg_plot.h"

namespace vxq::tools {

namespace {
struct PlotOptions {
    std::string input, output;
    int x_col = 0, y_col = 1, label_col = -1, series_col = -1;
    PlotSpec spec;
};

void run_plot(const PlotOptions& o) {
    std::istringstream in(read_file(o.input));
    std::vector<PlotPoint> pts;
    std::string line;
    int lineno = 0;
    while (std::getline(in, line)) {
        ++lineno;
        if (line.empty() || line[0] == '#') continue;
        std::vector<std::string> cols;
        std::istringstream ls(line);
        for (std::string c; std::getline(ls, c, '\t');) cols.push_back(c);
        const int need = std::max({o.x_col, o.y_col, o.label_col, o.series_col});
        if (int(cols.size()) <= need) fail("{}:{}: expected at least {} tab-separated columns", o.input, lineno, need + 1);
        PlotPoint p;
        try {
            p.x = std::stod(cols[size_t(o.x_col)]);
            p.y = std::stod(cols[size_t(o.y_col)]);
        } catch (const std::exception&) {
            fail("{}:{}: column {} or {} is not a number", o.input, lineno, o.x_col + 1, o.y_col + 1);
        }
        if (o.label_col >= 0) p.label = cols[size_t(o.label_col)];
        if (o.series_col >= 0) p.series = cols[size_t(o.series_col)];
        pts.push_back(p);
    }
    const std::string svg = render_svg(o.spec, pts);
    const std::string tmp = o.output + ".tmp";
    {
        std::ofstream out(tmp, std::ios::binary);
        out << svg;
        if (!out) fail("cannot write '{}'", tmp);
    }
    if (std::rename(tmp.c_str(), o.output.c_str()) != 0) fail("cannot write '{}'", o.output);
    fmt::print("wrote {} ({} points)\n", o.output, pts.size());
}
}  // namespace

void add_plot(CLI::App& app, int& rc) {
    auto* sub = app.add_subcommand("plot", "Draw an SVG chart from a tab-separated table");
    auto o = std::make_shared<PlotOptions>();
    sub->add_option("input", o->input, "TSV file")->required();
    sub->add_option("-o,--output", o->output, "SVG file to write")->required();
    sub->add_option("--x", o->x_col, "x column (0-based)")->check(CLI::Range(0, 64));
    sub->add_option("--y", o->y_col, "y column (0-based)")->check(CLI::Range(0, 64));
    sub->add_option("--label", o->label_col, "label column (0-based, -1 none)")->check(CLI::Range(-1, 64));
    sub->add_option("--series", o->series_col, "series column (0-based, -1 none)")->check(CLI::Range(-1, 64));
    sub->add_option("--title", o->spec.title, "chart title");
    sub->add_option("--xlabel", o->spec.x_label, "x axis label");
    sub->add_option("--ylabel", o->spec.y_label, "y axis label");
    sub->add_flag("--lines", o->spec.lines, "join the points of each series");
    sub->callback([o, &rc] {
        run_plot(*o);
        rc = 0;
    });
}

}  // namespace vxq::tools
