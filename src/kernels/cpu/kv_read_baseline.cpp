// Readers of the baseline KV formats (kv/formats/baseline.h) for the fused CPU attention.
//
// The scalar readers are the reference; the AVX2 + FMA + F16C readers live in
// baseline_avx2.cpp and are used after a runtime CPU check.
//
// accumulate (all formats) and scores (f32, f16, bf16, fp8): both readers dequantize each token
// exactly as decode() does (the same roundings) in registers (scalar: 32 values of one token at a
// time) and apply it to all n_q query heads before moving on; only the summation order differs
// (see tests/test_codecs_baseline.cpp for the tolerance). This is what llama.cpp's CPU flash
// attention does on the V side for every type (v_to_float, then ggml_vec_mad_f32 into an f32
// accumulator).
//
// scores for q8_0 / q4_0 keys follow llama.cpp's CPU flash attention on the K side instead
// (ggml_compute_forward_flash_attn_ext_f16, ggml-cpu.c in b4748, ggml-cpu/ops.cpp later): the
// query row is converted ONCE to K's vec_dot_type with `q_to_vec_dot` (= the type traits'
// from_float of GGML_TYPE_Q8_0, i.e. the AVX2 quantize_row_q8_0 described above, applied to the
// UNSCALED query), each score is `kq_vec_dot(K row, Q_q)` = ggml_vec_dot_q8_0_q8_0 /
// ggml_vec_dot_q4_0_q8_0, and only then `s = s*scale` (the fused kernel does that multiply). The
// dots, AVX2 branch of ggml-cpu-quants.c: one __m256 accumulator; per 32-block
//     acc = fma(set1(fp16(d_k) * fp16(d_q)), cvtepi32_ps(mul_sum_i8_pairs(k codes, q codes)), acc)
// where mul_sum_i8_pairs leaves in int32 lane l the exact sum of the products of values 4l..4l+3
// (maddubs(|k|, sign(q, k)) then madd with ones; q4_0 codes are nibble - 8 with value j in byte
// j), and the result is hsum_float_8(acc) = ((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7)). The scalar
// reader computes exactly these operations (std::fma, the same lane sums and reduction), so the
// two readers agree bit for bit; the result differs from <q, decode(k)> by the q8_0 rounding of
// the query (|error| <= sum over blocks of amax(q_block)/127 * sum |k values of the block|).
#include <cpuid.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string_view>
#include <type_traits>

#include "core/error.h"
#include "kernels/cpu/kv_reader.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/matmul_avx2.h"
#include "kv/formats/baseline.h"

namespace vxq::cpu {

// AVX2 + FMA + F16C kernels (kv_read_baseline_avx2.cpp). Same contract as KvReader::scores /
// accumulate; `scale` is fp8's per-stream scale (ignored by the others). head_dim % 8 == 0.
// (q8_0 / q4_0 scores take the query already quantized, qdot_scores_*.)
namespace baseline_avx2 {
#define VXQ_BASELINE_AVX2_DECL(fmt)                                                                          \
    void scores_##fmt(const float* q, int64_t n_q, const uint8_t* blk, int64_t n, int64_t d, float scale,   \
                      float* s);                                                                             \
    void accumulate_##fmt(const float* p, int64_t n_q, const uint8_t* blk, int64_t n, int64_t d, float scale, \
                          float* acc);
VXQ_BASELINE_AVX2_DECL(f32)
VXQ_BASELINE_AVX2_DECL(f16)
VXQ_BASELINE_AVX2_DECL(bf16)
VXQ_BASELINE_AVX2_DECL(fp8)
#undef VXQ_BASELINE_AVX2_DECL
void accumulate_q8_0(const float* p, int64_t n_q, const uint8_t* blk, int64_t n, int64_t d, float scale, float* acc);
void accumulate_q4_0(const float* p, int64_t n_q, const uint8_t* blk, int64_t n, int64_t d, float scale, float* acc);
// llama.cpp's q8_0-query scores for q8_0 / q4_0 keys: qb = n_q * d/32 BlockQ8_0 (34 bytes each,
// the query heads quantized by quantize_row_q8_0), qd = their scales as f32. d % 32 == 0.
void qdot_scores_q8_0(const uint8_t* qb, const float* qd, int64_t n_q, const uint8_t* blk, int64_t n, int64_t d,
                      float* s);
