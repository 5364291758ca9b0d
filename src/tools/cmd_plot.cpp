// vxq plot: an SVG chart from a tab-separated table (e.g. scripts/quality_table.sh's output),
// decode speed vs context depth from `vxq bench --json` files, or KL divergence vs bits/element
// from `vxq eval --json` files.
#include <charconv>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "tools/commands.h"
#include "tools/common.h"
#include "tools/eval_plot.h"
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
        if (line.empty() || line[0] == '#') continue;
        std::vector<std::string> cols;
        std::istringstream ls(line);
        for (std::string c; std::getline(ls, c, '\t');) cols.push_back(c);
        const int need = std::max({o.x_col, o.y_col, o.label_col, o.series_col});
        if (int(cols.size()) <= need) fail("{}:{}: expected at least {} tab-separated columns", input, lineno, need + 1);
        PlotPoint p;
        try {
            p.x = std::stod(cols[size_t(o.x_col)]);
            p.y = std::stod(cols[size_t(o.y_col)]);
        } catch (const std::exception&) {
            fail("{}:{}: column {} or {} is not a number", input, lineno, o.x_col + 1, o.y_col + 1);
        }
        if (o.label_col >= 0) p.label = cols[size_t(o.label_col)];
        if (o.series_col >= 0) p.series = cols[size_t(o.series_col)];
        pts.push_back(p);
    }
    return pts;
}

// nlohmann's message without its "[json.exception.type_error.302] " prefix.
std::string json_message(const nlohmann::json::exception& e) {
    const std::string m = e.what();
    const size_t close = m.find("] ");
    return m.rfind("[json.exception.", 0) == 0 && close != std::string::npos ? m.substr(close + 2) : m;
}

// "tg64@d1024" -> 1024, "tg64" -> 0: the depth of rows written before bench rows carried one.
double depth_from_test_name(const std::string& path, size_t row, const std::string& test) {
    const size_t at = test.find("@d");
    if (at == std::string::npos) return 0;
    int64_t d = 0;
    const char* first = test.data() + at + 2;
    const char* last = test.data() + test.size();
    const auto [end, ec] = std::from_chars(first, last, d);
    if (ec != std::errc{} || end != last || first == last || d < 0) fail("{}: row {}: cannot read a depth from test '{}'", path, row, test);
    return double(d);
}

// What the bench JSON files say about how they were measured, for the default title.
struct BenchRunInfo {
    std::set<int64_t> threads, reps;
};

// The decode (tg) rows of one `vxq bench --json` file as points: x = depth, y = median tokens/s,
// error bar = min-max over the repetitions, one series per configuration; A/A rows are skipped.
void read_bench_json(const std::string& path, std::vector<PlotPoint>& pts, BenchRunInfo& info) {
    nlohmann::json j;
    try {
        j = nlohmann::json::parse(read_file(path));
    } catch (const nlohmann::json::exception& e) {
        fail("{}: not valid JSON: {}", path, json_message(e));
    }
    if (!j.is_object() || !j.contains("rows") || !j["rows"].is_array() || j["rows"].empty()) {
        fail("{}: no \"rows\" to plot (expected the output of vxq bench --json)", path);
    }
    if (j.contains("threads") && j["threads"].is_number_integer()) info.threads.insert(j["threads"].get<int64_t>());
    if (j.contains("repetitions") && j["repetitions"].is_number_integer()) info.reps.insert(j["repetitions"].get<int64_t>());
    const auto& rows = j["rows"];
    size_t n_decode = 0;
    for (size_t i = 0; i < rows.size(); ++i) {
        const auto& r = rows[i];
        try {
            const std::string test = r.at("test").get<std::string>();
            if (r.value("aa", false) || test.rfind("tg", 0) != 0) continue;
            PlotPoint p;
            p.series = r.at("config").get<std::string>();
            p.x = r.contains("depth") ? r["depth"].get<double>() : depth_from_test_name(path, i, test);
            p.y = r.at("tps_median").get<double>();
            if (r.contains("tps_min") && r.contains("tps_max")) {
                p.y_lo = r["tps_min"].get<double>();
                p.y_hi = r["tps_max"].get<double>();
            }
            pts.push_back(p);
            ++n_decode;
        } catch (const nlohmann::json::exception& e) {
            fail("{}: row {}: {}", path, i, json_message(e));
        }
    }
    if (n_decode == 0) fail("{}: no decode rows (tests named tg...) to plot", path);
}

