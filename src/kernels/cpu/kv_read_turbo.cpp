// CPU readers of the TurboQuant formats (kv/formats/turbo.h): the scalar reference, and the AVX2
// one (kv_read_turbo_avx2.cpp) for blocks without the QJL term (turbo with one bit count for every
// coordinate or, rot=calib, its own per coordinate; turbo-rvq; turbo-prod's values; turbo-prod
// keys stay scalar). Keys: prepare_query rotates each query head once (q' = Pi q; turbo-prod keys
// also sketch it, u = S q'), then a key scores
// n * (<q', y> [+ qjl_scale * gamma * <u, sign>]) with y the block's codebook vector in the rotated
// domain. Values: the weighted sum of n * y stays in the rotated domain and finish_accumulate
// applies Pi^T once. No cached token is ever rotated.
#include <algorithm>

#include "core/error.h"
#include "kernels/cpu/kv_read_turbo.h"
#include "kernels/cpu/kv_reader.h"
#include "kv/formats/turbo.h"

namespace vxq::cpu {

namespace {

namespace turbo = codecs::turbo;

const turbo::State& state_of(const KvFormatParams& f) {
    VXQ_ASSERT(f.layer_state != nullptr);
    return *static_cast<const turbo::State*>(f.layer_state);
}

turbo_avx2::CodePage page_of(const turbo::State& st, const KvFormatParams& f) {
    const turbo::Layout& l = st.layout;
    turbo_avx2::CodePage c;
    c.d = l.d;
    c.block_bytes = f.block_bytes;
    c.idx1_offset = l.idx1_offset();
    c.idx2_offset = l.idx2_offset();
    c.bits = l.bits1;
    c.cb1 = st.cb1.centroids.data();
    c.cb2 = l.bits2 > 0 ? st.cb2.centroids.data() : nullptr;
    VXQ_ASSERT(l.bits1 >= 1 && l.bits1 <= 4 && (l.bits2 == 0 || l.bits2 == l.bits1));
    return c;
}

turbo_avx2::CalibPage calib_page_of(const turbo::State& st, const KvFormatParams& f) {
    const turbo::Layout& l = st.layout;
    turbo_avx2::CalibPage c;
    c.d = l.d;
    c.block_bytes = f.block_bytes;
    c.idx_offset = l.idx1_offset();
    c.idx_bytes = size_t(turbo::Layout::area(l.d, l.bits1));
    c.bits = st.coord_bits.data();
    c.offset = st.coord_offset.data();
    c.scale = st.coord_scale.data();
    VXQ_ASSERT(st.params.calibrated() && !l.qjl && l.bits2 == 0 && l.d <= 1024 && st.cbk.size() <= 9);
    for (size_t w = 0; w < st.cbk.size(); ++w) c.cb[w] = st.cbk[w].centroids.data();
    return c;
}

template <bool Avx2>
class TurboReader final : public KvReader {
public:
    // pq.data: [n_q, d] rotated queries, then for turbo-prod keys [n_q, d] sketched ones.
    void prepare_query(const KvFormatParams& f, const float* q, int64_t n_q, int64_t d, PreparedQuery& pq) const override {
        const turbo::State& st = state_of(f);
        const bool qjl = st.layout.qjl;
        pq.q = q;
        pq.buf.resize(size_t(n_q * d * (qjl ? 2 : 1)) * sizeof(float));
        float* qr = reinterpret_cast<float*>(pq.buf.data());
        for (int64_t h = 0; h < n_q; ++h) {
            float* qh = qr + h * d;
            std::copy_n(q + h * d, d, qh);
            st.rot.apply(qh);
            if (!qjl) continue;
            st.sketch.project(qh, qr + (n_q + h) * d);
        }
        pq.data = qr;
    }

