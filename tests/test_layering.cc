// test_layering.cc — the layers of src/ and which may include which (issue 36): a file includes
// headers of its own room and of the rooms below it, never above. The table is the design; a
// failure names the file, the line and the include that runs upward. Rooms are the first path
// component under src/ (and include/onyx for the public headers, tools/onyx for the CLI,
// python/ for the extension).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <string>
#include <vector>

namespace fs = std::filesystem;

namespace {

// Each room and the rooms it may include (besides itself). Lower rooms first.
const std::vector<std::pair<std::string, std::set<std::string>>>& layers() {
  static const std::vector<std::pair<std::string, std::set<std::string>>> table = {
      {"onyx", {}},  // include/onyx: the public headers
      {"io", {"onyx"}},
      {"ir", {"onyx", "io"}},
      {"quant", {"onyx", "io", "ir"}},  // weight formats (bitsandbytes' 4-bit) and their storage
      {"runtime", {"onyx", "io", "ir"}},
      {"kernels", {"onyx", "io", "ir", "quant", "runtime"}},
      {"autodiff", {"onyx", "io", "ir", "runtime", "kernels"}},
      {"passes", {"onyx", "io", "ir", "quant", "runtime", "kernels", "autodiff"}},
      {"custom_ops", {"onyx", "io", "ir", "runtime", "kernels", "autodiff"}},
      {"models", {"onyx", "io", "ir", "quant", "runtime", "kernels", "autodiff", "passes"}},
      {"tokenizers", {"onyx", "io"}},
      {"templates", {"onyx", "io", "tokenizers"}},
      {"data", {"onyx", "io", "tokenizers", "templates"}},
      {"dist", {"onyx", "runtime"}},
      {"diffusion",  // diffusers' UNets as graphs, noise schedules, the sampler, the text encoder
       {"onyx", "io", "ir", "quant", "runtime", "kernels", "autodiff", "passes", "models",
        "tokenizers"}},
      {"generate",
       {"onyx", "io", "ir", "quant", "runtime", "kernels", "autodiff", "passes", "models",
        "tokenizers", "templates"}},
      {"train",
       {"onyx", "io", "ir", "quant", "runtime", "kernels", "autodiff", "passes", "custom_ops",
        "models", "tokenizers", "templates", "data", "dist", "generate"}},
      {"config",
       {"onyx", "io", "ir", "quant", "runtime", "kernels", "autodiff", "passes", "custom_ops",
        "models", "tokenizers", "templates", "data", "dist", "diffusion", "generate", "train"}},
      {"capi",  // the C API (include/onyx/onyx_c.h) over the Trainer and the configs
       {"onyx", "io", "ir", "quant", "runtime", "kernels", "autodiff", "passes", "custom_ops",
        "models", "tokenizers", "templates", "data", "dist", "diffusion", "generate", "train",
        "config"}},
  };
  return table;
}

struct Include {
  std::string file;
  int line;
  std::string header;
};

// The room of a header as included ("kernels/cpu/gemm.h" -> kernels; "onyx/trainer.h" -> onyx),
// or "" for a header that is not onyx's (standard, system, third-party).
std::string room_of_header(const std::string& header, const std::set<std::string>& rooms) {
  auto slash = header.find('/');
  if (slash == std::string::npos) return "";
  std::string first = header.substr(0, slash);
  return rooms.count(first) ? first : "";
}

std::vector<Include> quoted_includes(const fs::path& file, const std::string& shown) {
  static const std::regex inc(R"(^\s*#\s*include\s*"([^"]+)\")");
  std::vector<Include> out;
  std::ifstream in(file);
  std::string line;
  for (int n = 1; std::getline(in, line); n++) {
    std::smatch m;
    if (std::regex_search(line, m, inc)) out.push_back({shown, n, m[1]});
  }
  return out;
}

// Every include of `dir`'s sources that runs outside what `allowed` (the room's row) permits.
std::vector<std::string> upward_includes(const fs::path& root, const std::string& room,
                                         const std::set<std::string>& allowed,
                                         const std::set<std::string>& rooms) {
  std::vector<std::string> bad;
  fs::path dir = room == "onyx" ? root / "include" / "onyx" : root / "src" / room;
  if (!fs::exists(dir)) return bad;
  for (auto& e : fs::recursive_directory_iterator(dir)) {
    auto ext = e.path().extension();
    if (!e.is_regular_file() ||
        (ext != ".cc" && ext != ".h" && ext != ".cu" && ext != ".cuh" && ext != ".inc"))
      continue;
    std::string shown = fs::relative(e.path(), root).string();
    for (auto& i : quoted_includes(e.path(), shown)) {
      std::string to = room_of_header(i.header, rooms);
      if (to.empty() || to == room || allowed.count(to)) continue;
      bad.push_back(i.file + ":" + std::to_string(i.line) + ": #include \"" + i.header +
                    "\" (room '" + room + "' may not include '" + to + "')");
    }
  }
  return bad;
}

std::set<std::string> room_names() {
  std::set<std::string> rooms;
  for (auto& [r, _] : layers()) rooms.insert(r);
  return rooms;
}

TEST(Layering, NoIncludeRunsUpward) {
  const fs::path root = ONYX_SOURCE_DIR;
  const auto rooms = room_names();
  std::vector<std::string> bad;
  for (auto& [room, allowed] : layers())
    for (auto& b : upward_includes(root, room, allowed, rooms)) bad.push_back(b);
  std::string all;
  for (auto& b : bad) all += "  " + b + "\n";
  EXPECT_TRUE(bad.empty()) << bad.size() << " include(s) run upward:\n" << all;
}

// Every room under src/ is in the table (a new room must say where it sits).
TEST(Layering, EveryRoomHasARow) {
  const fs::path root = ONYX_SOURCE_DIR;
  const auto rooms = room_names();
  for (auto& e : fs::directory_iterator(root / "src")) {
    if (!e.is_directory()) continue;
    EXPECT_TRUE(rooms.count(e.path().filename().string()))
        << "src/" << e.path().filename().string() << " has no row in test_layering.cc";
  }
}

// The table is a strict order: no room may include a room that may include it back.
TEST(Layering, TableHasNoCycle) {
  std::map<std::string, std::set<std::string>> row(layers().begin(), layers().end());
  for (auto& [room, allowed] : row)
    for (auto& below : allowed)
      EXPECT_FALSE(row[below].count(room)) << room << " and " << below << " include each other";
}

// The check itself: a planted upward include is reported with its file and line.
TEST(Layering, ReportsAPlantedUpwardInclude) {
  fs::path tmp = fs::temp_directory_path() / "onyx-layering-test";
  fs::remove_all(tmp);
  fs::create_directories(tmp / "src" / "io");
  std::ofstream(tmp / "src" / "io" / "planted.cc") << "// planted\n#include \"train/trainer.h\"\n";
  auto bad = upward_includes(tmp, "io", {"onyx"}, room_names());
  fs::remove_all(tmp);
  ASSERT_EQ(bad.size(), 1u);
  EXPECT_NE(bad[0].find("src/io/planted.cc:2"), std::string::npos) << bad[0];
  EXPECT_NE(bad[0].find("may not include 'train'"), std::string::npos) << bad[0];
}

}  // namespace