void qdot_scores_q4_0(const uint8_t* qb, const float* qd, int64_t n_q, const uint8_t* blk, int64_t n, int64_t d,
                      float* s);
}  // namespace baseline_avx2

namespace {

using namespace kvfmt;

// Which AVX2 kernels read a format.
template <class F> struct Avx2Ops;
template <> struct Avx2Ops<F32> {
    static constexpr auto scores = baseline_avx2::scores_f32;
    static constexpr auto accumulate = baseline_avx2::accumulate_f32;
};
template <> struct Avx2Ops<F16> {
    static constexpr auto scores = baseline_avx2::scores_f16;
    static constexpr auto accumulate = baseline_avx2::accumulate_f16;
};
template <> struct Avx2Ops<BF16> {
    static constexpr auto scores = baseline_avx2::scores_bf16;
    static constexpr auto accumulate = baseline_avx2::accumulate_bf16;
};
template <> struct Avx2Ops<FP8> {
    static constexpr auto scores = baseline_avx2::scores_fp8;
    static constexpr auto accumulate = baseline_avx2::accumulate_fp8;
};
template <> struct Avx2Ops<Q8_0> {
    static constexpr auto qdot_scores = baseline_avx2::qdot_scores_q8_0;
    static constexpr auto accumulate = baseline_avx2::accumulate_q8_0;
};
template <> struct Avx2Ops<Q4_0> {
    static constexpr auto qdot_scores = baseline_avx2::qdot_scores_q4_0;
    static constexpr auto accumulate = baseline_avx2::accumulate_q4_0;
};

// _mm256_sign_epi8 for one byte: a negated (wrapping: -(-128) = -128) where b < 0, 0 where b == 0.
int8_t sign_epi8(int8_t a, int8_t b) {
    if (b < 0) return int8_t(uint8_t(-int(a)));
    return b == 0 ? int8_t(0) : a;
}

// Int32 lane of ggml's AVX2 mul_sum_i8_pairs_float(x = k, y = q) over 4 values:
// maddubs_epi16(|k| as uint8, sign(q, k)) -> two saturated int16 pair sums, then madd with ones.
int32_t lane_dot4(const int8_t* k, const int8_t* q) {
    int32_t sum = 0;
    for (int p = 0; p < 4; p += 2) {
        int pair = 0;
        for (int i = p; i < p + 2; ++i) pair += int(uint8_t(sign_epi8(k[i], k[i]))) * int(sign_epi8(q[i], k[i]));
        sum += std::clamp(pair, -32768, 32767);
    }
    return sum;
}

// hsum_float_8: ((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7)).
float hsum_float_8(const float l[8]) {
    const float v0 = l[4] + l[0], v1 = l[5] + l[1], v2 = l[6] + l[2], v3 = l[7] + l[3];
    return (v0 + v2) + (v1 + v3);
}

// The n_q query heads quantized to q8_0 (ggml's quantize_row_q8_0: the AVX2 version when
// `avx2`), laid out as n_q * d/32 blocks, then their scales as f32, then the QueryQ8 view, each
// part at an 8-byte boundary of pq.buf (34-byte blocks: an odd count left the floats and the
// view's pointers misaligned, which UBSan reported).
struct QueryQ8 {
    const BlockQ8_0* qb;
    const float* qd;
};

void quantize_query(const float* q, int64_t n_q, int64_t d, bool avx2, PreparedQuery& pq) {
    const size_t nb = size_t(n_q * (d / kQK8_0));
    const auto align8 = [](size_t b) { return (b + 7) / 8 * 8; };
    const size_t qd_at = align8(nb * sizeof(BlockQ8_0)), view_at = align8(qd_at + nb * sizeof(float));
    static_assert(alignof(QueryQ8) <= 8 && alignof(float) <= 8);
    pq.buf.resize(view_at + sizeof(QueryQ8));  // vector storage: aligned for any fundamental type
    auto* qb = reinterpret_cast<BlockQ8_0*>(pq.buf.data());
    auto* qd = reinterpret_cast<float*>(pq.buf.data() + qd_at);
    if (avx2) {
        avx2::quantize_q8_0(q, qb, qd, n_q * d);  // d % 32 == 0: blocks stay per head
    } else {
        quantize_row_q8_0(q, qb, n_q * d);
        for (size_t i = 0; i < nb; ++i) qd[i] = fp16_to_fp32(qb[i].d);
    }
    auto* view = reinterpret_cast<QueryQ8*>(pq.buf.data() + view_at);
    *view = QueryQ8{qb, qd};
    pq.q = q;
    pq.data = view;
}

template <class F>
class ScalarReader final : public KvReader {
public:
    void prepare_query(const KvFormatParams& f, const float* q, int64_t n_q, int64_t d, PreparedQuery& pq) const override {
        if constexpr (F::kBlocks32) {
            quantize_query(q, n_q, d, false, pq);
        } else {
            KvReader::prepare_query(f, q, n_q, d, pq);
        }
    }

