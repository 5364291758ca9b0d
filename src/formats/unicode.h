// UTF-8 helpers shared by the tokenizers, and GPT-2's byte <-> unicode table (the byte-level BPE
// alphabet: each of the 256 byte values is spelled as one printable code point).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace vxq::utf8 {

// Length of the sequence a lead byte announces: 1 for ASCII, 2..4 for a lead byte, 1 for anything
// else (continuation or invalid byte), so that a loop over "characters" always advances.
inline size_t seq_len(uint8_t lead) {
    if (lead < 0x80) return 1;
    if ((lead & 0xE0) == 0xC0) return 2;
    if ((lead & 0xF0) == 0xE0) return 3;
    if ((lead & 0xF8) == 0xF0) return 4;
    return 1;
}

void append(std::string& out, uint32_t cp);

// Decodes the code point at s[pos] (s must be valid UTF-8), advancing pos.
uint32_t decode(std::string_view s, size_t& pos);

}  // namespace vxq::utf8

namespace vxq::byte_unicode {

// UTF-8 spelling of the code point GPT-2 uses for byte b.
const std::string& encode_byte(uint8_t b);

// Byte for a code point of the GPT-2 alphabet, or -1 when cp is not one of its 256 code points.
int decode_cp(uint32_t cp);

}  // namespace vxq::byte_unicode
