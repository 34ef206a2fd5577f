// specdec: command-line entry point.
#include <cstdio>
#include <exception>

#include <CLI/CLI.hpp>

#include "commands.h"
#include "backend/cpu/cpu_features.h"
#include "util/check.h"

int main(int argc, char** argv) {
  CLI::App app{"specdec: LLM inference with speculative decoding"};
  app.require_subcommand(1);
  specdec::cli::add_generate_command(app);
  specdec::cli::add_bench_command(app);
  specdec::cli::add_serve_command(app);
  specdec::cli::add_train_drafter_command(app);
  try {
    specdec::set_isa(specdec::detect_isa());  // validates SPECDEC_ISA once, up front
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const specdec::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  }
  return 0;
}
