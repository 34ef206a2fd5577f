// GGUF reader: real files, every metadata type, and malformed files that must give a clear
// specdec::Error (never a crash or an out-of-bounds read).
#include <gtest/gtest.h>

#include <limits>

#include "common/gguf_writer.h"
#include "common/test_paths.h"
#include "model/gguf.h"
#include "model/model.h"
#include "util/check.h"

namespace specdec {
namespace {

using test::GgufWriter;
using test::write_temp_file;

// Expects open(path) to throw specdec::Error whose message contains every needle.
void expect_open_error(const std::string& path, std::initializer_list<const char*> needles) {
  try {
    GgufFile::open(path);
    FAIL() << "expected an error for " << path;
  } catch (const Error& e) {
    const std::string msg = e.what();
    for (const char* needle : needles) {
      EXPECT_NE(msg.find(needle), std::string::npos) << "message: " << msg << "\nmissing: " << needle;
    }
  }
}

std::vector<uint8_t> small_valid_file() {
  GgufWriter w;
  w.kv_str("general.architecture", "llama");
  w.kv_u32("llama.block_count", 2);
  w.kv_str_array("tokenizer.ggml.tokens", {"a", "b", "c"});
  std::vector<float> values(16);
  for (int i = 0; i < 16; ++i) values[i] = static_cast<float>(i);
  w.tensor_f32("w0", {8, 2}, values);  // 64 bytes: no padding after the last tensor
  w.tensor_f32("w1", {16}, values);
  return w.finish();
}

TEST(Gguf, ReadsTinyModel) {
  auto f = GgufFile::open(test::tiny_model("stories260K.gguf"));
  EXPECT_EQ(f->version(), 3u);
  EXPECT_EQ(f->tensors().size(), 48u);
  EXPECT_EQ(f->get_string("general.architecture"), "llama");
  EXPECT_EQ(f->get_int("llama.embedding_length"), 64);
  EXPECT_EQ(f->get_int("llama.attention.head_count_kv"), 4);
  EXPECT_NEAR(*f->get_float("llama.attention.layer_norm_rms_epsilon"), 1e-5, 1e-9);
  ASSERT_NE(f->get_string_array("tokenizer.ggml.tokens"), nullptr);
  EXPECT_EQ(f->get_string_array("tokenizer.ggml.tokens")->size(), 512u);
  EXPECT_EQ(f->get_float_array("tokenizer.ggml.scores")->size(), 512u);
  EXPECT_EQ(f->get_int_array("tokenizer.ggml.token_type")->size(), 512u);
  const GgufTensor* t = f->find_tensor("blk.0.ffn_gate.weight");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->type, GgmlType::kF32);
  EXPECT_EQ(t->ne, (std::vector<int64_t>{64, 172}));
  EXPECT_EQ(t->nbytes, 64u * 172 * 4);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(t->data) % f->alignment(), 0u);
  EXPECT_EQ(f->find_tensor("nope"), nullptr);
  // A key of the wrong type is an error, not a silent misread.
  EXPECT_THROW(f->get_string("llama.embedding_length"), Error);
  EXPECT_THROW(f->get_string_array("tokenizer.ggml.scores"), Error);
}

TEST(Gguf, EveryValueTypeRoundTrips) {
  for (uint32_t version : {2u, 3u}) {
    GgufWriter w(version);
    w.kv_u32("u32", 4000000000u);
    w.kv_i32("i32", -7);
    w.kv_u64("u64", 1ull << 40);
    w.kv_f32("f32", 0.5f);
    w.kv_f64("f64", -2.25);
    w.kv_bool("flag", true);
    w.kv_str("s", "héllo");
    w.kv_str_array("strs", {"x", "", "yz"});
    w.kv_f32_array("floats", {1.5f, -2.0f});
    w.kv_i32_array("ints", {3, -4, 5});
    const std::string path = write_temp_file("types.gguf", w.finish());
    auto f = GgufFile::open(path);
    EXPECT_EQ(f->version(), version);
    EXPECT_EQ(f->keys().size(), 10u);
    EXPECT_EQ(f->get_int("u32"), 4000000000ll);
    EXPECT_EQ(f->get_int("i32"), -7);
    EXPECT_EQ(f->get_int("u64"), 1ll << 40);
    EXPECT_EQ(f->get_float("f32"), 0.5);
    EXPECT_EQ(f->get_float("f64"), -2.25);
    EXPECT_EQ(f->get_bool("flag"), true);
    EXPECT_EQ(f->get_string("s"), "héllo");
    EXPECT_EQ(*f->get_string_array("strs"), (std::vector<std::string>{"x", "", "yz"}));
    EXPECT_EQ(*f->get_float_array("floats"), (std::vector<double>{1.5, -2.0}));
    EXPECT_EQ(*f->get_int_array("ints"), (std::vector<int64_t>{3, -4, 5}));
    EXPECT_FALSE(f->get_int("absent").has_value());
  }
}

