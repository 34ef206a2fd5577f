#include "model/gguf.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <limits>

#include <fmt/format.h>

#include "util/check.h"

namespace specdec {
namespace {

constexpr uint32_t kGgufMagic = 0x46554747;  // "GGUF" little-endian
constexpr int kMaxDims = 4;                  // GGML_MAX_DIMS
constexpr uint64_t kMaxStringBytes = 1ull << 30;

// Reads little-endian values from [pos, end) with a bounds check on every read.
class Cursor {
 public:
  Cursor(const uint8_t* begin, const uint8_t* end, const std::string& path)
      : begin_(begin), pos_(begin), end_(end), path_(path) {}

  uint64_t offset() const { return static_cast<uint64_t>(pos_ - begin_); }
  uint64_t remaining() const { return static_cast<uint64_t>(end_ - pos_); }

  template <class T>
  T read(const char* what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }

  std::string read_string(const char* what) {
    const uint64_t n = read<uint64_t>(what);
    if (n > kMaxStringBytes) fail(fmt::format("{} has an absurd length {}", what, n));
    need(n, what);
    std::string s(reinterpret_cast<const char*>(pos_), n);
    pos_ += n;
    return s;
  }

  void need(uint64_t n, const char* what) const {
    if (n > remaining()) {
      fail(fmt::format("truncated: {} needs {} bytes at offset {}, only {} left", what, n, offset(),
                       remaining()));
    }
  }

  [[noreturn]] void fail(const std::string& msg) const {
    throw Error(fmt::format("{}: malformed GGUF file: {}", path_, msg));
  }

