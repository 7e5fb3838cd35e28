"""gdnc: Gated DeltaNet training kernels compiled per layer (JIT, NVRTC, disk cache).

    from gdnc import chunk_gated_delta_rule
    o, ht = chunk_gated_delta_rule(q, k, v, g, beta, use_qk_l2norm_in_kernel=True, cu_seqlens=cu,
                                   spec={"save_mode": "light", "deterministic": True})
"""

from . import cake, cp
from ._lib import CompileError, CudaError, GdncError, InputError, NcclError, SpecError, library
from .api import check_arguments, chunk_gated_delta_rule
from .spec import build as build_spec
from .spec import region_layout
from .spec import validate as validate_spec

__all__ = ["cake", "cp", "chunk_gated_delta_rule", "check_arguments", "build_spec", "validate_spec", "region_layout", "library", "GdncError",
           "InputError", "SpecError", "CompileError", "CudaError", "NcclError"]
