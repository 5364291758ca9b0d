// libFuzzer target for the tokenizers: random bytes as text through SentencePiece-style and
// byte-level BPE tokenizers (every pre-tokenizer), built from small hand-made vocabularies so the
// target needs no model file. The first input byte picks the tokenizer and the flags; the rest is
// the text. A vxq::Error is the expected answer to text that is not UTF-8 (and only to that); a
// crash, a sanitizer report, any other exception or a broken invariant (trap) is a finding.
//
// Invariants checked on every input:
//  - encode throws vxq::Error exactly when find_invalid_utf8(text) finds a bad byte;
//  - every id is inside the vocabulary, and BOS comes first when add_special asks for it;
//  - round trip: byte-level BPE decodes back to the text; SentencePiece (no special tokens in the
//    vocabulary) decodes to " " + text with U+2581 read as a space, as llama.cpp does;
//  - Utf8Stream, fed the pieces one by one, emits exactly decode(ids), each chunk valid UTF-8
//    when the whole is; fed the raw input in arbitrary slices, it gives the input back.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"
#include "formats/tokenizer.h"
#include "formats/unicode.h"

namespace {

void check(bool ok) {
    if (!ok) __builtin_trap();
}

constexpr std::string_view kSp = "\xE2\x96\x81";  // U+2581

std::string hex_byte_token(int b) {
    static const char* hex = "0123456789ABCDEF";
    return std::string("<0x") + hex[b >> 4] + hex[b & 15] + ">";
}

// <unk> <s> </s>, the 256 byte tokens, then pieces that make merges happen on ASCII and on
// multi-byte characters; with_specials adds a user-defined and a control token.
vxq::Vocab spm_vocab(bool with_specials) {
    vxq::Vocab v;
    v.model = "llama";
    auto add = [&](const std::string& text, float score, vxq::TokenType type) {
        v.tokens.push_back(text);
        v.scores.push_back(score);
        v.types.push_back(type);
    };
    add("<unk>", 0, vxq::TokenType::Unknown);
    add("<s>", 0, vxq::TokenType::Control);
    add("</s>", 0, vxq::TokenType::Control);
    for (int b = 0; b < 256; ++b) add(hex_byte_token(b), 0, vxq::TokenType::Byte);
    const std::string sp(kSp);
    const char* pieces[] = {"a", "e", "t", "h", "o", "l", "he", "ll", "the", "\xC3\xA9", "\xE6\x97\xA5", "\xE6\x97\xA5\xE6\x9C\xAC"};
    float score = -1.0f;
    for (const char* p : pieces) add(p, score -= 0.5f, vxq::TokenType::Normal);
    add(sp, -0.1f, vxq::TokenType::Normal);
    add(sp + "t", -2.0f, vxq::TokenType::Normal);
    add(sp + "the", -1.5f, vxq::TokenType::Normal);
    add(sp + "\xC3\xA9", -3.0f, vxq::TokenType::Normal);
    add(sp + sp, -4.0f, vxq::TokenType::Normal);
    if (with_specials) {
        add("<|user|>", 0, vxq::TokenType::UserDefined);
        add("<|ctl|>", 0, vxq::TokenType::Control);
    }
    v.unk = 0;
    v.bos = 1;
    v.eos = 2;
    v.add_eos = with_specials;
    return v;
}

// The 256 byte-level tokens (id = byte), merges over ASCII and a multi-byte character, and a
// control and a user-defined token.
vxq::Vocab bpe_vocab(const std::string& pre) {
    vxq::Vocab v;
    v.model = "gpt2";
    v.pre = pre;
    for (int b = 0; b < 256; ++b) v.tokens.push_back(vxq::byte_unicode::encode_byte(uint8_t(b)));
    const std::string G = vxq::byte_unicode::encode_byte(' ');
    const std::string e_acute = vxq::byte_unicode::encode_byte(0xC3) + vxq::byte_unicode::encode_byte(0xA9);
    const std::vector<std::pair<std::string, std::string>> merges = {
        {"t", "h"}, {"th", "e"}, {G, "t"}, {G + "t", "he"}, {"l", "l"}, {"e", "ll"}, {"1", "2"}, {"12", "3"},
        {vxq::byte_unicode::encode_byte(0xC3), vxq::byte_unicode::encode_byte(0xA9)}, {G, e_acute}, {G, G}};
    for (const auto& [l, r] : merges) {
        v.merges.push_back(l + " " + r);
        v.tokens.push_back(l + r);
    }
    v.types.assign(v.tokens.size(), vxq::TokenType::Normal);
    v.tokens.push_back("<|endoftext|>");
    v.types.push_back(vxq::TokenType::Control);
    v.tokens.push_back("<|user|>");
    v.types.push_back(vxq::TokenType::UserDefined);
    v.bos = v.eos = vxq::TokenId(v.tokens.size() - 2);
    v.add_bos = true;
    v.add_space_prefix = false;
    return v;
}

struct Tokenizers {
    std::vector<std::unique_ptr<vxq::Tokenizer>> all;  // [spm, spm with specials, bpe x pre-tokenizers]
    Tokenizers() {
        all.push_back(vxq::Tokenizer::create(spm_vocab(false)));
        all.push_back(vxq::Tokenizer::create(spm_vocab(true)));
        for (const char* pre : {"default", "gpt-2", "llama3", "qwen2"}) all.push_back(vxq::Tokenizer::create(bpe_vocab(pre)));
    }
};

const Tokenizers& tokenizers() {
    static const Tokenizers t;
    return t;
}

std::string replace_all(std::string s, std::string_view from, std::string_view to) {
    for (size_t pos = 0; (pos = s.find(from, pos)) != std::string::npos; pos += to.size()) s.replace(pos, from.size(), to);
    return s;
}

void check_stream(const vxq::Tokenizer& tok, const std::vector<vxq::TokenId>& ids) {
    const std::string whole = tok.decode(ids);
    const bool whole_valid = vxq::find_invalid_utf8(whole) < 0;
    vxq::Utf8Stream stream;
    std::string streamed;
    for (vxq::TokenId id : ids) {
        const std::string chunk = stream.push(tok.token_to_piece(id));
        if (whole_valid) check(vxq::find_invalid_utf8(chunk) < 0);
        streamed += chunk;
    }
    streamed += stream.finish();
    check(streamed == whole);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    if (size == 0) return 0;
    const Tokenizers& t = tokenizers();
    const uint8_t sel = data[0];
    const size_t which = sel % t.all.size();
    const bool add_special = (sel >> 3) & 1;
    const bool parse_special = (sel >> 4) & 1;
    const std::string_view text(reinterpret_cast<const char*>(data + 1), size - 1);
    const vxq::Tokenizer& tok = *t.all[which];

    // The stream on raw bytes, cut where the input's own bytes say.
    {
        vxq::Utf8Stream stream;
        std::string out;
        for (size_t pos = 0; pos < text.size();) {
            const size_t n = std::min<size_t>(1 + uint8_t(text[pos]) % 5, text.size() - pos);
            out += stream.push(text.substr(pos, n));
            pos += n;
        }
        out += stream.finish();
        check(out == text);
    }

    const bool valid = vxq::find_invalid_utf8(text) < 0;
    std::vector<vxq::TokenId> ids;
    try {
        ids = tok.encode(text, add_special, parse_special);
    } catch (const vxq::Error&) {
        check(!valid);
        return 0;
    }
    check(valid);
    for (vxq::TokenId id : ids) check(id >= 0 && id < tok.n_vocab());
    if (add_special && tok.vocab().add_bos) check(!ids.empty() && ids.front() == tok.vocab().bos);
    check_stream(tok, ids);

    if (!add_special && !parse_special) {
        const std::string back = tok.decode(ids);
        if (tok.vocab().model == "gpt2") {
            check(back == text);
        } else if (which == 0) {  // SentencePiece without special tokens
            check(back == (text.empty() ? std::string() : " " + replace_all(std::string(text), kSp, " ")));
        }
    }
    return 0;
}