TEST(Gguf, EveryTruncationIsAnError) {
  const std::vector<uint8_t> full = small_valid_file();
  ASSERT_NO_THROW(GgufFile::open(write_temp_file("full.gguf", full)));
  for (size_t len = 0; len < full.size(); ++len) {
    std::vector<uint8_t> cut(full.begin(), full.begin() + len);
    const std::string path = write_temp_file("cut.gguf", cut);
    EXPECT_THROW(GgufFile::open(path), Error) << "prefix of " << len << " bytes was accepted";
  }
}

TEST(Gguf, TruncatedRealModelNamesTheTensor) {
  const std::string src = test::read_file(test::tiny_model("stories260K.gguf"));
  std::vector<uint8_t> half(src.begin(), src.begin() + src.size() / 2);
  const std::string path = write_temp_file("half.gguf", half);
  expect_open_error(path, {path.c_str(), "tensor", "extends past the end"});
}

TEST(Gguf, BadMagicAndVersion) {
  std::vector<uint8_t> f = small_valid_file();
  f[0] = 'X';
  expect_open_error(write_temp_file("magic.gguf", f), {"bad magic"});
  f = small_valid_file();
  f[4] = 1;
  expect_open_error(write_temp_file("v1.gguf", f), {"version 1"});
  f[4] = 9;
  expect_open_error(write_temp_file("v9.gguf", f), {"unsupported version 9"});
  expect_open_error("/nonexistent/model.gguf", {"/nonexistent/model.gguf", "cannot open"});
}

TEST(Gguf, BadTensorOffsets) {
  GgufWriter w;
  w.tensor_f32("w", {8}, std::vector<float>(8, 1.0f));
  expect_open_error(write_temp_file("misaligned.gguf", w.finish(4)), {"'w'", "not aligned"});
  expect_open_error(write_temp_file("far.gguf", w.finish(1ull << 40)), {"'w'", "past the end"});
  // An offset so large that offset + size wraps around 2^64.
  expect_open_error(write_temp_file("wrap.gguf", w.finish(~0ull - 31)), {"'w'"});
}

TEST(Gguf, HugeCounts) {
  auto with_u64_at = [](std::vector<uint8_t> f, size_t at, uint64_t v) {
    std::memcpy(f.data() + at, &v, 8);
    return f;
  };
  const std::vector<uint8_t> base = small_valid_file();
  // Tensor count at byte 8, metadata count at byte 16.
  expect_open_error(write_temp_file("nt.gguf", with_u64_at(base, 8, 1ull << 60)), {"tensor count"});
  expect_open_error(write_temp_file("nkv.gguf", with_u64_at(base, 16, ~0ull)), {"metadata count"});
  // First key length at byte 24.
  expect_open_error(write_temp_file("klen.gguf", with_u64_at(base, 24, 1ull << 62)), {"length"});

  GgufWriter w;
  w.kv_str_array("arr", {"a"});
  std::vector<uint8_t> f = w.finish();
  // Layout: header 24 | key len 8 | "arr" 3 | type 4 | elem type 4 | count 8
  f = with_u64_at(f, 24 + 8 + 3 + 4 + 4, 1ull << 61);
  expect_open_error(write_temp_file("arr.gguf", f), {"'arr'", "elements"});
}

