// weft-plan: the memory plan of a training run, without running it. The first argument names
// the app, the rest are its training flags; --ranks N plans for N ranks (with --fsdp).
//   weft-plan transformer --fsdp --ranks 4 --n-layer 12 --d-model 512 --memory-budget 900M
//   weft-plan mnist --fsdp --ranks 2 --model cnn
// It runs `weft-transformer train --plan` or `weft-mnist --plan` (found beside weft-plan, or
// in the build tree's apps/<app>/) with those flags: one planner, the apps' own training step.
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

namespace fs = std::filesystem;

int main(int argc, char** argv) {
  const std::string usage =
      "usage: weft-plan transformer|mnist [--ranks N] [--memory-budget BYTES] [the app's training flags]\n"
      "  prints the predicted peak memory per rank and its parts (fsdp::plan_memory); with --memory-budget,\n"
      "  the reshard-after-forward and activation checkpointing settings that fit, or by how much none does\n";
  if (argc < 2 || std::strcmp(argv[1], "-h") == 0 || std::strcmp(argv[1], "--help") == 0) {
    std::fputs(usage.c_str(), argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  const std::string app = argv[1];
  if (app != "transformer" && app != "mnist") {
    std::fprintf(stderr, "weft-plan: unknown app \"%s\" (choose transformer or mnist)\n%s", app.c_str(), usage.c_str());
    return 2;
  }
  const std::string program = "weft-" + app;
  std::error_code ec;
  const fs::path self = fs::read_symlink("/proc/self/exe", ec);
  std::string exe;
  for (const fs::path& p : {self.parent_path() / program, self.parent_path().parent_path() / app / program})
    if (!ec && ::access(p.c_str(), X_OK) == 0) {
      exe = p.string();
      break;
    }
  if (exe.empty()) {
    std::fprintf(stderr, "weft-plan: %s is not beside %s (nor in ../%s/): install the apps together\n",
                 program.c_str(), self.c_str(), app.c_str());
    return 1;
  }
  std::vector<std::string> args = {exe};
  if (app == "transformer") args.push_back("train");
  bool ranks = false;
  for (int i = 2; i < argc; ++i) {
    std::string a = argv[i];
    if ((a == "--ranks" || a.starts_with("--ranks=")) && ranks) {
      std::fprintf(stderr, "weft-plan: --ranks is given more than once\n");
      return 2;
    }
    if (a == "--plan-ranks" || a.starts_with("--plan-ranks=")) {  // the app's name for --ranks, which becomes it
      std::fprintf(stderr, "weft-plan: --plan-ranks is the apps' flag; weft-plan's is --ranks\n");
      return 2;
    }
    if (a == "--ranks" || a.starts_with("--ranks=")) {
      // Checked here, so that the error names weft-plan's flag rather than the app's --plan-ranks.
      const std::string n = a == "--ranks" ? (i + 1 < argc ? argv[i + 1] : "") : a.substr(8);
      const bool digits = !n.empty() && n.size() <= 7 && n.find_first_not_of("0123456789") == std::string::npos;
      if (!digits || std::stol(n) < 1 || std::stol(n) > (1 << 20)) {
        std::fprintf(stderr, "weft-plan: --ranks: expected an integer from 1 to %d, got \"%s\"\n", 1 << 20, n.c_str());
        return 2;
      }
      a = a == "--ranks" ? "--plan-ranks" : "--plan-ranks=" + n;
      ranks = true;
    }
    args.push_back(a);
  }
  auto fsdp = [](const std::string& a) {  // --fsdp, or CLI11's --fsdp=VALUE with a true value (no, disable: false)
    return a == "--fsdp" || a == "--fsdp=true" || a == "--fsdp=1" || a == "--fsdp=on" || a == "--fsdp=yes" || a == "--fsdp=enable";
  };
  if (ranks && std::none_of(args.begin(), args.end(), fsdp)) {
    std::fprintf(stderr, "weft-plan: --ranks plans sharded training: add --fsdp\n");
    return 2;
  }
  if (!ranks) args.push_back("--plan");
  std::vector<char*> cargs;
  for (auto& a : args) cargs.push_back(a.data());
  cargs.push_back(nullptr);
  ::execv(exe.c_str(), cargs.data());
  std::fprintf(stderr, "weft-plan: cannot run %s: %s\n", exe.c_str(), std::strerror(errno));
  return 1;
}
