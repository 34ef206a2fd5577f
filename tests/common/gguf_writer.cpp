#include "common/gguf_writer.h"

#include <unistd.h>

#include <fstream>
#include <stdexcept>

namespace specdec::test {

std::string write_temp_file(const std::string& name, const std::vector<uint8_t>& bytes) {
  const char* tmp = std::getenv("TMPDIR");
  const std::string path = std::string(tmp && *tmp ? tmp : "/tmp") + "/specdec_test_" +
                           std::to_string(::getpid()) + "_" + name;
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  if (!out) throw std::runtime_error("cannot write " + path);
  return path;
}

}  // namespace specdec::test
