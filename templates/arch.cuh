/**
 * @file arch.cuh
 * @brief Maps the compilation target to gdnc's own feature macros. The only place that reads
 *        __CUDA_ARCH__ or the arch-specific feature macros.
 *
 * GDN_ARCH            compute capability as an integer (90, 100, 103)
 * GDN_HAS_MMA_SYNC    warp-level mma.sync bf16 -> fp32 (every supported target)
 * GDN_HAS_WGMMA       Hopper warpgroup MMA (sm_90a only)
 * GDN_HAS_TCGEN05     Blackwell tensor-core gen 5 (sm_100a, sm_103a)
 */
#pragma once

#if defined(__CUDA_ARCH__)
#define GDN_ARCH (__CUDA_ARCH__ / 10)
#else
#define GDN_ARCH 0
#endif

#if GDN_ARCH != 0 && GDN_ARCH < 90
#error "gdnc templates need sm_90a or newer"
#endif

#define GDN_HAS_MMA_SYNC 1

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define GDN_HAS_WGMMA 1
#else
#define GDN_HAS_WGMMA 0
#endif

#if defined(__CUDA_ARCH_FEAT_SM100_ALL) || defined(__CUDA_ARCH_FEAT_SM103_ALL)
#define GDN_HAS_TCGEN05 1
#else
#define GDN_HAS_TCGEN05 0
#endif
