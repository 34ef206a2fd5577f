#include "common/test_paths.h"

#include <array>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <sstream>
#include <sys/stat.h>

namespace specdec::test {

std::string cache_dir() {
  if (const char* env = std::getenv("SPECDEC_CACHE"); env && *env) return env;
  const char* home = std::getenv("HOME");
  return std::string(home ? home : "/root") + "/.cache/specdec";
}
std::string default_model_path() { return cache_dir() + "/SmolLM2-135M-Instruct.Q4_1.gguf"; }

bool file_exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string run_stdout(const std::string& cmd, int* status) {
  std::unique_ptr<FILE, int (*)(FILE*)> pipe(popen(cmd.c_str(), "r"), pclose);
  if (!pipe) {
    *status = -1;
    return {};
  }
  std::string out;
  std::array<char, 4096> buf;
  size_t got;
  while ((got = fread(buf.data(), 1, buf.size(), pipe.get())) > 0) out.append(buf.data(), got);
  *status = pclose(pipe.release());
  return out;
}

}  // namespace specdec::test
