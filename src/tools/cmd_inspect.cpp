// vxq inspect MODEL: metadata and tensor table of a GGUF file.
#include <cstdio>
#include <memory>
#include <string>

#include <fmt/format.h>

#include "formats/gguf.h"
#include "tools/commands.h"

namespace vxq::tools {

namespace {

std::string value_summary(const GgufValue& v) {
    switch (v.type) {
        case GgufValueType::STRING: return fmt::format("\"{}\"", v.s.size() > 80 ? v.s.substr(0, 77) + "..." : v.s);
        case GgufValueType::FLOAT32: case GgufValueType::FLOAT64: return fmt::format("{}", v.f);
        case GgufValueType::BOOL: return v.i ? "true" : "false";
        case GgufValueType::ARRAY:
            return fmt::format("[{} x {}]", v.array_size(), gguf_value_type_name(v.elem_type));
        default: return fmt::format("{}", v.i);
    }
}

void run_inspect(const std::string& path) {
    const GgufFile f = GgufFile::open(path);
    fmt::print("file: {}\nGGUF version: {}\nsize: {} bytes\nalignment: {}\n\nmetadata ({} keys):\n", f.path(),
               f.version(), f.size(), f.alignment(), f.metadata().size());
    for (const auto& [k, v] : f.metadata()) fmt::print("  {:<48} {:<7} {}\n", k, gguf_value_type_name(v.type), value_summary(v));
    fmt::print("\ntensors ({}):\n", f.tensors().size());
    size_t total = 0;
    for (const auto& t : f.tensors()) {
        std::string dims;
        for (size_t i = 0; i < t.ne.size(); ++i) dims += fmt::format("{}{}", i ? " x " : "", t.ne[i]);
        fmt::print("  {:<32} {:<6} {:<20} {:>12} bytes @ {}\n", t.name, ggml_type_name(t.type), dims, t.n_bytes, t.offset);
        total += t.n_bytes;
    }
    fmt::print("\ntensor bytes: {}\n", total);
}

}  // namespace

void add_inspect(CLI::App& app, int& rc) {
    auto* sub = app.add_subcommand("inspect", "Print a GGUF file's metadata and tensor table");
    auto path = std::make_shared<std::string>();
    sub->add_option("model", *path, "GGUF file")->required();
    sub->callback([path, &rc] {
        run_inspect(*path);
        rc = 0;
    });
}

}  // namespace vxq::tools
