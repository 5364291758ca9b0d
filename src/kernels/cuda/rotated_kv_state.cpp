// A layer's state copied to the device (rotated_kv.cuh: DeviceStateCopy), each part at a 16-byte
// boundary of one allocation: a turbo::State's rotation (Hadamard signs or dense rows),
// codebooks, rot=calib's per-coordinate bits and scales and turbo-prod's sketch; a
// vecinfer::State's smoothing factors and codebooks; a qjl::State's two sketches and their
// transposes (qjl_kv.cuh).
#include <cmath>
#include <cstring>
#include <initializer_list>
#include <vector>

#include "core/error.h"
#include "kernels/cuda/check.cuh"
#include "kernels/cuda/qjl_kv.cuh"
#include "kernels/cuda/rotated_kv.cuh"
#include "kv/formats/qjl.h"
#include "kv/formats/turbo.h"
#include "kv/formats/vecinfer.h"

namespace vxq::cuda {
namespace {

// n bytes from src appended to `bytes` at the next 16-byte boundary (at least 4 reserved, so an
// empty part still has an address of its own); returns where.
size_t put_part(std::vector<uint8_t>& bytes, const void* src, size_t n) {
    const size_t at = (bytes.size() + 15) / 16 * 16;
    bytes.resize(at + std::max<size_t>(n, 4));
    if (n > 0) std::memcpy(bytes.data() + at, src, n);
    return at;
}
size_t put_floats(std::vector<uint8_t>& bytes, const std::vector<float>& v) {
    return put_part(bytes, v.data(), v.size() * sizeof(float));
}

}  // namespace

TurboFormatDev turbo_format_host(const codecs::turbo::State& s, std::vector<uint8_t>& bytes) {
    const codecs::turbo::Layout& l = s.layout;
    VXQ_ASSERT(l.d % 32 == 0 && l.d <= kTurboMaxHeadDim);
    bytes.clear();
    TurboFormatDev f{};
    f.d = int32_t(l.d);
    f.block_bytes = int32_t(l.block_bytes());
    f.hadamard = !s.rot.haar();
    f.calibrated = s.params.calibrated();
    f.bits1 = l.bits1;
    f.bits2 = l.bits2;
    f.idx1_offset = int32_t(l.idx1_offset());
    f.idx2_offset = int32_t(l.idx2_offset());
    f.inv_sqrt_d = 1.0f / std::sqrt(float(l.d));  // as Rotation::apply computes it
    f.qjl = l.qjl;
    f.gamma_offset = int32_t(l.gamma_offset());
    f.sign_offset = int32_t(l.sign_offset());
    f.qjl_scale = s.qjl_scale;
    const size_t rot = put_floats(bytes, f.hadamard ? s.rot.signs() : s.rot.rows());
    const size_t thr1 = put_floats(bytes, s.cb1.thresholds), cent1 = put_floats(bytes, s.cb1.centroids);
    const size_t thr2 = put_floats(bytes, s.cb2.thresholds), cent2 = put_floats(bytes, s.cb2.centroids);
    std::vector<int32_t> coord_at;
    std::vector<float> cbk_thr, cbk_cent;
    for (size_t i = 0; i < s.coord_bits.size(); ++i) coord_at.push_back(s.coord_offset[i] << 8 | s.coord_bits[i]);
    for (const codecs::turbo::Codebook& cb : s.cbk) {  // bit count b's centroids at 2^b - 1, thresholds at 2^b - 1 - b
        cbk_thr.insert(cbk_thr.end(), cb.thresholds.begin(), cb.thresholds.end());
        cbk_cent.insert(cbk_cent.end(), cb.centroids.begin(), cb.centroids.end());
    }
    VXQ_ASSERT(cbk_cent.size() <= size_t(kTurboPoolFloats) &&
               (1u << l.bits1) + (l.bits2 > 0 ? 1u << l.bits2 : 0u) <= unsigned(kTurboPoolFloats));
    f.cbk_floats = int32_t(cbk_cent.size());
    const size_t at = put_part(bytes, coord_at.data(), coord_at.size() * sizeof(int32_t));
    const size_t scale = put_floats(bytes, s.coord_scale), kthr = put_floats(bytes, cbk_thr), kcent = put_floats(bytes, cbk_cent);
    VXQ_ASSERT(!l.qjl || (s.sketch.rows() == l.d && s.sketch.dim() == l.d));
    std::vector<float> st;  // S^T
    if (l.qjl) {
        st.resize(size_t(l.d * l.d));
        for (int64_t r = 0; r < l.d; ++r) {
            for (int64_t c = 0; c < l.d; ++c) st[size_t(c * l.d + r)] = s.sketch.row(r)[c];
        }
    }
    const size_t sketch_t = put_floats(bytes, st);
    const uint8_t* base = bytes.data();
    const auto ptr = [base](size_t off) { return reinterpret_cast<const float*>(base + off); };
    (f.hadamard ? f.signs : f.rows) = ptr(rot);
    f.thr1 = ptr(thr1);
    f.cent1 = ptr(cent1);
    f.thr2 = ptr(thr2);
    f.cent2 = ptr(cent2);
    f.coord_at = reinterpret_cast<const int32_t*>(base + at);
    f.coord_scale = ptr(scale);
    f.cbk_thr = ptr(kthr);
    f.cbk_cent = ptr(kcent);
    f.sketch_t = ptr(sketch_t);
    return f;
}

namespace {

// The host bytes uploaded, each of f's pointers `at` moved from the host bytes to the same offset
// of the device copy, and f as it is then.
template <class F>
DeviceStateCopy<F> upload(F& f, const std::vector<uint8_t>& bytes, std::initializer_list<const void**> at) {
    DeviceStateCopy<F> c;
    VXQ_CUDA_CHECK(cudaMalloc(&c.buf, bytes.size()));
    c.bytes = bytes.size();
    VXQ_CUDA_CHECK(cudaMemcpy(c.buf, bytes.data(), bytes.size(), cudaMemcpyHostToDevice));
    for (const void** p : at) {
        const auto* host = static_cast<const uint8_t*>(*p);
        *p = static_cast<const uint8_t*>(c.buf) + (host - bytes.data());
    }
    c.f = f;
    return c;
}

}  // namespace

TurboStateCopy turbo_state_copy(const codecs::turbo::State& s) {
    std::vector<uint8_t> bytes;
    TurboFormatDev f = turbo_format_host(s, bytes);
    const auto v = [](auto*& p) { return reinterpret_cast<const void**>(&p); };
    return upload(f, bytes, {v(f.hadamard ? f.signs : f.rows), v(f.thr1), v(f.cent1), v(f.thr2), v(f.cent2), v(f.coord_at),
                             v(f.coord_scale), v(f.cbk_thr), v(f.cbk_cent), v(f.sketch_t)});
}

VecinferFormatDev vecinfer_format_host(const codecs::vecinfer::State& s, std::vector<uint8_t>& bytes) {
    const codecs::vecinfer::Layout& l = s.layout;
    VXQ_ASSERT(l.d % 32 == 0 && l.d <= kTurboMaxHeadDim && l.m <= 8);
    bytes.clear();
    VecinferFormatDev f{};
    f.d = int32_t(l.d);
    f.block_bytes = int32_t(l.block_bytes());
    f.n = l.n;
    f.m = l.m;
    f.inv_sqrt_d = 1.0f / std::sqrt(float(l.d));  // as vecinfer::hadamard computes it
    const size_t lambda = put_floats(bytes, s.lambda), codebook = put_floats(bytes, s.codebook);
    f.lambda = s.lambda.empty() ? nullptr : reinterpret_cast<const float*>(bytes.data() + lambda);
    f.codebook = reinterpret_cast<const float*>(bytes.data() + codebook);
    return f;
}

VecinferStateCopy vecinfer_state_copy(const codecs::vecinfer::State& s) {
    std::vector<uint8_t> bytes;
    VecinferFormatDev f = vecinfer_format_host(s, bytes);
    if (f.lambda == nullptr) return upload(f, bytes, {reinterpret_cast<const void**>(&f.codebook)});
    return upload(f, bytes, {reinterpret_cast<const void**>(&f.lambda), reinterpret_cast<const void**>(&f.codebook)});
}

QjlFormatDev qjl_format_host(const codecs::qjl::State& s, std::vector<uint8_t>& bytes) {
    const codecs::qjl::Layout& l = s.layout;
    VXQ_ASSERT(l.d % 32 == 0 && l.d <= kReaderMaxHeadDim);
    bytes.clear();
    QjlFormatDev f{};
    f.d = int32_t(l.d);
    f.m = int32_t(l.m);
    f.mo = int32_t(l.mo);
    f.outliers = l.outliers;
    f.block_bytes = int32_t(l.block_bytes());
    f.norm_in = int32_t(l.norm_in_offset());
    f.norm_out = int32_t(l.norm_out_offset());
    f.signs_in = int32_t(l.signs_in_offset());
    f.signs_out = int32_t(l.signs_out_offset());
    f.scale_in = s.inliers.scale();
    f.scale_out = l.mo > 0 ? s.outliers.scale() : 0.0f;
    const auto transposed = [](const codecs::qjl::Sketch& sk) {
        std::vector<float> t(size_t(sk.rows() * sk.dim()));
        for (int64_t i = 0; i < sk.rows(); ++i)
            for (int64_t c = 0; c < sk.dim(); ++c) t[size_t(c * sk.rows() + i)] = sk.at(i, c);
        return t;
    };
    const size_t in = put_part(bytes, s.inliers.row(0), s.inliers.bytes());
    const size_t out = put_part(bytes, l.mo > 0 ? s.outliers.row(0) : nullptr, l.mo > 0 ? s.outliers.bytes() : 0);
    const size_t t_in = put_floats(bytes, transposed(s.inliers));
    const size_t t_out = put_floats(bytes, l.mo > 0 ? transposed(s.outliers) : std::vector<float>{});
    const auto ptr = [&bytes](size_t off) { return reinterpret_cast<const float*>(bytes.data() + off); };
    f.s_in = ptr(in);
    f.s_out = ptr(out);
    f.t_in = ptr(t_in);
    f.t_out = ptr(t_out);
    return f;
}

QjlStateCopy qjl_state_copy(const codecs::qjl::State& s) {
    std::vector<uint8_t> bytes;
    QjlFormatDev f = qjl_format_host(s, bytes);
    const auto v = [](auto*& p) { return reinterpret_cast<const void**>(&p); };
    return upload(f, bytes, {v(f.s_in), v(f.s_out), v(f.t_in), v(f.t_out)});
}

void device_state_free(void* buf) {
    cudaFree(buf);  // (the destructor path: nothing useful to do with an error here)
}

}  // namespace vxq::cuda
