"""CPU tests of the Python binding: argument checking, spec building through libgdn, loading
errors. They need libgdn.so (GDNC_LIBRARY or build/libgdn.so) but neither torch nor a GPU."""

import math
import os
import random
import subprocess
import sys
import unittest
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import gdnc  # noqa: E402


class FakeDtype:
    def __init__(self, name):
        self.name = name

    def __str__(self):
        return "torch." + self.name


class FakeTensor:
    """What check_arguments reads of a tensor: shape, dtype, is_cuda, is_contiguous()."""

    def __init__(self, shape, dtype="bfloat16", cuda=True, contiguous=True):
        self.shape = shape
        self.dtype = FakeDtype(dtype)
        self.is_cuda = cuda
        self._contiguous = contiguous

    def is_contiguous(self):
        return self._contiguous


def call(**over):
    args = dict(q=FakeTensor((1, 100, 2, 128)), k=FakeTensor((1, 100, 2, 128)), v=FakeTensor((1, 100, 6, 128)),
                g=FakeTensor((1, 100, 6), "float32"), beta=FakeTensor((1, 100, 6), "float32"),
                initial_state=FakeTensor((3, 6, 128, 128), "float32"), cu_seqlens=FakeTensor((4,), "int32"))
    args.update(over)
    return gdnc.check_arguments(**args)


