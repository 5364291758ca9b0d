// The layering rule of docs/architecture.md, checked on every `#include "..."` of every file
// under src/: a layer includes only itself and the layers listed before it in kLayers. So
// kv/, formats/, model/, backend/ and core/ never include kernels/ (the model sees a backend
// only through backend/), and no backend or kernel includes model/, runtime/ or tools/.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace vxq {
namespace {

namespace fs = std::filesystem;


struct Layer {
    std::string folder;                 // top-level folder under src/
    std::vector<std::string> may_use;   // folders its files may include
};

// Bottom up. kernels implement the backend interface; model, runtime and tools are written
// against that interface and never include kernels/.
const std::vector<Layer> kLayers = {
    {"core", {"core"}},
    {"formats", {"core", "formats"}},
    {"kv", {"core", "formats", "kv"}},
    {"backend", {"core", "formats", "kv", "backend"}},
    {"kernels", {"core", "formats", "kv", "backend", "kernels"}},
    {"model", {"core", "formats", "kv", "backend", "model"}},
    {"runtime", {"core", "formats", "kv", "backend", "model", "runtime"}},
    {"tools", {"core", "formats", "kv", "backend", "model", "runtime", "tools"}},
};

const Layer* layer_of(const std::string& rel) {  // rel: a path under src/
    const std::string top = rel.substr(0, rel.find('/'));
    for (const Layer& l : kLayers) {
        if (l.folder == top) return &l;
    }
    return nullptr;
}

struct Include {
    std::string file;    // under src/
    int line;
    std::string target;  // under src/, as the compiler resolves it; empty if it resolves nowhere
    std::string spelled; // as written
};

// Every quoted include of every source file under src/, resolved as the compiler does: next to
// the including file first, then from src/ (the include root).
std::vector<Include> scan(const fs::path& src) {
    static const std::regex kInclude(R"re(^\s*#\s*include\s*"([^"]+)")re");
    std::vector<Include> out;
    for (const auto& entry : fs::recursive_directory_iterator(src)) {
        if (!entry.is_regular_file()) continue;
        const std::string ext = entry.path().extension().string();
        if (ext != ".h" && ext != ".cpp" && ext != ".cu" && ext != ".cuh" && ext != ".inl") continue;
        const std::string file = entry.path().lexically_relative(src).generic_string();
        std::ifstream in(entry.path());
        std::string text;
        int line_no = 0;
        while (std::getline(in, text)) {
            ++line_no;
            std::smatch m;
            if (!std::regex_search(text, m, kInclude)) continue;
            const std::string spelled = m[1];
            std::string target;
            for (const fs::path& base : {entry.path().parent_path(), src}) {
                const fs::path p = (base / spelled).lexically_normal();
                if (fs::exists(p)) {
                    target = p.lexically_relative(src).generic_string();
                    break;
                }
            }
            out.push_back({file, line_no, target, spelled});
        }
    }
    std::sort(out.begin(), out.end(), [](const Include& a, const Include& b) {
        return a.file != b.file ? a.file < b.file : a.line < b.line;
    });
    return out;
}

TEST(Layering, SourceIncludesFollowTheLayerOrder) {
    const fs::path src = VXQ_SOURCE_DIR;
    ASSERT_TRUE(fs::is_directory(src)) << src;
    const std::vector<Include> includes = scan(src);
    ASSERT_GT(includes.size(), 100u) << "the scan found too few includes under " << src;

    std::vector<std::string> violations;
    for (const Include& inc : includes) {
        const Layer* from = layer_of(inc.file);
        const std::string where = fmt::format("src/{}:{} -> {}", inc.file, inc.line, inc.spelled);
        if (!from) {
            violations.push_back(where + " (src/" + inc.file.substr(0, inc.file.find('/')) +
                                 "/ is not a layer: add it to kLayers and docs/architecture.md)");
            continue;
        }
        if (inc.target.empty()) {
            violations.push_back(where + " (resolves to no file under src/)");
            continue;
        }
        const Layer* to = layer_of(inc.target);
        const bool ok = to && std::find(from->may_use.begin(), from->may_use.end(), to->folder) != from->may_use.end();
        if (ok) continue;
        violations.push_back(fmt::format("{} ({}/ may include only {})", where, from->folder,
                                         fmt::join(from->may_use, ", ")));
    }
    for (const std::string& v : violations) ADD_FAILURE() << "layering violation: " << v;
}

// Every folder under src/ is a layer of the table, so a new folder cannot escape the check.
TEST(Layering, EveryFolderIsALayer) {
    const fs::path src = VXQ_SOURCE_DIR;
    for (const auto& entry : fs::directory_iterator(src)) {
        if (!entry.is_directory()) continue;
        const std::string name = entry.path().filename().string();
        EXPECT_NE(layer_of(name + "/x"), nullptr) << "src/" << name << "/ is not in kLayers";
    }
}

}  // namespace
}  // namespace vxq
