#include "drafter/safetensors.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "backend/cpu/quant_blocks.h"
#include "util/check.h"

namespace specdec {

namespace {

constexpr uint64_t kMaxHeader = 100u << 20;  // a header of over 100 MB is not a drafter head

bool parse_dtype(const std::string& s, StDtype* t) {
  static const std::pair<const char*, StDtype> kNames[] = {
      {"F32", StDtype::kF32}, {"F16", StDtype::kF16}, {"BF16", StDtype::kBF16},
      {"I32", StDtype::kI32}, {"I64", StDtype::kI64}};
  for (const auto& [name, dt] : kNames) {
    if (s == name) {
      *t = dt;
      return true;
    }
  }
  return false;
}

uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // NaN
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even
  return static_cast<uint16_t>(u >> 16);
}

float bf16_to_f32(uint16_t h) {
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

}  // namespace

const char* st_dtype_name(StDtype t) {
  switch (t) {
    case StDtype::kF32: return "F32";
    case StDtype::kF16: return "F16";
    case StDtype::kBF16: return "BF16";
    case StDtype::kI32: return "I32";
    case StDtype::kI64: return "I64";
  }
  return "?";
}

int st_dtype_size(StDtype t) {
  switch (t) {
    case StDtype::kF16:
    case StDtype::kBF16: return 2;
    case StDtype::kF32:
    case StDtype::kI32: return 4;
    case StDtype::kI64: return 8;
  }
  return 0;
}

int64_t StTensor::num_elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::vector<float> StTensor::to_f32() const {
  const int64_t n = num_elements();
  std::vector<float> out(static_cast<size_t>(n));
  switch (dtype) {
    case StDtype::kF32:
      std::memcpy(out.data(), bytes.data(), static_cast<size_t>(n) * 4);
      break;
    case StDtype::kF16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, bytes.data() + 2 * i, 2);
        out[i] = fp16_to_fp32(h);
      }
      break;
    case StDtype::kBF16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, bytes.data() + 2 * i, 2);
        out[i] = bf16_to_f32(h);
      }
      break;
    default:
      throw Error(fmt::format("tensor '{}' is {}, not a float tensor", name, st_dtype_name(dtype)));
  }
  return out;
}

std::vector<int32_t> StTensor::to_i32() const {
  const int64_t n = num_elements();
  std::vector<int32_t> out(static_cast<size_t>(n));
  if (dtype == StDtype::kI32) {
    std::memcpy(out.data(), bytes.data(), static_cast<size_t>(n) * 4);
  } else if (dtype == StDtype::kI64) {
    for (int64_t i = 0; i < n; ++i) {
      int64_t v;
      std::memcpy(&v, bytes.data() + 8 * i, 8);
      if (v < INT32_MIN || v > INT32_MAX) {
        throw Error(fmt::format("tensor '{}' holds {}, out of the int32 range", name, v));
      }
      out[i] = static_cast<int32_t>(v);
    }
  } else {
    throw Error(fmt::format("tensor '{}' is {}, not an integer tensor", name, st_dtype_name(dtype)));
  }
  return out;
}