 private:
  const uint8_t* begin_;
  const uint8_t* pos_;
  const uint8_t* end_;
  const std::string& path_;
};

// Smallest encoded size of one element of `type`, used to reject absurd counts before
// allocating anything for them.
uint64_t min_encoded_size(GgufValueType type) {
  switch (type) {
    case GgufValueType::kUint8:
    case GgufValueType::kInt8:
    case GgufValueType::kBool:
      return 1;
    case GgufValueType::kUint16:
    case GgufValueType::kInt16:
      return 2;
    case GgufValueType::kUint32:
    case GgufValueType::kInt32:
    case GgufValueType::kFloat32:
      return 4;
    case GgufValueType::kUint64:
    case GgufValueType::kInt64:
    case GgufValueType::kFloat64:
    case GgufValueType::kString:  // the length prefix
      return 8;
    case GgufValueType::kArray:
      return 12;
  }
  return 1;
}

bool valid_value_type(uint32_t t) {
  return t <= static_cast<uint32_t>(GgufValueType::kFloat64);
}

// Reads one scalar of `type` into the matching field of `v`.
void read_scalar(Cursor& c, GgufValueType type, GgufValue* v, const char* what) {
  v->type = type;
  switch (type) {
    case GgufValueType::kUint8:
      v->i = c.read<uint8_t>(what);
      break;
    case GgufValueType::kInt8:
      v->i = c.read<int8_t>(what);
      break;
    case GgufValueType::kUint16:
      v->i = c.read<uint16_t>(what);
      break;
    case GgufValueType::kInt16:
      v->i = c.read<int16_t>(what);
      break;
    case GgufValueType::kUint32:
      v->i = c.read<uint32_t>(what);
      break;
    case GgufValueType::kInt32:
      v->i = c.read<int32_t>(what);
      break;
    case GgufValueType::kUint64:
      v->u = c.read<uint64_t>(what);
      v->i = static_cast<int64_t>(v->u);
      return;
    case GgufValueType::kInt64:
      v->i = c.read<int64_t>(what);
      break;
    case GgufValueType::kFloat32:
      v->f = c.read<float>(what);
      return;
    case GgufValueType::kFloat64:
      v->f = c.read<double>(what);
      return;
    case GgufValueType::kBool: {
      const uint8_t b = c.read<uint8_t>(what);
      if (b > 1) c.fail(fmt::format("{} is a bool with value {}", what, b));
      v->b = b != 0;
      v->i = b;
      return;
    }
    case GgufValueType::kString:
      v->str = c.read_string(what);
      return;
    case GgufValueType::kArray:
      SPECDEC_CHECK(false, "arrays are read by read_value");
      break;
  }
  v->u = static_cast<uint64_t>(v->i);
}

void read_value(Cursor& c, GgufValueType type, GgufValue* v, const std::string& key) {
  const std::string what = "value of '" + key + "'";
  if (type != GgufValueType::kArray) {
    read_scalar(c, type, v, what.c_str());
    return;
  }
  v->type = GgufValueType::kArray;
  const uint32_t raw_elem = c.read<uint32_t>(what.c_str());
  if (!valid_value_type(raw_elem)) {
    c.fail(fmt::format("array '{}' has unknown element type {}", key, raw_elem));
  }
  const auto elem = static_cast<GgufValueType>(raw_elem);
  if (elem == GgufValueType::kArray) c.fail(fmt::format("array '{}' is nested", key));
  v->array_type = elem;
  const uint64_t count = c.read<uint64_t>(what.c_str());
  if (count > c.remaining() / min_encoded_size(elem)) {
    c.fail(fmt::format("array '{}' claims {} elements, more than the file can hold", key, count));
  }
  GgufValue e;
  if (elem == GgufValueType::kString) {
    v->array_strings.reserve(count);
    for (uint64_t k = 0; k < count; ++k) v->array_strings.push_back(c.read_string(what.c_str()));
  } else if (elem == GgufValueType::kFloat32 || elem == GgufValueType::kFloat64) {
    v->array_floats.reserve(count);
    for (uint64_t k = 0; k < count; ++k) {
      read_scalar(c, elem, &e, what.c_str());
      v->array_floats.push_back(e.f);
    }
  } else {
    v->array_ints.reserve(count);
    for (uint64_t k = 0; k < count; ++k) {
      read_scalar(c, elem, &e, what.c_str());
      v->array_ints.push_back(e.i);
    }
  }
}

}  // namespace

const char* gguf_value_type_name(GgufValueType type) {
  switch (type) {
    case GgufValueType::kUint8:
      return "uint8";
    case GgufValueType::kInt8:
      return "int8";
    case GgufValueType::kUint16:
      return "uint16";
    case GgufValueType::kInt16:
      return "int16";
    case GgufValueType::kUint32:
      return "uint32";
    case GgufValueType::kInt32:
      return "int32";
    case GgufValueType::kFloat32:
      return "float32";
    case GgufValueType::kBool:
      return "bool";
    case GgufValueType::kString:
      return "string";
    case GgufValueType::kArray:
      return "array";
    case GgufValueType::kUint64:
      return "uint64";
    case GgufValueType::kInt64:
      return "int64";
    case GgufValueType::kFloat64:
      return "float64";
  }
  return "?";
}

bool GgufValue::is_integer() const {
  switch (type) {
    case GgufValueType::kUint8:
    case GgufValueType::kInt8:
    case GgufValueType::kUint16:
    case GgufValueType::kInt16:
    case GgufValueType::kUint32:
    case GgufValueType::kInt32:
    case GgufValueType::kUint64:
    case GgufValueType::kInt64:
      return true;
    default:
      return false;
  }
}

bool GgufValue::is_float() const {
  return type == GgufValueType::kFloat32 || type == GgufValueType::kFloat64;
}

size_t GgufValue::array_size() const {
  return array_strings.size() + array_ints.size() + array_floats.size();
}

int64_t GgufTensor::num_elements() const {
  int64_t n = 1;
  for (int64_t d : ne) n *= d;
  return n;
}

std::unique_ptr<GgufFile> GgufFile::open(const std::string& path) {
  std::unique_ptr<GgufFile> f(new GgufFile());
  f->path_ = path;
  f->fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (f->fd_ < 0) throw Error(fmt::format("{}: cannot open: {}", path, std::strerror(errno)));
  struct stat st;
  if (::fstat(f->fd_, &st) != 0) {
    throw Error(fmt::format("{}: cannot stat: {}", path, std::strerror(errno)));
  }
  if (!S_ISREG(st.st_mode)) throw Error(fmt::format("{}: not a regular file", path));
  f->size_ = static_cast<uint64_t>(st.st_size);
  if (f->size_ < 8) {
    throw Error(fmt::format("{}: malformed GGUF file: truncated: {} bytes, too short for a header",
                            path, f->size_));
  }
  void* p = ::mmap(nullptr, f->size_, PROT_READ, MAP_PRIVATE, f->fd_, 0);
  if (p == MAP_FAILED) throw Error(fmt::format("{}: cannot map: {}", path, std::strerror(errno)));
  f->base_ = static_cast<const uint8_t*>(p);
  f->parse();
  return f;
}

GgufFile::~GgufFile() {
  if (base_) ::munmap(const_cast<uint8_t*>(base_), size_);
  if (fd_ >= 0) ::close(fd_);
}

void GgufFile::parse() {
  Cursor c(base_, base_ + size_, path_);
  const uint32_t magic = c.read<uint32_t>("magic");
  if (magic != kGgufMagic) c.fail(fmt::format("bad magic 0x{:08x}, not a GGUF file", magic));
  version_ = c.read<uint32_t>("version");
  if (version_ == 1) c.fail("GGUF version 1 is not supported (only 2 and 3)");
  if (version_ != 2 && version_ != 3) {
    c.fail(fmt::format("unsupported version {} (big-endian files are not supported either)",
                       version_));
  }
  const uint64_t n_tensors = c.read<uint64_t>("tensor count");
  const uint64_t n_kv = c.read<uint64_t>("metadata count");
  // A key-value pair takes at least 8 (key length) + 4 (type) + 1 bytes; a tensor info 8 + 4 +
  // 4 + 8 bytes.
  if (n_kv > c.remaining() / 13) c.fail(fmt::format("metadata count {} is impossible", n_kv));
  if (n_tensors > c.remaining() / 24)
    c.fail(fmt::format("tensor count {} is impossible", n_tensors));

  keys_.reserve(n_kv);
  for (uint64_t k = 0; k < n_kv; ++k) {
    std::string key = c.read_string("metadata key");
    const uint32_t raw_type = c.read<uint32_t>("metadata value type");
    if (!valid_value_type(raw_type)) {
      c.fail(fmt::format("metadata '{}' has unknown value type {}", key, raw_type));
    }
    GgufValue v;
    read_value(c, static_cast<GgufValueType>(raw_type), &v, key);
    if (kv_.count(key)) c.fail(fmt::format("metadata key '{}' appears twice", key));
    keys_.push_back(key);
    kv_.emplace(std::move(key), std::move(v));
  }

  if (const GgufValue* a = find("general.alignment")) {
    if (!a->is_integer() || a->i <= 0 || (a->i & (a->i - 1)) != 0) {
      c.fail("general.alignment must be a positive power of two");
    }
    alignment_ = static_cast<uint64_t>(a->i);
  }

  tensors_.reserve(n_tensors);
  for (uint64_t t = 0; t < n_tensors; ++t) {
    GgufTensor info;
    info.name = c.read_string("tensor name");
    const uint32_t n_dims = c.read<uint32_t>("tensor dimension count");
    if (n_dims == 0 || n_dims > kMaxDims) {
      c.fail(fmt::format("tensor '{}' has {} dimensions (1 to {} allowed)", info.name, n_dims,
                         kMaxDims));
    }
    int64_t n_elem = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      const uint64_t dim = c.read<uint64_t>("tensor dimension");
      if (dim > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) ||
          (dim != 0 && static_cast<uint64_t>(n_elem) > (1ull << 62) / dim)) {
        c.fail(fmt::format("tensor '{}' dimension {} = {} is too large", info.name, d, dim));
      }
      info.ne.push_back(static_cast<int64_t>(dim));
      n_elem *= static_cast<int64_t>(dim);
    }
    const uint32_t raw_type = c.read<uint32_t>("tensor type");
    const GgmlTypeTraits* traits = ggml_type_traits(raw_type);
    if (!traits) c.fail(fmt::format("tensor '{}' has unknown type {}", info.name, raw_type));
    info.type = static_cast<GgmlType>(raw_type);
    if (info.ne[0] % traits->block_size != 0) {
      c.fail(fmt::format("tensor '{}' of type {} has row length {}, not a multiple of {}",
                         info.name, traits->name, info.ne[0], traits->block_size));
    }
    // The element count is at most 2^62, but its size in bytes can exceed int64 (2^62 float32
    // values are 2^64 bytes): reject it before multiplying (the fuzzer found the overflow).
    const int64_t n_blocks = n_elem / traits->block_size;
    if (n_blocks > std::numeric_limits<int64_t>::max() / traits->block_bytes) {
      c.fail(fmt::format("tensor '{}' of {} elements of type {} is too large", info.name, n_elem,
                         traits->name));
    }
    info.nbytes = static_cast<uint64_t>(n_blocks * traits->block_bytes);
    info.offset = c.read<uint64_t>("tensor offset");
    if (info.offset % alignment_ != 0) {
      c.fail(fmt::format("tensor '{}' offset {} is not aligned to {}", info.name, info.offset,
                         alignment_));
    }
    if (tensor_index_.count(info.name)) {
      c.fail(fmt::format("tensor '{}' appears twice", info.name));
    }
    tensor_index_.emplace(info.name, tensors_.size());
    tensors_.push_back(std::move(info));
  }

  const uint64_t data_start = (c.offset() + alignment_ - 1) / alignment_ * alignment_;
  if (data_start > size_ && n_tensors > 0) {
    c.fail(fmt::format("truncated: tensor data would start at {} but the file has {} bytes",
                       data_start, size_));
  }
  const uint64_t data_size = data_start <= size_ ? size_ - data_start : 0;
  for (GgufTensor& t : tensors_) {
    if (t.offset > data_size || t.nbytes > data_size - t.offset) {
      throw Error(fmt::format(
          "{}: malformed GGUF file: tensor '{}' ({} bytes at data offset {}) extends past the end "
          "of the file (data section is {} bytes); the file may be truncated",
          path_, t.name, t.nbytes, t.offset, data_size));
    }
    t.data = base_ + data_start + t.offset;
  }
}

