"""CPU tests of bench/compare_fla.py's table and merge (the GPU part runs on the H200 only)."""

import contextlib
import io
import sys
import tempfile
import unittest
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import compare_fla  # noqa: E402


def cells(ours, fla):
    return {"gdnc": {"ms": ours, "drift_pct": 0.5, "power_limited_pct": 0.0},
            "fla": {"ms": fla, "drift_pct": 0.4, "power_limited_pct": 0.0}}


class ReportTests(unittest.TestCase):
    def test_merge_tags_earlier_shapes_with_their_commit_and_keeps_the_input_unchanged(self):
        earlier = {"commit": "aaaa", "shapes": {"M": {"ops": {"fwd": cells(3.0, 2.7)}},
                                                 "G": {"ops": {"fwd": cells(9.9, 9.9)}, "commit": "cccc"}}}
        results = compare_fla.merge_earlier({"shapes": {}}, earlier)
        self.assertEqual(results["shapes"]["M"]["commit"], "aaaa")  # the file's commit
        self.assertEqual(results["shapes"]["G"]["commit"], "cccc")  # the entry's own commit wins
        self.assertNotIn("commit", earlier["shapes"]["M"])
        # main() merges before measuring: a shape measured now replaces the earlier entry.
        results["shapes"]["M"] = {"ops": {"fwd": cells(2.5, 2.7)}, "commit": "bbbb"}
        self.assertEqual(results["shapes"]["M"]["commit"], "bbbb")

    def test_summary_lists_shapes_in_seed_order_with_ratios_and_commits(self):
        results = {"shapes": {"M": {"ops": {"fwd": cells(3.0, 2.7)}, "commit": "aaaa"},
                              "N": {"ops": {"fwd": cells(0.25, 0.75)}, "commit": "bbbb"}}}
        out = io.StringIO()
        with tempfile.TemporaryDirectory() as d, contextlib.redirect_stdout(out):
            compare_fla.report(results, Path(d) / "compare.json")
            made_plot = (Path(d) / "compare.png").exists()
        lines = [line for line in out.getvalue().splitlines() if line[:2].strip() in ("N", "M")]
        self.assertEqual([line.split()[0] for line in lines], ["N", "M"])
        self.assertIn("gdnc 0.250 (3.00x)", lines[0])
        self.assertIn("[bbbb]", lines[0])
        self.assertIn("gdnc 3.000 (0.90x)", lines[1])
        self.assertIn("[aaaa]", lines[1])
        self.assertTrue(made_plot or "no plot:" in out.getvalue())

class NvmlTests(unittest.TestCase):
    def test_a_missing_nvml_library_is_an_error_that_names_it(self):
        with self.assertRaises(RuntimeError) as cm:
            compare_fla.Nvml(lib_name="libnvidia-ml-not-here.so.1")
        self.assertIn("libnvidia-ml-not-here.so.1", str(cm.exception))


if __name__ == "__main__":
    unittest.main()
