"""CPU tests of bench/compare.py's helpers (the timing itself runs on the H200 only)."""

import json
import sys
import tempfile
import unittest
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import compare  # noqa: E402


class ShapeTests(unittest.TestCase):
    def test_every_shape_has_a_floor_and_the_gate_pack_scales_every_document(self):
        self.assertEqual(set(compare.SHAPES), set(compare.FLOOR))
        # M: 32768 tokens in five documents; the pack keeps five, each scaled by 25000 / 32768.
        self.assertEqual(compare.shape_docs("M", 25000), ((16, 48), [9155, 6866, 4577, 2874, 1525]))
        self.assertEqual(compare.shape_docs("L", 8192), ((2, 6), [8192]))
        self.assertEqual(compare.shape_docs("N"), ((2, 6), [2049, 3001, 3142]))
        self.assertEqual(compare.shape_docs("N", 100000), ((2, 6), [2049, 3001, 3142]))  # above the total: whole
        self.assertEqual(compare.shape_docs("N", 2), ((2, 6), [1, 1, 1]))  # never an empty document
        for shape in compare.SHAPES:
            heads, docs = compare.shape_docs(shape, 8192)
            self.assertEqual(len(docs), len(compare.SHAPES[shape][1]))
            self.assertLessEqual(sum(docs), 8192)


class KernelProfileTests(unittest.TestCase):
    def test_top_kernels_keeps_the_longest_with_their_calls_and_drops_idle_rows(self):
        rows = [("kkt_solve", 1, 120.04), ("Memset (Device)", 2, 0.0), ("fused_fwd", 3, 900.26),
                ("l2norm", 2, 120.04), ("x" * 150, 1, 5.0)]
        got = compare.top_kernels(rows, top=3)
        self.assertEqual(got, [["fused_fwd", 3, 900.3], ["kkt_solve", 1, 120.0], ["l2norm", 2, 120.0]])
        self.assertEqual(len(compare.top_kernels(rows)[-1][0]), 100)  # long names cut
        self.assertEqual(compare.top_kernels([]), [])


class FakeCuda:
    """A stream on a clock: the host's time and the time the GPU's queue drains (ms)."""

    def __init__(self):
        self.host, self.gpu, self.allocs = 0.0, 0.0, 0

    def launch(self, ms, host_ms=0.01):
        self.host += host_ms
        self.gpu = max(self.gpu, self.host) + ms

    def synchronize(self):
        self.host = max(self.host, self.gpu)

    def _sleep(self, cycles):
        self.launch(cycles / 1e6, 0.0)

    def memory_stats(self):
        return {"num_device_alloc": self.allocs}

    def clock(self):
        return self.host / 1e3

    def Event(self, enable_timing):
        cuda = self

        class Event:
            def record(self):
                cuda.gpu = max(cuda.gpu, cuda.host)
                self.t = cuda.gpu

            def elapsed_time(self, other):
                return other.t - self.t
        return Event()


class HostWaitTests(unittest.TestCase):
    def test_the_gpu_waits_only_for_a_slow_host_and_a_sync_is_named(self):
        cuda = FakeCuda()

        def run_one(name):
            if name == "queued":  # the host ahead: five 1 ms kernels
                for _ in range(5):
                    cuda.launch(1.0)
            elif name == "slow host":  # 2 ms of host work before each of two 1 ms kernels
                for _ in range(2):
                    cuda.launch(1.0, host_ms=2.0)
            else:  # reads a result back: waits for the device, and allocates device memory
                cuda.launch(1.0)
                cuda.synchronize()
                cuda.allocs += 1
                cuda.launch(1.0)

        got = compare.host_wait(["queued", "slow host", "syncs"], run_one, lambda: cuda.launch(0.1), cuda,
                                clock=cuda.clock)
        q, slow, sync = got["queued"], got["slow host"], got["syncs"]
        self.assertAlmostEqual(q["event_ms"], 5.0, places=3)
        self.assertAlmostEqual(q["gpu_waits_ms"], 0.0, places=3)
        self.assertFalse(q["synchronizes"])
        self.assertEqual(q["allocator"]["num_device_alloc"], 0)
        self.assertAlmostEqual(slow["event_ms"], 4.9, places=3)  # the flush's 0.1 ms runs under the host
        self.assertAlmostEqual(slow["queued_event_ms"], 2.0, places=3)
        self.assertAlmostEqual(slow["gpu_waits_ms"], 2.9, places=3)
        self.assertAlmostEqual(slow["host_ms"], 4.0, places=3)
        self.assertFalse(slow["synchronizes"])
        self.assertTrue(sync["synchronizes"])
        self.assertEqual(sync["allocator"]["num_device_alloc"], 3)  # one a call, three plain calls
        self.assertEqual(sync["repeats"], 3)

    def test_an_error_is_recorded_not_raised(self):
        def fails(name):
            raise RuntimeError("no GPU")
        got = compare.host_wait(["a"], fails, lambda: None, FakeCuda())
        self.assertEqual(got, {"a": {"error": "RuntimeError: no GPU"}})


