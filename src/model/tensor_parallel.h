// Tensor parallelism (Megatron-style) at the model layer: which part of every weight a rank of a
// group owns, and the config of the slice of the model it runs. The forward pass (model.cpp)
// runs on each rank with that config and joins the ranks with the backend's collectives
// (Backend::all_reduce_sum, Backend::gather_columns).
//
// Rank r of N owns:
//   - query heads [r h/N, (r+1) h/N) and KV heads [r h_kv/N, (r+1) h_kv/N): Q, K, V split by output
//     rows (column-parallel), their biases alike, the KV cache of its KV heads (a GQA group never
//     straddles two ranks); the attention output matrix split by input columns (row-parallel),
//     its partial products summed by an all-reduce;
//   - FFN rows [r ff/N, (r+1) ff/N) of gate and up (column-parallel) and the same columns of down
//     (row-parallel, an all-reduce);
//   - vocabulary rows [r V/N, (r+1) V/N) of the output matrix (V need not divide: floor bounds),
//     whose logits rank 0 gathers;
//   - a full copy of token_embd and the norms (the residual stream is the same on every rank).
// Column-parallel slices are views into the mapped file (whole rows); a row-parallel slice cuts
// every row, so it is copied once into memory the shard owns (whole blocks of the weight's type).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "model/config.h"
#include "model/weights.h"

namespace vxq {

struct TpRank {
    int rank = 0;
    int size = 1;
};

// Rank r's [begin, end) of n items split over `size` ranks (floor bounds: sizes differ by at most 1).
inline int64_t tp_begin(int64_t n, int rank, int size) { return n * rank / size; }

// vxq::Error, naming what does not divide, unless a model of this config and these weights
// splits over `size` ranks: heads and KV heads divisible by size, and every row-parallel slice
// (attention output, FFN down) whole blocks of its weight type and of its activations' dot type.
void check_tp_split(const ModelConfig& full, const ModelWeights& w, int size, const std::string& path);

// The same check for a shape whose matrices all have one type (what vxq synth writes), before
// the file exists; `what` names it in the message.
void check_tp_split(const ModelConfig& full, GgmlType type, int size, const std::string& what);

// The config rank `tp` runs: its heads, KV heads and FFN width (everything else as `full`).
ModelConfig shard_config(const ModelConfig& full, TpRank tp);

// Rank tp's weights (check_tp_split first). The row-parallel copies go to `owned`, which must
// outlive the returned views (a device backend keys its uploads by their addresses).
ModelWeights shard_weights(const ModelWeights& full, const ModelConfig& cfg, TpRank tp,
                           std::vector<std::unique_ptr<std::byte[]>>& owned);

// Columns [col0, col0 + n_cols) of every row of w, copied into `owned` (whole blocks of w's type).
WeightView copy_columns(const WeightView& w, int64_t col0, int64_t n_cols, std::vector<std::unique_ptr<std::byte[]>>& owned);

// Rows [row0, row0 + n_rows) of w: a view into the same memory.
WeightView slice_rows(const WeightView& w, int64_t row0, int64_t n_rows);

}  // namespace vxq
