// The specdec sub-commands. Each adds itself to the CLI11 app; its callback runs the command.
#pragma once

namespace CLI {
class App;
}

namespace specdec::cli {

void add_generate_command(CLI::App& app);
void add_bench_command(CLI::App& app);
void add_serve_command(CLI::App& app);
void add_train_drafter_command(CLI::App& app);

}  // namespace specdec::cli