class ArgumentTests(unittest.TestCase):
    def test_valid_varlen_call(self):
        self.assertEqual(call(), (1, 100, 2, 6, 128, 128, 3))

    def test_batch_without_cu_seqlens_is_one_document_per_row(self):
        self.assertEqual(call(q=FakeTensor((4, 100, 2, 128)), k=FakeTensor((4, 100, 2, 128)),
                              v=FakeTensor((4, 100, 6, 128)), g=FakeTensor((4, 100, 6), "float32"),
                              beta=FakeTensor((4, 100, 6), "float32"), cu_seqlens=None,
                              initial_state=FakeTensor((4, 6, 128, 128), "float32")), (4, 100, 2, 6, 128, 128, 4))

    def test_errors_name_the_argument_and_value(self):
        cases = [
            (dict(q=FakeTensor((100, 2, 128))), "q: expected [B, T, H, K], got shape (100, 2, 128)"),
            (dict(k=FakeTensor((1, 99, 2, 128))), "k: shape (1, 99, 2, 128) differs from q's (1, 100, 2, 128)"),
            (dict(v=FakeTensor((1, 100, 5, 128))), "v: 5 value heads is not a multiple of 2 q/k heads"),
            (dict(g=FakeTensor((1, 100, 5), "float32")), "g: expected [B=1, T=100, HV=6], got shape (1, 100, 5)"),
            (dict(q=FakeTensor((1, 100, 2, 128), "float16")), "q: dtype float16 is not supported (supported: bfloat16)"),
            (dict(beta=FakeTensor((1, 100, 6), "bfloat16")),
             "beta: dtype bfloat16 is not supported (supported: float32)"),
            (dict(cu_seqlens=FakeTensor((4,), "float32")),
             "cu_seqlens: dtype float32 is not supported (int32 or int64)"),
            (dict(initial_state=FakeTensor((2, 6, 128, 128), "float32")),
             "initial_state: expected [N=3, HV=6, K=128, V=128], got (2, 6, 128, 128)"),
            (dict(v=FakeTensor((1, 100, 6, 128), cuda=False)), "v: must be on a CUDA device"),
            (dict(g=FakeTensor((1, 100, 6), "float32", contiguous=False)), "g: must be contiguous"),
        ]
        for over, message in cases:
            with self.subTest(message=message):
                with self.assertRaises(gdnc.InputError) as e:
                    call(**over)
                self.assertEqual(str(e.exception), message)

    def test_unknown_and_unsupported_arguments_raise(self):
        with self.assertRaisesRegex(TypeError, r"unexpected argument\(s\) \['use_qk_l2norm'\]"):
            call(use_qk_l2norm=True)
        with self.assertRaisesRegex(NotImplementedError, "use_beta_sigmoid_in_kernel=True is not supported"):
            call(use_beta_sigmoid_in_kernel=True)
        with self.assertRaisesRegex(ValueError, r"chunk_size=32 is not supported \(supported: 64\)"):
            call(chunk_size=32)
        self.assertEqual(call(cu_seqlens_cpu=[0, 30, 60, 100])[-1], 3)  # FLA's hint: checked on the host

    def test_arguments_that_are_not_tensors_are_named(self):
        cases = [
            (dict(q=[[1.0]]), "q: expected a tensor, got list"),
            (dict(v=None), "v: expected a tensor, got None"),
            (dict(beta=0.5), "beta: expected a tensor, got float"),
            (dict(initial_state="zeros"), "initial_state: expected a tensor, got str"),
            (dict(cu_seqlens=[0, 30, 60, 100]), "cu_seqlens: expected a tensor, got list"),
        ]
        for over, message in cases:
            with self.subTest(message=message):
                with self.assertRaises(gdnc.InputError) as e:
                    call(**over)
                self.assertEqual(str(e.exception), message)

    def test_empty_dimensions_are_named_not_divided_by(self):
        # Zero heads raised ZeroDivisionError from HV % H.
        with self.assertRaisesRegex(gdnc.InputError, r"^q: shape \(1, 100, 0, 128\) has an empty dimension$"):
            call(q=FakeTensor((1, 100, 0, 128)), k=FakeTensor((1, 100, 0, 128)))
        with self.assertRaisesRegex(gdnc.InputError, r"^v: shape \(1, 100, 0, 128\) has an empty dimension$"):
            call(v=FakeTensor((1, 100, 0, 128)))

    def test_scale_is_checked_before_the_library_sees_it(self):
        self.assertEqual(gdnc.api.check_scale(None), 0.0)  # 0.0 tells libgdn: the spec's 1/sqrt(K)
        self.assertEqual(gdnc.api.check_scale(2), 2.0)
        self.assertAlmostEqual(gdnc.api.check_scale(0.1), 0.1, places=7)
        for bad in (float("nan"), float("inf"), -1, 0, 0.0, "abc", True, [0.5], None.__class__):
            with self.subTest(scale=bad):
                with self.assertRaisesRegex(gdnc.InputError, r"^scale: .* must be a positive finite number or None"):
                    call(scale=bad)
        for bad in (1e39, 1e-50):  # finite doubles that a float32 turns into inf or 0
            with self.subTest(scale=bad):
                with self.assertRaisesRegex(gdnc.InputError, r"^scale: .* is outside what a float32 holds"):
                    call(scale=bad)
        self.assertEqual(call(scale=0.5)[-1], 3)

    def test_flags_must_be_booleans(self):
        for name in ("output_final_state", "use_qk_l2norm_in_kernel", "check_inputs", "check_cu_seqlens"):
            with self.subTest(name=name):
                with self.assertRaisesRegex(gdnc.InputError, f"^{name}: expected True or False, got 'yes'$"):
                    call(**{name: "yes"})
        self.assertEqual(call(output_final_state=1, check_cu_seqlens=True)[-1], 3)
        self.assertEqual(call(check_inputs=True)[-1], 3)

    def test_the_spec_argument_is_checked_as_a_dict_or_json_text(self):
        self.assertEqual(call(spec='{"save_mode": "full"}')[-1], 3)
        cases = [
            ([1], "spec: expected a dict, a JSON string or None, got list"),
            ('{"save_mode": "full", "save_mode": "light"}', "spec: duplicate key 'save_mode' (each field may appear once)"),
            ('{"scale": 1e400}', "spec: number '1e400' is out of range (it overflows a double)"),
            ('{"scale": NaN}', "spec: NaN is not a JSON number"),
            ('{"save_mode": ', "spec: invalid JSON at line 1, column 15: Expecting value"),
            ('["full"]', "spec: expected a JSON object, got ['full']"),
            ("[" * 100000 + "]" * 100000, "spec: nesting too deep"),
        ]
        for spec, message in cases:
            with self.subTest(message=message):
                with self.assertRaises(gdnc.SpecError) as e:
                    call(spec=spec)
                self.assertEqual(str(e.exception), message)

    def test_cu_seqlens_cpu_is_checked_like_the_device_checks_cu_seqlens(self):
        cases = [
            ([1, 30, 60, 100], "cu_seqlens[0]: 1 must be 0 (from cu_seqlens_cpu)"),
            ([0, 30, 20, 100], "cu_seqlens[2]: 20 < cu_seqlens[1] (30): must be non-decreasing (from cu_seqlens_cpu)"),
            ([0, 30, 60, 99], "cu_seqlens[3]: 99 must equal T (100) (from cu_seqlens_cpu)"),
            ([0, 30, 100], "cu_seqlens_cpu: 3 offsets, cu_seqlens has 4"),
            ([0, 30.0, 60, 100], "cu_seqlens_cpu[1]: 30.0 is not an integer"),
            (object(), "cu_seqlens_cpu: expected a sequence of integers, got object"),
        ]
        for values, message in cases:
            with self.subTest(message=message):
                with self.assertRaises(gdnc.InputError) as e:
                    call(cu_seqlens_cpu=values)
                self.assertEqual(str(e.exception), message)
        # Several failures: the lowest offset's, as the device reports it (offset i checks
        # cu_seqlens[i] and the length of document i - 1).
        from gdnc.api import check_cu_seqlens_values
        for values, bound, message in (
                ([0, 50, 60], 40, "cu_seqlens: document 0 has 50 tokens, more than max_seqlen 40"),
                ([0, 50, 40, 100], 45, "cu_seqlens: document 0 has 50 tokens, more than max_seqlen 45"),
                ([0, 30, 20, 99], None, "cu_seqlens[2]: 20 < cu_seqlens[1] (30): must be non-decreasing"),
                ([0, 30, 60, 99], 20, "cu_seqlens: document 0 has 30 tokens, more than max_seqlen 20"),
                ([0, 30, 30, 200], 50, "cu_seqlens[3]: 200 must equal T (100)")):
            with self.subTest(values=values, bound=bound):
                with self.assertRaises(gdnc.InputError) as e:
                    check_cu_seqlens_values(values, 100, len(values) - 1, max_seqlen=bound)
                self.assertEqual(str(e.exception), message + " (from cu_seqlens_cpu)")

        class HostTensor:  # what torch gives: tolist()
            def tolist(self):
                return [0, 0, 100, 100]  # empty documents are valid
        self.assertEqual(call(cu_seqlens_cpu=HostTensor())[-1], 3)
        with self.assertRaisesRegex(gdnc.InputError, "^cu_seqlens_cpu: given without cu_seqlens$"):
            call(cu_seqlens=None, initial_state=None, cu_seqlens_cpu=[0, 100])

    def test_max_seqlen_is_checked_and_gives_the_call_its_bound(self):
        cases = [
            (dict(max_seqlen=0), "max_seqlen: 0 must be a positive Python int or None (a tensor would need a host "
                                 "sync)"),
            (dict(max_seqlen=True), "max_seqlen: True must be a positive Python int or None (a tensor would need a "
                                    "host sync)"),
            (dict(max_seqlen=FakeTensor((1,), "int32")), None),
            (dict(max_seqlen=33), "max_seqlen: 3 documents of at most 33 tokens cannot hold the 100 of cu_seqlens"),
            (dict(max_seqlen=39, cu_seqlens_cpu=[0, 30, 60, 100]),
             "cu_seqlens: document 2 has 40 tokens, more than max_seqlen 39 (from cu_seqlens_cpu)"),
            (dict(max_seqlen=99, cu_seqlens=None, initial_state=None),
             "max_seqlen: 99 is less than the sequences' length T=100"),
        ]
        for over, message in cases:
            with self.subTest(over=str(over)):
                with self.assertRaises(gdnc.InputError) as e:
                    call(**over)
                if message is not None:
                    self.assertEqual(str(e.exception), message)
        self.assertEqual(call(max_seqlen=40, cu_seqlens_cpu=[0, 30, 60, 100])[-1], 3)
        self.assertEqual(call(max_seqlen=34)[-1], 3)
        from gdnc.api import doc_bound
        cu = FakeTensor((4,), "int32")
        self.assertEqual(doc_bound(100, cu, dict(max_seqlen=70)), 70)
        self.assertEqual(doc_bound(100, cu, dict(max_seqlen=1 << 70)), (1 << 31) - 1)  # fits the C ABI's int64
        self.assertEqual(doc_bound(100, cu, dict(cu_seqlens_cpu=[0, 30, 60, 100])), 40)
        self.assertEqual(doc_bound(100, cu, dict(cu_seqlens_cpu=[0, 0, 100, 100])), 100)
        self.assertEqual(doc_bound(100, cu, dict(cu_seqlens_cpu=iter([0, 30, 60, 100]))), 40)
        self.assertEqual(doc_bound(100, cu, {}), 0)  # unknown: T bounds it inside libgdn
        self.assertEqual(doc_bound(100, None, {}), 100)  # [B, T] sequences: T each
        # Under graph capture the hint describes only the captured call: no bound from it.
        self.assertEqual(doc_bound(100, cu, dict(cu_seqlens_cpu=[0, 30, 60, 100]), capturing=True), 0)
        self.assertEqual(doc_bound(100, cu, dict(max_seqlen=70), capturing=True), 70)
        self.assertEqual(doc_bound(100, None, {}, capturing=True), 100)

    def test_large_values_are_quoted_by_an_excerpt(self):
        with self.assertRaises(NotImplementedError) as e:
            call(head_first="x" * 100000)
        self.assertLess(len(str(e.exception)), 200)