const GgufValue* GgufFile::find(std::string_view key) const {
  auto it = kv_.find(std::string(key));
  return it == kv_.end() ? nullptr : &it->second;
}

namespace {
[[noreturn]] void wrong_type(const std::string& path, std::string_view key, const GgufValue& v,
                             const char* wanted) {
  std::string got = gguf_value_type_name(v.type);
  if (v.is_array()) got = fmt::format("array of {}", gguf_value_type_name(v.array_type));
  throw Error(fmt::format("{}: metadata '{}' is {}, expected {}", path, key, got, wanted));
}
}  // namespace

std::optional<int64_t> GgufFile::get_int(std::string_view key) const {
  const GgufValue* v = find(key);
  if (!v) return std::nullopt;
  if (!v->is_integer()) wrong_type(path_, key, *v, "an integer");
  return v->i;
}

std::optional<double> GgufFile::get_float(std::string_view key) const {
  const GgufValue* v = find(key);
  if (!v) return std::nullopt;
  if (v->is_float()) return v->f;
  if (v->is_integer()) return static_cast<double>(v->i);
  wrong_type(path_, key, *v, "a number");
}

std::optional<bool> GgufFile::get_bool(std::string_view key) const {
  const GgufValue* v = find(key);
  if (!v) return std::nullopt;
  if (v->type != GgufValueType::kBool) wrong_type(path_, key, *v, "a bool");
  return v->b;
}

