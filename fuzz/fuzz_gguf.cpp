// libFuzzer target for the GGUF reader. A vxq::Error is the expected answer to bad input; a
// crash, a sanitizer report, any other exception or a broken invariant (trap) is a finding.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <span>
#include <string>

#include "core/error.h"
#include "formats/ggml_types.h"
#include "formats/gguf.h"

namespace {

volatile uint64_t g_sink;

void check(bool ok) {
    if (!ok) __builtin_trap();
}

void touch_value(const vxq::GgufValue& v, int depth) {
    check(depth <= 8);
    uint64_t h = uint64_t(v.type) + uint64_t(v.i) + uint64_t(v.f != v.f) + v.s.size();
    if (!v.s.empty()) h += uint8_t(v.s.front()) + uint8_t(v.s.back());
    if (v.type == vxq::GgufValueType::ARRAY) {
        h += uint64_t(v.elem_type) + v.array_size();
        for (int64_t x : v.ints) h += uint64_t(x);
        for (double x : v.floats) h += uint64_t(x == x);
        for (const auto& s : v.strs) h += s.size() + (s.empty() ? 0 : uint8_t(s.back()));
        for (const auto& item : v.items) touch_value(item, depth + 1);
    } else {
        check(v.array_size() == 0);
    }
    g_sink = g_sink + h;
}

// Typed getters may legitimately throw vxq::Error (wrong type); nothing else.
template <typename F>
void getter(F&& f) {
    try {
        f();
    } catch (const vxq::Error&) {
    }
}

void touch(const vxq::GgufFile& g) {
    check(g.version() == 2 || g.version() == 3);
    const size_t a = g.alignment();
    check(a > 0 && (a & (a - 1)) == 0);
    for (const auto& kv : g.metadata()) {
        const std::string& key = kv.first;
        const vxq::GgufValue& v = kv.second;
        check(!key.empty());
        check(g.find(key) == &v);
        touch_value(v, 0);
        getter([&] { g_sink = g_sink + uint64_t(g.get_int(key).value_or(0)); });
        getter([&] { g_sink = g_sink + uint64_t(g.get_float(key).value_or(0) != 0); });
        getter([&] { g_sink = g_sink + g.get_bool(key).value_or(false); });
        getter([&] { g_sink = g_sink + g.get_string(key).value_or("").size(); });
        getter([&] { const auto* arr = g.get_array(key); g_sink = g_sink + (arr ? arr->array_size() : 0); });
    }
    for (const auto& t : g.tensors()) {
        check(g.find_tensor(t.name) == &t);
        check(!t.ne.empty() && t.ne.size() <= 4);
        const auto tr = vxq::ggml_type_traits(uint32_t(t.type));
        check(tr.has_value());
        int64_t n = 1;
        for (int64_t d : t.ne) {
            check(d > 0);
            check(!__builtin_mul_overflow(n, d, &n));
        }
        check(n == t.n_elements);
        check(t.ne[0] % tr->block_size == 0);
        uint64_t bytes = 0;
        check(!__builtin_mul_overflow(uint64_t(n / tr->block_size), uint64_t(tr->block_bytes), &bytes));
        check(bytes == t.n_bytes && bytes > 0);
        check(t.offset % a == 0);
        check(t.offset <= g.size() && t.n_bytes <= g.size() - t.offset);
        const uint8_t* p = g.tensor_data(t);
        g_sink = g_sink + p[0] + p[t.n_bytes - 1];  // out-of-bounds shows here under ASan
    }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    try {
        vxq::GgufFile g = vxq::GgufFile::parse(std::span<const uint8_t>(data, size), "fuzz.gguf");
        touch(g);
        vxq::GgufFile moved(std::move(g));  // the move must keep the data pointers valid
        touch(moved);
    } catch (const vxq::Error&) {
    }
    return 0;
}
