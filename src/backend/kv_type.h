// Storage type of the cached K/V rows. f16 (IEEE half, llama.cpp's default cache type) halves the
// bytes that decode and verification stream from DRAM per cached token; f32 keeps the values of
// the reference arithmetic exactly (the golden-logit tests run on it); q8_0 (as llama.cpp's
// `--cache-type-k/v q8_0`) stores each (slot, KV head) row of head_dim values as int8 codes with
// one float scale (kv_quant.h): 68 bytes per 64 values instead of 128, so a pool of the same
// size holds 1.9x the tokens and attention streams half the bytes. Its attention arithmetic is
// defined on the codes (ops.h: each score and each p·v step times the slot's scale).
#pragma once

#include <cstddef>
#include <optional>
#include <string_view>

namespace specdec {

enum class KvType : unsigned char { kF32, kF16, kQ8 };

// Bytes of one stored element (q8_0: one code; its scales are stored apart, kv_scale_bytes).
inline constexpr size_t kv_type_bytes(KvType t) {
  return t == KvType::kF32 ? 4 : t == KvType::kF16 ? 2 : 1;
}

// Bytes of scale per (slot, KV head) row: 4 (one float) for q8_0, 0 otherwise.
inline constexpr size_t kv_scale_bytes(KvType t) {
  return t == KvType::kQ8 ? 4 : 0;
}

inline constexpr const char* kv_type_name(KvType t) {
  return t == KvType::kF32 ? "f32" : t == KvType::kF16 ? "f16" : "q8_0";
}

// "f16" / "f32" / "q8_0" (nothing else).
inline std::optional<KvType> parse_kv_type(std::string_view s) {
  if (s == "f16") return KvType::kF16;
  if (s == "f32") return KvType::kF32;
  if (s == "q8_0") return KvType::kQ8;
  return std::nullopt;
}

}  // namespace specdec
