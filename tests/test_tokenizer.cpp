// Tokenizer tests: golden parity with llama.cpp (b4748) on the shared models, the SPM and BPE
// algorithms on hand-built vocabularies, the regex pre-tokenizers, UTF-8 validation and streaming,
// and GGUF metadata validation.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "formats/gguf.h"
#include "formats/tokenizer.h"
#include "support/assets.h"

namespace vxq {
namespace {

std::string hex_byte_token(int b) {
    static const char* hex = "0123456789ABCDEF";
    return std::string("<0x") + hex[b >> 4] + hex[b & 15] + ">";
}

// The message of the vxq::Error that f throws ("" and a test failure when it throws none).
template <typename F>
std::string error_of(F&& f) {
    try {
        f();
    } catch (const Error& e) {
        return e.what();
    }
    ADD_FAILURE() << "expected a vxq::Error";
    return {};
}

// ---------------------------------------------------------------------------------------------
// Golden parity with llama.cpp on the shared models

struct Shared {
    std::unique_ptr<Tokenizer> tok;
    nlohmann::json golden;
};

Shared load_shared(const std::string& model, const std::string& golden) {
    Shared s;
    std::ifstream in(test::shared_path("golden/" + golden));
    s.golden = nlohmann::json::parse(in);
    s.tok = Tokenizer::create(Vocab::from_gguf(GgufFile::open(test::shared_path("assets/models/" + model))));
    return s;
}

// Skips loudly (fails under CI=true) when the shared assets are not there.
#define LOAD_SHARED_OR_SKIP(var, model, golden)                                                 \
    VXQ_REQUIRE_ASSET(std::string("assets/models/") + (model));                                 \
    VXQ_REQUIRE_ASSET(std::string("golden/") + (golden));                                       \
    const Shared var = load_shared(model, golden)

void expect_golden_tokenize(const Shared& s) {
    ASSERT_TRUE(s.golden.contains("tokenize"));
    ASSERT_FALSE(s.golden["tokenize"].empty());
    for (const auto& entry : s.golden["tokenize"]) {
        const std::string text = entry["text"];
        const std::vector<TokenId> want = entry["ids_with_bos"];
        EXPECT_EQ(s.tok->encode(text, /*add_special=*/true), want) << "text: \"" << text << "\"";
    }
}

// llama.cpp's SPM pieces keep the space prefix: with BOS first (whose piece is ""),
// llama_detokenize does not strip it either, so the text comes back with one leading space.
void expect_round_trip(const Shared& s) {
    for (const auto& entry : s.golden["tokenize"]) {
        const std::string text = entry["text"];
        EXPECT_EQ(s.tok->decode(s.tok->encode(text, true)), " " + text);
    }
}

TEST(TokenizerGolden, Stories260KMatchesLlamaCpp) {
    LOAD_SHARED_OR_SKIP(s, "stories260K.gguf", "stories260K.llamacpp.json");
    expect_golden_tokenize(s);
}

TEST(TokenizerGolden, VxqLlamaH64MatchesLlamaCpp) {
    LOAD_SHARED_OR_SKIP(s, "vxq-llama-h64-f16.gguf", "vxq-llama-h64.llamacpp.json");
    expect_golden_tokenize(s);
}

TEST(TokenizerGolden, Stories260KRoundTrip) {
    LOAD_SHARED_OR_SKIP(s, "stories260K.gguf", "stories260K.llamacpp.json");
    expect_round_trip(s);
}

TEST(TokenizerGolden, VxqLlamaH64RoundTrip) {
    LOAD_SHARED_OR_SKIP(s, "vxq-llama-h64-f16.gguf", "vxq-llama-h64.llamacpp.json");
    expect_round_trip(s);
}

TEST(TokenizerGolden, Stories260KVocabMetadata) {
    LOAD_SHARED_OR_SKIP(s, "stories260K.gguf", "stories260K.llamacpp.json");
    const Vocab& v = s.tok->vocab();
    EXPECT_EQ(v.model, "llama");
    EXPECT_EQ(s.tok->n_vocab(), 512);
    EXPECT_EQ(v.bos, 1);
    EXPECT_EQ(v.eos, 2);
    EXPECT_EQ(v.unk, 0);
    EXPECT_EQ(v.pad, -1);  // written as 0xFFFFFFFF
    EXPECT_TRUE(v.add_bos);
    EXPECT_TRUE(v.add_space_prefix);
    EXPECT_TRUE(s.tok->is_eog(2));
    EXPECT_FALSE(s.tok->is_eog(1));
    // token_to_piece as llama.cpp with special = false.
    EXPECT_EQ(s.tok->token_to_piece(0), "");  // <unk>: unknown
    EXPECT_EQ(s.tok->token_to_piece(1), "");  // <s>: control
    EXPECT_EQ(s.tok->token_to_piece(2), "");  // </s>: control
    EXPECT_EQ(s.tok->token_to_piece(3), std::string(1, '\0'));  // <0x00>
    EXPECT_EQ(s.tok->token_to_piece(3 + 0x0A), "\n");
    EXPECT_EQ(v.tokens[265], "\xE2\x96\x81the");  // "▁the"
    EXPECT_EQ(s.tok->token_to_piece(265), " the");
    EXPECT_THROW(s.tok->token_to_piece(512), Error);
    EXPECT_THROW(s.tok->token_to_piece(-1), Error);
}

// "😀" is not in stories260K's vocabulary: byte fallback to <0xF0><0x9F><0x98><0x80>.
TEST(TokenizerGolden, Stories260KByteFallback) {
    LOAD_SHARED_OR_SKIP(s, "stories260K.gguf", "stories260K.llamacpp.json");
    const std::string emoji = "\xF0\x9F\x98\x80";
    const auto ids = s.tok->encode(emoji, /*add_special=*/false);
    ASSERT_EQ(ids.size(), 5u);
    EXPECT_EQ(s.tok->vocab().tokens[size_t(ids[0])], "\xE2\x96\x81");  // the space prefix
    const int bytes[] = {0xF0, 0x9F, 0x98, 0x80};
    for (int i = 0; i < 4; ++i) {
        EXPECT_EQ(s.tok->vocab().tokens[size_t(ids[size_t(i) + 1])], hex_byte_token(bytes[i]));
        EXPECT_EQ(s.tok->vocab().types[size_t(ids[size_t(i) + 1])], TokenType::Byte);
    }
    EXPECT_EQ(s.tok->decode(ids), " " + emoji);

    // Streamed piece by piece, the emoji comes out once, whole, on its last byte.
    Utf8Stream stream;
    std::vector<std::string> emitted;
    for (TokenId id : ids) emitted.push_back(stream.push(s.tok->token_to_piece(id)));
    EXPECT_EQ(stream.finish(), "");
    EXPECT_EQ(emitted, (std::vector<std::string>{" ", "", "", "", emoji}));
}

TEST(TokenizerGolden, Stories260KParseSpecial) {
    LOAD_SHARED_OR_SKIP(s, "stories260K.gguf", "stories260K.llamacpp.json");
    const Tokenizer& t = *s.tok;
    // parse_special: "<s>"/"</s>" become control tokens, and (as llama.cpp) the text after a
    // special token gets the space prefix again.
    std::vector<TokenId> want = {1};
    for (TokenId id : t.encode("Hi", false)) want.push_back(id);
    want.push_back(2);
    for (TokenId id : t.encode("there", false)) want.push_back(id);
    EXPECT_EQ(t.encode("<s>Hi</s>there", false, /*parse_special=*/true), want);
    // Without parse_special they are plain text.
    const auto plain = t.encode("<s>", false, false);
    EXPECT_EQ(std::count(plain.begin(), plain.end(), 1), 0);
    EXPECT_EQ(t.decode(plain), " <s>");
}

// ---------------------------------------------------------------------------------------------
// SPM on hand-built vocabularies

constexpr const char* kSp = "\xE2\x96\x81";  // "▁"

struct TokenSpec {
    std::string text;
    float score = 0.0f;
    TokenType type = TokenType::Normal;
};

// <unk> <s> </s>, the 256 byte tokens, then `extra`.
Vocab spm_vocab(const std::vector<TokenSpec>& extra) {
    Vocab v;
    v.model = "llama";
    v.tokens = {"<unk>", "<s>", "</s>"};
    v.types = {TokenType::Unknown, TokenType::Control, TokenType::Control};
    v.scores = {0, 0, 0};
    for (int b = 0; b < 256; ++b) {
        v.tokens.push_back(hex_byte_token(b));
        v.types.push_back(TokenType::Byte);
        v.scores.push_back(0);
    }
    for (const auto& t : extra) {
        v.tokens.push_back(t.text);
        v.types.push_back(t.type);
        v.scores.push_back(t.score);
    }
    v.unk = 0;
    v.bos = 1;
    v.eos = 2;
    return v;
}

TokenId id_of(const Tokenizer& t, const std::string& text) {
    const auto& toks = t.vocab().tokens;
    const auto it = std::find(toks.begin(), toks.end(), text);
    return it == toks.end() ? -1 : TokenId(it - toks.begin());
}

TEST(TokenizerSpm, MergesHighestScoreFirst) {
    const std::string sp = kSp;
    {
        auto t = Tokenizer::create(spm_vocab({{sp, -10}, {"a", -10}, {"b", -10}, {sp + "a", -1}, {"ab", -5}}));
        EXPECT_EQ(t->encode("ab", false), (std::vector<TokenId>{id_of(*t, sp + "a"), id_of(*t, "b")}));
    }
    {
        auto t = Tokenizer::create(spm_vocab({{sp, -10}, {"a", -10}, {"b", -10}, {sp + "a", -5}, {"ab", -1}}));
        EXPECT_EQ(t->encode("ab", false), (std::vector<TokenId>{id_of(*t, sp), id_of(*t, "ab")}));
    }
    {
        // Merges continue over merged symbols: ▁a + b -> ▁ab.
        auto t = Tokenizer::create(
            spm_vocab({{sp, -10}, {"a", -10}, {"b", -10}, {sp + "a", -1}, {sp + "ab", -2}}));
        EXPECT_EQ(t->encode("ab", false), (std::vector<TokenId>{id_of(*t, sp + "ab")}));
    }
}

TEST(TokenizerSpm, EqualScoresMergeLeftmostFirst) {
    Vocab v = spm_vocab({{"a", -10}, {"aa", -1}});
    v.add_space_prefix = false;
    auto t = Tokenizer::create(std::move(v));
    const TokenId a = id_of(*t, "a"), aa = id_of(*t, "aa");
    EXPECT_EQ(t->encode("aaa", false), (std::vector<TokenId>{aa, a}));
    EXPECT_EQ(t->encode("aaaaa", false), (std::vector<TokenId>{aa, aa, a}));
}

TEST(TokenizerSpm, SpacesAndBosEos) {
    Vocab v = spm_vocab({{kSp, -1}, {"a", -1}});
    v.add_eos = true;
    auto t = Tokenizer::create(std::move(v));
    const TokenId sp = id_of(*t, kSp), a = id_of(*t, "a");
    EXPECT_EQ(t->encode("a a", true), (std::vector<TokenId>{1, sp, a, sp, a, 2}));
    EXPECT_EQ(t->encode("", true), (std::vector<TokenId>{1, 2}));
    EXPECT_EQ(t->encode("", false), (std::vector<TokenId>{}));
    EXPECT_EQ(t->decode(t->encode("a a", true)), " a a");
}

TEST(TokenizerSpm, ByteFallbackAndUnknown) {
    auto t = Tokenizer::create(spm_vocab({{kSp, -1}}));
    // "é" = C3 A9 is not a token: two byte tokens.
    EXPECT_EQ(t->encode("\xC3\xA9", false),
              (std::vector<TokenId>{id_of(*t, kSp), 3 + 0xC3, 3 + 0xA9}));
    EXPECT_EQ(t->decode(t->encode("\xC3\xA9", false)), " \xC3\xA9");

    // Without byte tokens, llama.cpp's next choice is the byte as a one-byte token, then (here,
    // where llama.cpp would abort) the unknown token.
    Vocab v;
    v.model = "llama";
    v.tokens = {"<unk>", kSp, "x"};
    v.types = {TokenType::Unknown, TokenType::Normal, TokenType::Normal};
    v.unk = 0;
    v.add_bos = false;
    auto u = Tokenizer::create(std::move(v));
    EXPECT_EQ(u->encode("xy", true), (std::vector<TokenId>{1, 2, 0}));
    EXPECT_EQ(u->decode(std::vector<TokenId>{1, 2, 0}), " x");  // unknown's piece is ""
}

TEST(TokenizerSpm, TokenToPieceByType) {
    auto t = Tokenizer::create(spm_vocab({{std::string(kSp) + "hi" + kSp, -1},
                                          {std::string("<tag>") + kSp, 0, TokenType::UserDefined},
                                          {"unused", 0, TokenType::Unused}}));
    EXPECT_EQ(t->token_to_piece(id_of(*t, std::string(kSp) + "hi" + kSp)), " hi ");
    EXPECT_EQ(t->token_to_piece(id_of(*t, std::string("<tag>") + kSp)), std::string("<tag>") + kSp);
    EXPECT_EQ(t->token_to_piece(id_of(*t, "unused")), "");
    EXPECT_EQ(t->token_to_piece(0), "");
    EXPECT_EQ(t->token_to_piece(1), "");
    EXPECT_EQ(t->token_to_piece(3 + 0xFF), "\xFF");
}

TEST(TokenizerSpm, UserDefinedTokensAlwaysSplitControlOnlyWhenAsked) {
    auto t = Tokenizer::create(spm_vocab({{kSp, -1}, {"x", -1}, {"y", -1}, {"<tag>", 0, TokenType::UserDefined}}));
    const TokenId sp = id_of(*t, kSp), x = id_of(*t, "x"), y = id_of(*t, "y"), tag = id_of(*t, "<tag>");
    // User-defined: split out even without parse_special; the text after it gets a space prefix.
    EXPECT_EQ(t->encode("x<tag>y", false, false), (std::vector<TokenId>{sp, x, tag, sp, y}));
    EXPECT_EQ(t->encode("<tag><tag>", false, false), (std::vector<TokenId>{tag, tag}));
    // Control "</s>": only with parse_special.
    EXPECT_EQ(t->encode("x</s>", false, true), (std::vector<TokenId>{sp, x, 2}));
    const auto plain = t->encode("x</s>", false, false);
    EXPECT_EQ(std::count(plain.begin(), plain.end(), 2), 0);
    EXPECT_EQ(t->decode(plain), " x</s>");
}

// ---------------------------------------------------------------------------------------------
// Byte-level BPE on a hand-built vocabulary

// GPT-2's bytes_to_unicode(), written out independently of the library as the test oracle.
std::string gpt2_char(int byte) {
    std::vector<int> printable;
    for (int b = 0; b < 256; ++b) {
        if ((b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF)) {
            printable.push_back(b);
        }
    }
    int cp = byte;
    if (std::find(printable.begin(), printable.end(), byte) == printable.end()) {
        int n = 0;
        for (int b = 0; b < byte; ++b) {
            if (std::find(printable.begin(), printable.end(), b) == printable.end()) ++n;
        }
        cp = 256 + n;
    }
    std::string s;
    if (cp < 0x80) {
        s += char(cp);
    } else {
        s += char(0xC0 | (cp >> 6));
        s += char(0x80 | (cp & 0x3F));
    }
    return s;
}

const std::string G = gpt2_char(' ');  // "Ġ"

// The 256 single-byte tokens (id = byte), then `extra`, with `merges` in rank order.
Vocab bpe_vocab(std::string pre, const std::vector<std::string>& extra,
                const std::vector<std::string>& merges) {
    Vocab v;
    v.model = "gpt2";
    v.pre = std::move(pre);
    for (int b = 0; b < 256; ++b) v.tokens.push_back(gpt2_char(b));
    for (const auto& t : extra) v.tokens.push_back(t);
    v.merges = merges;
    v.add_bos = false;
    v.add_space_prefix = false;
    return v;
}

TEST(TokenizerBpe, ByteAlphabetOracle) {
    EXPECT_EQ(G, "\xC4\xA0");            // U+0120 "Ġ"
    EXPECT_EQ(gpt2_char('\n'), "\xC4\x8A");  // U+010A "Ċ"
    EXPECT_EQ(gpt2_char('a'), "a");
    EXPECT_EQ(gpt2_char(0xAD), "\xC5\x83");  // soft hyphen: the 68th remapped byte, U+0143
}

TEST(TokenizerBpe, MergesApplyByRank) {
    const std::vector<std::string> merges = {"l l", "h e", "e l", "he ll", G + " w", "o r",
                                             G + "w or", "l d", G + "wor ld"};
    auto t = Tokenizer::create(bpe_vocab(
        "gpt-2", {"ll", "he", "el", "hell", G + "w", "or", G + "wor", "ld", G + "world"}, merges));
    const auto id = [&](const std::string& s) { return id_of(*t, s); };
    // "ell": "l l" (rank 0) beats "e l" (rank 2) although "e l" is further left.
    EXPECT_EQ(t->encode("ell", false), (std::vector<TokenId>{'e', id("ll")}));
    // "hello": l+l, then h+e, then he+ll; "e l" is stale by then.
    EXPECT_EQ(t->encode("hello", false), (std::vector<TokenId>{id("hell"), 'o'}));
    // " world": Ġ+w (4), o+r (5), Ġw+or (6) before l+d (7), then Ġwor+ld (8).
    EXPECT_EQ(t->encode("hello world", false), (std::vector<TokenId>{id("hell"), 'o', id(G + "world")}));
    EXPECT_EQ(t->decode(t->encode("hello world", false)), "hello world");
    // Merges never cross pre-tokenizer pieces: "l" and "d" of "l.d" stay apart.
    EXPECT_EQ(t->encode("l.d", false), (std::vector<TokenId>{'l', '.', 'd'}));
}

TEST(TokenizerBpe, BytesRoundTrip) {
    auto t = Tokenizer::create(bpe_vocab("gpt-2", {}, {}));
    const std::string text = "caf\xC3\xA9 \xF0\x9F\x98\x80\n\ttab";
    const auto ids = t->encode(text, false);
    EXPECT_EQ(ids.size(), text.size());  // no merges: one token per byte
    for (size_t i = 0; i < ids.size(); ++i) EXPECT_EQ(ids[i], TokenId(uint8_t(text[i])));
    EXPECT_EQ(t->decode(ids), text);
    for (int b = 0; b < 256; ++b) EXPECT_EQ(t->token_to_piece(b), std::string(1, char(b)));
}

TEST(TokenizerBpe, SpecialTokensAndBos) {
    Vocab v = bpe_vocab("gpt-2", {"<|endoftext|>"}, {});
    v.types.assign(v.tokens.size(), TokenType::Normal);
    v.types.back() = TokenType::Control;
    v.bos = v.eos = 256;
    v.add_bos = true;
    auto t = Tokenizer::create(std::move(v));
    EXPECT_EQ(t->encode("hi<|endoftext|>", true, true), (std::vector<TokenId>{256, 'h', 'i', 256}));
    const auto plain = t->encode("<|endoftext|>", false, false);
    EXPECT_EQ(plain.size(), std::strlen("<|endoftext|>"));
    EXPECT_EQ(t->token_to_piece(256), "");
    EXPECT_TRUE(t->is_eog(256));
}

TEST(TokenizerBpe, Llama3UsesWholeWordTokensWithoutMerges) {
    // llama.cpp sets ignore_merges for Llama-3: a piece that is a token is taken as is.
    auto l3 = Tokenizer::create(bpe_vocab("llama3", {G + "world"}, {}));
    EXPECT_EQ(l3->encode(" world", false), (std::vector<TokenId>{256}));
    auto g2 = Tokenizer::create(bpe_vocab("gpt-2", {G + "world"}, {}));
    EXPECT_EQ(g2->encode(" world", false).size(), 6u);
}

using Pieces = std::vector<std::string>;

TEST(TokenizerBpe, PreTokenizerSplits) {
    const std::string text = "Hello world's 12345";
    EXPECT_EQ(detail::bpe_pre_tokenize("llama3", text),
              (Pieces{"Hello", " world", "'s", " ", "123", "45"}));
    EXPECT_EQ(detail::bpe_pre_tokenize("llama-bpe", text),
              (Pieces{"Hello", " world", "'s", " ", "123", "45"}));
    EXPECT_EQ(detail::bpe_pre_tokenize("gpt-2", text), (Pieces{"Hello", " world", "'s", " 12345"}));
    EXPECT_EQ(detail::bpe_pre_tokenize("qwen2", text),
              (Pieces{"Hello", " world", "'s", " ", "1", "2", "3", "4", "5"}));
    // llama.cpp's "default" runs four regexes in turn: punctuation runs, GPT-2, digit runs,
    // ASCII digit triples; so "'" is cut off before GPT-2 can see "'s".
    EXPECT_EQ(detail::bpe_pre_tokenize("default", text),
              (Pieces{"Hello", " world", "'", "s", " ", "123", "45"}));
}

TEST(TokenizerBpe, PreTokenizerWhitespaceAndCase) {
    // \s+(?!\S) leaves the last space for the next word; newlines.
    EXPECT_EQ(detail::bpe_pre_tokenize("gpt-2", "a  b\n\nc"), (Pieces{"a", " ", " b", "\n", "\n", "c"}));
    EXPECT_EQ(detail::bpe_pre_tokenize("llama3", "a  b\n\nc"), (Pieces{"a", " ", " b", "\n\n", "c"}));
    EXPECT_EQ(detail::bpe_pre_tokenize("llama3", "x  \n y"), (Pieces{"x", "  \n", " y"}));
    EXPECT_EQ(detail::bpe_pre_tokenize("llama3", "end  "), (Pieces{"end", "  "}));
    // Contractions: Llama-3 and Qwen2 are case-insensitive, GPT-2 is not.
    EXPECT_EQ(detail::bpe_pre_tokenize("llama3", "IT'S"), (Pieces{"IT", "'S"}));
    EXPECT_EQ(detail::bpe_pre_tokenize("qwen2", "IT'S"), (Pieces{"IT", "'S"}));
    EXPECT_EQ(detail::bpe_pre_tokenize("gpt-2", "IT'S"), (Pieces{"IT", "'", "S"}));
    // Llama-3: one non-letter may lead a word; punctuation takes trailing newlines.
    EXPECT_EQ(detail::bpe_pre_tokenize("llama3", "(hi)!!\n\nok"), (Pieces{"(hi", ")!!\n\n", "ok"}));
    // Unicode letters and numbers (PCRE2_UCP).
    EXPECT_EQ(detail::bpe_pre_tokenize("gpt-2", "caf\xC3\xA9 \xD9\xA3\xD9\xA4"),
              (Pieces{"caf\xC3\xA9", " \xD9\xA3\xD9\xA4"}));  // Arabic-Indic digits 3 4
    EXPECT_EQ(detail::bpe_pre_tokenize("gpt-2", ""), (Pieces{}));
}

TEST(TokenizerBpe, UnknownPreTokenizerIsAnError) {
    const std::string msg = error_of([] { Tokenizer::create(bpe_vocab("no-such-pre", {}, {})); });
    EXPECT_NE(msg.find("no-such-pre"), std::string::npos) << msg;
    EXPECT_NE(msg.find("tokenizer.ggml.pre"), std::string::npos) << msg;
    EXPECT_THROW(detail::bpe_pre_tokenize("no-such-pre", "x"), Error);
}

TEST(TokenizerCreate, UnknownModelIsAnError) {
    Vocab v = spm_vocab({});
    v.model = "bert";
    const std::string msg = error_of([&] { Tokenizer::create(v); });
    EXPECT_NE(msg.find("bert"), std::string::npos) << msg;
}

TEST(TokenizerCreate, RejectsInconsistentVocab) {
    {
        Vocab v = spm_vocab({});
        v.scores.pop_back();
        EXPECT_THROW(Tokenizer::create(v), Error);
    }
    {
        Vocab v = spm_vocab({});
        v.types.push_back(TokenType::Normal);
        EXPECT_THROW(Tokenizer::create(v), Error);
    }
    {
        Vocab v = spm_vocab({});
        v.bos = TokenId(v.tokens.size());
        EXPECT_NE(error_of([&] { Tokenizer::create(v); }).find("bos_token_id"), std::string::npos);
    }
    {
        Vocab v = spm_vocab({{"dup"}, {"dup"}});
        EXPECT_NE(error_of([&] { Tokenizer::create(v); }).find("dup"), std::string::npos);
    }
    {
        Vocab v = spm_vocab({});
        v.tokens.clear();
        v.types.clear();
        v.scores.clear();
        EXPECT_THROW(Tokenizer::create(v), Error);
    }
    {
        Vocab v = spm_vocab({});
        v.bos = -1;
        auto t = Tokenizer::create(v);
        EXPECT_THROW(t->encode("x", /*add_special=*/true), Error);  // add_bos without a BOS token
        EXPECT_NO_THROW(t->encode("x", false));
    }
}

// ---------------------------------------------------------------------------------------------
// UTF-8 validation and streaming

struct BadUtf8 {
    const char* what;
    std::string bytes;
    int64_t offset;
};

const BadUtf8 kBadUtf8[] = {
    {"lone continuation byte", std::string("ab\x80") + "cd", 2},
    {"truncated 3-byte sequence at the end", "a\xE2\x82", 1},
    {"truncated 3-byte sequence before ASCII", "\xE2\x82z", 0},
    {"overlong 2-byte '/'", "x\xC0\xAF", 1},
    {"overlong 3-byte '/'", "\xE0\x80\xAF", 0},
    {"UTF-16 surrogate U+D800", "ok\xED\xA0\x80", 2},
    {"above U+10FFFF", "\xF4\x90\x80\x80", 0},
    {"0xFF", "abc\xFF", 3},
    {"F5 lead byte", "\xF5\x80\x80\x80", 0},
    {"truncated 4-byte emoji", "hi \xF0\x9F\x98", 3},
};

TEST(Utf8Validation, FindsFirstBadByte) {
    for (const auto& c : kBadUtf8) EXPECT_EQ(find_invalid_utf8(c.bytes), c.offset) << c.what;
    const std::string valid[] = {"", "plain ascii\x7F", "caf\xC3\xA9 \xC3\xBC \xF0\x9F\x98\x80",
                                 "\xC2\x80", "\xED\x9F\xBF" /* U+D7FF */, "\xEE\x80\x80" /* U+E000 */,
                                 "\xEF\xBF\xBF", "\xF0\x90\x80\x80", "\xF4\x8F\xBF\xBF" /* U+10FFFF */};
    for (const auto& s : valid) EXPECT_EQ(find_invalid_utf8(s), -1) << s;
}

TEST(Utf8Validation, EncodeRejectsInvalidUtf8NamingTheOffset) {
    auto spm = Tokenizer::create(spm_vocab({{kSp, -1}}));
    auto bpe = Tokenizer::create(bpe_vocab("llama3", {}, {}));
    for (const auto& c : kBadUtf8) {
        for (const Tokenizer* t : {spm.get(), bpe.get()}) {
            const std::string msg = error_of([&] { t->encode(c.bytes, true); });
            EXPECT_NE(msg.find("offset " + std::to_string(c.offset)), std::string::npos)
                << c.what << ": " << msg;
        }
    }
}

TEST(Utf8Stream, HoldsBackIncompleteSequences) {
    Utf8Stream s;
    EXPECT_EQ(s.push("a\xE2"), "a");
    EXPECT_EQ(s.push("\x82"), "");
    EXPECT_EQ(s.push("\xAC b"), "\xE2\x82\xAC b");
    EXPECT_EQ(s.push(""), "");
    EXPECT_EQ(s.push("\xF0\x9F"), "");
    EXPECT_EQ(s.push("\x98"), "");
    EXPECT_EQ(s.push("\x80\xC3"), "\xF0\x9F\x98\x80");
    EXPECT_EQ(s.push("\xA9!"), "\xC3\xA9!");
    EXPECT_EQ(s.finish(), "");
    // An unfinished sequence at the end of output comes out of finish().
    EXPECT_EQ(s.push("x\xE2\x82"), "x");
    EXPECT_EQ(s.finish(), "\xE2\x82");
    EXPECT_EQ(s.finish(), "");
    // Bytes that can never complete are not held back.
    EXPECT_EQ(s.push("\x80"), "\x80");
    EXPECT_EQ(s.push("\xFF"), "\xFF");
}

// ---------------------------------------------------------------------------------------------
// Vocab::from_gguf

// Writes a GGUF v3 file with metadata only.
class GgufBuilder {
public:
    void str(const std::string& key, const std::string& v) {
        head(key, GgufValueType::STRING);
        put_str(v);
    }
    void u32(const std::string& key, uint32_t v) {
        head(key, GgufValueType::UINT32);
        put(v);
    }
    void boolean(const std::string& key, bool v) {
        head(key, GgufValueType::BOOL);
        put(uint8_t(v));
    }
    void strs(const std::string& key, const std::vector<std::string>& v) {
        head(key, GgufValueType::ARRAY);
        put(uint32_t(GgufValueType::STRING));
        put(uint64_t(v.size()));
        for (const auto& s : v) put_str(s);
    }
    void f32s(const std::string& key, const std::vector<float>& v) {
        head(key, GgufValueType::ARRAY);
        put(uint32_t(GgufValueType::FLOAT32));
        put(uint64_t(v.size()));
        for (float f : v) put(f);
    }
    void i32s(const std::string& key, const std::vector<int32_t>& v) {
        head(key, GgufValueType::ARRAY);
        put(uint32_t(GgufValueType::INT32));
        put(uint64_t(v.size()));
        for (int32_t x : v) put(x);
    }
    GgufFile file() const {
        std::vector<uint8_t> out;
        const auto app = [&](const void* p, size_t n) {
            out.insert(out.end(), static_cast<const uint8_t*>(p), static_cast<const uint8_t*>(p) + n);
        };
        app("GGUF", 4);
        const uint32_t version = 3;
        const uint64_t n_tensors = 0;
        app(&version, 4);
        app(&n_tensors, 8);
        app(&n_kv_, 8);
        app(kv_.data(), kv_.size());
        return GgufFile::parse(out, "test.gguf");
    }

private:
    template <typename T>
    void put(T v) {
        const auto* p = reinterpret_cast<const uint8_t*>(&v);
        kv_.insert(kv_.end(), p, p + sizeof v);
    }
    void put_str(const std::string& s) {
        put(uint64_t(s.size()));
        kv_.insert(kv_.end(), s.begin(), s.end());
    }
    void head(const std::string& key, GgufValueType t) {
        put_str(key);
        put(uint32_t(t));
        ++n_kv_;
    }
    std::vector<uint8_t> kv_;
    uint64_t n_kv_ = 0;
};

const std::vector<std::string> kSmallTokens = {"<unk>", "<s>", "</s>", "\xE2\x96\x81" "a", "a"};

GgufBuilder llama_gguf() {
    GgufBuilder b;
    b.str("tokenizer.ggml.model", "llama");
    b.strs("tokenizer.ggml.tokens", kSmallTokens);
    b.f32s("tokenizer.ggml.scores", {0, 0, 0, -1, -2});
    b.i32s("tokenizer.ggml.token_type", {2, 3, 3, 1, 1});
    b.u32("tokenizer.ggml.bos_token_id", 1);
    b.u32("tokenizer.ggml.eos_token_id", 2);
    b.u32("tokenizer.ggml.unknown_token_id", 0);
    b.u32("tokenizer.ggml.padding_token_id", 0xFFFFFFFFu);
    return b;
}

TEST(VocabFromGguf, ReadsLlamaTokenizer) {
    const GgufFile f = llama_gguf().file();
    const Vocab v = Vocab::from_gguf(f);
    EXPECT_EQ(v.model, "llama");
    EXPECT_EQ(v.pre, "default");
    EXPECT_EQ(v.tokens, kSmallTokens);
    EXPECT_EQ(v.scores, (std::vector<float>{0, 0, 0, -1, -2}));
    EXPECT_EQ(v.types, (std::vector<TokenType>{TokenType::Unknown, TokenType::Control, TokenType::Control,
                                               TokenType::Normal, TokenType::Normal}));
    EXPECT_EQ(v.bos, 1);
    EXPECT_EQ(v.eos, 2);
    EXPECT_EQ(v.unk, 0);
    EXPECT_EQ(v.pad, -1);
    EXPECT_EQ(v.eot, -1);
    EXPECT_TRUE(v.add_bos);
    EXPECT_FALSE(v.add_eos);
    EXPECT_TRUE(v.add_space_prefix);
    auto t = Tokenizer::create(v);
    EXPECT_EQ(t->encode("a", true), (std::vector<TokenId>{1, 3}));
}

TEST(VocabFromGguf, FlagsOverrideDefaults) {
    GgufBuilder b = llama_gguf();
    b.boolean("tokenizer.ggml.add_bos_token", false);
    b.boolean("tokenizer.ggml.add_eos_token", true);
    b.boolean("tokenizer.ggml.add_space_prefix", false);
    const Vocab v = Vocab::from_gguf(b.file());
    EXPECT_FALSE(v.add_bos);
    EXPECT_TRUE(v.add_eos);
    EXPECT_FALSE(v.add_space_prefix);
    EXPECT_EQ(Tokenizer::create(v)->encode("a", true), (std::vector<TokenId>{4, 2}));
}

TEST(VocabFromGguf, Gpt2Defaults) {
    GgufBuilder b;
    b.str("tokenizer.ggml.model", "gpt2");
    b.str("tokenizer.ggml.pre", "llama-bpe");
    b.strs("tokenizer.ggml.tokens", {"a", "b", "ab", "<|eot_id|>"});
    b.strs("tokenizer.ggml.merges", {"a b"});
    b.u32("tokenizer.ggml.bos_token_id", 0);
    Vocab v = Vocab::from_gguf(b.file());
    EXPECT_EQ(v.pre, "llama-bpe");
    EXPECT_TRUE(v.add_bos);  // the Llama-3 family adds BOS
    EXPECT_FALSE(v.add_space_prefix);
    EXPECT_EQ(v.merges, (std::vector<std::string>{"a b"}));
    EXPECT_EQ(v.eot, 3);  // found by its text, as llama.cpp does
    auto t = Tokenizer::create(v);
    EXPECT_EQ(t->encode("ab", true), (std::vector<TokenId>{0, 2}));
    EXPECT_TRUE(t->is_eog(3));

    GgufBuilder c;
    c.str("tokenizer.ggml.model", "gpt2");
    c.strs("tokenizer.ggml.tokens", {"a"});
    c.strs("tokenizer.ggml.merges", {});
    v = Vocab::from_gguf(c.file());
    EXPECT_EQ(v.pre, "default");
    EXPECT_FALSE(v.add_bos);
}

TEST(VocabFromGguf, RejectsBadMetadataNamingTheKey) {
    const auto expect_key = [](GgufBuilder b, const std::string& key) {
        const GgufFile f = b.file();
        const std::string msg = error_of([&] { Vocab::from_gguf(f); });
        EXPECT_NE(msg.find(key), std::string::npos) << msg;
    };
    {
        GgufBuilder b;
        b.strs("tokenizer.ggml.tokens", kSmallTokens);
        expect_key(b, "tokenizer.ggml.model");
    }
    {
        GgufBuilder b;
        b.str("tokenizer.ggml.model", "llama");
        expect_key(b, "tokenizer.ggml.tokens");
    }
    {
        GgufBuilder b;
        b.str("tokenizer.ggml.model", "llama");
        b.strs("tokenizer.ggml.tokens", kSmallTokens);
        b.f32s("tokenizer.ggml.scores", {0, 0});
        expect_key(b, "tokenizer.ggml.scores");
    }
    {
        GgufBuilder b;
        b.str("tokenizer.ggml.model", "llama");
        b.strs("tokenizer.ggml.tokens", kSmallTokens);
        b.i32s("tokenizer.ggml.token_type", {1, 1, 1, 1, 1, 1});
        expect_key(b, "tokenizer.ggml.token_type");
    }
    {
        GgufBuilder b;
        b.str("tokenizer.ggml.model", "llama");
        b.strs("tokenizer.ggml.tokens", kSmallTokens);
        b.u32("tokenizer.ggml.eos_token_id", 5);
        expect_key(b, "tokenizer.ggml.eos_token_id");
    }
    {
        GgufBuilder b;
        b.str("tokenizer.ggml.model", "llama");
        b.i32s("tokenizer.ggml.tokens", {1, 2});
        expect_key(b, "tokenizer.ggml.tokens");
    }
    {
        GgufBuilder b;
        b.str("tokenizer.ggml.model", "llama");
        b.strs("tokenizer.ggml.tokens", kSmallTokens);
        b.strs("tokenizer.ggml.scores", {"x"});
        expect_key(b, "tokenizer.ggml.scores");
    }
    {
        GgufBuilder b;
        b.str("tokenizer.ggml.model", "gpt2");
        b.strs("tokenizer.ggml.tokens", kSmallTokens);
        expect_key(b, "tokenizer.ggml.merges");
    }
    {
        GgufBuilder b = llama_gguf();
        b.u32("tokenizer.ggml.add_bos_token", 1);  // not a bool
        expect_key(b, "tokenizer.ggml.add_bos_token");
    }
}

}  // namespace
}  // namespace vxq
