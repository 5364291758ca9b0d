#include "formats/unicode.h"

#include <algorithm>
#include <array>

#include "formats/tokenizer.h"

namespace vxq {

namespace utf8 {

void append(std::string& out, uint32_t cp) {
    if (cp < 0x80) {
        out.push_back(char(cp));
    } else if (cp < 0x800) {
        out.push_back(char(0xC0 | (cp >> 6)));
        out.push_back(char(0x80 | (cp & 0x3F)));
    } else if (cp < 0x10000) {
        out.push_back(char(0xE0 | (cp >> 12)));
        out.push_back(char(0x80 | ((cp >> 6) & 0x3F)));
        out.push_back(char(0x80 | (cp & 0x3F)));
    } else {
        out.push_back(char(0xF0 | (cp >> 18)));
        out.push_back(char(0x80 | ((cp >> 12) & 0x3F)));
        out.push_back(char(0x80 | ((cp >> 6) & 0x3F)));
        out.push_back(char(0x80 | (cp & 0x3F)));
    }
}

uint32_t decode(std::string_view s, size_t& pos) {
    const auto b = [&](size_t i) { return uint32_t(uint8_t(s[i])); };
    const uint32_t b0 = b(pos);
    const size_t n = std::min(seq_len(uint8_t(b0)), s.size() - pos);
    uint32_t cp;
    switch (n) {
        case 2: cp = ((b0 & 0x1F) << 6) | (b(pos + 1) & 0x3F); break;
        case 3: cp = ((b0 & 0x0F) << 12) | ((b(pos + 1) & 0x3F) << 6) | (b(pos + 2) & 0x3F); break;
        case 4:
            cp = ((b0 & 0x07) << 18) | ((b(pos + 1) & 0x3F) << 12) | ((b(pos + 2) & 0x3F) << 6) |
                 (b(pos + 3) & 0x3F);
            break;
        default: cp = b0; break;
    }
    pos += n;
    return cp;
}

}  // namespace utf8

namespace byte_unicode {
namespace {

// GPT-2's bytes_to_unicode(): printable Latin-1 bytes ('!'..'~', 0xA1..0xAC, 0xAE..0xFF) stand
// for themselves; the other 68 bytes are given U+0100, U+0101, ... in increasing byte order.
struct Table {
    std::array<uint32_t, 256> cp_of{};
    std::array<std::string, 256> utf8_of;
    std::array<int16_t, 324> byte_of{};  // indexed by code point, all of which are < 256 + 68
    Table() {
        byte_of.fill(-1);
        uint32_t next = 256;
        for (int b = 0; b < 256; ++b) {
            const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
            cp_of[b] = printable ? uint32_t(b) : next++;
            utf8::append(utf8_of[b], cp_of[b]);
            byte_of[cp_of[b]] = int16_t(b);
        }
    }
};

const Table& table() {
    static const Table t;
    return t;
}

}  // namespace

const std::string& encode_byte(uint8_t b) { return table().utf8_of[b]; }

int decode_cp(uint32_t cp) {
    const auto& t = table();
    return cp < t.byte_of.size() ? t.byte_of[cp] : -1;
}

}  // namespace byte_unicode

// Unicode Table 3-7 (well-formed UTF-8): the second byte's range depends on the lead byte, which
// is what rules out overlongs (E0 80..9F, F0 80..8F), surrogates (ED A0..BF) and code points above
// U+10FFFF (F4 90..BF, F5..FF). The offset returned is that of the lead byte of the ill-formed
// sequence (or of the stray byte itself).
int64_t find_invalid_utf8(std::string_view s) {
    const size_t n = s.size();
    size_t i = 0;
    while (i < n) {
        const uint8_t c = uint8_t(s[i]);
        if (c < 0x80) {
            ++i;
            continue;
        }
        size_t len;
        uint8_t lo = 0x80, hi = 0xBF;  // allowed range of the second byte
        if (c >= 0xC2 && c <= 0xDF) {
            len = 2;
        } else if (c >= 0xE0 && c <= 0xEF) {
            len = 3;
            if (c == 0xE0) lo = 0xA0;
            if (c == 0xED) hi = 0x9F;
        } else if (c >= 0xF0 && c <= 0xF4) {
            len = 4;
            if (c == 0xF0) lo = 0x90;
            if (c == 0xF4) hi = 0x8F;
        } else {
            return int64_t(i);  // continuation byte without a lead, C0/C1 (overlong), F5..FF
        }
        if (i + len > n) return int64_t(i);
        const uint8_t c1 = uint8_t(s[i + 1]);
        if (c1 < lo || c1 > hi) return int64_t(i);
        for (size_t k = 2; k < len; ++k) {
            if ((uint8_t(s[i + k]) & 0xC0) != 0x80) return int64_t(i);
        }
        i += len;
    }
    return -1;
}

std::string Utf8Stream::push(std::string_view piece) {
    pending_.append(piece);
    // Hold back the tail only when it is the unfinished start of a sequence: a lead byte within the
    // last 3 bytes whose announced length runs past the end. Anything else (complete or invalid)
    // goes out now, so a bad byte never blocks the stream.
    size_t keep_from = pending_.size();
    const size_t n = pending_.size();
    for (size_t back = 1; back <= 3 && back <= n; ++back) {
        const uint8_t c = uint8_t(pending_[n - back]);
        if ((c & 0xC0) == 0x80) continue;  // continuation: keep looking for its lead
        const size_t len = utf8::seq_len(c);
        if (len > back) keep_from = n - back;
        break;
    }
    std::string out = pending_.substr(0, keep_from);
    pending_.erase(0, keep_from);
    return out;
}

std::string Utf8Stream::finish() {
    std::string out;
    out.swap(pending_);
    return out;
}

}  // namespace vxq
