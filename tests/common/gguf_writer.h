// Builds GGUF files byte by byte for tests: valid ones, and deliberately broken ones
// (truncations, bad offsets, absurd counts) to check that the reader rejects them cleanly.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace specdec::test {

class GgufWriter {
 public:
  explicit GgufWriter(uint32_t version = 3, uint32_t alignment = 32) : alignment_(alignment) {
    put<uint32_t>(0x46554747);
    put<uint32_t>(version);
  }

  // Header counts are written by finish(); callers add metadata, then tensors.
  void kv_u32(const std::string& key, uint32_t v) { key_type(key, 4); put(v); ++n_kv_; }
  void kv_i32(const std::string& key, int32_t v) { key_type(key, 5); put(v); ++n_kv_; }
  void kv_u64(const std::string& key, uint64_t v) { key_type(key, 10); put(v); ++n_kv_; }
  void kv_f32(const std::string& key, float v) { key_type(key, 6); put(v); ++n_kv_; }
  void kv_f64(const std::string& key, double v) { key_type(key, 12); put(v); ++n_kv_; }
  void kv_bool(const std::string& key, bool v) { key_type(key, 7); put<uint8_t>(v); ++n_kv_; }
  void kv_str(const std::string& key, const std::string& v) { key_type(key, 8); str(v); ++n_kv_; }
  void kv_str_array(const std::string& key, const std::vector<std::string>& v) {
    key_type(key, 9);
    put<uint32_t>(8);
    put<uint64_t>(v.size());
    for (const auto& s : v) str(s);
    ++n_kv_;
  }
  void kv_f32_array(const std::string& key, const std::vector<float>& v) {
    key_type(key, 9);
    put<uint32_t>(6);
    put<uint64_t>(v.size());
    for (float f : v) put(f);
    ++n_kv_;
  }
  void kv_i32_array(const std::string& key, const std::vector<int32_t>& v) {
    key_type(key, 9);
    put<uint32_t>(5);
    put<uint64_t>(v.size());
    for (int32_t x : v) put(x);
    ++n_kv_;
  }

  // A tensor whose data is `data` (raw bytes). ne[0] innermost.
  void tensor(const std::string& name, std::vector<uint64_t> ne, uint32_t type,
              const std::vector<uint8_t>& data) {
    tensors_.push_back({name, std::move(ne), type, data});
  }
  void tensor_f32(const std::string& name, std::vector<uint64_t> ne, const std::vector<float>& v) {
    std::vector<uint8_t> bytes(v.size() * 4);
    std::memcpy(bytes.data(), v.data(), bytes.size());
    tensor(name, std::move(ne), 0, bytes);
  }

  // The whole file. `offset_bias` is added to every tensor's offset (to forge bad offsets).
  std::vector<uint8_t> finish(uint64_t offset_bias = 0) const {
    std::vector<uint8_t> out;
    auto put_to = [&](const void* p, size_t n) {
      const uint8_t* b = static_cast<const uint8_t*>(p);
      out.insert(out.end(), b, b + n);
    };
    put_to(head_.data(), 8);
    const uint64_t n_tensors = tensors_.size();
    put_to(&n_tensors, 8);
    put_to(&n_kv_, 8);
    put_to(head_.data() + 8, head_.size() - 8);
    uint64_t offset = 0;
    std::vector<uint64_t> offsets;
    for (const auto& t : tensors_) {
      offsets.push_back(offset);
      offset += (t.data.size() + alignment_ - 1) / alignment_ * alignment_;
    }
    for (size_t i = 0; i < tensors_.size(); ++i) {
      const auto& t = tensors_[i];
      const uint64_t len = t.name.size();
      put_to(&len, 8);
      put_to(t.name.data(), len);
      const uint32_t n_dims = static_cast<uint32_t>(t.ne.size());
      put_to(&n_dims, 4);
      for (uint64_t d : t.ne) put_to(&d, 8);
      put_to(&t.type, 4);
      const uint64_t off = offsets[i] + offset_bias;
      put_to(&off, 8);
    }
    while (out.size() % alignment_) out.push_back(0);
    for (const auto& t : tensors_) {
      put_to(t.data.data(), t.data.size());
      while (out.size() % alignment_) out.push_back(0);
    }
    return out;
  }

 private:
  struct Tensor {
    std::string name;
    std::vector<uint64_t> ne;
    uint32_t type;
    std::vector<uint8_t> data;
  };
  template <class T>
  void put(T v) {
    const uint8_t* b = reinterpret_cast<const uint8_t*>(&v);
    head_.insert(head_.end(), b, b + sizeof(T));
  }
  void str(const std::string& s) {
    put<uint64_t>(s.size());
    head_.insert(head_.end(), s.begin(), s.end());
  }
  void key_type(const std::string& key, uint32_t type) {
    str(key);
    put(type);
  }

  uint32_t alignment_;
  uint64_t n_kv_ = 0;
  std::vector<uint8_t> head_;  // magic, version, then metadata (counts inserted by finish)
  std::vector<Tensor> tensors_;
};

// Writes bytes to a fresh file under the test's temporary folder and returns its path.
std::string write_temp_file(const std::string& name, const std::vector<uint8_t>& bytes);

}  // namespace specdec::test
