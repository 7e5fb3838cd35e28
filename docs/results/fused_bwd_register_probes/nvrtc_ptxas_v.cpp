#include <nvrtc.h>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>
namespace fs = std::filesystem;
int main(int argc, char** argv) {
  std::string tdir = argv[1];
  std::vector<std::string> names, texts;
  for (auto& e : fs::recursive_directory_iterator(tdir)) {
    if (!e.is_regular_file()) continue;
    auto p = e.path().string();
    if (p.find(".cuh") == std::string::npos && p.find(".hpp") == std::string::npos) continue;
    std::ifstream f(p);
    std::stringstream ss;
    ss << f.rdbuf();
    names.push_back(fs::relative(e.path(), tdir).string());
    texts.push_back(ss.str());
  }
  std::vector<const char*> hn, ht;
  for (size_t i = 0; i < names.size(); ++i) {
    hn.push_back(names[i].c_str());
    ht.push_back(texts[i].c_str());
  }
  std::ifstream f(argv[2]);
  std::stringstream ss;
  ss << f.rdbuf();
  std::string src = ss.str();
  std::vector<std::string> opts = {"--gpu-architecture=sm_90a", "--std=c++17", "--device-as-default-execution-space",
                                   "-DGDN_NVRTC=1", "--ptxas-options=-v"};
  for (int a = 3; a < argc; ++a) opts.push_back(argv[a]);
  std::vector<const char*> op;
  for (auto& o : opts) op.push_back(o.c_str());
  nvrtcProgram prog;
  nvrtcCreateProgram(&prog, src.c_str(), "p.cu", (int)hn.size(), ht.data(), hn.data());
  nvrtcResult r = nvrtcCompileProgram(prog, (int)op.size(), op.data());
  size_t ls;
  nvrtcGetProgramLogSize(prog, &ls);
  std::string log(ls, 0);
  nvrtcGetProgramLog(prog, log.data());
  printf("%s\n%s\n", r == NVRTC_SUCCESS ? "OK" : "FAIL", log.c_str());
}
