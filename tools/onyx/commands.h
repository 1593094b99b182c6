// commands.h — one function per `onyx` subcommand; each registers its CLI11 options and returns
// the action to run when that subcommand is chosen.
#pragma once
#include <CLI/CLI.hpp>
#include <functional>

namespace onyx::cli {

using Action = std::function<int()>;

Action add_run_command(CLI::App& app);
Action add_info_command(CLI::App& app);
Action add_conformance_command(CLI::App& app);
Action add_grad_command(CLI::App& app);
Action add_train_command(CLI::App& app);
Action add_evaluate_command(CLI::App& app);
Action add_predict_command(CLI::App& app);
Action add_export_command(CLI::App& app);
Action add_plan_command(CLI::App& app);
Action add_ops_command(CLI::App& app);
Action add_plot_command(CLI::App& app);
Action add_check_command(CLI::App& app);
Action add_launch_command(CLI::App& app);
Action add_consolidate_command(CLI::App& app);
Action add_chat_template_command(CLI::App& app);
Action add_generate_command(CLI::App& app);
Action add_whisper_features_command(CLI::App& app);
Action add_sample_command(CLI::App& app);
Action add_batch_command(CLI::App& app);

}  // namespace onyx::cli
