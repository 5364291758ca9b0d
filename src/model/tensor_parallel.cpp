#include "model/tensor_parallel.h"

#include <cstring>

#include "backend/weight_formats.h"
#include "core/error.h"

namespace vxq {

namespace {

// The block a row-parallel slice must be made of: the weight's own, or its activations' dot type
// when that is larger (TQ2_G128's 128-value blocks meet q8_K's 256).
int64_t cut_block(const WeightView& w) {
    const WeightFormat* wf = find_weight_format(w.type);
    VXQ_ASSERT(wf);
    const int64_t dot = ggml_type_traits(uint32_t(wf->dot_type))->block_size;
    return std::max(wf->block_size, dot);
}

void check_columns(const WeightView& w, int size, const char* what, const std::string& path) {
    const int64_t cols = w.cols / size;
    const int64_t block = cut_block(w);
    if (cols % block != 0) {
        fail("{}: --tp {} cuts the {} matrix ({}, {} columns) into {} columns per rank, not whole {}-value blocks", path, size,
             what, ggml_type_display_name(w.type), w.cols, cols, block);
    }
}

}  // namespace

void check_tp_split(const ModelConfig& c, const ModelWeights& w, int size, const std::string& path) {
    if (size < 1) fail("--tp must be at least 1, got {}", size);
    if (size == 1) return;
    if (c.n_head_kv % size != 0) {
        fail("{}: --tp {} does not divide the {} KV heads (each rank owns whole KV heads and their query heads)", path, size,
             c.n_head_kv);
    }
    if (c.n_ff % size != 0) fail("{}: --tp {} does not divide the feed-forward width {}", path, size, c.n_ff);
    for (const LayerWeights& L : w.layers) {
        check_columns(L.wo, size, "attention output", path);
        check_columns(L.w_down, size, "feed-forward down", path);
    }
    if (c.n_vocab < size) fail("{}: --tp {} is more ranks than the {} vocabulary rows", path, size, c.n_vocab);
}

void check_tp_split(const ModelConfig& c, GgmlType type, int size, const std::string& what) {
    ModelWeights w;
    LayerWeights L{};
    L.wo = WeightView{type, nullptr, c.n_embd, c.q_dim(), ggml_row_bytes(type, c.q_dim())};
    L.w_down = WeightView{type, nullptr, c.n_embd, c.n_ff, ggml_row_bytes(type, c.n_ff)};
    w.layers.push_back(L);
    check_tp_split(c, w, size, what);
}

ModelConfig shard_config(const ModelConfig& full, TpRank tp) {
    ModelConfig c = full;
    c.n_head = full.n_head / tp.size;
    c.n_head_kv = full.n_head_kv / tp.size;
    c.n_ff = full.n_ff / tp.size;
    return c;
}

WeightView slice_rows(const WeightView& w, int64_t row0, int64_t n_rows) {
    VXQ_ASSERT(row0 >= 0 && n_rows >= 0 && row0 + n_rows <= w.rows);
    WeightView s = w;
    s.data = static_cast<const std::byte*>(w.data) + size_t(row0) * w.row_bytes;
    s.rows = n_rows;
    return s;
}

WeightView copy_columns(const WeightView& w, int64_t col0, int64_t n_cols, std::vector<std::unique_ptr<std::byte[]>>& owned) {
    const int64_t block = ggml_type_traits(uint32_t(w.type))->block_size;
    VXQ_ASSERT(col0 % block == 0 && n_cols % block == 0 && col0 + n_cols <= w.cols);
    const size_t skip = ggml_row_bytes(w.type, col0);
    const size_t row_bytes = ggml_row_bytes(w.type, n_cols);
    auto buf = std::make_unique<std::byte[]>(size_t(w.rows) * row_bytes);
    const auto* src = static_cast<const std::byte*>(w.data);
    for (int64_t r = 0; r < w.rows; ++r) {
        std::memcpy(buf.get() + size_t(r) * row_bytes, src + size_t(r) * w.row_bytes + skip, row_bytes);
    }
    WeightView s{w.type, buf.get(), w.rows, n_cols, row_bytes};
    owned.push_back(std::move(buf));
    return s;
}

ModelWeights shard_weights(const ModelWeights& full, const ModelConfig& cfg, TpRank tp,
                           std::vector<std::unique_ptr<std::byte[]>>& owned) {
    if (tp.size == 1) return full;
    const ModelConfig c = shard_config(cfg, tp);
    const int64_t q0 = tp.rank * c.q_dim(), kv0 = tp.rank * c.kv_dim(), ff0 = tp.rank * c.n_ff;
    const auto offset = [](const float* b, int64_t at) { return b ? b + at : nullptr; };
    ModelWeights w = full;
    const int64_t v0 = tp_begin(cfg.n_vocab, tp.rank, tp.size), v1 = tp_begin(cfg.n_vocab, tp.rank + 1, tp.size);
    w.output = slice_rows(full.output, v0, v1 - v0);
    for (LayerWeights& L : w.layers) {
        L.wq = slice_rows(L.wq, q0, c.q_dim());
        L.wk = slice_rows(L.wk, kv0, c.kv_dim());
        L.wv = slice_rows(L.wv, kv0, c.kv_dim());
        L.bq = offset(L.bq, q0);
        L.bk = offset(L.bk, kv0);
        L.bv = offset(L.bv, kv0);
        L.wo = copy_columns(L.wo, q0, c.q_dim(), owned);
        L.w_gate = slice_rows(L.w_gate, ff0, c.n_ff);
        L.w_up = slice_rows(L.w_up, ff0, c.n_ff);
        L.w_down = copy_columns(L.w_down, ff0, c.n_ff, owned);
    }
    return w;
}

}  // namespace vxq
