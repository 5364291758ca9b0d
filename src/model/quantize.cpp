#include "model/quantize.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <vector>

#include <fmt/format.h>

#include "core/error.h"
#include "core/fp16.h"
#include "formats/gguf.h"
#include "formats/gguf_writer.h"

namespace vxq {

namespace {

bool is_float_type(GgmlType t) { return t == GgmlType::F32 || t == GgmlType::F16 || t == GgmlType::BF16; }

// Row r of a float tensor (F32/F16/BF16) widened to f32.
void row_to_f32(const GgufFile& f, const GgufTensorInfo& t, int64_t r, float* out) {
    const int64_t n = t.ne[0];
    const uint8_t* row = f.tensor_data(t) + size_t(r) * ggml_row_bytes(t.type, n);
    if (t.type == GgmlType::F32) {
        std::memcpy(out, row, size_t(n) * sizeof(float));
        return;
    }
    for (int64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, row + 2 * i, 2);
        out[i] = t.type == GgmlType::F16 ? fp16_to_fp32(h) : bf16_to_fp32(h);
    }
}

int64_t rows_of(const GgufTensorInfo& t) {
    int64_t rows = 1;
    for (size_t d = 1; d < t.ne.size(); ++d) rows *= t.ne[d];
    return rows;
}

}  // namespace

std::optional<GgmlType> quantize_target_type(std::string_view name) {
    for (GgmlType t : {GgmlType::TQ2_0, GgmlType::TQ1_0, GgmlType::TQ2_G128, GgmlType::Q8_0, GgmlType::Q4_0}) {
        if (ggml_type_name(t) == name) return t;
    }
    return std::nullopt;
}

QuantizeReport quantize_model(const QuantizeOptions& o, const std::function<void(uint64_t, uint64_t)>& progress) {
    const GgmlType to = o.type;
    VXQ_ASSERT(quantize_target_type(ggml_type_name(to)).has_value());
    const bool ternary = to == GgmlType::TQ1_0 || to == GgmlType::TQ2_0 || to == GgmlType::TQ2_G128;
    // TQ2_G128's rows are whole q8_K super-blocks (256 values), as the dot product takes them.
    const int64_t block = to == GgmlType::TQ2_G128 ? kQK_K : ggml_type_traits(uint32_t(to))->block_size;
    if (std::filesystem::weakly_canonical(o.input) == std::filesystem::weakly_canonical(o.output)) {
        fail("quantize: the output {} is the input", o.output);
    }
    const GgufFile in = GgufFile::open(o.input);

    QuantizeReport report;
    for (const GgufTensorInfo& t : in.tensors()) {
        QuantizedTensor q{t.name, t.ne, t.type, t.type, ""};
        const bool matrix = t.ne.size() == 2 && t.name.ends_with(".weight");
        if (matrix && t.name != "token_embd.weight" && t.type != to) {
            if (!is_float_type(t.type)) {
                fail("{}: tensor '{}' is {}: quantize from a file of f32, f16 or bf16 weights", o.input, t.name,
                     ggml_type_name(t.type));
            }
            if (t.ne[0] % block == 0) {
                q.to = to;
            } else {
                q.note = fmt::format("rows of {} are not whole {}-element blocks: kept", t.ne[0], block);
            }
        }
        report.tensors.push_back(std::move(q));
    }

    GgufStreamWriter w;
    for (const auto& [key, value] : in.metadata()) {
        if (key == "general.alignment") continue;  // set_alignment writes it
        if (key == "general.file_type" || key == "general.quantization_version") continue;  // below
        w.add(key, GgufWriterValue::of(value));
    }
    if (const auto ftype = llama_ftype(to)) w.add_u32("general.file_type", *ftype);  // none for TQ2_G128
    w.add_u32("general.quantization_version", 2);  // ggml's GGML_QNT_VERSION, as llama-quantize writes
    w.set_alignment(uint32_t(in.alignment()));
    for (const QuantizedTensor& q : report.tensors) w.add_tensor(q.name, q.ne, q.to);

    // Absmean's per-tensor gamma, before any row is written (a first pass over those tensors: the
    // rows are converted again when written, rather than held).
    std::vector<double> gamma(report.tensors.size(), 0.0);
    std::vector<float> buf;
    if (ternary && o.rule == TernaryRule::Absmean) {
        for (size_t i = 0; i < report.tensors.size(); ++i) {
            if (report.tensors[i].from == report.tensors[i].to) continue;
            const GgufTensorInfo& t = in.tensors()[i];
            buf.resize(size_t(t.ne[0]));
            double sum = 0.0;
            for (int64_t r = 0; r < rows_of(t); ++r) {
                row_to_f32(in, t, r, buf.data());
                sum += ternary_absmean(buf.data(), t.ne[0]) * double(t.ne[0]);
            }
            gamma[i] = sum / double(t.n_elements);
        }
    }

    w.write(
        o.output,
        [&](size_t i, int64_t row0, int64_t n_rows, std::span<uint8_t> out) {
            const GgufTensorInfo& t = in.tensors()[i];
            const QuantizedTensor& q = report.tensors[i];
            const size_t in_row = ggml_row_bytes(t.type, t.ne[0]), out_row = ggml_row_bytes(q.to, t.ne[0]);
            if (q.from == q.to) {
                std::memcpy(out.data(), in.tensor_data(t) + size_t(row0) * in_row, size_t(n_rows) * in_row);
                return;
            }
            buf.resize(size_t(t.ne[0]));
            for (int64_t r = 0; r < n_rows; ++r) {
                row_to_f32(in, t, row0 + r, buf.data());
                uint8_t* dst = out.data() + size_t(r) * out_row;
                if (ternary) {
                    quantize_row_ternary(q.to, o.rule, gamma[i], buf.data(), t.ne[0], dst);
                } else {
                    quantize_row_ref(q.to, buf.data(), t.ne[0], dst);
                }
            }
        },
        progress);
    report.bytes_in = in.size();
    report.bytes_out = w.file_bytes();
    return report;
}

}  // namespace vxq