const StTensor* StFile::find(const std::string& name) const {
  for (const StTensor& t : tensors) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

const StTensor& StFile::require(const std::string& path, const std::string& name,
                                std::span<const int64_t> shape) const {
  const StTensor* t = find(name);
  if (!t) throw Error(fmt::format("{}: tensor '{}' is missing", path, name));
  if (!std::equal(t->shape.begin(), t->shape.end(), shape.begin(), shape.end())) {
    throw Error(fmt::format("{}: tensor '{}' has shape [{}], expected [{}]", path, name,
                            fmt::join(t->shape, ", "), fmt::join(shape, ", ")));
  }
  return *t;
}

const std::string& StFile::require_meta(const std::string& path, const std::string& key) const {
  auto it = metadata.find(key);
  if (it == metadata.end()) throw Error(fmt::format("{}: metadata '{}' is missing", path, key));
  return it->second;
}

StTensor st_from_f32(std::string name, std::vector<int64_t> shape, std::span<const float> data,
                     StDtype dtype) {
  StTensor t;
  t.name = std::move(name);
  t.dtype = dtype;
  t.shape = std::move(shape);
  SPECDEC_CHECK(t.num_elements() == static_cast<int64_t>(data.size()), "shape/data mismatch");
  t.bytes.resize(data.size() * static_cast<size_t>(st_dtype_size(dtype)));
  for (size_t i = 0; i < data.size(); ++i) {
    if (dtype == StDtype::kF32) {
      std::memcpy(t.bytes.data() + 4 * i, &data[i], 4);
    } else if (dtype == StDtype::kF16) {
      const uint16_t h = fp32_to_fp16(data[i]);
      std::memcpy(t.bytes.data() + 2 * i, &h, 2);
    } else if (dtype == StDtype::kBF16) {
      const uint16_t h = f32_to_bf16(data[i]);
      std::memcpy(t.bytes.data() + 2 * i, &h, 2);
    } else {
      SPECDEC_CHECK(false, "st_from_f32 takes a float dtype");
    }
  }
  return t;
}

StTensor st_from_i32(std::string name, std::vector<int64_t> shape, std::span<const int32_t> data) {
  StTensor t;
  t.name = std::move(name);
  t.dtype = StDtype::kI32;
  t.shape = std::move(shape);
  SPECDEC_CHECK(t.num_elements() == static_cast<int64_t>(data.size()), "shape/data mismatch");
  t.bytes.resize(data.size() * 4);
  std::memcpy(t.bytes.data(), data.data(), t.bytes.size());
  return t;
}

std::map<std::string, std::string> read_safetensors_metadata(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(fmt::format("{}: cannot open the file", path));
  in.seekg(0, std::ios::end);
  const auto file_size = static_cast<uint64_t>(in.tellg());
  in.seekg(0);
  uint8_t len_bytes[8];
  if (file_size < 8 || !in.read(reinterpret_cast<char*>(len_bytes), 8)) {
    throw Error(fmt::format("{}: not a safetensors file (under 8 bytes)", path));
  }
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | len_bytes[i];
  if (header_len > kMaxHeader || header_len > file_size - 8) {
    throw Error(fmt::format("{}: header length {} does not fit the file", path, header_len));
  }
  std::string header(header_len, '\0');
  if (!in.read(header.data(), static_cast<std::streamsize>(header_len))) {
    throw Error(fmt::format("{}: truncated header", path));
  }
  std::map<std::string, std::string> meta;
  try {
    const nlohmann::json j = nlohmann::json::parse(header);
    if (j.is_object() && j.contains("__metadata__") && j["__metadata__"].is_object()) {
      for (auto m = j["__metadata__"].begin(); m != j["__metadata__"].end(); ++m) {
        if (m->is_string()) meta[m.key()] = m->get<std::string>();
      }
    }
  } catch (const nlohmann::json::exception& e) {
    throw Error(fmt::format("{}: the header is not valid JSON ({})", path, e.what()));
  }
  return meta;
}

StFile read_safetensors(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(fmt::format("{}: cannot open the file", path));
  in.seekg(0, std::ios::end);
  const auto file_size = static_cast<uint64_t>(in.tellg());
  in.seekg(0);
  if (file_size < 8) throw Error(fmt::format("{}: not a safetensors file (under 8 bytes)", path));
  uint8_t len_bytes[8];
  in.read(reinterpret_cast<char*>(len_bytes), 8);
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | len_bytes[i];
  if (header_len > kMaxHeader || header_len > file_size - 8) {
    throw Error(fmt::format("{}: header length {} does not fit the file ({} bytes)", path,
                            header_len, file_size));
  }
  std::string header(header_len, '\0');
  in.read(header.data(), static_cast<std::streamsize>(header_len));
  if (!in) throw Error(fmt::format("{}: truncated header", path));
  const uint64_t data_size = file_size - 8 - header_len;

  nlohmann::json j;
  try {
    j = nlohmann::json::parse(header);
  } catch (const nlohmann::json::exception& e) {
    throw Error(fmt::format("{}: the header is not valid JSON ({})", path, e.what()));
  }
  if (!j.is_object()) throw Error(fmt::format("{}: the header is not a JSON object", path));

  StFile f;
  struct Span {
    uint64_t begin, end;
    size_t index;
  };
  std::vector<Span> spans;
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (it.key() == "__metadata__") {
      if (!it->is_object()) throw Error(fmt::format("{}: __metadata__ is not an object", path));
      for (auto m = it->begin(); m != it->end(); ++m) {
        if (!m->is_string()) {
          throw Error(fmt::format("{}: metadata '{}' is not a string", path, m.key()));
        }
        f.metadata[m.key()] = m->get<std::string>();
      }
      continue;
    }
    const nlohmann::json& e = *it;
    StTensor t;
    t.name = it.key();
    if (!e.is_object() || !e.contains("dtype") || !e["dtype"].is_string() ||
        !e.contains("shape") || !e["shape"].is_array() || !e.contains("data_offsets") ||
        !e["data_offsets"].is_array() || e["data_offsets"].size() != 2) {
      throw Error(fmt::format("{}: tensor '{}' needs dtype, shape and data_offsets [begin, end]",
                              path, t.name));
    }
    if (!parse_dtype(e["dtype"].get<std::string>(), &t.dtype)) {
      throw Error(fmt::format("{}: tensor '{}' has an unsupported dtype '{}'", path, t.name,
                              e["dtype"].get<std::string>()));
    }
    uint64_t n = 1;
    for (const auto& d : e["shape"]) {
      if (!d.is_number_unsigned()) {
        throw Error(fmt::format("{}: tensor '{}' has a bad dimension", path, t.name));
      }
      const uint64_t v = d.get<uint64_t>();
      if (v > (1ull << 40) || (v != 0 && n > (1ull << 40) / v)) {
        throw Error(fmt::format("{}: tensor '{}' is too large", path, t.name));
      }
      n *= v;
      t.shape.push_back(static_cast<int64_t>(v));
    }
    const auto& off = e["data_offsets"];
    if (!off[0].is_number_unsigned() || !off[1].is_number_unsigned()) {
      throw Error(fmt::format("{}: tensor '{}' has bad data_offsets", path, t.name));
    }
    const uint64_t b = off[0].get<uint64_t>(), en = off[1].get<uint64_t>();
    if (b > en || en > data_size) {
      throw Error(fmt::format("{}: tensor '{}' data [{}, {}) lies outside the {} data bytes", path,
                              t.name, b, en, data_size));
    }
    if (en - b != n * static_cast<uint64_t>(st_dtype_size(t.dtype))) {
      throw Error(fmt::format("{}: tensor '{}' has {} bytes for {} elements of {}", path, t.name,
                              en - b, n, st_dtype_name(t.dtype)));
    }
    spans.push_back({b, en, f.tensors.size()});
    f.tensors.push_back(std::move(t));
  }
  std::sort(spans.begin(), spans.end(), [](const Span& a, const Span& b) { return a.begin < b.begin; });
  for (size_t i = 1; i < spans.size(); ++i) {
    if (spans[i].begin < spans[i - 1].end) {
      throw Error(fmt::format("{}: tensors '{}' and '{}' overlap", path,
                              f.tensors[spans[i - 1].index].name, f.tensors[spans[i].index].name));
    }
  }
  const uint64_t data_start = 8 + header_len;
  std::vector<StTensor> ordered;
  for (const Span& s : spans) {
    StTensor& t = f.tensors[s.index];
    t.bytes.resize(s.end - s.begin);
    in.seekg(static_cast<std::streamoff>(data_start + s.begin));
    in.read(reinterpret_cast<char*>(t.bytes.data()), static_cast<std::streamsize>(t.bytes.size()));
    if (!in) throw Error(fmt::format("{}: cannot read tensor '{}'", path, t.name));
    ordered.push_back(std::move(t));
  }
  f.tensors = std::move(ordered);
  return f;
}

