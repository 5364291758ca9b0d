// The flash-style prefill of the token-wise KV formats (attention.cuh: attention_prefill): each
// block copies a 32-token tile of its KV head's keys and values from the pages (one contiguous run
// each) into shared memory with cp.async, the next tile in flight while one is converted and
// computed, converts it into the MMAs' operands, then flash_prefill.cuh computes its 64 rows'
// scores, online softmax and P V on tensor cores.
#include "kernels/cuda/attention.cuh"

#include "kernels/cuda/check.cuh"
#include "kernels/cuda/cp_async.cuh"
#include "kernels/cuda/device_math.cuh"
#include "kernels/cuda/flash_prefill.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/mma.cuh"

namespace vxq::cuda {

namespace {

// Whether a value format's numbers need an fp16 lo half (q8_0 / q4_0: code * d has up to 19
// significant bits; f16 and fp8 values are fp16 numbers).
__host__ __device__ constexpr bool prefill_value_lo(KvCode c) { return !kv_half_keys(c); }

// Shared memory (byte offsets, 16-byte aligned). f16 / fp8 keys: q as hi / lo halves and the
// tile's keys as fp16 rows [token][flash_qpitch(d)]; q8_0 / q4_0 keys: q's q8_0 codes [row][d + 16]
// and scales [row][d / 32], the tile's key codes [token][d + 16] and block scales [token][d / 32]
// (code rows 16 bytes longer: a fragment's 8 rows fall in distinct banks). Then the values
// transposed [channel][kFlashVPitch] as hi (and lo) halves. Then two stages of a tile's raw
// bytes: keys [32 tokens][token bytes], values likewise (multiples of 16 bytes: d % 32 == 0).
struct PrefillSmem {
    int qh, ql, qc, qd, kh, kc, kd, vh, vl, raw, raw_v, raw_stage, total;
};
__host__ __device__ constexpr PrefillSmem prefill_smem(int d, KvCode kc, KvCode vc) {
    PrefillSmem m{};
    const int hp = flash_qpitch(d) * 2, cp = d + 16, nb = d / kQBlock;
    int at = 0;
    if (kv_half_keys(kc)) {
        m.qh = at, at += kFlashRows * hp;
        m.ql = at, at += kFlashRows * hp;
        m.kh = at, at += kFlashTile * hp;
    } else {
        m.qc = at, at += kFlashRows * cp;
        m.qd = at, at += kFlashRows * nb * 4;
        m.kc = at, at += kFlashTile * cp;
        m.kd = at, at += kFlashTile * nb * 4;
    }
    m.vh = at, at += d * kFlashVPitch * 2;
    m.vl = at, at += prefill_value_lo(vc) ? d * kFlashVPitch * 2 : 0;
    m.raw = at;
    m.raw_v = kFlashTile * int(kv_token_bytes(kc, d));
    m.raw_stage = m.raw_v + kFlashTile * int(kv_token_bytes(vc, d));
    m.total = at + 2 * m.raw_stage;
    return m;
}

// Eight fp16 numbers of a row of f16 or fp8 values starting at channel c (fp8: exact conversions).
template <KvCode C>
__device__ __forceinline__ uint4 half8_at(const uint8_t* row, int c) {
    if constexpr (C == KvCode::F16) {
        return *reinterpret_cast<const uint4*>(row + 2 * c);
    } else {
        const uint2 w = *reinterpret_cast<const uint2*>(row + c);
        return make_uint4(kv_fp8x2_to_half2(w.x), kv_fp8x2_to_half2(w.x >> 16), kv_fp8x2_to_half2(w.y),
                          kv_fp8x2_to_half2(w.y >> 16));
    }
}

template <int D, KvCode KC, KvCode VC>
__global__ void __launch_bounds__(kFlashWarps * 32) attention_prefill_kernel(const SplitAttentionParams p) {
    extern __shared__ __align__(16) uint8_t smem[];
    constexpr bool kHalfK = kv_half_keys(KC), kValLo = prefill_value_lo(VC);
    constexpr int QP = flash_qpitch(D), CP = D + 16, NB = D / kQBlock;
    constexpr int ktb = int(kv_token_bytes(KC, D)), vtb = int(kv_token_bytes(VC, D));
    constexpr PrefillSmem L = prefill_smem(D, KC, VC);
    auto* qh = reinterpret_cast<__half*>(smem + L.qh);
    auto* ql = reinterpret_cast<__half*>(smem + L.ql);
    auto* kh = reinterpret_cast<__half*>(smem + L.kh);
    auto* qc = reinterpret_cast<int8_t*>(smem + L.qc);
    auto* qd = reinterpret_cast<float*>(smem + L.qd);
    auto* kc = reinterpret_cast<int8_t*>(smem + L.kc);
    auto* kd = reinterpret_cast<float*>(smem + L.kd);
    auto* vh = reinterpret_cast<__half*>(smem + L.vh);
    auto* vl = reinterpret_cast<__half*>(smem + L.vl);
    const int gqa = int(p.n_head / p.n_head_kv), qb = kFlashRows / gqa;  // queries a block takes
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, gid = lane >> 2, tig = lane & 3;
    const int64_t g = blockIdx.y, i0 = int64_t(blockIdx.x) * qb;
    const KvHeadDev head = p.heads[g];  // the step block: written before the pass starts (launch.cuh)
    pdl_wait();
    const int64_t pos0 = *p.pos0;
    const auto n_vis = [&](int64_t i) { return kv_visible(head, pos0, i); };
    const int64_t i_last = (p.n_q < i0 + qb ? p.n_q : i0 + qb) - 1;
    const int ra = 16 * warp + gid, rb = ra + 8;
    const auto visible = [&](int r) {  // padding rows: the last query's count (their q is 0)
        const int64_t i = i0 + r / gqa;
        return n_vis(r < qb * gqa && i < p.n_q ? i : i_last);
    };
    const int64_t vis_a = visible(ra), vis_b = visible(rb), n_end = n_vis(i_last);
    if constexpr (kHalfK) {
        flash_load_q<D>(p.q, p.n_q, p.n_head, gqa, i0, g, qh, ql);
    } else {  // a warp per (row, 32-block): the CPU reader's q8_0 query
        for (int b = warp; b < kFlashRows * NB; b += kFlashWarps) {
            const int r = b / NB, blk = b - r * NB;
            const int64_t i = i0 + r / gqa;
            const float x = r < qb * gqa && i < p.n_q ? p.q[(i * p.n_head + g * gqa + r % gqa) * D + blk * kQBlock + lane] : 0.0f;
            const Q8Lane q8 = quantize_q8_0_lane(x);
            qc[r * CP + blk * kQBlock + lane] = int8_t(q8.q);
            if (lane == 0) qd[r * NB + blk] = q8.d;
        }
    }
    FlashRows<D> rows;
    rows.init();
    const float score_scale = KC == KvCode::FP8 ? p.scale * head.k_scale : p.scale;
    const auto* kpage = reinterpret_cast<const uint8_t*>(head.k);
    const auto* vpage = reinterpret_cast<const uint8_t*>(head.v);
    // Tile t0's raw bytes into stage s: the tokens up to n_end, whole 16-byte pieces (a tile starts
    // 16-byte aligned in every format; the last piece may run past the last token, never past its
    // page). A group is committed per call, empty past the last tile, so the waits count the same.
    const auto issue = [&](int64_t t0, int s) {
        if (t0 < n_end) {
            const int64_t len = n_end - t0 < kFlashTile ? n_end - t0 : kFlashTile;
            uint8_t* dst = smem + L.raw + s * L.raw_stage;
            const int kb = int((len * ktb + 15) / 16 * 16), vb = int((len * vtb + 15) / 16 * 16);
            for (int o = tid * 16; o < kb; o += kFlashWarps * 32 * 16) cp_async16(dst + o, kpage + t0 * ktb + o);
            for (int o = tid * 16; o < vb; o += kFlashWarps * 32 * 16) cp_async16(dst + L.raw_v + o, vpage + t0 * vtb + o);
        }
        cp_async_commit();
    };
    issue(0, 0);
    int s = 0;
    for (int64_t t0 = 0; t0 < n_end; t0 += kFlashTile, s ^= 1) {
        issue(t0 + kFlashTile, s ^ 1);  // into the stage tile t0 - 32 was converted from (before the last barrier)
        cp_async_wait<1>();
        __syncthreads();  // tile t0's bytes have landed; q is staged; every warp is done with the previous tile
        const uint8_t* kraw = smem + L.raw + s * L.raw_stage;
        const uint8_t* vraw = kraw + L.raw_v;
        // Keys: a token row's pieces by adjacent threads (coalesced); tokens past n_end zero.
        if constexpr (kHalfK) {
            for (int it = tid; it < kFlashTile * (D / 8); it += kFlashWarps * 32) {
                const int t = it / (D / 8), c = 8 * (it - t * (D / 8));
                const int64_t tok = t0 + t;
                *reinterpret_cast<uint4*>(kh + t * QP + c) = tok < n_end ? half8_at<KC>(kraw + t * ktb, c) : make_uint4(0, 0, 0, 0);
            }
        } else {
            constexpr int kBlockBytes = KC == KvCode::Q8_0 ? kKvQ8BlockBytes : kKvQ4BlockBytes;
            for (int it = tid; it < kFlashTile * NB; it += kFlashWarps * 32) {
                const int t = it / NB, b = it - t * NB;
                const int64_t tok = t0 + t;
                unsigned w[8] = {0, 0, 0, 0, 0, 0, 0, 0};
                float d = 0.0f;
                if (tok < n_end) {
                    const uint8_t* blk = kraw + t * ktb + b * kBlockBytes;
                    d = kv_half_at(blk);
                    if constexpr (KC == KvCode::Q8_0) {
#pragma unroll
                        for (int i = 0; i < 8; ++i) w[i] = u32_at2(blk + 2 + 4 * i);
                    } else {
#pragma unroll
                        for (int i = 0; i < 4; ++i) {  // values 4i .. 4i + 3 and 16 + 4i ..: nibble - 8
                            const unsigned x = u32_at2(blk + 2 + 4 * i);
                            w[i] = __vsub4(x & 0x0f0f0f0fu, 0x08080808u);
                            w[i + 4] = __vsub4((x >> 4) & 0x0f0f0f0fu, 0x08080808u);
                        }
                    }
                }
                auto* dst = reinterpret_cast<uint4*>(kc + t * CP + b * kQBlock);
                dst[0] = make_uint4(w[0], w[1], w[2], w[3]);
                dst[1] = make_uint4(w[4], w[5], w[6], w[7]);
                kd[t * NB + b] = d;
            }
        }
        // Values, transposed: tokens fastest (a warp's lanes write 32 tokens of one channel row).
        for (int it = tid; it < kFlashTile * (D / 8); it += kFlashWarps * 32) {
            const int t = it % kFlashTile, c = 8 * (it / kFlashTile);
            const int64_t tok = t0 + t;
            unsigned hi[4] = {0, 0, 0, 0}, lo[4] = {0, 0, 0, 0};
            if (tok < n_end) {
                const uint8_t* row = vraw + t * vtb;
                if constexpr (kValLo) {
                    constexpr int kBlockBytes = VC == KvCode::Q8_0 ? kKvQ8BlockBytes : kKvQ4BlockBytes;
                    const uint8_t* blk = row + (c / kQBlock) * kBlockBytes;
                    const float d = kv_half_at(blk);
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        split_pair(float(kv_code_at(blk, c % kQBlock + 2 * e, VC)) * d,
                                   float(kv_code_at(blk, c % kQBlock + 2 * e + 1, VC)) * d, hi[e], lo[e]);
                    }
                } else {
                    const uint4 h = half8_at<VC>(row, c);
                    hi[0] = h.x, hi[1] = h.y, hi[2] = h.z, hi[3] = h.w;
                }
            }
            flash_put_values8<kValLo>(vh, vl, c, t, hi, lo);
        }
        __syncthreads();
        float sc[4][4];
        if constexpr (kHalfK) {
            flash_scores<D, false>(qh, ql, kh, nullptr, ra, rb, gid, tig, sc);
        } else {  // per 32-block: the exact int32 dot of codes times d_k d_q (the split kernel's products)
#pragma unroll
            for (int nt = 0; nt < 4; ++nt) sc[nt][0] = sc[nt][1] = sc[nt][2] = sc[nt][3] = 0.0f;
            const auto word = [&](const int8_t* base, int row, int col) { return *reinterpret_cast<const unsigned*>(base + row * CP + col); };
#pragma unroll
            for (int b = 0; b < NB; ++b) {
                const int c = b * kQBlock + 4 * tig;
                const uint4 a = make_uint4(word(qc, ra, c), word(qc, rb, c), word(qc, ra, c + 16), word(qc, rb, c + 16));
                const float dqa = qd[ra * NB + b], dqb = qd[rb * NB + b];
#pragma unroll
                for (int nt = 0; nt < 4; ++nt) {
                    const int tok = 8 * nt + gid, tc = 8 * nt + 2 * tig;  // this lane's B column; its C columns
                    int acc[4] = {0, 0, 0, 0};
                    mma_s8(acc, a, word(kc, tok, c), word(kc, tok, c + 16));
                    const float dk0 = kd[tc * NB + b], dk1 = kd[(tc + 1) * NB + b];
                    sc[nt][0] += float(acc[0]) * (dk0 * dqa);
                    sc[nt][1] += float(acc[1]) * (dk1 * dqa);
                    sc[nt][2] += float(acc[2]) * (dk0 * dqb);
                    sc[nt][3] += float(acc[3]) * (dk1 * dqb);
                }
            }
        }
        flash_softmax_pv<D, kValLo>(sc, score_scale, t0, vis_a, vis_b, vh, vl, gid, tig, rows);
    }
    cp_async_wait<0>();  // (only empty groups can be left)
    pdl_launch_dependents();
    flash_store<D>(rows, p.out, p.n_q, p.n_head, gqa, i0, g, ra, rb, tig, VC == KvCode::FP8 ? head.v_scale : 1.0f);
}

template <int D, KvCode KC, KvCode VC>
void launch_prefill(const SplitAttentionParams& p, cudaStream_t st) {
    constexpr size_t smem = size_t(prefill_smem(D, KC, VC).total);
    static PerDevice configured;
    allow_smem(attention_prefill_kernel<D, KC, VC>, smem, configured);
    const int64_t qb = kFlashRows / (p.n_head / p.n_head_kv);
    launch_pdl(attention_prefill_kernel<D, KC, VC>, dim3(unsigned((p.n_q + qb - 1) / qb), unsigned(p.n_head_kv)),
               dim3(kFlashWarps * 32), smem, st, p);
}

template <int D>
void launch_prefill_kv(const SplitAttentionParams& p, cudaStream_t st) {
    with_kv_codes(p.k_code, p.v_code, [&]<KvCode KC, KvCode VC>() { launch_prefill<D, KC, VC>(p, st); });
}

}  // namespace

bool attention_prefill_fits(int64_t n_head, int64_t n_head_kv, int64_t head_dim, KvCode k_code, KvCode v_code) {
    return n_head_kv > 0 && n_head % n_head_kv == 0 && n_head / n_head_kv <= kFlashRows && (head_dim == 64 || head_dim == 128) &&
           kv_code_fits(k_code, head_dim) && kv_code_fits(v_code, head_dim);
}

void attention_prefill(const SplitAttentionParams& p, cudaStream_t st) {
    if (p.n_q * p.n_head == 0) return;
    if (!attention_prefill_fits(p.n_head, p.n_head_kv, p.head_dim, p.k_code, p.v_code)) {
        throw_cuda_error(cudaErrorInvalidValue, "attention_prefill: shape or format not taken (attention_prefill_fits)",
                         __FILE__, __LINE__);
    }
    if (p.head_dim == 64) {
        launch_prefill_kv<64>(p, st);
    } else {
        launch_prefill_kv<128>(p, st);
    }
}

}  // namespace vxq::cuda