TEST(Gguf, BadTensorInfo) {
  {
    GgufWriter w;
    w.tensor("t", {32}, 77, std::vector<uint8_t>(64));
    expect_open_error(write_temp_file("type.gguf", w.finish()), {"'t'", "unknown type 77"});
  }
  {
    GgufWriter w;
    w.tensor("q", {33}, /*Q8_0=*/8, std::vector<uint8_t>(64));
    expect_open_error(write_temp_file("rowlen.gguf", w.finish()), {"'q'", "multiple of 32"});
  }
  {
    GgufWriter w;
    w.tensor("d", {1, 1, 1, 1, 1}, 0, std::vector<uint8_t>(4));
    expect_open_error(write_temp_file("dims.gguf", w.finish()), {"'d'", "5 dimensions"});
  }
  {
    GgufWriter w;
    w.tensor("big", {1ull << 40, 1ull << 40}, 0, std::vector<uint8_t>(4));
    expect_open_error(write_temp_file("bigdim.gguf", w.finish()), {"'big'", "too large"});
  }
  {
    // 2^62 float32 elements pass the element-count bound but are 2^64 bytes: the byte count
    // must be refused, not wrapped to 0 (found by fuzz_gguf; fuzz/corpus/gguf/huge-tensor).
    GgufWriter w;
    w.tensor("wide", {1ull << 31, 1ull << 31}, 0, std::vector<uint8_t>(4));
    expect_open_error(write_temp_file("bigbytes.gguf", w.finish()), {"'wide'", "too large"});
  }
  {
    GgufWriter w;
    w.tensor_f32("dup", {8}, std::vector<float>(8));
    w.tensor_f32("dup", {8}, std::vector<float>(8));
    expect_open_error(write_temp_file("dup.gguf", w.finish()), {"'dup'", "twice"});
  }
}

// Model-level checks: a readable file that is not a usable model.
void expect_load_error(const std::vector<uint8_t>& bytes, std::initializer_list<const char*> needles) {
  const std::string path = write_temp_file("model.gguf", bytes);
  try {
    Model::load(path);
    FAIL() << "expected a load error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(path), std::string::npos) << msg;
    for (const char* needle : needles) EXPECT_NE(msg.find(needle), std::string::npos) << msg;
  }
}

GgufWriter tiny_llama_header(const std::string& arch = "llama") {
  GgufWriter w;
  w.kv_str("general.architecture", arch);
  w.kv_u32(arch + ".embedding_length", 32);
  w.kv_u32(arch + ".block_count", 1);
  w.kv_u32(arch + ".attention.head_count", 4);
  w.kv_u32(arch + ".feed_forward_length", 64);
  w.kv_str_array("tokenizer.ggml.tokens", {"a", "b", "c", "d"});
  return w;
}

TEST(Gguf, ModelLoadErrors) {
  expect_load_error(tiny_llama_header("gpt5").finish(), {"unsupported architecture 'gpt5'"});
  {
    GgufWriter w;
    w.kv_str("general.architecture", "llama");
    expect_load_error(w.finish(), {"llama.embedding_length", "missing"});
  }
  {
    GgufWriter w = tiny_llama_header();
    w.tensor_f32("token_embd.weight", {32, 4}, std::vector<float>(128));
    expect_load_error(w.finish(), {"output_norm.weight", "missing"});
  }
  {
    GgufWriter w = tiny_llama_header();
    w.tensor_f32("token_embd.weight", {32, 5}, std::vector<float>(160));
    expect_load_error(w.finish(), {"token_embd.weight", "shape"});
  }
  {
    GgufWriter w = tiny_llama_header();
    w.tensor("token_embd.weight", {256, 4}, /*Q2_K=*/10, std::vector<uint8_t>(84 * 4));
    w.kv_u32("llama.embedding_length", 256);  // duplicate key → malformed before type check
    expect_load_error(w.finish(), {"twice"});
  }
  {
    GgufWriter w;
    w.kv_str("general.architecture", "llama");
    w.kv_u32("llama.embedding_length", 256);
    w.kv_u32("llama.block_count", 1);
    w.kv_u32("llama.attention.head_count", 4);
    w.kv_u32("llama.feed_forward_length", 64);
    w.kv_str_array("tokenizer.ggml.tokens", {"a", "b", "c", "d"});
    w.tensor("token_embd.weight", {256, 4}, /*Q2_K=*/10, std::vector<uint8_t>(84 * 4));
    expect_load_error(w.finish(), {"token_embd.weight", "Q2_K", "not support"});
  }
}

}  // namespace
}  // namespace specdec
