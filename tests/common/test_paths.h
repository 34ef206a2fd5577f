// Where the tests find their data: ../shared (SPECDEC_SHARED_DIR at configure time, or the
// environment variable of the same name; shared_data.cpp) and the default model in the setup
// cache (test_paths.cpp).
#pragma once

#include <string>

namespace specdec::test {

std::string shared_dir();                 // .../shared
std::string tiny_model(const char* name);  // shared/models/tiny/<name>
std::string golden_file(const char* name);  // shared/golden/<name>
std::string fixture_dir();                // shared/tokenizer-fixtures
// Empty when shared_dir() holds the test data, else the message to show ("shared test data not
// found at ..."). Binaries that use the paths above check it before their first test
// (shared_data.cpp).
std::string shared_data_missing_message();
std::string cache_dir();                  // $SPECDEC_CACHE or ~/.cache/specdec
std::string default_model_path();         // cache_dir()/SmolLM2-135M-Instruct.Q4_1.gguf
bool file_exists(const std::string& path);
std::string read_file(const std::string& path);
// Runs a shell command and returns its stdout (stderr goes to the test's log unless the command
// redirects it); *status = pclose's status (-1 if the command could not start).
std::string run_stdout(const std::string& cmd, int* status);

}  // namespace specdec::test
