"""CPU tests of the benchmark's publishing rules (bench/protocol.py) and of the table built from
run files (bench/table.py), on synthetic samples."""

import contextlib
import io
import json
import random
import sys
import tempfile
import unittest
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import protocol  # noqa: E402
import table  # noqa: E402


def groups_around(values, samples=12, jitter=0.0, seed=0):
    """Groups of samples whose medians are exactly `values` (odd jitter pairs cancel around them)."""
    rng = random.Random(seed)
    out = []
    for v in values:
        g = [v]
        for _ in range((samples - 1) // 2):
            d = rng.uniform(0, jitter) * v
            g += [v - d, v + d]
        out.append(g)
    return out


def arm(values, capped_pct=0.0, **kw):
    return {"groups": groups_around(values, **kw), "power_limited_pct": capped_pct}


class DriftTests(unittest.TestCase):
    def test_drift_is_first_vs_last_group_median_over_the_overall_median(self):
        g = groups_around([10.0, 10.5, 9.0, 10.2, 10.1])
        self.assertAlmostEqual(protocol.drift_pct(g), abs(10.0 - 10.1) / 10.1 * 100, places=9)

    def test_middle_groups_do_not_count(self):
        self.assertAlmostEqual(protocol.drift_pct(groups_around([10.0, 30.0, 1.0, 10.0])), 0.0)

    def test_one_group_has_no_drift(self):
        with self.assertRaises(ValueError):
            protocol.drift_pct([[1.0, 2.0]])


class PairedRatioTests(unittest.TestCase):
    def test_passes_with_five_groups_within_one_percent(self):
        self.assertTrue(protocol.paired_ratio_test([1.500, 1.505, 1.495, 1.51, 1.49]))

    def test_fails_when_one_ratio_is_outside_one_percent_of_the_median(self):
        self.assertFalse(protocol.paired_ratio_test([1.50, 1.50, 1.50, 1.50, 1.52]))

    def test_fails_with_fewer_than_five_groups(self):
        self.assertFalse(protocol.paired_ratio_test([1.5, 1.5, 1.5, 1.5]))

    def test_ratios_pair_the_same_groups(self):
        r = protocol.per_group_ratios(groups_around([2.0, 4.0]), groups_around([1.0, 1.0]))
        self.assertEqual(r, [2.0, 4.0])
        with self.assertRaises(ValueError):
            protocol.per_group_ratios(groups_around([2.0]), groups_around([1.0, 1.0]))


class ClassTests(unittest.TestCase):
    def test_envelope_is_the_largest_aa_deviation_from_one(self):
        self.assertAlmostEqual(protocol.aa_spread([1.002, 0.995, 1.001]), 0.005)

    def test_classes_against_the_envelope(self):
        self.assertEqual(protocol.classify(1.02, 0.005), "win")
        self.assertEqual(protocol.classify(1.004, 0.005), "parity")
        self.assertEqual(protocol.classify(0.996, 0.005), "parity")
        self.assertEqual(protocol.classify(0.98, 0.005), "REGRESSION")


class NormalDecisionTests(unittest.TestCase):
    def cell(self, ours, peer, aa=None, ours_cap=0.0, peer_cap=0.0, aa_cap=0.0):
        return {"gdnc": arm(ours, ours_cap, jitter=0.01, seed=1), "peer": arm(peer, peer_cap, jitter=0.01, seed=2),
                "gdnc A/A": arm(aa or ours, aa_cap, jitter=0.01, seed=3)}

    def decide(self, cell):
        return protocol.decide_normal(cell, "gdnc", "peer", "gdnc A/A")

    def test_stable_arms_publish_by_drift_with_a_class(self):
        d = self.decide(self.cell([1.0] * 5, [2.0] * 5, aa=[1.001, 0.999, 1.0, 1.002, 1.0]))
        self.assertEqual((d["status"], d["by"], d["cls"]), ("published", "drift", "win"))
        self.assertAlmostEqual(d["ratio"], 2.0)
        self.assertAlmostEqual(d["aa_spread"], 0.002)

    def test_a_slower_gdnc_is_a_regression(self):
        d = self.decide(self.cell([2.0] * 5, [1.0] * 5))
        self.assertEqual((d["status"], d["cls"]), ("published", "REGRESSION"))

    def test_inside_the_aa_spread_is_parity(self):
        d = self.decide(self.cell([1.0] * 5, [1.003] * 5, aa=[1.0, 1.005, 0.996, 1.0, 1.0]))
        self.assertEqual(d["cls"], "parity")

    def test_drifting_arms_that_move_together_pass_the_paired_test(self):
        # Both arms slow down 5 % over the run (a clock drop): drift > 2 %, ratios constant.
        ours = [1.00, 1.01, 1.02, 1.04, 1.05]
        d = self.decide(self.cell(ours, [2 * t for t in ours], aa=ours))
        self.assertGreater(d["drift_pct"]["gdnc"], 2.0)
        self.assertEqual((d["status"], d["by"], d["cls"]), ("published", "paired", "win"))

    def test_drift_with_unpaired_ratios_is_unstable(self):
        d = self.decide(self.cell([1.00, 1.0, 1.0, 1.0, 1.05], [2.0] * 5))
        self.assertEqual((d["status"], d["published"], d["cls"]), ("unstable", False, None))

    def test_paired_test_needs_five_groups(self):
        ours = [1.00, 1.02, 1.04, 1.05]
        d = self.decide(self.cell(ours, [2 * t for t in ours], aa=ours))
        self.assertEqual(d["status"], "unstable")

    def test_any_arm_at_the_power_limit_in_five_percent_blocks_the_cell(self):
        for caps in ((5.0, 0.0, 0.0), (0.0, 7.5, 0.0), (0.0, 0.0, 100.0)):
            d = self.decide(self.cell([1.0] * 5, [2.0] * 5, ours_cap=caps[0], peer_cap=caps[1], aa_cap=caps[2]))
            self.assertEqual((d["status"], d["published"]), ("power-capped", False), caps)
        d = self.decide(self.cell([1.0] * 5, [2.0] * 5, ours_cap=4.9, peer_cap=4.9, aa_cap=4.9))
        self.assertEqual(d["status"], "published")

    def test_a_missing_arm_is_named(self):
        with self.assertRaises(KeyError) as cm:
            protocol.decide_normal({"gdnc": arm([1.0] * 5)}, "gdnc", "flashqla", "gdnc A/A")
        self.assertIn("flashqla", str(cm.exception))


class SustainedTests(unittest.TestCase):
    def test_order_is_mirrored_block_pairs(self):
        self.assertEqual(protocol.sustained_order(["gdnc", "peer"]), ["gdnc", "peer", "peer", "gdnc"])

    def test_value_is_the_median_of_block_medians_with_its_range(self):
        blocks = {"gdnc": [[1.00, 1.02], [1.01, 1.01], [1.00, 1.03]], "peer": [[2.0, 2.0], [2.01, 2.0], [2.0, 2.02]]}
        d = protocol.decide_sustained(blocks, "gdnc", "peer")
        self.assertAlmostEqual(d["ms"]["gdnc"], 1.01)
        self.assertEqual(d["range"]["gdnc"], [1.0, 1.03])
        self.assertAlmostEqual(d["ratio"], 2.0 / 1.01)
        self.assertEqual(d["status"], "published")

    def test_drift_across_groups_over_two_percent_is_under_the_cap(self):
        blocks = {"gdnc": [[1.0, 1.0], [1.02, 1.02], [1.05, 1.05]], "peer": [[2.0, 2.0]] * 3}
        d = protocol.decide_sustained(blocks, "gdnc", "peer")
        self.assertGreater(d["drift_pct"]["gdnc"], 2.0)
        self.assertEqual((d["status"], d["published"]), ("under-cap", False))


def run_file(peer, order, started, cells, commit="abc1234", proto=None, gate_ok=True):
    """A synthetic output of bench/compare.py: cells maps (shape, op) to the arms' group values."""
    run = {"commit": commit, "peer": peer, "peer_version": f"{peer} 1.0", "order": order, "device": "H200",
           "protocol": proto or dict(protocol.NORMAL), "started_utc": started, "shapes": {}}
    for (shape, op), (ours, theirs, capped, sustained) in cells.items():
        arms = {"gdnc": arm(ours, capped), "gdnc A/A": arm(ours), peer: arm(theirs)}
        entry = run["shapes"].setdefault(shape, {"ops": {}, "gate": {
            n: {"o": {"ok": gate_ok or n != peer, "rel_rms": 1e-3}} for n in arms}})
        cell = {"arms": arms, "decision": protocol.decide_normal(arms, "gdnc", peer, "gdnc A/A")}
        if sustained:
            cell["sustained"] = {"decision": protocol.decide_sustained(sustained, "gdnc", peer)}
        entry["ops"][op] = cell
    return run


class TableTests(unittest.TestCase):
    def test_first_published_run_gives_the_ms_and_every_published_run_its_ratio(self):
        runs = [run_file("flashqla", "reversed", "2026-12-01T02:00", {("M", "fwd"): ([2.0] * 5, [1.0] * 5, 0, None)}),
                run_file("flashqla", "forward", "2026-12-01T01:00", {("M", "fwd"): ([2.2] * 5, [1.0] * 5, 0, None)})]
        t = table.build(runs)
        c = t[("M", "fwd", "flashqla")]
        self.assertAlmostEqual(c["headline"]["ours_ms"], 2.2)  # the earlier run, not the first file
        self.assertEqual(table.ratio_text(c), "0.455 REGRESSION, 0.500 REGRESSION")

    def test_a_cell_says_how_many_of_its_runs_were_published(self):
        runs = [run_file("flashqla", "forward", "t1", {("M", "fwd"): ([1.0] * 5, [2.0] * 5, 50.0, None)}),
                run_file("flashqla", "reversed", "t2", {("M", "fwd"): ([1.0] * 5, [2.0] * 5, 0.0, None)})]
        c = table.build(runs)[("M", "fwd", "flashqla")]
        self.assertEqual(table.ratio_text(c), "2.000 win (1 of 2 runs)")
        self.assertAlmostEqual(c["headline"]["ours_ms"], 1.0)

    def test_capped_cells_publish_only_from_a_stable_sustained_record(self):
        stable = {"gdnc": [[1.0, 1.0]] * 3, "flashqla": [[1.5, 1.5]] * 3}
        drifting = {"gdnc": [[1.0, 1.0], [1.1, 1.1], [1.2, 1.2]], "flashqla": [[1.5, 1.5]] * 3}
        run = run_file("flashqla", "forward", "t1", {("G", "fwd"): ([1.0] * 5, [1.5] * 5, 50.0, stable),
                                                      ("G", "fwd+bwd"): ([1.0] * 5, [1.5] * 5, 50.0, drifting),
                                                      ("G", "ckpt"): ([1.0] * 5, [1.5] * 5, 50.0, None)})
        t = table.build([run])
        self.assertEqual(table.ratio_text(t[("G", "fwd", "flashqla")]), "1.500§ win")
        self.assertEqual(table.ratio_text(t[("G", "fwd+bwd", "flashqla")]), "measured under the cap (1 run)")
        self.assertEqual(table.ratio_text(t[("G", "ckpt", "flashqla")]), "n/p power-capped (1 run)")

    def test_shortened_protocol_and_failed_gates_are_never_published(self):
        short = run_file("fla", "forward", "t1", {("N", "fwd"): ([1.0] * 5, [3.0] * 5, 0, None)},
                         proto={"groups": 2, "samples": 5, "warmup": 3})
        failed = run_file("flashqla", "forward", "t2", {("N", "fwd"): ([1.0] * 5, [3.0] * 5, 0, None)}, gate_ok=False)
        t = table.build([short, failed])
        self.assertEqual(table.ratio_text(t[("N", "fwd", "fla")]), "shortened protocol (1 run)")
        self.assertEqual(table.ratio_text(t[("N", "fwd", "flashqla")]), "FlashQLA failed gate (1 run)")

    def test_markdown_has_both_peers_per_row_and_the_floor_ratio(self):
        runs = [run_file("flashqla", "forward", "t1", {("M", "fwd"): ([2.0] * 5, [1.0] * 5, 0, None)}),
                run_file("fla", "forward", "t2", {("M", "fwd"): ([2.1] * 5, [2.8] * 5, 0, None)})]
        text = table.markdown(table.build(runs), runs)
        row = next(line for line in text.splitlines() if line.startswith("| M | fwd"))
        cols = [c.strip() for c in row.strip("|").split("|")]
        self.assertEqual(cols[:6], ["M", "fwd", "0.352", "2.000", "1.000", "0.500 REGRESSION"])
        self.assertEqual(cols[6:9], ["2.100", "2.800", "1.333 win"])
        self.assertEqual(cols[9], f"{2.0 / 0.352:.1f}")
        self.assertIn("abc1234", text)
        self.assertIn("Peer kernels: fla unknown, flashqla unknown.", text.splitlines()[0])  # older run files

    def test_the_header_says_whether_the_peer_compiled_its_kernels_or_loaded_them(self):
        fresh = run_file("flashqla", "forward", "t1", {("M", "fwd"): ([2.0] * 5, [1.0] * 5, 0, None)})
        carried = run_file("flashqla", "reversed", "t2", {("M", "fwd"): ([2.0] * 5, [1.0] * 5, 0, None)})
        fresh["peer_kernel_cache"], carried["peer_kernel_cache"] = "fresh", "carried"
        self.assertIn("Peer kernels: flashqla carried, flashqla fresh.",
                      table.markdown(table.build([fresh, carried]), [fresh, carried]).splitlines()[0])

    def test_a_peer_that_loaded_its_kernels_from_a_carried_cache_is_never_published(self):
        fresh = run_file("flashqla", "forward", "t1", {("M", "fwd"): ([1.0] * 5, [2.0] * 5, 0, None)})
        carried = run_file("flashqla", "reversed", "t2", {("M", "fwd"): ([1.0] * 5, [2.5] * 5, 0, None)})
        fresh["peer_kernel_cache"], carried["peer_kernel_cache"] = "fresh", "carried"
        self.assertEqual(table.ratio_text(table.build([fresh, carried])[("M", "fwd", "flashqla")]),
                         "2.000 win (1 of 2 runs)")
        self.assertEqual(table.ratio_text(table.build([carried])[("M", "fwd", "flashqla")]),
                         "n/p peer kernels from a carried cache (1 run)")

    def test_the_header_names_every_commit_of_a_code_digest(self):
        run = run_file("flashqla", "forward", "t1", {("M", "fwd"): ([2.0] * 5, [1.0] * 5, 0, None)})
        run["code_digest"], run["resumed_commits"] = "65920f368b0bbea7", ["def5678"]
        first = table.markdown(table.build([run]), [run]).splitlines()[0]
        self.assertIn("gdnc at abc1234, def5678 (code digest 65920f368b0bbea7)", first)

    def test_command_line_writes_markdown_json_and_names_a_bad_file(self):
        run = run_file("flashqla", "forward", "t1", {("L", "fwd+bwd"): ([2.0] * 5, [3.0] * 5, 0, None)})
        with tempfile.TemporaryDirectory() as d, contextlib.redirect_stdout(io.StringIO()):
            p = Path(d) / "run.json"
            p.write_text(json.dumps(run))
            table.main([str(p), "--out", str(Path(d) / "bench_x")])
            self.assertIn("| L | fwd+bwd", (Path(d) / "bench_x.md").read_text())
            summary = json.loads((Path(d) / "bench_x.json").read_text())
            self.assertEqual(summary[0]["headline"]["cls"], "win")
            bad = Path(d) / "bad.json"
            bad.write_text("{")
            with self.assertRaises(SystemExit) as cm:
                table.main([str(bad), "--out", str(Path(d) / "y")])
            self.assertIn("bad.json", str(cm.exception))

    def assert_one_table_per(self, first, second, refusal, header):
        """Two run files that table.py must not merge: the refusal names both, and the second alone
        builds a table whose first line says what it was timed with."""
        with tempfile.TemporaryDirectory() as d, contextlib.redirect_stdout(io.StringIO()):
            paths = [Path(d) / "first.json", Path(d) / "second.json"]
            for path, run in zip(paths, (first, second)):
                path.write_text(json.dumps(run))
            with self.assertRaises(SystemExit) as cm:
                table.main([str(p) for p in paths] + ["--out", str(Path(d) / "z")])
            self.assertIn(refusal, str(cm.exception))
            table.main([str(paths[1]), "--out", str(Path(d) / "t")])
            self.assertIn(header, (Path(d) / "t.md").read_text().splitlines()[0])

    def test_one_table_per_gdnc_configuration(self):
        plain = run_file("flashqla", "forward", "t1", {("M", "fwd"): ([2.0] * 5, [1.0] * 5, 0, None)})
        fused = dict(run_file("flashqla", "reversed", "t2", {("M", "fwd"): ([1.0] * 5, [1.1] * 5, 0, None)}),
                     gdnc_spec={"forward": "fused"})
        self.assert_one_table_per(plain, fused, "different gdnc configurations", 'with {"forward": "fused"}')

    def test_one_table_per_device(self):
        h100 = dict(run_file("flashqla", "forward", "t1", {("M", "fwd"): ([2.0] * 5, [1.0] * 5, 0, None)}),
                    device="NVIDIA H100 80GB HBM3")
        h200 = dict(run_file("flashqla", "reversed", "t2", {("G", "fwd"): ([1.0] * 5, [1.1] * 5, 0, None)}),
                    device="NVIDIA H200")
        self.assert_one_table_per(h100, h200, "different devices: NVIDIA H100 80GB HBM3; NVIDIA H200",
                                  "on NVIDIA H200;")


if __name__ == "__main__":
    unittest.main()


class CompareCpMergeTests(unittest.TestCase):
    """bench/compare_cp.py's merge of the ranks' samples: a CP arm's sample is the slowest rank's,
    the CP 1 arm is rank 0's alone, and the decisions compare gdnc CP R with each other arm."""

    def test_a_sample_is_the_slowest_ranks_and_cp1_is_rank_0s(self):
        import compare_cp
        groups, samples = 5, 11  # groups_around gives 11 samples a group: 55 a rank
        p = {"groups": groups, "samples": samples, "warmup": 0}
        fast = groups_around([1.0] * groups, samples, jitter=0.001, seed=1)
        slow = groups_around([1.5] * groups, samples, jitter=0.001, seed=2)
        cp1 = groups_around([3.0] * groups, samples, jitter=0.001, seed=3)

        def rank(cp_groups, cp1_groups, limited=0):
            return {("A", "fwd+bwd"): {
                "groups": {"gdnc CP2": cp_groups, "gdnc CP2 A/A": cp_groups, "gdnc CP1": cp1_groups},
                "limited": {"gdnc CP2": limited, "gdnc CP2 A/A": 0, "gdnc CP1": 0},
                "gate": {"gdnc CP2": {"rel_rms_max": 1e-3, "ok": True},
                         "gdnc CP2 A/A": {"rel_rms_max": 2e-3, "ok": True}},
                "peer": None}}
        # Rank 1 is the slow one; its CP 1 "samples" (it waited at the barrier) are empty.
        args = type("Args", (), {"transport": "nccl"})()
        out = compare_cp.merge([rank(fast, cp1), rank(slow, [[] for _ in range(groups)], limited=11)], 2, p, args)
        cell = out["cells"][0]
        self.assertAlmostEqual(cell["arms"]["gdnc CP2"]["ms"], 1.5, places=2)
        self.assertAlmostEqual(cell["arms"]["gdnc CP1"]["ms"], 3.0, places=2)
        # 11 of rank 1's 55 samples at the limit: 10 % of the two ranks' 110.
        self.assertAlmostEqual(cell["arms"]["gdnc CP2"]["power_limited_pct"], 10.0)
        d = cell["decisions"]["gdnc CP1"]
        self.assertAlmostEqual(d["ratio"], 2.0, places=2)
        self.assertEqual(d["status"], "power-capped")
        self.assertEqual(cell["gate_rel_rms"], {"gdnc CP2": 1e-3, "gdnc CP2 A/A": 2e-3})
        out = compare_cp.merge([rank(fast, cp1), rank(slow, [[] for _ in range(groups)])], 2, p, args)
        d = out["cells"][0]["decisions"]["gdnc CP1"]
        self.assertEqual((d["status"], d["by"], d["cls"]), ("published", "drift", "win"))
