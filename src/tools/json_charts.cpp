#include "tools/json_charts.h"

#include <charconv>
#include <filesystem>
#include <map>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/error.h"
#include "tools/common.h"

namespace vxq::tools {

namespace {

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

nlohmann::json parse_file(const std::string& path) {
    try {
        return nlohmann::json::parse(read_file(path));
    } catch (const nlohmann::json::exception& e) {
        fail("{}: not valid JSON: {}", path, json_message(e));
    }
}

}  // namespace

bool is_eval_json_file(const std::string& path) {
    try {
        const auto j = nlohmann::json::parse(read_file(path));
        return j.is_object() && j.contains("methods");
    } catch (const nlohmann::json::exception&) {
        return false;  // the bench reader names the problem
    }
}

Chart kl_vs_bits_chart(const nlohmann::json& j) {
    Chart c;
    for (const auto& m : j.at("methods")) {
        for (const auto& [mode, e] : m.at("modes").items()) {
            const double kl = e.at("kl").at("mean").get<double>();
            if (kl <= 0) continue;
            c.points.push_back({e.at("bits_per_element").get<double>(), kl, m.at("method").get<std::string>(), mode});
        }
    }
    c.spec.title = fmt::format("{}: KL divergence from the f16 cache vs KV bits",
                               std::filesystem::path(j.at("model").get<std::string>()).stem().string());
    c.spec.x_label = "resident bits/element";
    c.spec.y_label = "mean KL per token (nats, log scale)";
    c.spec.log_y = true;
    return c;
}

Chart kl_vs_bits_chart(const std::vector<std::string>& paths) {
    Chart all;
    for (const auto& path : paths) {
        const nlohmann::json j = parse_file(path);
        try {
            Chart c = kl_vs_bits_chart(j);
            all.spec = c.spec;
            for (PlotPoint& p : c.points) all.points.push_back(std::move(p));
        } catch (const nlohmann::json::exception& e) {
            fail("{}: {} (expected the output of vxq eval --json)", path, json_message(e));
        }
    }
    return all;
}

Chart speed_vs_depth_chart(const std::vector<std::string>& paths) {
    Chart c;
    std::vector<PlotPoint>& pts = c.points;
    BenchRunInfo info;
    for (const auto& path : paths) read_bench_json(path, pts, info);

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
    c.spec.title = "decode tokens/s vs context depth";
    if (!notes.empty()) c.spec.title += fmt::format(" ({})", fmt::join(notes, ", "));
    c.spec.x_label = "context depth (tokens)";
    c.spec.y_label = "decode tokens/s (median)";
    c.spec.lines = true;
    return c;
}

}  // namespace vxq::tools
