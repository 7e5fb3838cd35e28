/**
 * @file test_nccl.cpp
 * @brief The NCCL loader (runtime/nccl.hpp) against stand-in libraries with NCCL 2's C ABI: the
 *        entry points and their argument passing, the version gate, a missing entry point, a
 *        library that is not there, the search order.
 */
#include "runtime/nccl.hpp"

#include <doctest/doctest.h>

#include <cstdlib>
#include <string>

using gdn::rt::Nccl;
using gdn::rt::NcclError;
namespace abi = gdn::rt::nccl_abi;

TEST_SUITE("nccl") {
  TEST_CASE("a library with NCCL 2's entry points loads, reports its version, and its calls pass their arguments") {
    const Nccl& n = Nccl::load(GDN_FAKE_NCCL_OK);
    CHECK(n.version() == 21803);
    CHECK(n.version_text() == "2.18.3");
    CHECK(n.library() == GDN_FAKE_NCCL_OK);
    CHECK(&Nccl::load(GDN_FAKE_NCCL_OK) == &n);  // loaded once
    abi::UniqueId id;
    n.check(n.get_unique_id(&id), "ncclGetUniqueId");
    abi::Comm comm = nullptr;
    n.check(n.comm_init_rank(&comm, 4, id, 3), "ncclCommInitRank");
    int count = 0, rank = -1;
    n.check(n.comm_count(comm, &count), "ncclCommCount");
    n.check(n.comm_user_rank(comm, &rank), "ncclCommUserRank");
    CHECK(count == 4);
    CHECK(rank == 3);  // the 128-byte id arrived by value, the integers after it
    n.check(n.all_gather(nullptr, nullptr, 16, abi::kFloat32, comm, nullptr), "ncclAllGather");
    CHECK_THROWS_WITH_AS(n.check(n.all_gather(nullptr, nullptr, 0, abi::kFloat32, comm, nullptr), "ncclAllGather"),
                         "ncclAllGather: invalid argument (fake) (ncclResult_t 4)", NcclError);
    CHECK_THROWS_WITH_AS(n.check(n.comm_init_rank(&comm, 2, id, 2), "ncclCommInitRank(rank 2 of 2)"),
                         "ncclCommInitRank(rank 2 of 2): invalid argument (fake) (ncclResult_t 4)", NcclError);
    n.check(n.comm_destroy(comm), "ncclCommDestroy");
  }

  TEST_CASE("too old a version, a missing entry point and a missing library are refused by name") {
    const std::string old_lib = GDN_FAKE_NCCL_OLD, partial = GDN_FAKE_NCCL_PARTIAL;
    CHECK_THROWS_WITH_AS(Nccl::load(old_lib),
                         ("NCCL library " + old_lib + " is version 2.15.0 (21500): gdnc needs 2.18 or newer").c_str(),
                         NcclError);
    CHECK_THROWS_WITH_AS(Nccl::load(partial),
                         ("NCCL library " + partial + " has no entry point ncclAllGather (not NCCL 2?)").c_str(),
                         NcclError);
    // The same message again, without loading again.
    CHECK_THROWS_WITH_AS(Nccl::load(partial),
                         ("NCCL library " + partial + " has no entry point ncclAllGather (not NCCL 2?)").c_str(),
                         NcclError);
    try {
      Nccl::load("/nonexistent/libnccl.so.2");
      FAIL("loaded a library that does not exist");
    } catch (const NcclError& e) {
      const std::string m = e.what();
      CHECK(m.rfind("cannot load NCCL; tried:\n  /nonexistent/libnccl.so.2: ", 0) == 0);
      CHECK(m.find("GDNC_NCCL_LIBRARY") != std::string::npos);
    }
  }

  TEST_CASE("the search order: a given path alone, else $GDNC_NCCL_LIBRARY, then the loader's libnccl.so.2") {
    CHECK(gdn::rt::nccl_search_list("/opt/x/libnccl.so.2") == std::vector<std::string>{"/opt/x/libnccl.so.2"});
    ::unsetenv("GDN_NCCL_LIBRARY");
    ::setenv("GDNC_NCCL_LIBRARY", "/env/libnccl.so.2", 1);
    CHECK(gdn::rt::nccl_search_list("") == std::vector<std::string>{"/env/libnccl.so.2", "libnccl.so.2"});
    ::unsetenv("GDNC_NCCL_LIBRARY");
    CHECK(gdn::rt::nccl_search_list("") == std::vector<std::string>{"libnccl.so.2"});
  }
}