class SpecTests(unittest.TestCase):
    def test_build_fills_in_the_shapes_and_defaults(self):
        s = gdnc.build_spec({"save_mode": "full", "deterministic": True}, heads_qk=2, heads_v=6, head_dim_k=128,
                            head_dim_v=128, l2norm=True, initial_state=False, final_state=True)
        self.assertEqual(s["heads"], {"qk": 2, "v": 6})
        self.assertEqual(s["save_mode"], "full")
        self.assertEqual(s["norm"], "l2_in_kernel")
        self.assertFalse(s["initial_state"])
        self.assertEqual(s["chunk"], 64)

    def test_invalid_specs_carry_the_json_pointer(self):
        with self.assertRaises(gdnc.SpecError) as e:
            gdnc.build_spec({"save_mode": "heavy"}, heads_qk=2, heads_v=6, head_dim_k=128, head_dim_v=128,
                            l2norm=True, initial_state=False, final_state=False)
        self.assertEqual(str(e.exception), '/save_mode: "heavy" is not supported (supported: "light", "full")')
        with self.assertRaises(gdnc.SpecError) as e:
            gdnc.build_spec(None, heads_qk=2, heads_v=6, head_dim_k=96, head_dim_v=128, l2norm=True,
                            initial_state=False, final_state=False)
        self.assertEqual(str(e.exception), "/head_dim/k: 96 is not supported (supported: 128)")

    def test_region_layouts_come_from_the_spec_without_a_gpu(self):
        spec = gdnc.build_spec(None, heads_qk=2, heads_v=6, head_dim_k=128, head_dim_v=128, l2norm=True,
                               initial_state=True, final_state=True)
        saved = gdnc.region_layout(spec, 10000, 3)
        # light saves keep the chunk table, the normalized q/k with their rstd, gc and Tm
        for name in ("chunks", "qn", "kn", "rstd_q", "rstd_k", "gc", "tm"):
            self.assertIn(name, saved["buffers"])
        self.assertEqual(saved["buffers"]["tm"][1], 10000 * 6 * 64 * 2)
        offsets = [off for off, _ in saved["buffers"].values()]
        self.assertEqual(offsets, sorted(offsets))
        for off, size in saved["buffers"].values():
            self.assertEqual(off % 256, 0)
            self.assertLessEqual(off + size, saved["bytes"])
        full = gdnc.region_layout(dict(spec, save_mode="full"), 10000, 3)
        self.assertIn("h_tape", full["buffers"])
        self.assertGreater(full["bytes"], saved["bytes"])
        bwd = gdnc.region_layout(spec, 10000, 3, region="workspace", form="backward")
        self.assertIn("h_tape", bwd["buffers"])
        for bad, message in (({"region": "scratch"}, "region: 'scratch' is not"),
                             ({"form": "step"}, "form: 'step' is not"),
                             ({"N": 2.0}, "N: expected an int, got float"),
                             ({"T": 1 << 70}, "T: 1180591620717411303424 does not fit a 64-bit integer"),
                             ({"T": -1}, "T")):
            args = dict({"T": 10000, "N": 3}, **bad)
            with self.assertRaises(gdnc.InputError) as e:
                gdnc.region_layout(spec, args.pop("T"), args.pop("N"), **args)
            self.assertTrue(str(e.exception).startswith(message), str(e.exception))

    def test_a_targets_region_layout_leaves_out_what_it_never_touches(self):
        spec = dict(gdnc.build_spec(None, heads_qk=16, heads_v=48, head_dim_k=128, head_dim_v=128, l2norm=True,
                                    initial_state=True, final_state=True), walk_bwd_layout="fused",
                    targets=["sm_90a", "sm_100a", "sm_103a"])
        layout = lambda target: gdnc.region_layout(spec, 32768, 5, "workspace", "backward", target=target)
        any_target, sm90a, sm100a = layout(None), layout("sm_90a"), layout("sm_100a")
        for name in ("dh_tape", "dv_new"):
            self.assertIn(name, any_target["buffers"])
            self.assertNotIn(name, sm90a["buffers"])
            self.assertIn(name, sm100a["buffers"])
        # the fused walk keeps dh and dV' on chip on sm_90a: NT * HV * K * V * 2 + T * HV * V * 2 bytes
        self.assertEqual(any_target["bytes"] - sm90a["bytes"],
                         (32768 // 64 + 5) * 48 * 128 * 128 * 2 + 32768 * 48 * 128 * 2)
        self.assertEqual(sm100a, any_target)
        with self.assertRaises(gdnc.InputError) as e:
            layout("sm_80")
        self.assertIn('target: "sm_80" is not among the targets of layer', str(e.exception))
        with self.assertRaises(gdnc.InputError) as e:
            layout(90)
        self.assertEqual(str(e.exception), "target: expected a str or None, got int")

    def test_intra_card_segments_are_a_code_option(self):
        s = gdnc.build_spec({"cp": {"ranks": 1, "segments": 8}}, heads_qk=2, heads_v=8, head_dim_k=128,
                            head_dim_v=128, l2norm=True, initial_state=False, final_state=False)
        self.assertEqual(s["cp"], {"ranks": 1, "segments": 8})
        with self.assertRaises(gdnc.SpecError) as e:
            gdnc.build_spec({"cp": {"ranks": 1, "segments": 65}}, heads_qk=2, heads_v=8, head_dim_k=128,
                            head_dim_v=128, l2norm=True, initial_state=False, final_state=False)
        self.assertEqual(str(e.exception), '/cp/segments: 65 is not supported (supported: "auto", 1 to 64)')

    def test_ranks_run_the_single_gpu_proxy_with_room_for_the_rank_cuts(self):
        spec = gdnc.build_spec({"cp": {"ranks": 4, "segments": 1}}, heads_qk=2, heads_v=6, head_dim_k=128,
                               head_dim_v=128, l2norm=True, initial_state=False, final_state=False)
        self.assertEqual(spec["cp"], {"ranks": 4, "segments": 1})
        plain = gdnc.region_layout(dict(spec, cp={"ranks": 1, "segments": 1}), 10000, 3)
        ranked = gdnc.region_layout(spec, 10000, 3)
        # The chunk table holds a 16-byte entry per chunk, and the rank cuts may add 3 chunks.
        self.assertEqual(ranked["buffers"]["chunks"][1], plain["buffers"]["chunks"][1] + 3 * 16)
        with self.assertRaises(gdnc.SpecError) as e:
            gdnc.build_spec({"cp": {"ranks": 2, "segments": 4}}, heads_qk=2, heads_v=6, head_dim_k=128,
                            head_dim_v=128, l2norm=True, initial_state=False, final_state=False)
        self.assertTrue(str(e.exception).startswith("/cp/segments: 4 with cp.ranks 2"), str(e.exception))

    def test_a_ranks_view_comes_from_the_whole_batch_without_a_gpu(self):
        # 4 ranks of 1024 tokens: rank 2 holds the end of document 0, documents 1 and 2, and the
        # start of document 3.
        view = gdnc.cp.rank_view([0, 2500, 2600, 3000, 4096], 2, 4)
        self.assertEqual(view, {"token_begin": 2048, "tokens": 1024, "cu_seqlens": [0, 452, 552, 952, 1024],
                                "documents": [0, 1, 2, 3], "pieces_before": 2, "pieces_after": 1})
        self.assertEqual(gdnc.cp.rank_view([0, 2500, 2600, 3000, 4096], 1, 4)["documents"], [0])
        with self.assertRaises(gdnc.InputError) as e:
            gdnc.cp.rank_view([0, 4096], 4, 4)
        self.assertEqual(str(e.exception), "rank: 4 is outside 0 .. 3 (world 4)")
        with self.assertRaises(gdnc.InputError) as e:
            gdnc.cp.rank_view([0, 4097], 0, 4)
        self.assertIn("4097", str(e.exception))
        with self.assertRaises(gdnc.InputError) as e:
            gdnc.cp.rank_view([], 0, 4)
        self.assertEqual(str(e.exception), "cu_seqlens: is empty (N + 1 offsets from 0 to T expected)")

    def test_a_cp_context_refuses_what_it_cannot_build_before_any_gpu_work(self):
        class Group:  # a communicator of the caller's own: rank 2 of 4
            def rank(self):
                return 2

            def size(self):
                return 4

            def all_gather_into_tensor(self, output, input):
                raise AssertionError("no collective while building a context")

        build = gdnc.cp.build_cp_context
        with self.assertRaisesRegex(NotImplementedError, "layout='zigzag' is not supported by gdnc"):
            build([0, 4096], Group(), layout="zigzag")
        with self.assertRaisesRegex(ValueError, "use_tf32x3_affine_chain=False: only True"):
            build([0, 4096], Group(), use_tf32x3_affine_chain=False)
        with self.assertRaises(gdnc.InputError) as e:
            build([0, 4096], Group(), conv1d_kernel_size=0)
        self.assertEqual(str(e.exception), "conv1d_kernel_size: 0 must be None or a positive int")
        with self.assertRaises(gdnc.InputError) as e:
            build([0, 4097], Group())
        self.assertIn("4097", str(e.exception))
        with self.assertRaises(gdnc.InputError) as e:
            build([0, 3000, 2000, 4096], Group())
        self.assertIn("cu_seqlens[2]", str(e.exception))
        with self.assertRaises(gdnc.InputError) as e:
            build([0, 128], Group())
        self.assertEqual(str(e.exception), "cu_seqlens: 128 tokens over 4 ranks leave 32 a rank; each rank needs at "
                                           "least one 64-token chunk")
        with self.assertRaises(gdnc.InputError) as e:
            build([0, 2.5, 4096], Group())
        self.assertEqual(str(e.exception), "cu_seqlens[1]: 2.5 is not an integer")
        with self.assertRaises(gdnc.InputError) as e:
            build([0, 4096], Group(), cu_seqlens_cpu=[0, True, 4096])
        self.assertEqual(str(e.exception), "cu_seqlens_cpu[1]: True is not an integer")

    def test_the_kcp_workspace_holds_the_gathered_records_after_the_layers_slots(self):
        spec = gdnc.build_spec({"cp": {"ranks": 4}}, heads_qk=2, heads_v=6, head_dim_k=128, head_dim_v=128,
                               l2norm=True, initial_state=True, final_state=True)
        cu = [0, 2500, 2600, 3000, 4096]
        layout = gdnc.cp.workspace_layout(spec, cu, 2)
        offset, size = layout["buffers"]["kcp_gathered"]
        self.assertEqual(size, 4 * 6 * 128 * (128 + 128) * 4)  # every rank's (S_ext, M), fp32
        self.assertEqual(offset % 256, 0)
        self.assertGreaterEqual(layout["bytes"], offset + size)
        for form in ("forward", "backward"):
            own = gdnc.region_layout(spec, 1024, 4, "workspace", form)
            self.assertGreaterEqual(offset, own["bytes"])
            if form == "backward":
                for name, slot in own["buffers"].items():
                    self.assertEqual(layout["buffers"][name], slot, name)
        with self.assertRaises(gdnc.InputError) as e:
            gdnc.cp.workspace_layout(dict(spec, cp={"ranks": 1, "segments": 1}), cu, 0)
        self.assertIn("has 1 rank; the KCP workspace needs cp.ranks > 1", str(e.exception))
        with self.assertRaises(gdnc.InputError) as e:
            gdnc.cp.workspace_layout(spec, [0, 128], 0)
        self.assertIn("each rank needs at least one 64-token chunk", str(e.exception))

    def test_the_first_call_compiles_for_the_gpu_it_runs_on(self):
        from gdnc import spec as spec_module
        self.assertEqual(spec_module.target_of_capability((9, 0)), "sm_90a")
        self.assertEqual(spec_module.target_of_capability((10, 0)), "sm_100a")
        self.assertEqual(spec_module.target_of_capability((10, 3)), "sm_103a")
        for capability, name in (((8, 0), "sm_80"), ((10, 7), "sm_107"), ((12, 0), "sm_120")):
            with self.assertRaises(gdnc.InputError) as e:
                spec_module.target_of_capability(capability)
            self.assertIn(name, str(e.exception))
            self.assertIn("sm_90a", str(e.exception))
        s = gdnc.build_spec(None, heads_qk=2, heads_v=6, head_dim_k=128, head_dim_v=128, l2norm=True,
                            initial_state=False, final_state=False, target="sm_100a")
        self.assertEqual(s["targets"], ["sm_100a"])
        s = gdnc.build_spec({"targets": ["sm_103a"]}, heads_qk=2, heads_v=6, head_dim_k=128, head_dim_v=128,
                            l2norm=True, initial_state=False, final_state=False, target="sm_90a")
        self.assertEqual(s["targets"], ["sm_103a"])  # the caller's spec wins

    def test_the_fused_forward_is_a_code_option(self):
        s = gdnc.build_spec({"forward": "fused"}, heads_qk=2, heads_v=6, head_dim_k=128, head_dim_v=128,
                            l2norm=True, initial_state=False, final_state=False)
        self.assertEqual(s["forward"], "fused")
        s = gdnc.build_spec({"forward": "fused", "save_mode": "full"}, heads_qk=2, heads_v=6, head_dim_k=128,
                            head_dim_v=128, l2norm=True, initial_state=False, final_state=False)
        self.assertEqual((s["forward"], s["save_mode"]), ("fused", "full"))
        with self.assertRaises(gdnc.SpecError) as e:
            gdnc.build_spec({"forward": "fast"}, heads_qk=2, heads_v=6, head_dim_k=128, head_dim_v=128,
                            l2norm=True, initial_state=False, final_state=False)
        self.assertIn("/forward", str(e.exception))

    def test_the_reverse_walk_layout_is_a_code_option(self):
        shape = dict(heads_qk=16, heads_v=48, head_dim_k=128, head_dim_v=128, l2norm=True, initial_state=True,
                     final_state=True)
        self.assertNotIn("walk_bwd_layout", gdnc.build_spec({"walk_bwd_layout": "auto"}, **shape))  # the default
        for layout in ("fused", "split"):
            self.assertEqual(gdnc.build_spec({"walk_bwd_layout": layout}, **shape)["walk_bwd_layout"], layout)
        with self.assertRaises(gdnc.SpecError) as e:
            gdnc.build_spec({"walk_bwd_layout": "fastest"}, **shape)
        self.assertIn("/walk_bwd_layout", str(e.exception))

    def test_options_that_follow_from_the_call_cannot_be_overridden(self):
        with self.assertRaisesRegex(TypeError, r"unknown option\(s\) \['heads'\]"):
            gdnc.build_spec({"heads": {"qk": 1, "v": 1}}, heads_qk=2, heads_v=6, head_dim_k=128, head_dim_v=128,
                            l2norm=True, initial_state=False, final_state=False)


class HostileSpecTests(unittest.TestCase):
    """Specs that crashed the interpreter, raised the wrong class or reached libgdn unchecked."""

    def test_deep_nesting_is_a_spec_error_not_a_crash(self):
        with self.assertRaisesRegex(gdnc.SpecError, "^/0/0/0/0/0/0/0/0/0/0/0/0/0/0/0/0: nesting deeper than 16 levels$"):
            gdnc.validate_spec("[" * 60000 + "]" * 60000)
        deep = {}
        for _ in range(100000):
            deep = {"cp": deep}
        with self.assertRaisesRegex(gdnc.SpecError, "^spec: nesting too deep$"):
            gdnc.validate_spec(deep)

    def test_library_side_json_errors_are_spec_errors_with_the_pointer(self):
        base = '{"name":"x","heads":{"qk":2,"v":6}'
        cases = [
            (base + ',"scale":1e400}', "/scale: number 1e400 is out of range (it overflows a double)"),
            (base + ',"heads":{"qk":2,"v":6}}', "/heads: duplicate key (each field may appear once)"),
            ('{"name":"x","heads":{"qk":18446744073709551615,"v":6}}',
             "/heads/qk: 18446744073709551615 is out of range (1 to 4096)"),
            ('{"name":"shape\\u0000n","heads":{"qk":2,"v":6}}',
             '/name: "shape\\u0000n" must be 1 to 64 characters of [A-Za-z0-9_-]'),
            ("{", "invalid JSON at line 1, column 2: syntax error while parsing object key - unexpected end "
                  "of input; expected string literal; last read: \"{\""),
        ]
        for text, message in cases:
            with self.subTest(message=message):
                with self.assertRaises(gdnc.SpecError) as e:
                    gdnc.validate_spec(text)
                self.assertEqual(str(e.exception), message)

    def test_python_side_errors_name_the_spec(self):
        cases = [
            (123, r"spec: expected a dict or a JSON string, got int"),
            ({"name": "x", "heads": {"qk": 2, "v": 6}, "scale": float("nan")},
             # Python 3.12 appends the value (": nan"); 3.11 does not.
             r"spec: cannot be written as JSON: 'Out of range float values are not JSON compliant(: nan)?'"),
            ({"name": object()}, r"spec: cannot be written as JSON: 'Object of type object is not JSON serializable'"),
            ('{"name":"x","heads":{"qk":2,"v":6}}\0{"chunk":48}',
             r"spec: a NUL character at index 35 \(JSON text holds none\)"),
        ]
        for spec, pattern in cases:
            with self.subTest(message=pattern):
                with self.assertRaises(gdnc.SpecError) as e:
                    gdnc.validate_spec(spec)
                self.assertRegex(str(e.exception), "^" + pattern + "$")

    def test_a_json_string_of_options_builds_like_the_dict(self):
        s = gdnc.build_spec('{"save_mode": "full"}', heads_qk=2, heads_v=6, head_dim_k=128, head_dim_v=128,
                            l2norm=True, initial_state=False, final_state=False)
        self.assertEqual(s["save_mode"], "full")


class SavedRegion:
    """Stands for a saved tensor: weakly referenceable, dies when its last reference goes."""


class HandoffBookkeepingTests(unittest.TestCase):
    """gdnc._handoff: a recompute's workspace lives exactly as long as its saved region."""

    def setUp(self):
        from gdnc._handoff import RecomputeWorkspaces
        self.table = RecomputeWorkspaces(limit=3)

    def test_backward_takes_the_workspace_once(self):
        saved = SavedRegion()
        self.table.remember(saved, 0x1000, "ws")
        self.assertEqual(self.table.take(0x1000), "ws")
        self.assertIsNone(self.table.take(0x1000))
        del saved  # the finalizer was detached: nothing to drop, nothing raised
        self.assertEqual(len(self.table), 0)

    def test_a_freed_region_leaves_no_entry_for_its_address(self):
        # A recompute whose backward never ran: once its region is gone, a later call that gets the
        # same address from the allocator must not find the old tapes.
        saved = SavedRegion()
        self.table.remember(saved, 0x2000, "stale")
        del saved
        self.assertIsNone(self.table.take(0x2000))

    def test_a_dead_region_does_not_drop_its_successor(self):
        old = SavedRegion()
        self.table.remember(old, 0x3000, "old")
        new = SavedRegion()
        self.table.remember(new, 0x3000, "new")  # the address reused while `old` still lives
        del old
        self.assertEqual(self.table.take(0x3000), "new")
        del new

    def test_the_oldest_go_past_the_limit(self):
        regions = [SavedRegion() for _ in range(4)]
        for i, r in enumerate(regions):
            self.table.remember(r, 0x100 * (i + 1), i)
        self.assertEqual(len(self.table), 3)
        self.assertIsNone(self.table.take(0x100))
        self.assertEqual(self.table.take(0x400), 3)


class ErrorDesignTests(unittest.TestCase):
    def test_every_error_derives_from_gdnc_error_and_its_builtin_kind(self):
        for cls, builtin in ((gdnc.SpecError, ValueError), (gdnc.InputError, ValueError),
                             (gdnc.CompileError, RuntimeError), (gdnc.CudaError, RuntimeError)):
            with self.subTest(cls=cls.__name__):
                self.assertTrue(issubclass(cls, gdnc.GdncError))
                self.assertTrue(issubclass(cls, builtin))


class LoadingTests(unittest.TestCase):
    def test_missing_library_names_the_path(self):
        code = "import gdnc\ntry:\n    gdnc.library()\nexcept gdnc.GdncError as e:\n    print(e)\n"
        env = dict(os.environ, GDNC_LIBRARY="/nonexistent/libgdn.so")
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                             cwd=str(Path(__file__).resolve().parents[1]), check=True).stdout
        self.assertIn("cannot load libgdn.so; tried: /nonexistent/libgdn.so (missing)", out)


class CakeFacadeTests(unittest.TestCase):
    """The seed's single-rank names (gdnc.cake): the option mapping and its errors (no GPU)."""

    def test_only_given_options_enter_the_spec_with_the_variant_determinism(self):
        from gdnc.cake import Options
        self.assertEqual(Options().spec(True), {"deterministic": True})
        self.assertEqual(Options(graph="replay").spec(False), {"graph": "replay", "deterministic": False})
        o = Options(reuse_recompute_tapes="auto")
        self.assertEqual(o.given, {"reuse_recompute_tapes": "auto"})  # an explicit "auto" is recorded
        self.assertEqual(Options().given, {})
        self.assertEqual((Options().graph, Options().save_mode, Options().reuse_recompute_tapes),
                         ("off", "light", "auto"))
        self.assertNotEqual(o, Options())
        self.assertEqual(Options(save_mode="full", reuse_recompute_tapes=False),
                         Options(reuse_recompute_tapes=False, save_mode="full"))
        with self.assertRaises(AttributeError):
            o.graph = "replay"
        s = gdnc.build_spec(Options(save_mode="full", graph="replay", reuse_recompute_tapes=False).spec(True),
                            heads_qk=2, heads_v=6, head_dim_k=128, head_dim_v=128, l2norm=True,
                            initial_state=False, final_state=False)
        self.assertEqual((s["save_mode"], s["graph"], s["reuse_recompute_tapes"], s["deterministic"]),
                         ("full", "replay", False, True))

    def test_bad_options_are_named_with_what_they_take(self):
        from gdnc.cake import Options
        with self.assertRaisesRegex(ValueError, r"Options: save_mode='heavy' is not supported \(supported: 'light', 'full'\)"):
            Options(save_mode="heavy")
        with self.assertRaisesRegex(ValueError, r"reuse_recompute_tapes=1 is not supported"):
            Options(reuse_recompute_tapes=1)  # 1 == True must not pass for True
        with self.assertRaisesRegex(TypeError, r"unknown option\(s\) \['deterministic'\]"):
            Options(deterministic=True)  # the variant decides it

    def test_the_facade_takes_options_not_a_spec(self):
        from gdnc.cake import cake_gdn_det_train, cake_gdn_train
        with self.assertRaisesRegex(TypeError, r"pass code options as options=Options"):
            cake_gdn_train(None, None, None, None, None, spec={"save_mode": "full"})
        with self.assertRaisesRegex(TypeError, r"options must be gdnc.cake.Options, not dict"):
            cake_gdn_det_train(None, None, None, None, None, options={"save_mode": "full"})

    def test_the_kcp_names_map_options_and_size_the_workspace_from_the_spec(self):
        from gdnc.cake import (OptionsKcp, cake_gdn_det_train_kcp, gdn_workspace_bytes_kcp,
                               gdn_workspace_layout_kcp)
        # A context of rank 1 of 4 as build_cp_context leaves it (its tensors are not read here).
        ctx = gdnc.cp.CPContext.__new__(gdnc.cp.CPContext)
        ctx.rank, ctx.world, ctx.global_cu_seqlens = 1, 4, (0, 2500, 4096)
        ctx.tokens, ctx.cu_seqlens = 1024, FakeTensor((2,), "int32")  # the middle of document 0
        T = 1024
        x = dict(q=FakeTensor((1, T, 2, 128)), k=FakeTensor((1, T, 2, 128)), v=FakeTensor((1, T, 6, 128)),
                 g=FakeTensor((1, T, 6), "float32"), beta=FakeTensor((1, T, 6), "float32"))
        layout = gdn_workspace_layout_kcp(ctx, **x, options=OptionsKcp(save_mode="full"),
                                          use_qk_l2norm_in_kernel=True)
        spec = gdnc.build_spec({"save_mode": "full", "deterministic": True, "cp": {"ranks": 4}}, heads_qk=2, heads_v=6,
                               head_dim_k=128, head_dim_v=128, l2norm=True, initial_state=False, final_state=False)
        self.assertEqual(layout, gdnc.cp.workspace_layout(spec, [0, 2500, 4096], 1))
        self.assertEqual(gdn_workspace_bytes_kcp(ctx, **x, use_qk_l2norm_in_kernel=True),
                         gdn_workspace_layout_kcp(ctx, **x, use_qk_l2norm_in_kernel=True)["bytes"])
        self.assertEqual(repr(OptionsKcp(graph="replay")), "OptionsKcp(graph='replay')")
        with self.assertRaisesRegex(gdnc.InputError, "spec: cp.ranks 2 differs from the cp_context's world of 4"):
            gdnc.chunk_gated_delta_rule(**x, cp_context=ctx, spec={"cp": {"ranks": 2}})
        with self.assertRaisesRegex(gdnc.InputError, "q: 512 tokens, but rank 1 of the cp_context holds 1024"):
            half = {n: FakeTensor((1, 512) + t.shape[2:], str(t.dtype)[6:]) for n, t in x.items()}
            gdnc.chunk_gated_delta_rule(**half, cp_context=ctx)
        # initial_state has a row per local document: the context's cu_seqlens count them.
        with self.assertRaisesRegex(gdnc.InputError, r"initial_state: expected \[N=1, HV=6, K=128, V=128\], got "
                                    r"\(3, 6, 128, 128\)"):
            gdnc.chunk_gated_delta_rule(**x, cp_context=ctx, initial_state=FakeTensor((3, 6, 128, 128), "float32"))
        with self.assertRaisesRegex(gdnc.InputError, "cp_context: expected a gdnc.cp.CPContext"):
            gdnc.chunk_gated_delta_rule(**x, cp_context="rank 1", cu_seqlens=FakeTensor((2,), "int32"))
        with self.assertRaisesRegex(TypeError, r"pass code options as options=OptionsKcp\(...\), not spec="):
            cake_gdn_det_train_kcp(*x.values(), ctx, spec={"save_mode": "full"})
        with self.assertRaisesRegex(TypeError, "workspace: expected gdnc.cake.WorkspaceKcp, not bytearray"):
            cake_gdn_det_train_kcp(*x.values(), ctx, workspace=bytearray(16))


if __name__ == "__main__":
    unittest.main()


class ReferenceTests(unittest.TestCase):
    """The fp64 reference through its C entry point, against a pure-Python recurrence."""

    @staticmethod
    def naive(q, k, v, g, beta, cu, H, HV, K, V, scale):
        G = HV // H
        o = [0.0] * (cu[-1] * HV * V)
        for n in range(len(cu) - 1):
            for j in range(HV):
                h = j // G
                S = [[0.0] * V for _ in range(K)]
                for t in range(cu[n], cu[n + 1]):
                    a = math.exp(g[t * HV + j])
                    kt = [k[(t * H + h) * K + i] for i in range(K)]
                    qt = [q[(t * H + h) * K + i] for i in range(K)]
                    S = [[a * S[i][c] for c in range(V)] for i in range(K)]
                    r = [v[(t * HV + j) * V + c] - sum(S[i][c] * kt[i] for i in range(K)) for c in range(V)]
                    b = beta[t * HV + j]
                    S = [[S[i][c] + b * kt[i] * r[c] for c in range(V)] for i in range(K)]
                    for c in range(V):
                        o[(t * HV + j) * V + c] = scale * sum(S[i][c] * qt[i] for i in range(K))
        return o

    def test_forward_and_a_gradient_match(self):
        from gdnc import reference
        rng = random.Random(5)
        H, HV, K, V, cu = 1, 2, 4, 3, [0, 7, 20]
        T = cu[-1]
        q = [rng.gauss(0, 1) for _ in range(T * H * K)]
        k = [rng.gauss(0, 1) for _ in range(T * H * K)]
        v = [rng.gauss(0, 1) for _ in range(T * HV * V)]
        g = [-abs(rng.gauss(0, 1)) for _ in range(T * HV)]
        beta = [rng.random() for _ in range(T * HV)]
        out = reference.run(q, k, v, g, beta, cu, H, HV, K, V, scale=0.5)
        want = self.naive(q, k, v, g, beta, cu, H, HV, K, V, 0.5)
        self.assertLess(max(abs(a - b) for a, b in zip(out["o"], want)), 1e-12)
        d_o = [rng.gauss(0, 1) for _ in range(T * HV * V)]
        grads = reference.run(q, k, v, g, beta, cu, H, HV, K, V, scale=0.5, d_o=d_o)
        eps, i = 1e-6, 11
        loss = lambda vv: sum(a * b for a, b in zip(reference.run(q, k, vv, g, beta, cu, H, HV, K, V, 0.5)["o"], d_o))
        vp, vm = list(v), list(v)
        vp[i] += eps
        vm[i] -= eps
        self.assertAlmostEqual(grads["dv"][i], (loss(vp) - loss(vm)) / (2 * eps), places=6)

    def test_errors_are_messages(self):
        from gdnc import reference
        with self.assertRaisesRegex(ValueError, "cu_seqlens"):
            reference.run([0.0] * 8, [0.0] * 8, [0.0] * 6, [0.0] * 2, [0.0] * 2, [0, 3, 2], 1, 1, 4, 3)

    def test_rel_rms_rejects_nan(self):
        from gdnc import reference
        self.assertEqual(reference.rel_rms([1.0, 2.0], [1.0, float("nan")]), float("inf"))
        self.assertAlmostEqual(reference.rel_rms([1.0, -1.0], [1.1, -0.9]), 0.1)