    void scores(const KvFormatParams& f, const PreparedQuery& q, int64_t n_q, const uint8_t* blk, int64_t n, int64_t d,
                float* s) const override {
        const turbo::State& st = state_of(f);
        const turbo::Layout& l = st.layout;
        VXQ_ASSERT(d == l.d && q.data != nullptr);
        const float* qr = static_cast<const float*>(q.data);
        if (Avx2 && !scalar_blocks(f, true)) {
            if (st.params.calibrated()) return turbo_avx2::key_scores(calib_page_of(st, f), qr, n_q, blk, n, s);
            return turbo_avx2::key_scores(page_of(st, f), qr, n_q, blk, n, s);
        }
        float y[1024], z[1024];
        for (int64_t t = 0; t < n; ++t) {
            const uint8_t* B = blk + size_t(t) * f.block_bytes;
            turbo::rotated_codes(st, B, y);
            const float nrm = load_fp16(B);
            float k = 0;
            if (l.qjl) {
                k = st.qjl_scale * load_fp16(B + l.gamma_offset());
                const uint8_t* signs = B + l.sign_offset();
                for (int64_t i = 0; i < d; ++i) z[i] = ((signs[i >> 3] >> (i & 7)) & 1) ? 1.0f : -1.0f;
            }
            for (int64_t h = 0; h < n_q; ++h) {
                const float* qh = qr + h * d;
                float dot = 0;
                for (int64_t c = 0; c < d; ++c) dot += qh[c] * y[c];
                if (l.qjl) {
                    const float* uh = qr + (n_q + h) * d;
                    float sk = 0;
                    for (int64_t i = 0; i < d; ++i) sk += uh[i] * z[i];
                    dot += k * sk;
                }
                s[h * n + t] = nrm * dot;
            }
        }
    }

    void accumulate(const KvFormatParams& f, const float* p, int64_t n_q, const uint8_t* blk, int64_t n, int64_t d,
                    float* acc) const override {
        const turbo::State& st = state_of(f);
        if (st.layout.qjl) fail("TurboQuant_prod blocks are keys only (values use TurboQuant_mse)");
        VXQ_ASSERT(d == st.layout.d);
        if (Avx2 && !scalar_blocks(f, false)) {
            if (st.params.calibrated()) return turbo_avx2::value_accumulate(calib_page_of(st, f), p, n_q, blk, n, acc);
            return turbo_avx2::value_accumulate(page_of(st, f), p, n_q, blk, n, acc);
        }
        float y[1024];
        for (int64_t t = 0; t < n; ++t) {
            const uint8_t* B = blk + size_t(t) * f.block_bytes;
            turbo::rotated_codes(st, B, y);
            const float nrm = load_fp16(B);
            for (int64_t h = 0; h < n_q; ++h) {
                const float w = p[h * n + t] * nrm;
                float* ah = acc + h * d;
                for (int64_t c = 0; c < d; ++c) ah[c] += w * y[c];
            }
        }
    }

    // The AVX2 code takes no QJL term: the one decision that scores / accumulate dispatch on and
    // that the reported code path names.
    bool scalar_blocks(const KvFormatParams& f, bool key) const override {
        return Avx2 && key && state_of(f).layout.qjl;
    }
    bool own_value_domain() const override { return true; }
    void finish_accumulate(const KvFormatParams& f, float* acc, int64_t n_q, int64_t d) const override {
        const turbo::State& st = state_of(f);
        for (int64_t h = 0; h < n_q; ++h) st.rot.apply_t(acc + h * d);
    }
};

}  // namespace

const KvReader* turbo_reader(KvFormatKind kind, KvIsa isa) {
    static const TurboReader<false> scalar;
    static const TurboReader<true> avx2;
    if (kind != KvFormatKind::TurboMse && kind != KvFormatKind::TurboProd && kind != KvFormatKind::TurboRvq) return nullptr;
    if (isa == KvIsa::Scalar) return &scalar;
    return kv_avx2_available() ? &avx2 : nullptr;
}

}  // namespace vxq::cpu
