#include "tokenizer/unicode.h"

#include <array>

namespace specdec {
namespace {

constexpr std::string_view kReplacementChar = "\xEF\xBF\xBD";  // U+FFFD

struct ByteLevelTables {
  std::array<std::string, 256> byte_to_text;  // byte -> UTF-8 of its code point
  std::array<int16_t, 512> cp_to_byte;        // code point (< 512) -> byte, or -1

  ByteLevelTables() {
    cp_to_byte.fill(-1);
    uint32_t next_extra = 256;
    for (uint32_t b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
      const uint32_t cp = printable ? b : next_extra++;
      append_utf8(cp, &byte_to_text[b]);
      cp_to_byte[cp] = static_cast<int16_t>(b);
    }
  }
};

const ByteLevelTables& byte_level_tables() {
  static const ByteLevelTables tables;
  return tables;
}

}  // namespace

void append_utf8(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

const std::string& byte_to_unicode(uint8_t byte) {
  return byte_level_tables().byte_to_text[byte];
}

int unicode_to_byte(uint32_t cp) {
  if (cp >= 512) return -1;
  return byte_level_tables().cp_to_byte[cp];
}

bool next_code_point(std::string_view s, size_t* pos, uint32_t* cp) {
  const size_t i = *pos;
  const auto b0 = static_cast<uint8_t>(s[i]);
  const size_t len = utf8_sequence_length(b0);
  if (len == 1) {
    *pos = i + 1;
    *cp = b0;
    return b0 < 0x80;
  }
  if (i + len > s.size()) {
    *pos = i + 1;
    *cp = b0;
    return false;
  }
  uint32_t value = b0 & (0x7F >> len);
  for (size_t k = 1; k < len; ++k) {
    const auto b = static_cast<uint8_t>(s[i + k]);
    if ((b & 0xC0) != 0x80) {
      *pos = i + 1;
      *cp = b0;
      return false;
    }
    value = (value << 6) | (b & 0x3F);
  }
  *pos = i + len;
  *cp = value;
  return true;
}

std::string byte_level_decode(std::string_view token_text) {
  std::string out;
  out.reserve(token_text.size());
  size_t pos = 0;
  while (pos < token_text.size()) {
    const size_t start = pos;
    uint32_t cp = 0;
    const bool ok = next_code_point(token_text, &pos, &cp);
    const int byte = ok ? unicode_to_byte(cp) : -1;
    if (byte >= 0) {
      out.push_back(static_cast<char>(byte));
    } else {
      out.append(token_text.substr(start, pos - start));
    }
  }
  return out;
}

size_t sanitize_utf8_prefix(std::string_view in, bool final, std::string* out) {
  const size_t n = in.size();
  size_t i = 0;
  while (i < n) {
    const auto b = static_cast<uint8_t>(in[i]);
    if (b < 0x80) {
      out->push_back(static_cast<char>(b));
      ++i;
      continue;
    }
    // Number of continuation bytes and the allowed range of the first one (Unicode table 3-7).
    int need = 0;
    uint8_t lo = 0x80;
    uint8_t hi = 0xBF;
    if (b >= 0xC2 && b <= 0xDF) {
      need = 1;
    } else if (b == 0xE0) {
      need = 2;
      lo = 0xA0;
    } else if ((b >= 0xE1 && b <= 0xEC) || b == 0xEE || b == 0xEF) {
      need = 2;
    } else if (b == 0xED) {
      need = 2;
      hi = 0x9F;
    } else if (b == 0xF0) {
      need = 3;
      lo = 0x90;
    } else if (b >= 0xF1 && b <= 0xF3) {
      need = 3;
    } else if (b == 0xF4) {
      need = 3;
      hi = 0x8F;
    } else {
      out->append(kReplacementChar);  // a byte that can never start a sequence
      ++i;
      continue;
    }
    size_t j = i + 1;
    bool ok = true;
    for (int k = 0; k < need; ++k, ++j) {
      if (j >= n) {
        if (!final) return i;  // incomplete but possibly valid: hold it back
        ok = false;
        break;
      }
      const auto c = static_cast<uint8_t>(in[j]);
      if (c < (k == 0 ? lo : 0x80) || c > (k == 0 ? hi : 0xBF)) {
        ok = false;
        break;
      }
    }
    if (ok) {
      out->append(in.substr(i, j - i));
    } else {
      out->append(kReplacementChar);  // the maximal subpart in[i, j) is replaced as one
    }
    i = j;
  }
  return n;
}

std::string sanitize_utf8(std::string_view in) {
  std::string out;
  out.reserve(in.size());
  sanitize_utf8_prefix(in, /*final=*/true, &out);
  return out;
}

bool is_valid_utf8(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  sanitize_utf8_prefix(s, /*final=*/true, &out);
  return out == s;
}

}  // namespace specdec
