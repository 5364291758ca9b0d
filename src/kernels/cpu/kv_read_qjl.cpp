// CPU readers of the QJL key format (kv/formats/qjl.h): the scalar reference, and the AVX2 one,
// which differs only in the sign sums (kv_read_qjl_avx2.cpp, 8 lanes). prepare_query projects
// each query head once per (query, KV head group, split): u = S q, the only m x d product of a
// step. A block of 32 tokens then restricts the projections to its channel split with its O
// outlier columns, S q_in = u - sum_{c in O} q_c S[:, c] and S_o q_out = sum_{c in O} q_c S_o[:, c]
// (O (m + m_o) multiply-adds per block and query head), and scores each token as
//   (sqrt(pi/2)/m) ||k_in|| <S q_in, sign(S k_in)> + (sqrt(pi/2)/m_o) ||k_out|| <S_o q_out, sign(S_o k_out)>,
// the inner product of q with the codec's decode() (tests/test_qjl.cpp checks the two agree).
#include <algorithm>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "core/fp16.h"
#include "kernels/cpu/kv_read_qjl.h"
#include "kernels/cpu/kv_reader.h"
#include "kv/formats/qjl.h"

namespace vxq::cpu {

namespace {

namespace qjl = codecs::qjl;

const qjl::State& state_of(const KvFormatParams& f) {
    VXQ_ASSERT(f.layer_state != nullptr);
    return *static_cast<const qjl::State*>(f.layer_state);
}

// sum_i (bit i ? v_i : -v_i) over m packed sign bits.
float signed_sum(const float* v, const uint8_t* bits, int64_t m) {
    float s = 0;
    for (int64_t i = 0; i < m; ++i) s += qjl::sign_bit(bits, i) ? v[i] : -v[i];
    return s;
}

template <bool Avx2>
class QjlReader final : public KvReader {
public:
    // pq.q: the query (the blocks need its outlier channels); pq.data: [n_q, m] u = S q. (S_o q
    // is never needed whole: a block's outlier estimate reads only its O channels of q.)
    void prepare_query(const KvFormatParams& f, const float* q, int64_t n_q, int64_t d, PreparedQuery& pq) const override {
        const qjl::State& st = state_of(f);
        const qjl::Layout& l = st.layout;
        VXQ_ASSERT(d == l.d);
        pq.q = q;
        pq.buf.resize(size_t(n_q * l.m) * sizeof(float));
        float* u = reinterpret_cast<float*>(pq.buf.data());
        for (int64_t h = 0; h < n_q; ++h) st.inliers.project(q + h * d, u + h * l.m);
        pq.data = u;
    }

    void scores(const KvFormatParams& f, const PreparedQuery& q, int64_t n_q, const uint8_t* blk, int64_t n, int64_t d,
                float* s) const override {
        const qjl::State& st = state_of(f);
        const qjl::Layout& l = st.layout;
        const int64_t B = qjl::kBlockTokens, m = l.m, mo = l.mo, O = l.outliers;
        VXQ_ASSERT(d == l.d && q.data != nullptr && n % B == 0);
        const float* u = static_cast<const float*>(q.data);
        thread_local std::vector<float> cols_in, cols_out, v_in, v_out;
        cols_in.resize(size_t(O * m));
        cols_out.resize(size_t(O * mo));
        v_in.resize(size_t(m));
        v_out.resize(size_t(mo));
        for (int64_t b = 0; b < n / B; ++b) {
            const uint8_t* blkb = blk + size_t(b) * f.block_bytes;
            // The block's outlier columns of S and S_o, gathered once for all query heads.
            for (int64_t j = 0; j < O; ++j) {
                const int64_t c = blkb[j];
                for (int64_t i = 0; i < m; ++i) cols_in[size_t(j * m + i)] = st.inliers.at(i, c);
                for (int64_t i = 0; i < mo; ++i) cols_out[size_t(j * mo + i)] = st.outliers.at(i, c);
            }
            for (int64_t h = 0; h < n_q; ++h) {
                const float* qh = q.q + h * d;
                std::copy_n(u + h * m, m, v_in.begin());
                std::fill(v_out.begin(), v_out.end(), 0.0f);
                for (int64_t j = 0; j < O; ++j) {
                    const float qc = qh[blkb[j]];
                    for (int64_t i = 0; i < m; ++i) v_in[size_t(i)] -= qc * cols_in[size_t(j * m + i)];
                    for (int64_t i = 0; i < mo; ++i) v_out[size_t(i)] += qc * cols_out[size_t(j * mo + i)];
                }
                for (int64_t t = 0; t < B; ++t) {
                    const float n_in = load_fp16(blkb + l.norm_in_offset() + 2 * size_t(t));
                    float score = st.inliers.scale() * n_in *
                                  sum(v_in.data(), blkb + l.signs_in_offset() + size_t(t * m / 8), m);
                    if (O > 0) {
                        const float n_out = load_fp16(blkb + l.norm_out_offset() + 2 * size_t(t));
                        score += st.outliers.scale() * n_out *
                                 sum(v_out.data(), blkb + l.signs_out_offset() + size_t(t * mo / 8), mo);
                    }
                    s[h * n + b * B + t] = score;
                }
            }
        }
    }

    // m and m_o are multiples of 8 (parse_params), as the AVX2 sum needs.
    static float sum(const float* v, const uint8_t* bits, int64_t m) {
        return Avx2 ? qjl_avx2::signed_sum(v, bits, m) : signed_sum(v, bits, m);
    }

    void accumulate(const KvFormatParams&, const float*, int64_t, const uint8_t*, int64_t, int64_t, float*) const override {
        fail("QJL blocks are keys only (qjl values are KIVI blocks)");
    }
};

}  // namespace

const KvReader* qjl_reader(KvFormatKind kind, KvIsa isa) {
    static const QjlReader<false> scalar;
    static const QjlReader<true> avx2;
    if (kind != KvFormatKind::Qjl) return nullptr;
    if (isa == KvIsa::Scalar) return &scalar;
    return kv_avx2_available() ? &avx2 : nullptr;
}

}  // namespace vxq::cpu
