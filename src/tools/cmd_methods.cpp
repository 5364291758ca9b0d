// vxq methods: every KV cache method, its options and its true bits per element.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "kv/codec.h"
#include "tools/commands.h"

namespace vxq::tools {

void add_methods(CLI::App& app, int& rc) {
    auto* sub = app.add_subcommand("methods", "List the KV cache methods with their options and bits/element");
    sub->callback([&rc] {
        fmt::print("| method | options (default) | bits/element | d=64 | d=128 | window | backends | description |\n");
        fmt::print("| --- | --- | --- | ---: | ---: | --- | --- | --- |\n");
        for (const CodecInfo& info : list_codecs()) {
            std::string bits[2];
            std::string window = "none";
            int i = 0;
            for (int64_t d : {64, 128}) {
                try {
                    const auto k = make_codec(CodecSpec{info.name, {}}, KvRole::Key, d);
                    const auto v = make_codec(CodecSpec{info.name, {}}, KvRole::Value, d);
                    bits[i] = fmt::format("{:.3f}", 0.5 * (k->bits_per_element(d) + v->bits_per_element(d)));
                    if (k->flush_at() > 1 || v->flush_at() > 1) {
                        window = fmt::format("fp16, K {} / V {} tokens", k->flush_at() - 1, v->flush_at() - 1);
                    }
                } catch (const std::exception& e) {
                    bits[i] = "n/a";
                }
                ++i;
            }
            fmt::print("| {} | {} | {} | {} | {} | {} | {} | {} |\n", info.name, info.options.empty() ? "-" : info.options,
                       info.bits, bits[0], bits[1], window, fmt::join(info.backends, ", "), info.description);
        }
        fmt::print("\nbits/element counts codes + scales/zeros (packed part); the fp16 window adds "
                   "16 * window / tokens on top (reported as measured by generate/perplexity).\n");
        rc = 0;
    });
}

}  // namespace vxq::tools
