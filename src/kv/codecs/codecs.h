// Factories of the built-in codecs (one file per codec family), listed in registry.cpp.
#pragma once

#include "kv/codec.h"

namespace vxq::codecs {

// baseline.cpp: plain and llama.cpp-compatible formats.
std::unique_ptr<Codec> make_f32(const CodecSpec&, KvRole, int64_t head_dim, const KvLayerState*);
std::unique_ptr<Codec> make_f16(const CodecSpec&, KvRole, int64_t head_dim, const KvLayerState*);
std::unique_ptr<Codec> make_bf16(const CodecSpec&, KvRole, int64_t head_dim, const KvLayerState*);
std::unique_ptr<Codec> make_q8_0(const CodecSpec&, KvRole, int64_t head_dim, const KvLayerState*);
std::unique_ptr<Codec> make_q4_0(const CodecSpec&, KvRole, int64_t head_dim, const KvLayerState*);
std::unique_ptr<Codec> make_fp8(const CodecSpec&, KvRole, int64_t head_dim, const KvLayerState*);

// kivi.cpp: KIVI (per-channel keys, per-token values, fp16 residual window).
std::unique_ptr<Codec> make_kivi(const CodecSpec&, KvRole, int64_t head_dim, const KvLayerState*);

// turbo.cpp: TurboQuant (mse, prod, rvq) with their per-layer state (rotation, codebooks, sketch).
std::unique_ptr<Codec> make_turbo(const CodecSpec&, KvRole, int64_t head_dim, const KvLayerState*);
std::unique_ptr<Codec> make_turbo_prod(const CodecSpec&, KvRole, int64_t head_dim, const KvLayerState*);
std::unique_ptr<Codec> make_turbo_rvq(const CodecSpec&, KvRole, int64_t head_dim, const KvLayerState*);
std::unique_ptr<KvLayerState> make_turbo_state(const CodecSpec&, KvRole, int64_t head_dim, int64_t layer);
std::unique_ptr<KvLayerState> make_turbo_prod_state(const CodecSpec&, KvRole, int64_t head_dim, int64_t layer);
std::unique_ptr<KvLayerState> make_turbo_rvq_state(const CodecSpec&, KvRole, int64_t head_dim, int64_t layer);

// vecinfer.cpp: VecInfer product quantization, its per-layer state from a calibration file.
std::unique_ptr<Codec> make_vecinfer(const CodecSpec&, KvRole, int64_t head_dim, const KvLayerState*);
std::unique_ptr<KvLayerState> make_vecinfer_state(const CodecSpec&, KvRole, int64_t head_dim, int64_t layer);
// qjl.cpp: QJL keys (1-bit JL sketch + norms, outlier channels apart) with KIVI-2 per-token values.
std::unique_ptr<Codec> make_qjl(const CodecSpec&, KvRole, int64_t head_dim, const KvLayerState*);
std::unique_ptr<KvLayerState> make_qjl_state(const CodecSpec&, KvRole, int64_t head_dim, int64_t layer);

}  // namespace vxq::codecs
