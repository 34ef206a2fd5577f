// safetensors files (the format of Hugging Face's `safetensors`): an 8-byte little-endian header
// length N, N bytes of JSON {"NAME": {"dtype", "shape", "data_offsets": [begin, end]}, ...,
// "__metadata__": {string: string}}, then the tensors' bytes (offsets relative to the end of the
// header, little-endian, row-major). specdec stores its drafter heads in it. The reader checks
// every offset, shape and size against the file and throws specdec::Error naming the file and
// the tensor; it copies the bytes (heads are small).
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <vector>

namespace specdec {

enum class StDtype { kF32, kF16, kBF16, kI32, kI64 };
const char* st_dtype_name(StDtype t);  // "F32", "F16", "BF16", "I32", "I64"
int st_dtype_size(StDtype t);

struct StTensor {
  std::string name;
  StDtype dtype = StDtype::kF32;
  std::vector<int64_t> shape;  // row-major, outermost first
  std::vector<uint8_t> bytes;  // prod(shape) * st_dtype_size(dtype)

  int64_t num_elements() const;
  // The tensor as floats (F32, F16 or BF16 converted); specdec::Error for integer dtypes.
  std::vector<float> to_f32() const;
  // The tensor as int32 (I32, or I64 values that fit); specdec::Error otherwise.
  std::vector<int32_t> to_i32() const;
};

struct StFile {
  std::map<std::string, std::string> metadata;
  std::vector<StTensor> tensors;  // in data-offset order on read, as given on write

  const StTensor* find(const std::string& name) const;
  // find() that throws specdec::Error naming `path` when the tensor is missing or its shape is
  // not `shape`.
  const StTensor& require(const std::string& path, const std::string& name,
                          std::span<const int64_t> shape) const;
  // metadata value or specdec::Error naming `path` and the key.
  const std::string& require_meta(const std::string& path, const std::string& key) const;
};

StTensor st_from_f32(std::string name, std::vector<int64_t> shape, std::span<const float> data,
                     StDtype dtype = StDtype::kF32);
StTensor st_from_i32(std::string name, std::vector<int64_t> shape, std::span<const int32_t> data);

// Throws specdec::Error (naming the file) when it cannot be read or is malformed.
StFile read_safetensors(const std::string& path);
// Only the header's metadata (cheap: the tensors are not read); specdec::Error as above.
std::map<std::string, std::string> read_safetensors_metadata(const std::string& path);
// Writes to path + ".tmp" and renames, so a crash never leaves a half-written file at `path`.
void write_safetensors(const std::string& path, const StFile& file);

}  // namespace specdec
