// Lowers a spec and compiles one of its programs with an installed gdnc (find_package(gdnc)).
#include "compiler/ir.hpp"
#include "compiler/nvrtc.hpp"

#include <cstdio>

int main() {
  const gdn::Spec spec =
      gdn::spec_from_json(nlohmann::json::parse(R"({"name": "consumer", "heads": {"qk": 2, "v": 6}})"));
  const gdn::LayerIR ir = gdn::lower(spec);
  const gdn::Program& p = ir.program("gate_cumsum");
  const gdn::CompiledProgram c = gdn::nvrtc_compile(p, gdn::Target::sm_90a, gdn::generate_source(p));
  std::printf("consumer: %zu programs lowered; %s compiled for sm_90a: %zu bytes of cubin, %d registers\n",
              ir.programs.size(), p.name.c_str(), c.cubin.size(), c.registers);
  return c.cubin.empty() ? 1 : 0;
}
