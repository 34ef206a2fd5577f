// GGUF reader: versions 2 and 3, memory-mapped. Every metadata value type and arrays are
// decoded eagerly into GgufValue; tensor data stays in the mapping and is bounds-checked.
// Any malformed input throws specdec::Error naming the file, the key or tensor, and the problem.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "backend/ggml_type.h"

namespace specdec {

enum class GgufValueType : uint32_t {
  kUint8 = 0,
  kInt8 = 1,
  kUint16 = 2,
  kInt16 = 3,
  kUint32 = 4,
  kInt32 = 5,
  kFloat32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kUint64 = 10,
  kInt64 = 11,
  kFloat64 = 12,
};

const char* gguf_value_type_name(GgufValueType type);

// One metadata value. Scalars: integers (signed or not) in `i` (uint64 values above INT64_MAX
// are kept in `u` too), floats in `f`, bool in `b`, strings in `str`. Arrays: `array_type` and
// exactly one of `array_ints` / `array_floats` / `array_strings` (bools go to array_ints).
// Nested arrays are rejected as malformed (no model uses them).
struct GgufValue {
  GgufValueType type = GgufValueType::kUint8;
  int64_t i = 0;
  uint64_t u = 0;
  double f = 0.0;
  bool b = false;
  std::string str;
  GgufValueType array_type = GgufValueType::kUint8;
  std::vector<int64_t> array_ints;
  std::vector<double> array_floats;
  std::vector<std::string> array_strings;

  bool is_integer() const;  // any of the integer scalar types
  bool is_float() const;    // float32 / float64
  bool is_array() const { return type == GgufValueType::kArray; }
  size_t array_size() const;
};

struct GgufTensor {
  std::string name;
  GgmlType type = GgmlType::kF32;
  std::vector<int64_t> ne;  // dims, ne[0] innermost: a weight [out, in] has ne = {in, out}
  uint64_t offset = 0;      // from the start of the data section
  uint64_t nbytes = 0;
  const uint8_t* data = nullptr;  // inside the mapping, aligned as the file says

  int64_t num_elements() const;
};

class GgufFile {
 public:
  // Maps and parses `path`. Throws specdec::Error for a missing, truncated or malformed file.
  static std::unique_ptr<GgufFile> open(const std::string& path);
  ~GgufFile();
  GgufFile(const GgufFile&) = delete;
  GgufFile& operator=(const GgufFile&) = delete;

  const std::string& path() const { return path_; }
  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  uint64_t file_size() const { return size_; }

  // Metadata, in file order.
  const std::vector<std::string>& keys() const { return keys_; }
  const GgufValue* find(std::string_view key) const;
  // Typed getters: nullopt when the key is absent; throw specdec::Error when it is present
  // with the wrong type (so that a wrong file is never silently misread).
  std::optional<int64_t> get_int(std::string_view key) const;    // any integer type
  std::optional<double> get_float(std::string_view key) const;   // float32/64 or integer
  std::optional<bool> get_bool(std::string_view key) const;
  std::optional<std::string> get_string(std::string_view key) const;
  const std::vector<std::string>* get_string_array(std::string_view key) const;
  const std::vector<int64_t>* get_int_array(std::string_view key) const;
  const std::vector<double>* get_float_array(std::string_view key) const;

  const std::vector<GgufTensor>& tensors() const { return tensors_; }
  const GgufTensor* find_tensor(std::string_view name) const;

 private:
  GgufFile() = default;
  void parse();

  std::string path_;
  int fd_ = -1;
  const uint8_t* base_ = nullptr;
  uint64_t size_ = 0;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  std::vector<std::string> keys_;
  std::unordered_map<std::string, GgufValue> kv_;
  std::vector<GgufTensor> tensors_;
  std::unordered_map<std::string, size_t> tensor_index_;
};

}  // namespace specdec
