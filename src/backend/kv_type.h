// Storage type of the cached K/V rows. f16 (IEEE half, llama.cpp's default cache type) halves the
// bytes that decode and verification stream from DRAM per cached token; f32 keeps the values of
// the reference arithmetic exactly (the golden-logit tests run on it).
#pragma once

#include <cstddef>
#include <optional>
#include <string_view>

namespace specdec {

enum class KvType : unsigned char { kF32, kF16 };

inline constexpr size_t kv_type_bytes(KvType t) {
  return t == KvType::kF16 ? 2 : 4;
}

inline constexpr const char* kv_type_name(KvType t) {
  return t == KvType::kF16 ? "f16" : "f32";
}

// "f16" / "f32" (nothing else).
inline std::optional<KvType> parse_kv_type(std::string_view s) {
  if (s == "f16") return KvType::kF16;
  if (s == "f32") return KvType::kF32;
  return std::nullopt;
}

}  // namespace specdec
