// GGUF reader: round trips through the test writer, typed getters, real models, and a table of
// malformed inputs that must each be rejected with a vxq::Error naming the problem.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "core/error.h"
#include "formats/gguf.h"
#include "formats/gguf_writer.h"
#include "support/assets.h"
#include "support/gguf_writer.h"
#include "support/text.h"

namespace vxq {
namespace {

using test::error_of;

namespace fs = std::filesystem;
using test::GgufWriter;
using test::GgufWriterValue;
using VT = GgufValueType;

std::vector<float> ramp(size_t n, float scale = 0.37f) {
    std::vector<float> v(n);
    for (size_t i = 0; i < n; ++i) v[i] = std::sin(float(i) * 0.91f + 0.3f) * scale * float(1 + i % 7);
    return v;
}

// A file removed when the test ends; unique per process and test.
class TempFile {
public:
    explicit TempFile(const std::string& tag) {
        const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
        std::string name = std::string("vxq_gguf_") + std::to_string(::getpid()) + "_" +
                           (info ? info->name() : "x") + "_" + tag + ".gguf";
        for (char& c : name) {
            if (c == '/') c = '_';
        }
        path_ = (fs::temp_directory_path() / name).string();
    }
    ~TempFile() {
        std::error_code ec;
        fs::remove(path_, ec);
    }
    const std::string& path() const { return path_; }

private:
    std::string path_;
};

// ---------------------------------------------------------------------------------------------
// Round trip

struct TensorSpec {
    std::string name;
    std::vector<int64_t> ne;
    GgmlType type;
};

const std::vector<TensorSpec> kTensorSpecs = {
    {"t.f32.2d", {5, 3}, GgmlType::F32},       {"t.f32.4d", {2, 1, 3, 1}, GgmlType::F32},
    {"t.f32.1", {1}, GgmlType::F32},           {"t.f16.1d", {8}, GgmlType::F16},
    {"t.f16.3d", {3, 5, 2}, GgmlType::F16},    {"t.bf16.3d", {3, 2, 2}, GgmlType::BF16},
    {"t.bf16.1d", {7}, GgmlType::BF16},        {"t.q8_0.2d", {64, 2}, GgmlType::Q8_0},
    {"t.q8_0.1d", {32}, GgmlType::Q8_0},       {"t.q4_0.2d", {32, 3}, GgmlType::Q4_0},
    {"t.q4_0.3d", {96, 1, 2}, GgmlType::Q4_0},
};

int64_t count(const std::vector<int64_t>& ne) {
    int64_t n = 1;
    for (int64_t d : ne) n *= d;
    return n;
}

constexpr uint64_t kBigU64 = (1ull << 63) + 5;

void add_every_metadata_type(GgufWriter& w) {
    w.add_string("general.architecture", "llama");
    w.add_u8("m.u8", 200);
    w.add_i8("m.i8", -100);
    w.add_u16("m.u16", 60000);
    w.add_i16("m.i16", -30000);
    w.add_u32("m.u32", 4000000000u);
    w.add_i32("m.i32", -2000000000);
    w.add_u64("m.u64", kBigU64);
    w.add_i64("m.i64", std::numeric_limits<int64_t>::min());
    w.add_f32("m.f32", 1.5f);
    w.add_f64("m.f64", -2.25e300);
    w.add_bool("m.true", true);
    w.add_bool("m.false", false);
    w.add_string("m.str", std::string("h\xc3\xa9llo\0world", 12));
    w.add_string("m.empty_str", "");
    w.add_array("a.u8", std::vector<uint8_t>{0, 1, 255});
    w.add_array("a.i8", std::vector<int8_t>{-128, 0, 127});
    w.add_array("a.u16", std::vector<uint16_t>{0, 65535});
    w.add_array("a.i16", std::vector<int16_t>{-32768, 32767});
    w.add_array("a.u32", std::vector<uint32_t>{0, 4294967295u});
    w.add_array("a.i32", std::vector<int32_t>{-7, 0, 7, std::numeric_limits<int32_t>::min()});
    w.add_array("a.u64", std::vector<uint64_t>{kBigU64, 3});
    w.add_array("a.i64", std::vector<int64_t>{-1, std::numeric_limits<int64_t>::max()});
    w.add_array("a.f32", std::vector<float>{0.5f, -1.25f, 3e38f});
    w.add_array("a.f64", std::vector<double>{1e-300, -0.0, 42.0});
    w.add_array("a.bool", std::vector<bool>{true, false, true});
    w.add_array("a.str", std::vector<std::string>{"<s>", "", "\xe2\x96\x81the"});
    w.add_array("a.empty", std::vector<int32_t>{});
    // [[1, 2], [3]] and a 4-deep nesting, the deepest the reader accepts.
    w.add("a.nested", GgufWriterValue::array(VT::ARRAY, {GgufWriterValue::array_of(std::vector<int32_t>{1, 2}),
                                                        GgufWriterValue::array_of(std::vector<int32_t>{3})}));
    GgufWriterValue deep = GgufWriterValue::array_of(std::vector<std::string>{"x"});
    for (int i = 0; i < 3; ++i) deep = GgufWriterValue::array(VT::ARRAY, {deep});
    w.add("a.deep4", deep);
}

GgufWriter full_writer(uint32_t version = 3, uint32_t alignment = 0) {
    GgufWriter w(version);
    add_every_metadata_type(w);
    if (alignment) w.set_alignment(alignment);
    for (const auto& s : kTensorSpecs) w.add_tensor_from_f32(s.name, s.ne, s.type, ramp(size_t(count(s.ne))));
    return w;
}

void expect_every_metadata_type(const GgufFile& g) {
    EXPECT_EQ(g.get_string("general.architecture"), "llama");
    EXPECT_EQ(g.get_int("m.u8"), 200);
    EXPECT_EQ(g.get_int("m.i8"), -100);
    EXPECT_EQ(g.get_int("m.u16"), 60000);
    EXPECT_EQ(g.get_int("m.i16"), -30000);
    EXPECT_EQ(g.get_int("m.u32"), 4000000000ll);
    EXPECT_EQ(g.get_int("m.i32"), -2000000000);
    EXPECT_EQ(uint64_t(g.get_int("m.u64").value()), kBigU64);  // u64 kept by bit pattern
    EXPECT_EQ(g.get_int("m.i64"), std::numeric_limits<int64_t>::min());
    EXPECT_EQ(g.get_float("m.f32"), 1.5);
    EXPECT_EQ(g.get_float("m.f64"), -2.25e300);
    EXPECT_EQ(g.get_float("m.i16"), -30000.0);  // integers read as numbers too
    EXPECT_EQ(g.get_bool("m.true"), true);
    EXPECT_EQ(g.get_bool("m.false"), false);
    EXPECT_EQ(g.get_string("m.str"), std::string("h\xc3\xa9llo\0world", 12));
    EXPECT_EQ(g.get_string("m.empty_str"), "");

    const struct { const char* key; VT type; } scalar_types[] = {
        {"m.u8", VT::UINT8},    {"m.i8", VT::INT8},     {"m.u16", VT::UINT16}, {"m.i16", VT::INT16},
        {"m.u32", VT::UINT32},  {"m.i32", VT::INT32},   {"m.u64", VT::UINT64}, {"m.i64", VT::INT64},
        {"m.f32", VT::FLOAT32}, {"m.f64", VT::FLOAT64}, {"m.true", VT::BOOL},  {"m.str", VT::STRING},
    };
    for (const auto& st : scalar_types) {
        const GgufValue* v = g.find(st.key);
        ASSERT_NE(v, nullptr) << st.key;
        EXPECT_EQ(v->type, st.type) << st.key;
    }

    auto ints = [&](const char* key, VT elem) {
        const GgufValue* a = g.get_array(key);
        EXPECT_NE(a, nullptr) << key;
        if (!a) return std::vector<int64_t>{};
        EXPECT_EQ(a->type, VT::ARRAY);
        EXPECT_EQ(a->elem_type, elem) << key;
        EXPECT_EQ(a->array_size(), a->ints.size()) << key;
        return a->ints;
    };
    EXPECT_EQ(ints("a.u8", VT::UINT8), (std::vector<int64_t>{0, 1, 255}));
    EXPECT_EQ(ints("a.i8", VT::INT8), (std::vector<int64_t>{-128, 0, 127}));
    EXPECT_EQ(ints("a.u16", VT::UINT16), (std::vector<int64_t>{0, 65535}));
    EXPECT_EQ(ints("a.i16", VT::INT16), (std::vector<int64_t>{-32768, 32767}));
    EXPECT_EQ(ints("a.u32", VT::UINT32), (std::vector<int64_t>{0, 4294967295ll}));
    EXPECT_EQ(ints("a.i32", VT::INT32), (std::vector<int64_t>{-7, 0, 7, std::numeric_limits<int32_t>::min()}));
    EXPECT_EQ(ints("a.u64", VT::UINT64), (std::vector<int64_t>{int64_t(kBigU64), 3}));
    EXPECT_EQ(ints("a.i64", VT::INT64), (std::vector<int64_t>{-1, std::numeric_limits<int64_t>::max()}));
    EXPECT_EQ(ints("a.bool", VT::BOOL), (std::vector<int64_t>{1, 0, 1}));
    EXPECT_EQ(ints("a.empty", VT::INT32), std::vector<int64_t>{});

    const GgufValue* f32 = g.get_array("a.f32");
    ASSERT_NE(f32, nullptr);
    EXPECT_EQ(f32->elem_type, VT::FLOAT32);
    EXPECT_EQ(f32->floats, (std::vector<double>{0.5, -1.25, double(3e38f)}));
    const GgufValue* f64 = g.get_array("a.f64");
    ASSERT_NE(f64, nullptr);
    EXPECT_EQ(f64->elem_type, VT::FLOAT64);
    ASSERT_EQ(f64->floats.size(), 3u);
    EXPECT_EQ(f64->floats[0], 1e-300);
    EXPECT_TRUE(f64->floats[1] == 0.0 && std::signbit(f64->floats[1]));
    EXPECT_EQ(f64->floats[2], 42.0);

    const GgufValue* strs = g.get_array("a.str");
    ASSERT_NE(strs, nullptr);
    EXPECT_EQ(strs->elem_type, VT::STRING);
    EXPECT_EQ(strs->strs, (std::vector<std::string>{"<s>", "", "\xe2\x96\x81the"}));
    EXPECT_EQ(strs->array_size(), 3u);

    const GgufValue* nested = g.get_array("a.nested");
    ASSERT_NE(nested, nullptr);
    EXPECT_EQ(nested->elem_type, VT::ARRAY);
    ASSERT_EQ(nested->items.size(), 2u);
    EXPECT_EQ(nested->items[0].elem_type, VT::INT32);
    EXPECT_EQ(nested->items[0].ints, (std::vector<int64_t>{1, 2}));
    EXPECT_EQ(nested->items[1].ints, (std::vector<int64_t>{3}));

    const GgufValue* deep = g.get_array("a.deep4");
    ASSERT_NE(deep, nullptr);
    for (int level = 0; level < 3; ++level) {
        ASSERT_EQ(deep->elem_type, VT::ARRAY) << level;
        ASSERT_EQ(deep->items.size(), 1u) << level;
        deep = &deep->items[0];
    }
    EXPECT_EQ(deep->elem_type, VT::STRING);
    EXPECT_EQ(deep->strs, std::vector<std::string>{"x"});

    // Insertion order is kept.
    ASSERT_FALSE(g.metadata().empty());
    EXPECT_EQ(g.metadata().front().first, "general.architecture");
    EXPECT_EQ(g.metadata().back().first, "a.deep4");

    // Absent keys.
    EXPECT_EQ(g.find("nope"), nullptr);
    EXPECT_EQ(g.get_int("nope"), std::nullopt);
    EXPECT_EQ(g.get_float("nope"), std::nullopt);
    EXPECT_EQ(g.get_bool("nope"), std::nullopt);
    EXPECT_EQ(g.get_string("nope"), std::nullopt);
    EXPECT_EQ(g.get_array("nope"), nullptr);
}

void expect_tensors(const GgufFile& g, const GgufWriter& w, const GgufWriter::Layout& lay) {
    ASSERT_EQ(g.tensors().size(), kTensorSpecs.size());
    ASSERT_EQ(lay.tensor_offsets.size(), kTensorSpecs.size());
    const uint8_t* data0 = g.tensor_data(g.tensors()[0]) - g.tensors()[0].offset;
    for (size_t i = 0; i < kTensorSpecs.size(); ++i) {
        const auto& s = kTensorSpecs[i];
        SCOPED_TRACE(s.name);
        const GgufTensorInfo& t = g.tensors()[i];
        EXPECT_EQ(g.find_tensor(s.name), &t);
        EXPECT_EQ(t.name, s.name);
        EXPECT_EQ(t.ne, s.ne);
        EXPECT_EQ(t.type, s.type);
        EXPECT_EQ(t.n_elements, count(s.ne));
        const std::vector<uint8_t> want = GgufWriter::encode(s.type, ramp(size_t(count(s.ne))));
        EXPECT_EQ(t.n_bytes, want.size());
        EXPECT_EQ(t.n_bytes, ggml_row_bytes(s.type, s.ne[0]) * size_t(count(s.ne) / s.ne[0]));
        EXPECT_EQ(t.offset, lay.tensor_offsets[i]);
        EXPECT_EQ(t.offset % g.alignment(), 0u);
        EXPECT_EQ(g.tensor_data(t), data0 + t.offset);
        EXPECT_EQ(std::memcmp(g.tensor_data(t), want.data(), want.size()), 0);
        // The data pointer is aligned in the file as promised.
        EXPECT_EQ(lay.data_start % g.alignment(), 0u);
    }
    EXPECT_EQ(g.find_tensor("nope"), nullptr);
    // Decoded f32 values read back exactly.
    const GgufTensorInfo* f = g.find_tensor("t.f32.2d");
    ASSERT_NE(f, nullptr);
    std::vector<float> got(size_t(f->n_elements));
    std::memcpy(got.data(), g.tensor_data(*f), f->n_bytes);
    EXPECT_EQ(got, ramp(15));
    (void)w;
}

TEST(GgufRoundTrip, ParseEveryMetadataTypeAndTensorType) {
    const GgufWriter w = full_writer();
    GgufWriter::Layout lay;
    const std::vector<uint8_t> b = w.bytes(&lay);
    const GgufFile g = GgufFile::parse(b, "roundtrip.gguf");
    EXPECT_EQ(g.path(), "roundtrip.gguf");
    EXPECT_EQ(g.version(), 3u);
    EXPECT_EQ(g.size(), b.size());
    EXPECT_EQ(g.alignment(), 32u);
    EXPECT_EQ(g.metadata().size(), w.kv_count());
    expect_every_metadata_type(g);
    expect_tensors(g, w, lay);
}

TEST(GgufRoundTrip, OpenFromFile) {
    const GgufWriter w = full_writer();
    GgufWriter::Layout lay;
    const std::vector<uint8_t> b = w.bytes(&lay);
    TempFile tmp("rt");
    w.write(tmp.path());
    ASSERT_EQ(fs::file_size(tmp.path()), b.size());
    const GgufFile g = GgufFile::open(tmp.path());
    EXPECT_EQ(g.path(), tmp.path());
    EXPECT_EQ(g.size(), b.size());
    EXPECT_EQ(g.version(), 3u);
    expect_every_metadata_type(g);
    expect_tensors(g, w, lay);
}

TEST(GgufRoundTrip, CustomAlignmentAndPaddedEnd) {
    GgufWriter w = full_writer(3, 64);
    w.set_pad_end(true);
    GgufWriter::Layout lay;
    const std::vector<uint8_t> b = w.bytes(&lay);
    EXPECT_EQ(b.size() % 64, 0u);
    const GgufFile g = GgufFile::parse(b);
    EXPECT_EQ(g.alignment(), 64u);
    EXPECT_EQ(g.get_int("general.alignment"), 64);
    expect_tensors(g, w, lay);
    for (const auto& t : g.tensors()) EXPECT_EQ(t.offset % 64, 0u) << t.name;
}

TEST(GgufRoundTrip, Version2Accepted) {
    const GgufWriter w = full_writer(2);
    GgufWriter::Layout lay;
    const GgufFile g = GgufFile::parse(w.bytes(&lay));
    EXPECT_EQ(g.version(), 2u);
    expect_every_metadata_type(g);
    expect_tensors(g, w, lay);
}

TEST(GgufRoundTrip, MetadataOnlyAndEmptyFiles) {
    GgufWriter w;
    w.add_u32("only", 7);
    const GgufFile g = GgufFile::parse(w.bytes());
    EXPECT_TRUE(g.tensors().empty());
    EXPECT_EQ(g.get_int("only"), 7);

    const GgufFile e = GgufFile::parse(GgufWriter().bytes());  // 24-byte header, nothing else
    EXPECT_EQ(e.size(), 24u);
    EXPECT_TRUE(e.metadata().empty());
    EXPECT_TRUE(e.tensors().empty());
}

TEST(GgufRoundTrip, MovedFileKeepsDataValid) {
    const GgufWriter w = full_writer();
    GgufWriter::Layout lay;
    const std::vector<uint8_t> b = w.bytes(&lay);
    GgufFile a = GgufFile::parse(b);
    GgufFile moved(std::move(a));
    expect_tensors(moved, w, lay);
    GgufFile assigned = GgufFile::parse(GgufWriter().bytes());
    assigned = std::move(moved);
    expect_every_metadata_type(assigned);
    expect_tensors(assigned, w, lay);

    TempFile tmp("mv");
    w.write(tmp.path());
    GgufFile mapped = GgufFile::open(tmp.path());
    GgufFile mapped2(std::move(mapped));
    expect_tensors(mapped2, w, lay);
}

TEST(GgufRoundTrip, WriterQuantizesLikeTheFormat) {
    // q8_0 of a block whose largest magnitude is 127 has scale 1 and exact integer codes.
    std::vector<float> v(32);
    for (int i = 0; i < 32; ++i) v[i] = float(i * 8 - 127);
    const auto q8 = GgufWriter::encode(GgmlType::Q8_0, v);
    ASSERT_EQ(q8.size(), sizeof(BlockQ8_0));
    BlockQ8_0 b8;
    std::memcpy(&b8, q8.data(), sizeof b8);
    EXPECT_EQ(fp16_to_fp32(b8.d), 1.0f);
    for (int i = 0; i < 32; ++i) EXPECT_EQ(b8.qs[i], i * 8 - 127) << i;

    // q4_0 with max magnitude -8: d = 1, codes q = x + 8.
    std::vector<float> u(32);
    for (int i = 0; i < 32; ++i) u[i] = float(i % 16) - 8.0f;
    const auto q4 = GgufWriter::encode(GgmlType::Q4_0, u);
    ASSERT_EQ(q4.size(), sizeof(BlockQ4_0));
    BlockQ4_0 b4;
    std::memcpy(&b4, q4.data(), sizeof b4);
    EXPECT_EQ(fp16_to_fp32(b4.d), 1.0f);
    for (int j = 0; j < 16; ++j) {
        EXPECT_EQ(b4.qs[j] & 0xf, (j % 16)) << j;
        EXPECT_EQ(b4.qs[j] >> 4, ((j + 16) % 16)) << j;
    }
    EXPECT_THROW(GgufWriter().add_tensor_f32("x", {4}, {1, 2, 3}), std::invalid_argument);
    EXPECT_THROW(GgufWriter().add_tensor("x", {4}, GgmlType::F16, std::vector<uint8_t>(7)), std::invalid_argument);
}

// The library's streaming writer (formats/gguf_writer.h, used by vxq synth) lays a file out byte
// for byte as this test writer does with end padding: header, aligned tensors, zero padding after
// each one; with ggml's default alignment and another one, and tensors of unaligned sizes.
TEST(GgufRoundTrip, StreamWriterLaysOutLikeTheTestWriter) {
    for (uint32_t alignment : {32u, 64u}) {
        SCOPED_TRACE(alignment);
        GgufWriter w;
        GgufStreamWriter sw;
        if (alignment != 32) {
            w.set_alignment(alignment);
            sw.set_alignment(alignment);
        }
        w.add_string("general.architecture", "llama").add_u32("a.n", 7).add_array("a.v", std::vector<float>{1, 2});
        sw.add_string("general.architecture", "llama").add_u32("a.n", 7).add_array("a.v", std::vector<float>{1, 2});
        struct T {
            const char* name;
            std::vector<int64_t> ne;
            GgmlType type;
        };
        const T tensors[] = {{"a", {3}, GgmlType::F32},
                             {"b", {64, 3}, GgmlType::Q8_0},
                             {"c", {32, 5, 2}, GgmlType::Q4_0},
                             {"d", {7, 3}, GgmlType::F16}};
        std::vector<std::vector<float>> values;
        for (const T& t : tensors) {
            int64_t n = 1;
            for (int64_t d : t.ne) n *= d;
            values.push_back(ramp(size_t(n), 1.0f + float(values.size())));
            w.add_tensor_from_f32(t.name, t.ne, t.type, values.back());
            sw.add_tensor(t.name, t.ne, t.type);
        }
        w.set_pad_end(true);
        const std::vector<uint8_t> want = w.bytes();

        TempFile tmp("stream");
        sw.write(tmp.path(), [&](size_t ti, int64_t row0, int64_t n_rows, std::span<uint8_t> out) {
            const T& t = tensors[ti];
            const int64_t n = t.ne[0];
            for (int64_t r = 0; r < n_rows; ++r) {
                const std::vector<float> row(values[ti].begin() + (row0 + r) * n, values[ti].begin() + (row0 + r + 1) * n);
                const std::vector<uint8_t> enc = GgufWriter::encode(t.type, row);
                std::memcpy(out.data() + size_t(r) * enc.size(), enc.data(), enc.size());
            }
        });
        std::ifstream in(tmp.path(), std::ios::binary);
        const std::vector<uint8_t> got((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
        EXPECT_EQ(got.size(), sw.file_bytes());
        EXPECT_TRUE(got == want);
        const GgufFile g = GgufFile::open(tmp.path());
        for (size_t i = 0; i < g.tensors().size(); ++i) EXPECT_EQ(g.tensors()[i].offset, sw.tensors()[i].offset);
    }
}

// ---------------------------------------------------------------------------------------------
// Typed getters

TEST(GgufGetters, WrongTypeErrorsNameKeyAndTypes) {
    GgufWriter w;
    add_every_metadata_type(w);
    const GgufFile g = GgufFile::parse(w.bytes(), "getters.gguf");

    struct Case { std::function<void()> call; std::string fragment; };
    const std::vector<Case> cases = {
        {[&] { (void)g.get_int("m.str"); }, "metadata key 'm.str' has type string, expected an integer"},
        {[&] { (void)g.get_int("m.f32"); }, "metadata key 'm.f32' has type f32, expected an integer"},
        {[&] { (void)g.get_int("m.true"); }, "metadata key 'm.true' has type bool, expected an integer"},
        {[&] { (void)g.get_int("a.i32"); }, "metadata key 'a.i32' has type array, expected an integer"},
        {[&] { (void)g.get_float("m.str"); }, "metadata key 'm.str' has type string, expected a number"},
        {[&] { (void)g.get_float("m.true"); }, "metadata key 'm.true' has type bool, expected a number"},
        {[&] { (void)g.get_bool("m.u8"); }, "metadata key 'm.u8' has type u8, expected bool"},
        {[&] { (void)g.get_bool("m.str"); }, "metadata key 'm.str' has type string, expected bool"},
        {[&] { (void)g.get_string("m.i32"); }, "metadata key 'm.i32' has type i32, expected string"},
        {[&] { (void)g.get_string("a.str"); }, "metadata key 'a.str' has type array, expected string"},
        {[&] { (void)g.get_array("m.f64"); }, "metadata key 'm.f64' has type f64, expected array"},
        {[&] { (void)g.get_array("m.u64"); }, "metadata key 'm.u64' has type u64, expected array"},
    };
    for (const auto& c : cases) {
        const std::string msg = error_of(c.call);
        EXPECT_NE(msg.find(c.fragment), std::string::npos) << "message: " << msg;
        EXPECT_NE(msg.find("getters.gguf"), std::string::npos) << "message: " << msg;
    }
}

TEST(GgufGetters, ValueTypeNames) {
    EXPECT_EQ(gguf_value_type_name(VT::UINT8), "u8");
    EXPECT_EQ(gguf_value_type_name(VT::STRING), "string");
    EXPECT_EQ(gguf_value_type_name(VT::FLOAT64), "f64");
    EXPECT_EQ(gguf_value_type_name(GgufValueType(77)), "?");
}

// ---------------------------------------------------------------------------------------------
// open() failures

TEST(GgufOpen, MissingEmptyAndDirectory) {
    const std::string missing = (fs::temp_directory_path() / "vxq_gguf_definitely_missing.gguf").string();
    std::string msg = error_of([&] { (void)GgufFile::open(missing); });
    EXPECT_NE(msg.find("cannot open model file"), std::string::npos) << msg;
    EXPECT_NE(msg.find(missing), std::string::npos) << msg;

    TempFile empty("empty");
    { std::ofstream(empty.path(), std::ios::binary); }
    msg = error_of([&] { (void)GgufFile::open(empty.path()); });
    EXPECT_NE(msg.find("the file is empty"), std::string::npos) << msg;

    msg = error_of([&] { (void)GgufFile::open(fs::temp_directory_path().string()); });
    EXPECT_NE(msg.find("not a regular file"), std::string::npos) << msg;

    TempFile bad("bad");
    { std::ofstream(bad.path(), std::ios::binary) << "GGUF\x01"; }
    msg = error_of([&] { (void)GgufFile::open(bad.path()); });
    EXPECT_NE(msg.find(bad.path()), std::string::npos) << msg;
    EXPECT_NE(msg.find("truncated file"), std::string::npos) << msg;
}

// ---------------------------------------------------------------------------------------------
// Real models from the shared assets

std::string shared_model(const std::string& name) { return test::shared_path("assets/models/" + name); }

TEST(GgufRealModel, LlamaH64F16Opens) {
    const std::string path = shared_model("vxq-llama-h64-f16.gguf");
    VXQ_REQUIRE_PATH(path);
    const GgufFile g = GgufFile::open(path);
    EXPECT_EQ(g.tensors().size(), 56u);
    EXPECT_EQ(g.get_string("general.architecture"), "llama");
    EXPECT_NE(g.find_tensor("token_embd.weight"), nullptr);
    for (const auto& t : g.tensors()) {
        EXPECT_EQ(g.find_tensor(t.name), &t);
        EXPECT_EQ(t.offset % g.alignment(), 0u) << t.name;
        EXPECT_LE(t.offset + t.n_bytes, g.size()) << t.name;
    }
}

TEST(GgufRealModel, AllSharedModelsOpen) {
    const std::string dir = test::shared_path("assets/models");
    VXQ_REQUIRE_PATH(dir);
    int n = 0;
    for (const auto& e : fs::directory_iterator(dir)) {
        if (e.path().extension() != ".gguf") continue;
        SCOPED_TRACE(e.path().string());
        const GgufFile g = GgufFile::open(e.path().string());
        EXPECT_FALSE(g.tensors().empty());
        EXPECT_TRUE(g.get_string("general.architecture").has_value());
        ++n;
    }
    EXPECT_GE(n, 1);
}

// Every type id ggml b4748 defines, with its block layout from ggml-common.h (written out here
// independently of the table in formats/ggml_types.cpp, so a wrong row there fails).
TEST(GgufTypes, OneTensorOfEveryGgmlTypeParsesWithItsByteSize) {
    struct Expect { uint32_t id; const char* name; int64_t block; size_t bytes; };
    const std::vector<Expect> types = {
        {0, "f32", 1, 4}, {1, "f16", 1, 2}, {2, "q4_0", 32, 18}, {3, "q4_1", 32, 20},
        {6, "q5_0", 32, 22}, {7, "q5_1", 32, 24}, {8, "q8_0", 32, 34}, {9, "q8_1", 32, 36},
        {10, "q2_K", 256, 84}, {11, "q3_K", 256, 110}, {12, "q4_K", 256, 144}, {13, "q5_K", 256, 176},
        {14, "q6_K", 256, 210}, {15, "q8_K", 256, 292}, {16, "iq2_xxs", 256, 66}, {17, "iq2_xs", 256, 74},
        {18, "iq3_xxs", 256, 98}, {19, "iq1_s", 256, 50}, {20, "iq4_nl", 32, 18}, {21, "iq3_s", 256, 110},
        {22, "iq2_s", 256, 82}, {23, "iq4_xs", 256, 136}, {24, "i8", 1, 1}, {25, "i16", 1, 2},
        {26, "i32", 1, 4}, {27, "i64", 1, 8}, {28, "f64", 1, 8}, {29, "iq1_m", 256, 56},
        {30, "bf16", 1, 2}, {34, "tq1_0", 256, 54}, {35, "tq2_0", 256, 66},
    };
    GgufWriter w;
    w.add_string("general.architecture", "llama");
    for (const Expect& e : types) {
        // Two rows of two blocks each: 4 blocks.
        const uint64_t cols = uint64_t(2 * e.block);
        w.add_tensor_raw({std::string("t.") + e.name, {cols, 2}, e.id, std::vector<uint8_t>(4 * e.bytes, 0x5a),
                          std::nullopt});
    }
    const std::vector<uint8_t> b = w.bytes();
    const GgufFile g = GgufFile::parse(b, "every_type.gguf");
    ASSERT_EQ(g.tensors().size(), types.size());
    std::set<uint32_t> defined;
    for (const Expect& e : types) {
        SCOPED_TRACE(e.name);
        defined.insert(e.id);
        const GgufTensorInfo* t = g.find_tensor(std::string("t.") + e.name);
        ASSERT_NE(t, nullptr);
        EXPECT_EQ(uint32_t(t->type), e.id);
        EXPECT_EQ(ggml_type_name(t->type), e.name);
        EXPECT_EQ(t->n_bytes, 4 * e.bytes);
        EXPECT_EQ(t->n_elements, 4 * e.block);
        EXPECT_EQ(ggml_row_bytes(t->type, 2 * e.block), 2 * e.bytes);
        for (size_t k = 0; k < t->n_bytes; ++k) ASSERT_EQ(g.tensor_data(*t)[k], 0x5a);
    }
    EXPECT_EQ(ggml_type_display_name(GgmlType::Q6_K), "Q6_K");
    // Every other id below 64 is undefined, and a file naming it fails with the tensor's name.
    for (uint32_t id = 0; id < 64; ++id) {
        EXPECT_EQ(ggml_type_traits(id).has_value(), defined.count(id) == 1) << id;
        if (defined.count(id)) continue;
        GgufWriter bad;
        bad.add_tensor_raw({"undefined", {32}, id, std::vector<uint8_t>(64), std::nullopt});
        const std::vector<uint8_t> bb = bad.bytes();
        try {
            (void)GgufFile::parse(bb, "bad.gguf");
            ADD_FAILURE() << "type id " << id << " parsed";
        } catch (const Error& err) {
            EXPECT_NE(std::string(err.what()).find(fmt::format("tensor 'undefined' has type id {}, which ggml does not define", id)),
                      std::string::npos) << err.what();
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Malformed inputs

// A small valid file the broken cases start from.
GgufWriter small_writer() {
    GgufWriter w;
    w.add_string("general.architecture", "llama");
    w.add_u32("llama.block_count", 1);
    w.add_array("tokenizer.ggml.tokens", std::vector<std::string>{"a", "bc"});
    w.add_tensor_f32("tok", {4, 2}, ramp(8));
    w.add_tensor_q8_0("q", {32}, ramp(32));
    return w;
}

std::vector<uint8_t> u64le(uint64_t v) {
    std::vector<uint8_t> b(8);
    std::memcpy(b.data(), &v, 8);
    return b;
}

std::vector<uint8_t> cat(std::initializer_list<std::vector<uint8_t>> parts) {
    std::vector<uint8_t> out;
    for (const auto& p : parts) out.insert(out.end(), p.begin(), p.end());
    return out;
}

std::vector<uint8_t> u32le(uint32_t v) {
    std::vector<uint8_t> b(4);
    std::memcpy(b.data(), &v, 4);
    return b;
}

std::vector<uint8_t> with_kv(const std::string& key, const GgufWriterValue& v) {
    GgufWriter w;
    w.add_u32("first", 1).add(key, v);
    return w.bytes();
}

std::vector<uint8_t> with_tensor(GgufWriter::RawTensor t) {
    GgufWriter w = small_writer();
    w.add_tensor_raw(std::move(t));
    return w.bytes();
}

struct BadCase {
    std::string name;
    std::function<std::vector<uint8_t>()> make;
    std::string fragment;
};

std::vector<BadCase> bad_cases() {
    const auto raw = [](VT t, std::vector<uint8_t> p) { return GgufWriterValue::raw(uint32_t(t), std::move(p)); };
    const auto f32_data = [](size_t n) { return std::vector<uint8_t>(n * 4, 0); };
    return {
        {"EmptyFile", [] { return std::vector<uint8_t>{}; }, "byte offset 0: truncated file: magic needs 4 bytes, 0 left"},
        {"TruncatedHeader", [] { auto b = small_writer().bytes(); b.resize(12); return b; },
         "byte offset 8: truncated file: tensor count needs 8 bytes, 4 left"},
        {"TruncatedKvCount", [] { auto b = small_writer().bytes(); b.resize(23); return b; },
         "truncated file: metadata count needs 8 bytes, 7 left"},
        {"WrongMagic", [] { return small_writer().set_magic(0x46554746).bytes(); }, "byte offset 4: bad magic"},
        {"GgmlMagic", [] { return std::vector<uint8_t>{'g', 'g', 'm', 'l', 0, 0, 0, 0}; }, "bad magic"},
        {"Version1", [] { return small_writer().set_version(1).bytes(); }, "unsupported GGUF version 1"},
        {"Version4", [] { return small_writer().set_version(4).bytes(); }, "unsupported GGUF version 4"},
        {"Version0", [] { return small_writer().set_version(0).bytes(); }, "unsupported GGUF version 0"},
        {"HugeTensorCount", [] { return small_writer().set_tensor_count(1ull << 40).bytes(); },
         "tensor count 1099511627776 exceeds the file"},
        {"MaxTensorCount", [] { return small_writer().set_tensor_count(~0ull).bytes(); },
         "tensor count 18446744073709551615 exceeds the file"},
        {"HugeKvCount", [] { return small_writer().set_kv_count(1ull << 40).bytes(); },
         "metadata count 1099511627776 exceeds the file"},
        {"MaxKvCount", [] { return small_writer().set_kv_count(~0ull).bytes(); },
         "metadata count 18446744073709551615 exceeds the file"},
        // The first tensor info then reads as a u16 key-value pair, and the tensor name length
        // as the rest of a dimension: 0x0002000000000000.
        {"KvCountOneTooMany", [] { return small_writer().set_kv_count(4).bytes(); },
         "tensor name has absurd length 562949953421312"},
        {"HugeKeyLength", [] { return GgufWriter().add_raw_kv(cat({u64le(1ull << 40), u64le(0), u64le(0)})).bytes(); },
         "metadata key has absurd length 1099511627776"},
        {"HugeStringValueLength", [=] { return with_kv("s", raw(VT::STRING, u64le(~0ull))); },
         "string value has absurd length 18446744073709551615"},
        {"KeyPastEnd", [] { return GgufWriter().add_raw_kv(cat({u64le(100), std::vector<uint8_t>(20, 'k')})).bytes(); },
         "truncated file: metadata key needs 100 bytes, 20 left"},
        {"StringValuePastEnd", [=] { return with_kv("s", raw(VT::STRING, cat({u64le(1000), {'a', 'b'}}))); },
         "truncated file: string value needs 1000 bytes, 2 left"},
        {"ArrayStringPastEnd",
         [=] { return with_kv("s", raw(VT::ARRAY, cat({u32le(8), u64le(1), u64le(50), {'x'}}))); },
         "truncated file: array string needs 50 bytes, 1 left"},
        {"EmptyKey", [] { return GgufWriter().add_u8("", 1).bytes(); }, "empty metadata key"},
        {"UnknownValueType13", [=] { return with_kv("k", raw(VT(13), u32le(0))); }, "metadata key 'k' has unknown value type 13"},
        {"UnknownValueTypeHuge", [=] { return with_kv("k", raw(VT(0xffffffff), u32le(0))); },
         "metadata key 'k' has unknown value type 4294967295"},
        {"UnknownArrayElementType", [=] { return with_kv("arr", raw(VT::ARRAY, cat({u32le(42), u64le(0)}))); },
         "metadata key 'arr' has unknown value type 42"},
        {"HugeArrayLength", [=] { return with_kv("arr", raw(VT::ARRAY, cat({u32le(4), u64le(1ull << 61)}))); },
         "metadata key 'arr': array of 2305843009213693952 elements does not fit in the file"},
        {"HugeStringArrayLength", [=] { return with_kv("arr", raw(VT::ARRAY, cat({u32le(8), u64le(~0ull)}))); },
         "array of 18446744073709551615 elements does not fit"},
        {"HugeArrayOfArraysLength", [=] { return with_kv("arr", raw(VT::ARRAY, cat({u32le(9), u64le(1ull << 60)}))); },
         "array of 1152921504606846976 elements does not fit"},
        {"ArrayPastEnd", [=] { return with_kv("arr", raw(VT::ARRAY, cat({u32le(5), u64le(3), u32le(1), u32le(2)}))); },
         "metadata key 'arr': array of 3 elements does not fit in the file"},
        {"BoolValue2", [=] { return with_kv("b", raw(VT::BOOL, {2})); }, "bool value 2 is neither 0 nor 1"},
        {"BoolValue255InArray", [=] { return with_kv("b", raw(VT::ARRAY, cat({u32le(7), u64le(2), {1, 255}}))); },
         "bool value 255 is neither 0 nor 1"},
        {"NestedArraysTooDeep", [] {
             GgufWriterValue v = GgufWriterValue::array_of(std::vector<uint8_t>{1});
             for (int i = 0; i < 4; ++i) v = GgufWriterValue::array(VT::ARRAY, {v});  // 5 levels
             return GgufWriter().add("deep", v).bytes();
         }, "metadata key 'deep': arrays nested too deep"},
        {"DuplicateKey", [] { return small_writer().add_u32("llama.block_count", 2).bytes(); },
         "duplicate metadata key 'llama.block_count'"},
        {"Alignment3", [] { return small_writer().add_u32("general.alignment", 3).bytes(); },
         "general.alignment must be a power of two integer"},
        {"Alignment0", [] { return small_writer().add_u64("general.alignment", 0).bytes(); },
         "general.alignment must be a power of two"},
        {"AlignmentTooLarge", [] { return small_writer().add_u32("general.alignment", 1u << 30).bytes(); },
         "general.alignment must be a power of two"},
        {"AlignmentNegative", [] { return small_writer().add_i32("general.alignment", -32).bytes(); },
         "general.alignment must be a power of two"},
        {"AlignmentString", [] { return small_writer().add_string("general.alignment", "32").bytes(); },
         "general.alignment must be a power of two"},
        {"ZeroDims", [] { return with_tensor({"z", {}, 0, {}, std::nullopt}); }, "tensor 'z' has 0 dimensions (1..4 allowed)"},
        {"FiveDims", [=] { return with_tensor({"five", {1, 1, 1, 1, 1}, 0, f32_data(1), std::nullopt}); },
         "tensor 'five' has 5 dimensions (1..4 allowed)"},
        {"HugeDimCount", [=] { return with_tensor({"many", std::vector<uint64_t>(1000, 1), 0, {}, std::nullopt}); },
         "tensor 'many' has 1000 dimensions"},
        {"DimensionZero", [=] { return with_tensor({"d0", {4, 0}, 0, {}, std::nullopt}); },
         "tensor 'd0' dimension 1 = 0 is zero or overflows"},
        {"DimsOverflowInt64", [=] { return with_tensor({"ov", {1ull << 32, 1ull << 32}, 0, {}, std::nullopt}); },
         "tensor 'ov' dimension 1 = 4294967296 is zero or overflows"},
        {"DimAboveInt64Max", [=] { return with_tensor({"big", {1ull << 63}, 0, {}, std::nullopt}); },
         "tensor 'big' dimension 0 = 9223372036854775808 is zero or overflows"},
        {"ByteSizeOverflows", [=] { return with_tensor({"wrap", {1ull << 62}, 0, {}, std::nullopt}); },
         "tensor 'wrap' of 4611686018427387904 f32 elements is too large"},
        {"ByteSizeOverflows4d", [=] { return with_tensor({"wrap4", {1ull << 16, 1ull << 16, 1ull << 16, 1ull << 14}, 0, {}, std::nullopt}); },
         "tensor 'wrap4' of 4611686018427387904 f32 elements is too large"},
        {"F16NearInt64Max", [=] { return with_tensor({"h", {(1ull << 63) - 1}, 1, {}, std::nullopt}); },
         "tensor 'h' (18446744073709551614 bytes at data offset 96) lies past the end of the file"},
        {"UnknownTensorType99", [=] { return with_tensor({"t99", {4}, 99, f32_data(4), std::nullopt}); },
         "tensor 't99' has type id 99, which ggml does not define"},
        {"RetiredTensorTypeQ4_2", [=] { return with_tensor({"q42", {32}, 4, std::vector<uint8_t>(20), std::nullopt}); },
         "tensor 'q42' has type id 4, which ggml does not define"},
        {"RetiredTensorTypeQ4_0_4_4", [=] { return with_tensor({"r31", {32}, 31, std::vector<uint8_t>(18), std::nullopt}); },
         "tensor 'r31' has type id 31, which ggml does not define"},
        {"TensorTypeCount39", [=] { return with_tensor({"t39", {32}, 39, std::vector<uint8_t>(18), std::nullopt}); },
         "tensor 't39' has type id 39, which ggml does not define"},
        {"Q6_KRowNotMultipleOfBlock", [=] { return with_tensor({"q6", {128}, 14, std::vector<uint8_t>(210), std::nullopt}); },
         "tensor 'q6' row of 128 elements is not a multiple of the q6_K block size 256"},
        {"Q8_0RowNotMultipleOfBlock", [=] { return with_tensor({"q8", {48, 2}, 8, std::vector<uint8_t>(34 * 3), std::nullopt}); },
         "tensor 'q8' row of 48 elements is not a multiple of the q8_0 block size 32"},
        {"Q4_0RowNotMultipleOfBlock", [=] { return with_tensor({"q4", {16}, 2, std::vector<uint8_t>(18), std::nullopt}); },
         "tensor 'q4' row of 16 elements is not a multiple of the q4_0 block size 32"},
        {"OffsetNotAligned", [=] { return with_tensor({"mis", {4}, 0, f32_data(4), 8}); },
         "tensor 'mis' offset 8 is not aligned to 32"},
        {"OffsetNotAlignedTo64", [=] {
             GgufWriter w = small_writer();
             w.set_alignment(64).add_tensor_raw({"mis64", {4}, 0, f32_data(4), 96});
             return w.bytes();
         }, "tensor 'mis64' offset 96 is not aligned to 64"},
        {"DuplicateTensorName", [=] { return with_tensor({"tok", {4}, 0, f32_data(4), std::nullopt}); },
         "duplicate tensor name 'tok'"},
        {"TensorDataPastEnd", [] { auto b = small_writer().bytes(); b.pop_back(); return b; },
         "tensor 'q' (34 bytes at data offset 32) lies past the end of the file (data section holds 65 bytes)"},
        {"TensorOffsetPastEnd", [=] { return with_tensor({"far", {4}, 0, f32_data(4), 1ull << 40}); },
         "tensor 'far' (16 bytes at data offset 1099511627776) lies past the end of the file"},
        {"TensorOffsetMaxAligned", [=] { return with_tensor({"max", {4}, 0, f32_data(4), ~0ull - 31}); },
         "lies past the end of the file"},
        {"TensorDataSectionMissing", [] {
             GgufWriter w = small_writer();
             GgufWriter::Layout lay;
             auto b = w.bytes(&lay);
             b.resize(lay.tensor_info_offsets.back() + 8 + 1 + 4 + 8 + 4 + 8);  // end of the last info
             if (b.size() % 32 == 0) throw std::logic_error("test setup: infos end aligned");
             return b;
         }, "truncated file: tensor data section is missing"},
    };
}

void PrintTo(const BadCase& c, std::ostream* os) { *os << c.name; }

class GgufBadInput : public ::testing::TestWithParam<BadCase> {};

TEST_P(GgufBadInput, ThrowsWithMessage) {
    const BadCase& c = GetParam();
    const std::vector<uint8_t> b = c.make();
    const std::string msg = error_of([&] { (void)GgufFile::parse(b, "bad.gguf"); });
    EXPECT_NE(msg.find(c.fragment), std::string::npos) << "expected fragment: " << c.fragment << "\nmessage: " << msg;
    EXPECT_NE(msg.find("bad.gguf: invalid GGUF"), std::string::npos) << "message: " << msg;

    // Same through open(): the mapped path must reject it the same way (an empty file has its
    // own message, checked in GgufOpen).
    if (!b.empty()) {
        TempFile tmp(c.name);
        {
            std::ofstream f(tmp.path(), std::ios::binary);
            f.write(reinterpret_cast<const char*>(b.data()), std::streamsize(b.size()));
        }
        const std::string msg2 = error_of([&] { (void)GgufFile::open(tmp.path()); });
        EXPECT_NE(msg2.find(c.fragment), std::string::npos) << "open(): " << msg2;
        EXPECT_NE(msg2.find(tmp.path()), std::string::npos) << "open(): " << msg2;
    }
}

INSTANTIATE_TEST_SUITE_P(Table, GgufBadInput, ::testing::ValuesIn(bad_cases()),
                         [](const ::testing::TestParamInfo<BadCase>& i) { return i.param.name; });

TEST(GgufBadInputTable, SmallWriterFileIsValid) {
    // The cases above are small edits of this file; it must itself be accepted.
    const GgufFile g = GgufFile::parse(small_writer().bytes());
    EXPECT_EQ(g.tensors().size(), 2u);
    EXPECT_EQ(g.metadata().size(), 3u);
}

TEST(GgufBadInputTable, EveryPrefixOfAValidFileThrows) {
    GgufWriter w;
    add_every_metadata_type(w);
    w.add_tensor_f32("a", {3, 2}, ramp(6));
    w.add_tensor_q4_0("b", {32}, ramp(32));
    w.add_tensor_f16("c", {5}, ramp(5));
    const std::vector<uint8_t> b = w.bytes();
    ASSERT_NO_THROW((void)GgufFile::parse(b));
    for (size_t n = 0; n < b.size(); ++n) {
        const std::string msg = error_of([&] { (void)GgufFile::parse(std::span(b.data(), n), "prefix"); });
        ASSERT_NE(msg.find("prefix: invalid GGUF"), std::string::npos) << "prefix of " << n << " bytes: " << msg;
    }
}

TEST(GgufBadInputTable, EverySingleByteCorruptionIsHandled) {
    // Flipping any one byte of the small file must either parse or throw vxq::Error, and a
    // parsed result must keep every tensor inside the file.
    const std::vector<uint8_t> good = small_writer().bytes();
    for (size_t i = 0; i < good.size(); ++i) {
        for (uint8_t x : {uint8_t(0x01), uint8_t(0x80), uint8_t(0xff)}) {
            std::vector<uint8_t> b = good;
            b[i] ^= x;
            try {
                const GgufFile g = GgufFile::parse(b);
                for (const auto& t : g.tensors()) {
                    ASSERT_GT(t.n_bytes, 0u);
                    ASSERT_LE(t.offset + t.n_bytes, g.size()) << "byte " << i;
                }
            } catch (const Error&) {
            }
        }
    }
}

}  // namespace
}  // namespace vxq

// ---------------------------------------------------------------------------------------------
// Fuzz seeds: built with the writer, checked to parse, and written to $VXQ_WRITE_FUZZ_CORPUS
// when that is set (how fuzz/corpus/ was made:
//   VXQ_WRITE_FUZZ_CORPUS=fuzz/corpus vxq_tests --gtest_filter=GgufFuzzSeeds.*).

namespace vxq {
namespace {

std::vector<std::pair<std::string, std::vector<uint8_t>>> fuzz_seeds() {
    std::vector<std::pair<std::string, std::vector<uint8_t>>> seeds;
    seeds.emplace_back("seed_empty_v3.gguf", GgufWriter().bytes());

    GgufWriter every;
    add_every_metadata_type(every);
    every.add_tensor_f32("f32", {3, 2}, ramp(6));
    every.add_tensor_f16("f16", {4}, ramp(4));
    every.add_tensor_bf16("bf16", {2, 1, 2}, ramp(4));
    every.add_tensor_q8_0("q8_0", {32}, ramp(32));
    every.add_tensor_q4_0("q4_0", {32, 1, 1, 1}, ramp(32));
    seeds.emplace_back("seed_every_type.gguf", every.bytes());

    GgufWriter v2(2);
    v2.set_alignment(64);
    v2.add("nested", GgufWriterValue::array(VT::ARRAY, {GgufWriterValue::array_of(std::vector<float>{1, 2}),
                                                        GgufWriterValue::array_of(std::vector<float>{})}));
    v2.add_tensor_f32("a", {2}, ramp(2)).add_tensor_f32("b", {1, 3}, ramp(3));
    v2.set_pad_end(true);
    seeds.emplace_back("seed_v2_align64.gguf", v2.bytes());

    GgufWriter llama;
    llama.add_string("general.architecture", "llama").add_string("general.name", "tiny");
    llama.add_u32("llama.context_length", 64).add_u32("llama.embedding_length", 32);
    llama.add_u32("llama.block_count", 1).add_u32("llama.attention.head_count", 2);
    llama.add_f32("llama.attention.layer_norm_rms_epsilon", 1e-5f).add_u32("general.file_type", 7);
    llama.add_string("tokenizer.ggml.model", "llama");
    llama.add_array("tokenizer.ggml.tokens", std::vector<std::string>{"<unk>", "<s>", "</s>", "\xe2\x96\x81" "a", "b"});
    llama.add_array("tokenizer.ggml.scores", std::vector<float>{0, 0, 0, -1, -2});
    llama.add_array("tokenizer.ggml.token_type", std::vector<int32_t>{2, 3, 3, 1, 1});
    llama.add_u32("tokenizer.ggml.bos_token_id", 1).add_bool("tokenizer.ggml.add_bos_token", true);
    llama.add_tensor_q8_0("token_embd.weight", {32, 5}, ramp(160));
    llama.add_tensor_f32("blk.0.attn_norm.weight", {32}, ramp(32));
    llama.add_tensor_q4_0("blk.0.attn_q.weight", {32, 32}, ramp(1024));
    llama.add_tensor_f16("output_norm.weight", {32}, ramp(32));
    seeds.emplace_back("seed_tiny_llama.gguf", llama.bytes());
    return seeds;
}

TEST(GgufFuzzSeeds, ParseAndOptionallyWrite) {
    const char* out = std::getenv("VXQ_WRITE_FUZZ_CORPUS");
    size_t total = 0;
    for (const auto& [name, bytes] : fuzz_seeds()) {
        SCOPED_TRACE(name);
        EXPECT_NO_THROW((void)GgufFile::parse(bytes, name));
        total += bytes.size();
        if (out) {
            std::ofstream f(fs::path(out) / name, std::ios::binary | std::ios::trunc);
            f.write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
            ASSERT_TRUE(f.good()) << "cannot write " << (fs::path(out) / name);
        }
    }
    EXPECT_LT(total, 16u * 1024u);  // fuzz/corpus stays small
}

}  // namespace
}  // namespace vxq