class FirstCallTests(unittest.TestCase):
    def test_every_arm_runs_once_in_order_and_an_error_is_recorded_not_raised(self):
        import types
        saved = compare.torch
        syncs = []
        compare.torch = types.SimpleNamespace(cuda=types.SimpleNamespace(synchronize=lambda: syncs.append(1)))
        try:
            ran = []

            def run_one(n):
                ran.append(n)
                if n == "peer":
                    raise RuntimeError("no kernel for sm_90")

            got = compare.first_calls(["gdnc", "peer", "aa"], run_one)
        finally:
            compare.torch = saved
        self.assertEqual(ran, ["gdnc", "peer", "aa"])
        self.assertEqual(len(syncs), 3)
        self.assertIn("s", got["gdnc"])
        self.assertEqual(got["peer"], {"error": "RuntimeError: no kernel for sm_90"})
        self.assertIn("s", got["aa"])

    def test_inductor_configs_without_torch_is_an_error_entry(self):
        if compare.torch is not None:
            self.skipTest("torch is importable here")
        got = compare.inductor_configs()
        self.assertIn("error", got)


class SettleTests(unittest.TestCase):
    def test_every_arm_runs_once_then_in_mirrored_order_until_the_time_is_up(self):
        ran, syncs, now = [], [], [0.0]

        def run_one(n):
            ran.append(n)
            now[0] += 0.25  # each call takes a quarter of a second on the fake clock

        calls = compare.settle(["gdnc", "aa", "peer"], run_one, lambda: syncs.append(len(ran)), 2.0,
                               clock=lambda: now[0])
        self.assertEqual(ran[:3], ["gdnc", "aa", "peer"])  # the first call of each, compiles included
        self.assertEqual(ran[3:9], ["gdnc", "aa", "peer", "peer", "aa", "gdnc"])
        self.assertEqual(len(ran[3:]) % 6, 0)  # whole mirrored rounds only
        self.assertGreaterEqual(now[0] - 0.75, 2.0)  # settled for at least the asked time
        self.assertLess(now[0] - 0.75, 2.0 + 6 * 0.25 + 1e-9)  # and stopped after the round that crossed it
        self.assertEqual(calls, {n: ran.count(n) for n in ("gdnc", "aa", "peer")})
        self.assertEqual(syncs[:3], [1, 2, 3])  # each first call waited for (a compile is not queued work)

    def test_zero_seconds_still_runs_every_arm_once(self):
        ran = []
        calls = compare.settle(["a", "b"], ran.append, lambda: None, 0.0, clock=lambda: 0.0)
        self.assertEqual(ran, ["a", "b"])
        self.assertEqual(calls, {"a": 1, "b": 1})


class ResumeTests(unittest.TestCase):
    def test_resume_takes_the_same_run_and_names_every_mismatch(self):
        with tempfile.TemporaryDirectory() as d:
            p = Path(d) / "run.json"
            p.write_text(json.dumps({"commit": "abc", "peer": "flashqla", "order": "forward", "shapes": {"M": {}}}))
            self.assertIn("M", compare.load_resume(str(p), "abc", "flashqla", "forward")["shapes"])
            with self.assertRaises(SystemExit) as cm:
                compare.load_resume(str(p), "def", "fla", "forward")
            msg = str(cm.exception)
            self.assertIn("commit 'abc' there, 'def' here", msg)
            self.assertIn("peer 'flashqla' there, 'fla' here", msg)
            self.assertIsNone(compare.load_resume(str(Path(d) / "absent.json"), "abc", "fla", "forward"))

    def test_resume_keeps_one_gdnc_configuration(self):
        with tempfile.TemporaryDirectory() as d:
            p = Path(d) / "run.json"
            fused = {"forward": "fused", "cp": {"segments": "auto"}}
            p.write_text(json.dumps({"commit": "abc", "peer": "flashqla", "order": "forward", "gdnc_spec": fused,
                                     "shapes": {}}))
            self.assertIsNotNone(compare.load_resume(str(p), "abc", "flashqla", "forward", fused))
            with self.assertRaises(SystemExit) as cm:
                compare.load_resume(str(p), "abc", "flashqla", "forward", {})
            self.assertIn("gdnc_spec", str(cm.exception))


