// vxq plot: an SVG chart from a tab-separated table (e.g. scripts/quality_table.sh's output),
// decode speed vs context depth from `vxq bench --json` files, or KL divergence vs bits/element
// from `vxq eval --json` files.
#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>

#include <fmt/format.h>


#include "core/error.h"
#include "tools/commands.h"
#include "tools/common.h"
#include "tools/json_charts.h"
#include "tools/svg_plot.h"

namespace vxq::tools {

namespace {
struct PlotOptions {
    std::vector<std::string> inputs, table_flags_given;
    std::string output;
    int x_col = 0, y_col = 1, label_col = -1, series_col = -1;
    PlotSpec spec;
    bool title_given = false, xlabel_given = false, ylabel_given = false;
};

bool is_json_path(const std::string& path) { return path.size() > 5 && path.ends_with(".json"); }

std::vector<PlotPoint> read_table(const PlotOptions& o, const std::string& input) {
    std::istringstream in(read_file(input));
    std::vector<PlotPoint> pts;
    std::string line;
    int lineno = 0;
    while (std::getline(in, line)) {
        ++lineno;
        if (!line.empty() && line.back() == '\r') line.pop_back();  // a CRLF file
        if (line.empty() || line[0] == '#') continue;
        std::vector<std::string> cols;
        std::istringstream ls(line);
        for (std::string c; std::getline(ls, c, '\t');) cols.push_back(c);
        const int need = std::max({o.x_col, o.y_col, o.label_col, o.series_col});
        if (int(cols.size()) <= need) fail("{}:{}: expected at least {} tab-separated columns", input, lineno, need + 1);
        // The whole field a finite number, spaces around it allowed (std::stod alone takes "12abc"
        // as 12, and "nan").
        const auto number = [&](int col) {
            const std::string& f = cols[size_t(col)];
            size_t used = 0;
            double v = NAN;
            try {
                v = std::stod(f, &used);
            } catch (const std::exception&) {
                used = 0;
            }
            while (used > 0 && used < f.size() && (f[used] == ' ' || f[used] == '\t')) ++used;
            if (used == 0 || used != f.size() || !std::isfinite(v)) {
                fail("{}:{}: column {} ('{}') is not a finite number", input, lineno, col + 1, f);
            }
            return v;
        };
        PlotPoint p;
        p.x = number(o.x_col);
        p.y = number(o.y_col);
        if (o.label_col >= 0) p.label = cols[size_t(o.label_col)];
        if (o.series_col >= 0) p.series = cols[size_t(o.series_col)];
        pts.push_back(p);
    }
    if (pts.empty()) fail("{}: no data rows to plot (rows of tab-separated numbers; '#' starts a comment)", input);
    return pts;
}

// A chart drawn from vxq's JSON outputs (tools/json_charts.h); --title/--xlabel/--ylabel override
// its labels.
std::vector<PlotPoint> read_json_inputs(PlotOptions& o) {
    if (!o.table_flags_given.empty()) {
        fail("{}: column options are for a TSV table; a vxq bench or eval JSON has its own chart",
             fmt::join(o.table_flags_given, ", "));
    }
    Chart c = is_eval_json_file(o.inputs.front()) ? kl_vs_bits_chart(o.inputs) : speed_vs_depth_chart(o.inputs);
    if (o.title_given) c.spec.title = o.spec.title;
    if (o.xlabel_given) c.spec.x_label = o.spec.x_label;
    if (o.ylabel_given) c.spec.y_label = o.spec.y_label;
    o.spec = c.spec;
    if (c.points.empty()) fail("{}: no data points to plot", fmt::join(o.inputs, ", "));
    return c.points;
}

void run_plot(PlotOptions o) {
    size_t n_json = 0;
    for (const auto& path : o.inputs) n_json += is_json_path(path);
    std::vector<PlotPoint> pts;
    if (n_json == o.inputs.size()) {
        pts = read_json_inputs(o);
    } else if (o.inputs.size() == 1) {
        pts = read_table(o, o.inputs.front());
    } else {
        fail("several inputs must all be vxq bench --json files (*.json); a TSV table is plotted on its own");
    }
    write_file_atomically(o.output, render_svg(o.spec, pts));
    fmt::print("wrote {} ({} points)\n", o.output, pts.size());
}
}  // namespace

void add_plot(CLI::App& app, int& rc) {
    auto* sub = app.add_subcommand("plot", "Draw an SVG chart from a tab-separated table, decode speed vs depth from vxq bench --json files, or KL vs bits from vxq eval --json files");
    auto o = std::make_shared<PlotOptions>();
    sub->add_option("input", o->inputs, "TSV file, or one or more vxq bench or vxq eval --json files (*.json, merged)")->required();
    sub->add_option("-o,--output", o->output, "SVG file to write")->required();
    sub->add_option("--x", o->x_col, "x column (0-based)")->check(CLI::Range(0, 64));
    sub->add_option("--y", o->y_col, "y column (0-based)")->check(CLI::Range(0, 64));
    sub->add_option("--label", o->label_col, "label column (0-based, -1 none)")->check(CLI::Range(-1, 64));
    sub->add_option("--series", o->series_col, "series column (0-based, -1 none)")->check(CLI::Range(-1, 64));
    sub->add_option("--title", o->spec.title, "chart title");
    sub->add_option("--xlabel", o->spec.x_label, "x axis label");
    sub->add_option("--ylabel", o->spec.y_label, "y axis label");
    sub->add_flag("--lines", o->spec.lines, "join the points of each series (always on for bench JSON)");
    sub->callback([o, sub, &rc] {
        for (const char* flag : {"--x", "--y", "--label", "--series"}) {
            if (sub->count(flag) > 0) o->table_flags_given.push_back(flag);
        }
        o->title_given = sub->count("--title") > 0;
        o->xlabel_given = sub->count("--xlabel") > 0;
        o->ylabel_given = sub->count("--ylabel") > 0;
        run_plot(*o);
        rc = 0;
    });
}

}  // namespace vxq::tools