// `vxq eval --json` files: the Pareto view, bits/element vs mean KL (log), one point per method
// and mode (tools/eval_plot.h).
std::vector<PlotPoint> read_eval_jsons(PlotOptions& o) {
    std::vector<PlotPoint> pts;
    std::string model;
    for (const auto& path : o.inputs) {
        nlohmann::json j;
        try {
            j = nlohmann::json::parse(read_file(path));
        } catch (const nlohmann::json::exception& e) {
            fail("{}: not valid JSON: {}", path, json_message(e));
        }
        try {
            for (PlotPoint& p : kl_vs_bits_points(j)) pts.push_back(std::move(p));
            model = std::filesystem::path(j.at("model").get<std::string>()).stem().string();
        } catch (const nlohmann::json::exception& e) {
            fail("{}: {}", path, json_message(e));
        }
    }
    const PlotSpec spec = kl_vs_bits_spec(model);
    if (!o.title_given) o.spec.title = spec.title;
    if (!o.xlabel_given) o.spec.x_label = spec.x_label;
    if (!o.ylabel_given) o.spec.y_label = spec.y_label;
    o.spec.log_y = true;
    return pts;
}

bool is_eval_json(const std::string& path) {
    try {
        const auto j = nlohmann::json::parse(read_file(path));
        return j.is_object() && j.contains("methods");
    } catch (const nlohmann::json::exception&) {
        return false;  // reported by the bench reader
    }
}

std::vector<PlotPoint> read_bench_jsons(PlotOptions& o) {
    if (!o.table_flags_given.empty()) {
        fail("{}: column options are for a TSV table; a vxq bench or eval JSON has its own chart",
             fmt::join(o.table_flags_given, ", "));
    }
    if (is_eval_json(o.inputs.front())) return read_eval_jsons(o);
    std::vector<PlotPoint> pts;
    BenchRunInfo info;
    for (const auto& path : o.inputs) read_bench_json(path, pts, info);

    std::map<std::pair<std::string, double>, int> seen;
    const PlotPoint* first_repeat = nullptr;
    size_t n_repeats = 0;
    for (const auto& p : pts) {
        if (++seen[{p.series, p.x}] == 2) {
            if (!first_repeat) first_repeat = &p;
            ++n_repeats;
        }
    }
    if (first_repeat) {
        fmt::print(stderr, "vxq: warning: {} (configuration, depth) pairs are in more than one row, e.g. '{}' at depth {:g}; every row is drawn\n",
                   n_repeats, first_repeat->series, first_repeat->x);
    }

    std::vector<std::string> notes;
    if (info.threads.size() == 1) {
        const int64_t t = *info.threads.begin();
        notes.push_back(fmt::format("{} thread{}", t, t == 1 ? "" : "s"));
    }
    if (info.reps.size() == 1) notes.push_back(fmt::format("bars: min–max of {} reps", *info.reps.begin()));
    if (!o.title_given) {
        o.spec.title = "decode tokens/s vs context depth";
        if (!notes.empty()) o.spec.title += fmt::format(" ({})", fmt::join(notes, ", "));
    }
    if (!o.xlabel_given) o.spec.x_label = "context depth (tokens)";
    if (!o.ylabel_given) o.spec.y_label = "decode tokens/s (median)";
    o.spec.lines = true;
    return pts;
}

void run_plot(PlotOptions o) {
    size_t n_json = 0;
    for (const auto& path : o.inputs) n_json += is_json_path(path);
    std::vector<PlotPoint> pts;
    if (n_json == o.inputs.size()) {
        pts = read_bench_jsons(o);
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