void write_safetensors(const std::string& path, const StFile& file) {
  nlohmann::json j = nlohmann::json::object();
  if (!file.metadata.empty()) {
    nlohmann::json m = nlohmann::json::object();
    for (const auto& [k, v] : file.metadata) m[k] = v;
    j["__metadata__"] = m;
  }
  uint64_t offset = 0;
  for (const StTensor& t : file.tensors) {
    SPECDEC_CHECK(t.bytes.size() == static_cast<size_t>(t.num_elements()) *
                                        static_cast<size_t>(st_dtype_size(t.dtype)),
                  "tensor bytes do not match its shape");
    j[t.name] = {{"dtype", st_dtype_name(t.dtype)},
                 {"shape", t.shape},
                 {"data_offsets", {offset, offset + t.bytes.size()}}};
    offset += t.bytes.size();
  }
  std::string header = j.dump();
  while ((8 + header.size()) % 8 != 0) header.push_back(' ');  // data aligned to 8 bytes
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) throw Error(fmt::format("{}: cannot open for writing", tmp));
    uint8_t len_bytes[8];
    uint64_t n = header.size();
    for (int i = 0; i < 8; ++i, n >>= 8) len_bytes[i] = static_cast<uint8_t>(n & 0xff);
    out.write(reinterpret_cast<const char*>(len_bytes), 8);
    out.write(header.data(), static_cast<std::streamsize>(header.size()));
    for (const StTensor& t : file.tensors) {
      out.write(reinterpret_cast<const char*>(t.bytes.data()),
                static_cast<std::streamsize>(t.bytes.size()));
    }
    out.flush();
    if (!out) throw Error(fmt::format("{}: write failed (disk full?)", tmp));
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) throw Error(fmt::format("{}: cannot rename to {}: {}", tmp, path, ec.message()));
}

}  // namespace specdec