    void scores(const KvFormatParams& f, const PreparedQuery& pq, int64_t n_q, const uint8_t* blk, int64_t n, int64_t d,
                float* s) const override {
        if constexpr (F::kBlocks32) {
            qdot_scores(*static_cast<const QueryQ8*>(pq.data), n_q, blk, n, d, s);
            return;
        }
        const float* q = pq.q;
        const size_t bb = F::bytes(d);
        const float sc = f.scale;
        float x[kChunk];
        for (int64_t t = 0; t < n; ++t) {
            const uint8_t* tok = blk + size_t(t) * bb;
            for (int64_t h = 0; h < n_q; ++h) s[h * n + t] = 0.0f;
            for (int64_t c0 = 0; c0 < d; c0 += kChunk) {
                const int64_t len = std::min(kChunk, d - c0);
                F::decode_range(tok, c0, len, x, sc);
                for (int64_t h = 0; h < n_q; ++h) {
                    const float* qh = q + h * d + c0;
                    float part = 0.0f;
                    for (int64_t i = 0; i < len; ++i) part += qh[i] * x[i];
                    s[h * n + t] += part;
                }
            }
        }
    }

    void accumulate(const KvFormatParams& f, const float* p, int64_t n_q, const uint8_t* blk, int64_t n, int64_t d,
                    float* acc) const override {
        const size_t bb = F::bytes(d);
        const float sc = f.scale;
        float x[kChunk];
        for (int64_t t = 0; t < n; ++t) {
            const uint8_t* tok = blk + size_t(t) * bb;
            for (int64_t c0 = 0; c0 < d; c0 += kChunk) {
                const int64_t len = std::min(kChunk, d - c0);
                F::decode_range(tok, c0, len, x, sc);
                for (int64_t h = 0; h < n_q; ++h) {
                    const float pt = p[h * n + t];
                    float* ah = acc + h * d + c0;
                    for (int64_t i = 0; i < len; ++i) ah[i] += pt * x[i];
                }
            }
        }
    }

private:
    // q8_0 / q4_0 keys: llama.cpp's q8_0-query dot (see the top of this file), literally.
    static void qdot_scores(const QueryQ8& qq, int64_t n_q, const uint8_t* blk, int64_t n, int64_t d, float* s) {
        const size_t bb = F::bytes(d);
        const int64_t nb = d / 32;
        int8_t kc[32];
        for (int64_t t = 0; t < n; ++t) {
            const uint8_t* tok = blk + size_t(t) * bb;
            for (int64_t h = 0; h < n_q; ++h) {
                float acc[8] = {};
                for (int64_t b = 0; b < nb; ++b) {
                    const float dk = F::block_codes(tok, b, kc);
                    const BlockQ8_0& qb = qq.qb[size_t(h * nb + b)];
                    const float dd = dk * qq.qd[size_t(h * nb + b)];
                    for (int l = 0; l < 8; ++l) acc[l] = std::fma(dd, float(lane_dot4(kc + 4 * l, qb.qs + 4 * l)), acc[l]);
                }
                s[h * n + t] = hsum_float_8(acc);
            }
        }
    }
};

// AVX2 reader: the kernels need head_dim % 8 == 0 (always true for q8_0 / q4_0); other head
// dimensions go to the scalar reader.
template <class F>
class Avx2Reader final : public KvReader {
public:
    explicit Avx2Reader(const KvReader* fallback) : fallback_(fallback) {}

