"""GPU tests of context parallelism through the binding (ctest label gpu; skipped without torch
and CUDA): ranks in processes of their own, each bitwise equal to the single-GPU proxy of the same
partition (kcp_ranks.py). On one GPU the ranks share it and gather through the host; with as many
GPUs as ranks they also run over NCCL."""

import subprocess
import sys
import unittest
from pathlib import Path

try:
    import torch
    HAVE_CUDA = torch.cuda.is_available()
    GPUS = torch.cuda.device_count() if HAVE_CUDA else 0
except ImportError:
    HAVE_CUDA, GPUS = False, 0

SCRIPT = Path(__file__).resolve().parent / "kcp_ranks.py"


def run_ranks(world, transport):
    done = subprocess.run([sys.executable, str(SCRIPT), "--world", str(world), "--transport", transport],
                          capture_output=True, text=True, timeout=900)
    print(done.stdout[-4000:], done.stderr[-4000:], sep="\n")
    return done


@unittest.skipUnless(HAVE_CUDA, "needs torch with CUDA")
class GpuKcpTests(unittest.TestCase):
    def test_ranks_sharing_one_gpu_give_the_proxys_bits(self):
        for world in (2, 4):
            with self.subTest(world=world):
                done = run_ranks(world, "host")
                self.assertEqual(done.returncode, 0, done.stdout[-2000:] + done.stderr[-2000:])
                self.assertIn(f"kcp_ranks: {world} ranks over host: 0 difference(s) from the proxy", done.stdout)

    @unittest.skipUnless(GPUS >= 2, "needs two GPUs")
    def test_two_gpus_over_nccl_give_the_proxys_bits(self):
        done = run_ranks(2, "nccl")
        self.assertEqual(done.returncode, 0, done.stdout[-2000:] + done.stderr[-2000:])
        self.assertIn("kcp_ranks: 2 ranks over nccl: 0 difference(s) from the proxy", done.stdout)


if __name__ == "__main__":
    unittest.main()
