// CPU readers of the KIVI format: the scalar reference kernels and the KvReader objects that
// pick them or the AVX2 ones (kv_read_kivi_avx2.cpp).
#include "kernels/cpu/kv_read_kivi.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "kernels/cpu/kv_reader.h"

// Parity rule 2 (METHODS.md): every product and sum rounds on its own (no FMA contraction).
#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

namespace vxq::cpu {

namespace kivi {

using codecs::kivi::code_at;
using codecs::kivi::dequantize;


void key_scores_scalar(const Layout& l, const float* q, int64_t n_q, const uint8_t* blk, int64_t n,
                       int64_t d, float* s) {
    const int64_t G = l.group, nb = n / G, rb = l.row_code_bytes();
    const size_t bytes = l.block_bytes();
    float acc[256];
    for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* B = blk + size_t(b) * bytes;
        const uint8_t* codes = B + l.codes_offset();
        for (int64_t h = 0; h < n_q; ++h) {
            const float* qh = q + h * d;
            double cst = 0.0;  // sum_c q[c] * z[c]
            std::fill(acc, acc + G, 0.0f);
            for (int64_t c = 0; c < d; ++c) {
                cst += double(qh[c]) * double(load_fp16(B + l.zero_offset() + 2 * size_t(c)));
                const float qs = qh[c] * load_fp16(B + l.scale_offset() + 2 * size_t(c));
                const uint8_t* row = codes + c * rb;
                for (int64_t t = 0; t < G; ++t) acc[t] += qs * float(code_at(row, t, l.bits));
            }
            float* out = s + h * n + b * G;
            for (int64_t t = 0; t < G; ++t) out[t] = float(double(acc[t]) + cst);
        }
    }
}

void value_accumulate_scalar(const Layout& l, const float* p, int64_t n_q, const uint8_t* blk, int64_t n,
                             int64_t d, float* acc) {
    const int64_t G = l.group, rb = l.row_code_bytes();
    const size_t bytes = l.block_bytes();
    for (int64_t t = 0; t < n; ++t) {
        const uint8_t* B = blk + size_t(t) * bytes;
        for (int64_t g = 0; g < l.rows; ++g) {
            f16_t z16, s16;
            std::memcpy(&z16, B + l.zero_offset() + 2 * size_t(g), 2);
            std::memcpy(&s16, B + l.scale_offset() + 2 * size_t(g), 2);
            const uint8_t* row = B + l.codes_offset() + g * rb;
            const int64_t c0 = g * G, c1 = std::min(d, c0 + G);
            for (int64_t c = c0; c < c1; ++c) {
                const float x = dequantize(code_at(row, c - c0, l.bits), s16, z16);
                for (int64_t h = 0; h < n_q; ++h) acc[h * d + c] += p[h * n + t] * x;
            }
        }
    }
}



}  // namespace kivi

namespace {

kivi::Layout layout_of(const KvFormatParams& f) { return kivi::Layout{f.bits, f.group, f.rows}; }

template <bool Avx2>
class KeyReader final : public KvReader {
public:
    void scores(const KvFormatParams& f, const PreparedQuery& q, int64_t n_q, const uint8_t* blk, int64_t n, int64_t d,
                float* s) const override {
        const kivi::Layout l = layout_of(f);
        VXQ_ASSERT(n % l.group == 0 && d == l.rows);
        (Avx2 ? kivi::key_scores_avx2 : kivi::key_scores_scalar)(l, q.q, n_q, blk, n, d, s);
    }
    void accumulate(const KvFormatParams&, const float*, int64_t, const uint8_t*, int64_t, int64_t, float*) const override {
        fail("KIVI keys cannot accumulate values");
    }
};

template <bool Avx2>
class ValueReader final : public KvReader {
public:
    void scores(const KvFormatParams&, const PreparedQuery&, int64_t, const uint8_t*, int64_t, int64_t, float*) const override {
        fail("KIVI values cannot score keys");
    }
    void accumulate(const KvFormatParams& f, const float* p, int64_t n_q, const uint8_t* blk, int64_t n, int64_t d,
                    float* acc) const override {
        (Avx2 ? kivi::value_accumulate_avx2 : kivi::value_accumulate_scalar)(layout_of(f), p, n_q, blk, n, d, acc);
    }
};

}  // namespace

const KvReader* kivi_reader(KvFormatKind kind, KvIsa isa) {
    static const KeyReader<false> key_scalar;
    static const KeyReader<true> key_avx2;
    static const ValueReader<false> value_scalar;
    static const ValueReader<true> value_avx2;
    const bool avx2 = isa == KvIsa::Avx2;
    if (avx2 && !kv_avx2_available()) return nullptr;
    if (kind == KvFormatKind::KiviKey) return avx2 ? static_cast<const KvReader*>(&key_avx2) : &key_scalar;
    if (kind == KvFormatKind::KiviValue) return avx2 ? static_cast<const KvReader*>(&value_avx2) : &value_scalar;
    return nullptr;
}

}  // namespace vxq::cpu
