// gguf_one: the GGUF reader on arbitrary bytes. GgufFile reads a path (it maps the file), so the
// bytes go to an anonymous in-memory file (memfd) opened through /proc/self/fd.
#include <sys/mman.h>
#include <unistd.h>

#include <memory>
#include <string>

#include "fuzz/fuzz_entries.h"
#include "model/config.h"
#include "model/gguf.h"
#include "tokenizer/tokenizer.h"
#include "util/check.h"

namespace specdec::fuzz {
namespace {

// An in-memory file holding the input, closed when it goes out of scope.
class MemFile {
 public:
  MemFile(const uint8_t* data, size_t size) : fd_(::memfd_create("specdec-fuzz", MFD_CLOEXEC)) {
    FUZZ_CHECK(fd_ >= 0);
    size_t done = 0;
    while (done < size) {
      const ssize_t n = ::write(fd_, data + done, size - done);
      FUZZ_CHECK(n > 0);
      done += static_cast<size_t>(n);
    }
  }
  ~MemFile() { ::close(fd_); }
  MemFile(const MemFile&) = delete;
  MemFile& operator=(const MemFile&) = delete;
  std::string path() const { return "/proc/self/fd/" + std::to_string(fd_); }

 private:
  int fd_;
};

// Every typed getter on every key: each either answers or throws Error for the wrong type.
void read_every_key(const GgufFile& f) {
  for (const std::string& key : f.keys()) {
    FUZZ_CHECK(f.find(key) != nullptr);
    try { (void)f.get_int(key); } catch (const Error&) {}
    try { (void)f.get_float(key); } catch (const Error&) {}
    try { (void)f.get_bool(key); } catch (const Error&) {}
    try { (void)f.get_string(key); } catch (const Error&) {}
    try { (void)f.get_string_array(key); } catch (const Error&) {}
    try { (void)f.get_int_array(key); } catch (const Error&) {}
    try { (void)f.get_float_array(key); } catch (const Error&) {}
  }
}

// Every tensor lies inside the file, its size is what its shape and type say (computed here
// without overflow), and each byte of it can be read.
void check_tensors(const GgufFile& f) {
  for (const GgufTensor& t : f.tensors()) {
    FUZZ_CHECK(f.find_tensor(t.name) == &t);
    const GgmlTypeTraits* traits = ggml_type_traits(static_cast<uint32_t>(t.type));
    FUZZ_CHECK(traits != nullptr);
    unsigned __int128 elements = 1;
    for (int64_t d : t.ne) {
      FUZZ_CHECK(d >= 0);
      elements *= static_cast<unsigned __int128>(d);
    }
    const unsigned __int128 bytes = elements / static_cast<unsigned __int128>(traits->block_size) *
                                    static_cast<unsigned __int128>(traits->block_bytes);
    FUZZ_CHECK(bytes == t.nbytes);
    FUZZ_CHECK(static_cast<unsigned __int128>(t.offset) + t.nbytes <= f.file_size());
    if (t.nbytes > 0) {
      // The first and the last byte: past the mapping, this faults.
      volatile uint8_t first = t.data[0];
      volatile uint8_t last = t.data[t.nbytes - 1];
      (void)first;
      (void)last;
    }
  }
}

}  // namespace

void gguf_one(const uint8_t* data, size_t size) {
  MemFile file(data, size);
  std::unique_ptr<GgufFile> f;
  try {
    f = GgufFile::open(file.path());
  } catch (const Error&) {
    return;  // rejected with a message: what a malformed file should get
  }
  FUZZ_CHECK(f->version() == 2 || f->version() == 3);
  FUZZ_CHECK(f->keys().size() <= size);
  read_every_key(*f);
  check_tensors(*f);
  try {
    (void)ModelConfig::from_gguf(*f);
  } catch (const Error&) {
  }
  std::unique_ptr<Tokenizer> tok;
  try {
    tok = Tokenizer::from_gguf(*f);
  } catch (const Error&) {
    return;
  }
  // A tokenizer that loads gives ids inside its vocabulary, and decodes them.
  std::vector<int32_t> ids;
  try {
    ids = tok->encode("Hello <s> world \xe2\x96\x81 \xff!", true, true);
  } catch (const Error&) {
    return;
  }
  for (int32_t id : ids) FUZZ_CHECK(id >= 0 && id < tok->n_vocab());
  (void)tok->decode(ids);
}

}  // namespace specdec::fuzz