std::optional<std::string> GgufFile::get_string(std::string_view key) const {
  const GgufValue* v = find(key);
  if (!v) return std::nullopt;
  if (v->type != GgufValueType::kString) wrong_type(path_, key, *v, "a string");
  return v->str;
}

const std::vector<std::string>* GgufFile::get_string_array(std::string_view key) const {
  const GgufValue* v = find(key);
  if (!v) return nullptr;
  if (!v->is_array() || v->array_type != GgufValueType::kString) {
    wrong_type(path_, key, *v, "an array of strings");
  }
  return &v->array_strings;
}

const std::vector<int64_t>* GgufFile::get_int_array(std::string_view key) const {
  const GgufValue* v = find(key);
  if (!v) return nullptr;
  if (!v->is_array() || v->array_type == GgufValueType::kString ||
      v->array_type == GgufValueType::kFloat32 || v->array_type == GgufValueType::kFloat64) {
    wrong_type(path_, key, *v, "an array of integers");
  }
  return &v->array_ints;
}

const std::vector<double>* GgufFile::get_float_array(std::string_view key) const {
  const GgufValue* v = find(key);
  if (!v) return nullptr;
  if (!v->is_array() ||
      (v->array_type != GgufValueType::kFloat32 && v->array_type != GgufValueType::kFloat64)) {
    wrong_type(path_, key, *v, "an array of floats");
  }
  return &v->array_floats;
}

const GgufTensor* GgufFile::find_tensor(std::string_view name) const {
  auto it = tensor_index_.find(std::string(name));
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

}  // namespace specdec
