#include "backend/ggml_type.h"

#include <array>

#include "util/check.h"

namespace specdec {
namespace {

constexpr uint32_t kNumRawTypes = 40;

// Index = raw GGML type id. name == nullptr marks ids that are not (or no longer) assigned.
constexpr std::array<GgmlTypeTraits, kNumRawTypes> kTraits = [] {
  std::array<GgmlTypeTraits, kNumRawTypes> t{};
  for (auto& e : t) e = {nullptr, 0, 0, false};
  t[0] = {"F32", 1, 4, true};
  t[1] = {"F16", 1, 2, true};
  t[2] = {"Q4_0", 32, 18, true};
  t[3] = {"Q4_1", 32, 20, true};
  t[6] = {"Q5_0", 32, 22, true};
  t[7] = {"Q5_1", 32, 24, true};
  t[8] = {"Q8_0", 32, 34, true};
  t[9] = {"Q8_1", 32, 36, false};
  t[10] = {"Q2_K", 256, 84, false};
  t[11] = {"Q3_K", 256, 110, false};
  t[12] = {"Q4_K", 256, 144, true};
  t[13] = {"Q5_K", 256, 176, true};
  t[14] = {"Q6_K", 256, 210, true};
  t[15] = {"Q8_K", 256, 292, false};
  t[16] = {"IQ2_XXS", 256, 66, false};
  t[17] = {"IQ2_XS", 256, 74, false};
  t[18] = {"IQ3_XXS", 256, 98, false};
  t[19] = {"IQ1_S", 256, 50, false};
  t[20] = {"IQ4_NL", 32, 18, false};
  t[21] = {"IQ3_S", 256, 110, false};
  t[22] = {"IQ2_S", 256, 82, false};
  t[23] = {"IQ4_XS", 256, 136, false};
  t[24] = {"I8", 1, 1, false};
  t[25] = {"I16", 1, 2, false};
  t[26] = {"I32", 1, 4, false};
  t[27] = {"I64", 1, 8, false};
  t[28] = {"F64", 1, 8, false};
  t[29] = {"IQ1_M", 256, 56, false};
  t[30] = {"BF16", 1, 2, true};
  t[34] = {"TQ1_0", 256, 54, false};
  t[35] = {"TQ2_0", 256, 66, false};
  t[39] = {"MXFP4", 32, 17, false};
  return t;
}();

}  // namespace

const GgmlTypeTraits* ggml_type_traits(uint32_t raw_type) {
  if (raw_type >= kNumRawTypes || kTraits[raw_type].name == nullptr) return nullptr;
  return &kTraits[raw_type];
}

const GgmlTypeTraits& ggml_type_traits(GgmlType type) {
  const GgmlTypeTraits* t = ggml_type_traits(static_cast<uint32_t>(type));
  SPECDEC_CHECK(t != nullptr, "unknown GgmlType");
  return *t;
}

std::string ggml_type_name(uint32_t raw_type) {
  const GgmlTypeTraits* t = ggml_type_traits(raw_type);
  return t ? std::string(t->name) : "unknown(" + std::to_string(raw_type) + ")";
}

}  // namespace specdec
