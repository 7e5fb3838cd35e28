/**
 * @file reference_c.cpp
 * @brief A C entry point to the fp64 reference, for Python (the benchmark's accuracy gate and
 *        the binding's tests) through ctypes: libgdn_reference.so.
 */
#include "runtime/check/gdn_reference.hpp"

#include <cstdio>
#include <cstring>
#include <exception>

extern "C" {

/**
 * Forward (and, if backward != 0, backward for loss = sum(o .* d_o) + sum(ht .* dht)) of the
 * fp64 reference. All arrays are fp64, token-major contiguous; h0, dht, ht and dh0 may be NULL.
 * Returns 0, or 1 with a message in err (up to err_size bytes).
 */
int gdn_ref_run(int64_t T, int H, int HV, int K, int V, const int64_t* cu_seqlens, int N, double scale, int l2norm,
                const double* q, const double* k, const double* v, const double* g, const double* beta,
                const double* h0, int backward, const double* d_o, const double* dht, double* o, double* ht, double* dq,
                double* dk, double* dv, double* dg, double* dbeta, double* dh0, char* err, size_t err_size) {
  try {
    gdn::ref::Problem p;
    p.T = T;
    p.H = H;
    p.HV = HV;
    p.K = K;
    p.V = V;
    p.cu_seqlens.assign(cu_seqlens, cu_seqlens + N + 1);
    p.scale = scale;
    p.l2norm = l2norm != 0;
    p.has_h0 = h0 != nullptr;
    const size_t tqk = static_cast<size_t>(T) * H * K, tv = static_cast<size_t>(T) * HV * V;
    const size_t th = static_cast<size_t>(T) * HV, state = static_cast<size_t>(N) * HV * K * V;
    gdn::ref::Inputs in;
    in.q.assign(q, q + tqk);
    in.k.assign(k, k + tqk);
    in.v.assign(v, v + tv);
    in.g.assign(g, g + th);
    in.beta.assign(beta, beta + th);
    if (h0) in.h0.assign(h0, h0 + state);
    gdn::ref::validate(p);
    const gdn::ref::Outputs out = gdn::ref::forward(p, in);
    std::memcpy(o, out.o.data(), tv * sizeof(double));
    if (ht) std::memcpy(ht, out.ht.data(), state * sizeof(double));
    if (backward) {
      const std::vector<double> dov(d_o, d_o + tv);
      const std::vector<double> dhtv = dht ? std::vector<double>(dht, dht + state) : std::vector<double>{};
      const gdn::ref::Grads gr = gdn::ref::backward(p, in, dov, dhtv);
      std::memcpy(dq, gr.dq.data(), tqk * sizeof(double));
      std::memcpy(dk, gr.dk.data(), tqk * sizeof(double));
      std::memcpy(dv, gr.dv.data(), tv * sizeof(double));
      std::memcpy(dg, gr.dg.data(), th * sizeof(double));
      std::memcpy(dbeta, gr.dbeta.data(), th * sizeof(double));
      if (dh0 && h0) std::memcpy(dh0, gr.dh0.data(), state * sizeof(double));
    }
    return 0;
  } catch (const std::exception& e) {
    if (err && err_size) std::snprintf(err, err_size, "%s", e.what());
    return 1;
  }
}

}  // extern "C"