    void prepare_query(const KvFormatParams& f, const float* q, int64_t n_q, int64_t d, PreparedQuery& pq) const override {
        if constexpr (F::kBlocks32) {
            quantize_query(q, n_q, d, true, pq);
        } else {
            KvReader::prepare_query(f, q, n_q, d, pq);
        }
    }
    void scores(const KvFormatParams& f, const PreparedQuery& pq, int64_t n_q, const uint8_t* blk, int64_t n, int64_t d,
                float* s) const override {
        if constexpr (F::kBlocks32) {
            const auto& qq = *static_cast<const QueryQ8*>(pq.data);
            Avx2Ops<F>::qdot_scores(reinterpret_cast<const uint8_t*>(qq.qb), qq.qd, n_q, blk, n, d, s);
        } else {
            if (d % 8 != 0) return fallback_->scores(f, pq, n_q, blk, n, d, s);
            Avx2Ops<F>::scores(pq.q, n_q, blk, n, d, f.scale, s);
        }
    }
    void accumulate(const KvFormatParams& f, const float* p, int64_t n_q, const uint8_t* blk, int64_t n, int64_t d,
                    float* acc) const override {
        if (d % 8 != 0) return fallback_->accumulate(f, p, n_q, blk, n, d, acc);
        Avx2Ops<F>::accumulate(p, n_q, blk, n, d, f.scale, acc);
    }

private:
    const KvReader* fallback_;
};

template <class F>
struct Readers {
    ScalarReader<F> scalar;
    Avx2Reader<F> avx2{&scalar};
};

template <class F>
const KvReader* pick(KvIsa isa) {
    static const Readers<F> r;
    if (isa == KvIsa::Scalar) return &r.scalar;
    return kv_avx2_available() ? &r.avx2 : nullptr;
}

}  // namespace

bool kv_avx2_available() {
    static const bool yes = [] {
        if (!(__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))) return false;
        unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
        if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx)) return false;
        return (ecx & (1u << 29)) != 0;  // F16C (clang 14 rejects __builtin_cpu_supports("f16c"))
    }();
    return yes;
}

const KvReader* baseline_reader(KvFormatKind kind, KvIsa isa) {
    switch (kind) {
        case KvFormatKind::F32: return pick<F32>(isa);
        case KvFormatKind::F16: return pick<F16>(isa);
        case KvFormatKind::BF16: return pick<BF16>(isa);
        case KvFormatKind::Q8_0: return pick<Q8_0>(isa);
        case KvFormatKind::Q4_0: return pick<Q4_0>(isa);
        case KvFormatKind::FP8: return pick<FP8>(isa);
        default: return nullptr;
    }
}

const KvReader* kv_reader(KvFormatKind kind, KvIsa isa) {
    if (const KvReader* r = baseline_reader(kind, isa)) return r;
    if (const KvReader* r = kivi_reader(kind, isa)) return r;
    if (const KvReader* r = vecinfer_reader(kind, isa)) return r;
    if (const KvReader* r = turbo_reader(kind, isa)) return r;
    return qjl_reader(kind, isa);
}

bool kv_scalar_forced() {
    static const bool yes = [] {
        const char* env = std::getenv("VXQ_KV_ISA");
        if (!env || !*env || std::string_view(env) == "auto") return false;
        if (std::string_view(env) == "scalar") return true;
        fail("VXQ_KV_ISA='{}': expected 'scalar' or 'auto'", env);
    }();
    return yes;
}

KvIsa kv_reader_isa(const KvFormatParams& f, bool key) {
    const KvReader& r = kv_reader(f.kind);
    if (&r == kv_reader(f.kind, KvIsa::Scalar) || r.scalar_blocks(f, key)) return KvIsa::Scalar;
    return KvIsa::Avx2;
}

const KvReader& kv_reader(KvFormatKind kind) {
    if (!kv_scalar_forced())
        if (const KvReader* r = kv_reader(kind, KvIsa::Avx2)) return *r;
    if (const KvReader* r = kv_reader(kind, KvIsa::Scalar)) return *r;
    fail("the CPU backend has no reader for KV format '{}'", kv_format_kind_name(kind));
}

}  // namespace vxq::cpu