class CodeDigestResumeTests(unittest.TestCase):
    def test_a_run_of_the_same_code_digest_resumes_across_commits(self):
        with tempfile.TemporaryDirectory() as d:
            p = Path(d) / "run.json"
            p.write_text(json.dumps({"commit": "abc", "code_digest": "d1", "peer": "flashqla", "order": "forward",
                                     "shapes": {"M": {}}}))
            later = compare.load_resume(str(p), "def", "flashqla", "forward", None, "d1")
            self.assertIn("M", later["shapes"])
            self.assertEqual(later["commit"], "abc")
            self.assertEqual(later["resumed_commits"], ["def"])
            with self.assertRaises(SystemExit) as cm:
                compare.load_resume(str(p), "def", "flashqla", "forward", None, "d2")
            self.assertIn("code_digest 'd1' there, 'd2' here", str(cm.exception))
            # Without a digest on either side the commit decides, as before.
            with self.assertRaises(SystemExit) as cm:
                compare.load_resume(str(p), "def", "flashqla", "forward")
            self.assertIn("commit 'abc' there, 'def' here", str(cm.exception))
            self.assertNotIn("resumed_commits", compare.load_resume(str(p), "abc", "flashqla", "forward", None, "d1"))


class DeviceResumeTests(unittest.TestCase):
    def test_a_run_resumes_only_on_the_device_it_started_on(self):
        with tempfile.TemporaryDirectory() as d:
            p = Path(d) / "run.json"
            p.write_text(json.dumps({"commit": "abc", "code_digest": "d1", "peer": "flashqla", "order": "reversed",
                                     "device": "NVIDIA H100 80GB HBM3", "shapes": {"M": {}}}))
            same = compare.load_resume(str(p), "abc", "flashqla", "reversed", None, "d1", "NVIDIA H100 80GB HBM3")
            self.assertIn("M", same["shapes"])
            with self.assertRaises(SystemExit) as cm:
                compare.load_resume(str(p), "abc", "flashqla", "reversed", None, "d1", "NVIDIA H200")
            self.assertIn("device 'NVIDIA H100 80GB HBM3' there, 'NVIDIA H200' here", str(cm.exception))


class GdncSpecTests(unittest.TestCase):
    def test_only_code_options_pass(self):
        self.assertEqual(compare.parse_gdnc_spec('{"forward": "fused"}'), {"forward": "fused"})
        for text, words in (("[1]", "JSON object"), ("{", "not JSON"), ('{"heads": {"qk": 2}}', "heads"),
                            ('{"name": "x"}', "name")):
            with self.assertRaises(SystemExit) as cm:
                compare.parse_gdnc_spec(text)
            self.assertIn(words, str(cm.exception))


class FlaDispatchTests(unittest.TestCase):
    def test_the_fla_arm_refuses_to_run_with_dispatch_to_flashqla_enabled(self):
        import os
        saved = os.environ.pop("FLA_FLASH_QLA", None)
        try:
            with self.assertRaises(RuntimeError) as cm:
                compare.fla_arm()
            self.assertIn("FLA_FLASH_QLA", str(cm.exception))
        finally:
            if saved is not None:
                os.environ["FLA_FLASH_QLA"] = saved


class NvmlTests(unittest.TestCase):
    def test_a_missing_nvml_library_is_an_error_that_names_it(self):
        with self.assertRaises(RuntimeError) as cm:
            compare.Nvml(lib_name="libnvidia-ml-not-here.so.1")
        self.assertIn("libnvidia-ml-not-here.so.1", str(cm.exception))


if __name__ == "__main__":
    unittest.main()
