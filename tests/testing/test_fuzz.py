"""The differential fuzzer (tracejit.testing.fuzz): a CI profile of random programs, and tests
that the fuzzer itself finds what it must (planted faults, a hang, eager's own errors).

Every program runs in a worker process (a hang is killed), eagerly and through jit,
10 calls with new values, flipped branches and a new batch size.
"""
import textwrap

import pytest

from tracejit.testing.fuzz import cli as fuzz
from tracejit.testing.fuzz.harness import PLANTS

# A program in the generator's format that jit gets right: float64, batch sides 2 and 3
# (no size-1 extent), one guard on the sign of x1, a captured Parameter, a float
# argument, a backward.
GOOD = textwrap.dedent('''\
    import numpy as np
    import tracejit as tj
    import tracejit.functions as F

    W0 = tj.Parameter(np.random.default_rng(1).uniform(-1.0, 1.0, (3,)))


    def make():
        def f(x0, x1, s0):
            h1 = F.tanh(x0) * W0
            if x1.data.sum() > 0:
                h2 = h1 * s0
            else:
                h2 = h1 - s0
            return h2,

        return f, {}


    f, _closure = make()
    CAPTURES = {'W0': W0, **_closure}
    PLAN = [(2, 1.0, 0.25), (2, 1.0, 0.5), (2, -1.0, 0.75), (2, 1.0, 0.25), (2, -1.0, 0.5),
            (2, 1.0, 0.75), (3, 1.0, 0.25), (3, 1.0, 0.5), (3, -1.0, 0.75), (3, 1.0, 0.25)]
    BACKWARD = 'plain'


    def args(call):
        nb, sign, s = PLAN[call]
        rng = np.random.default_rng(call)
        x0 = tj.Variable(rng.uniform(-2.0, 2.0, (nb, 3)))
        x1 = tj.Variable(rng.uniform(-0.5, 0.5, (nb,)) + sign)
        return x0, x1, s
''')


def _program(body):
    """GOOD with f's body replaced."""
    start = GOOD.index("    def f(")
    end = GOOD.index("    return f, {}")
    return GOOD[:start] + textwrap.indent(textwrap.dedent(body), " " * 4) + "\n" + GOOD[end:]


def test_good_program_matches_and_every_planted_fault_is_found():
    items = [(GOOD, False, None)] + [(GOOD, False, p) for p in PLANTS]
    res = fuzz.run_many(items, jobs=1, timeout=120)
    got = {plant: r["cls"] for (_, _, plant), r in zip(items, res)}
    assert got[None] == "match", res[0]
    expected = {p: "crash" if p == "raise" else "mismatch" for p in PLANTS}
    assert {p: got[p] for p in PLANTS} == expected, res
    details = {plant: r["detail"] for (_, _, plant), r in zip(items, res)}
    assert "call 3: result leaf 0: value" in details["value"]
    assert "call 3: result leaf 0: dtype" in details["dtype"]
    assert "call 3: result leaf 0: ident" in details["identity"]
    assert "call 3: gradient of argument 0" in details["grad"]
    assert "call 3: state after the call: capture W0.data" in details["state"]
    assert "RuntimeError" in details["raise"]


def test_a_program_that_does_not_finish_is_a_hang():
    sleeper = _program('''\
        def f(x0, x1, s0):
            import time
            time.sleep(600)
            return x0 * 2.0,
        ''')
    (res,) = fuzz.run_many([(sleeper, False)], jobs=1, timeout=3)
    assert res["cls"] == "hang"
    assert "eager call 0" in res["detail"]


def test_a_program_spinning_on_the_cpu_is_a_hang():
    spinner = _program('''\
        def f(x0, x1, s0):
            while True:
                pass
            return x0 * 2.0,
        ''')
    (res,) = fuzz.run_many([(spinner, False)], jobs=1, timeout=3)
    assert res["cls"] == "hang"


def test_a_starved_runnable_worker_is_not_a_hang(monkeypatch):
    # A deep run at nice 19 beside other work: past its wall timeout, the worker is
    # runnable ('R') and has used little CPU: still running, not hung.
    import time
    slot = type("Slot", (), {})()
    slot.t0, slot.proc = time.monotonic() - 500, type("P", (), {"pid": 1})()
    slot.cpu0 = slot.cpu_last = 1.0
    monkeypatch.setattr(fuzz, "_cpu_state", lambda pid: (1.5, "R"))
    assert not fuzz._hung(slot, 120)
    monkeypatch.setattr(fuzz, "_cpu_state", lambda pid: (1.5, "S"))     # asleep: hung
    assert fuzz._hung(slot, 120)
    monkeypatch.setattr(fuzz, "_cpu_state", lambda pid: (130.0, "R"))   # 129 s of CPU
    assert fuzz._hung(slot, 120)


def test_eager_raising_is_an_invalid_program_not_a_jit_bug():
    bad = _program('''\
        def f(x0, x1, s0):
            return F.matmul(x0, x1),        # (nb, 3) @ (nb,): no
        ''')
    (res,) = fuzz.run_many([(bad, False)], jobs=1, timeout=60)
    assert res["cls"] == "invalid", res
    assert "ValueError" in res["detail"] or "TypeError" in res["detail"]


def test_warning_causes_are_grouped_without_their_variable_parts():
    a = ("jit(f) runs eagerly: more than max_variants=8 variants (data-dependent control "
         "flow keeps changing) at prog_1.py:12  if x0.data.sum() > 0:")
    b = ("jit(g) runs eagerly: more than max_variants=4 variants (data-dependent control "
         "flow keeps changing) at other.py:40  while t < 1.2:")
    assert fuzz.normalize_warning(a) == fuzz.normalize_warning(b)
    res = [dict(cls="fallback", warnings=[a]), dict(cls="fallback", warnings=[b]),
           dict(cls="match", warnings=[])]
    counts, causes = fuzz.summarize(res)
    assert counts == {"fallback": 2, "match": 1}
    ((cause, (n, example)),) = causes.items()
    assert n == 2 and example == a


def test_generated_programs_are_deterministic_and_varied():
    p1 = fuzz.generate(30, seed=5)
    p2 = fuzz.generate(30, seed=5)
    assert [p.source for p in p1] == [p.source for p in p2]
    features = set().union(*(p.features for p in p1))
    for f in ("if", "create_graph", "float_arg", "dropout", "no_grad", "nonfinite_input"):
        assert f in features, features
    for p in p1:
        compile(p.source, "<program>", "exec")


def test_avoided_constructs_are_left_out():
    progs = fuzz.generate(40, seed=7, avoid=sorted(fuzz.AVOIDABLE))
    for p in progs:
        assert "SignScale()" not in p.source and "TanhData()" not in p.source
        assert not {"return_arg", "return_capture"} & set(p.features)
        assert "NONFINITE = None" in p.source
        plan = p.source.split("PLAN = ")[1].split("\n")[0]
        assert "(1, " not in plan, plan
    with pytest.raises(ValueError, match="unknown avoid"):
        fuzz.generate(1, avoid=["nonsense"])


def test_fallback_causes_ignore_which_value_differed():
    a = ("jit(f) runs eagerly: the compiled variant differs from eager (output[2]: eager "
         "np.float32(-0.15571487), compiled np.float32(-0.15571484)); the function likely")
    b = ("jit(f) runs eagerly: the compiled variant differs from eager (a captured "
         "Variable.grad[0]: eager 0.19, compiled 0.09); the function likely")
    assert fuzz.normalize_warning(a) == fuzz.normalize_warning(b)


def test_ci_profile_finds_no_mismatch_crash_or_hang():
    programs = fuzz.generate(30, seed=0)
    # 60 s: a program takes 1-3 s alone; 15 s was exceeded on a machine loaded 5x over.
    # A hang (a compile that never finishes) is still one.
    results = fuzz.run_many(programs, jobs=1, timeout=60)
    bad = [(i, r["cls"], (r["detail"] or "")[:300]) for i, r in enumerate(results)
           if r["cls"] in fuzz.FAILING]
    assert not bad, "\n" + "\n".join(map(str, bad)) + "\n\n" + fuzz.format_summary(results)


def test_workers_are_replaced_after_recycle_programs(tmp_path):
    # A worker keeps every kernel its programs compiled; the deep run's workers grew to
    # 11.6 GB each. Each program here writes its worker's pid.
    log = tmp_path / "pids.txt"
    prog = _program(f'''\
        def f(x0, x1, s0):
            import os
            with open({str(log)!r}, "a") as fh:
                fh.write(f"{{os.getpid()}}\\n")
            return x0 * 2.0,
        ''')
    results = fuzz.run_many([(prog, False)] * 4, jobs=1, timeout=60, recycle=2)
    assert [r["cls"] for r in results] == ["match"] * 4, results
    assert len(set(log.read_text().split())) == 2


def test_the_state_focus_draws_each_of_its_constructs():
    # Issue 9's identity and in-place classes (programs.STATE_STEPS): each appears.
    progs = fuzz.generate(20, seed=3, focus="state")
    features = set().union(*(p.features for p in progs))
    for f in ("seed_through_arg", "seed_through_param", "seed_through_create_graph",
              "inplace_view_arg",
              "capture_updated_before_backward", "data_held_across_update",
              "eval_shape_writes"):
        assert f in features, features
    for p in progs:
        compile(p.source, "<program>", "exec")


def test_the_matmul_focus_draws_what_the_batching_pass_rewrites():
    # programs.MATMUL_STEPS: each construct appears, and the programs run compiled with
    # eager's results (a sum of products, shared operands, a recurrence, an outer product).
    progs = fuzz.generate(20, seed=5, focus="matmul")
    features = set().union(*(p.features for p in progs))
    for f in ("matmul_sum", "matmul_shared", "matmul_recurrence", "matmul_outer"):
        assert f in features, features
    # (not a buffer read of traced data, nor traced data handed to NumPy: a .view() or
    # .tobytes() of it runs eagerly by design, warned)
    chosen = [p for p in progs if {"matmul_sum", "matmul_recurrence"} & set(p.features)
              and not {"buffer_read", "numpy_entry"} & set(p.features)][:4]
    assert len(chosen) == 4
    results = fuzz.run_many(chosen, jobs=1, timeout=120)
    assert [r["cls"] for r in results] == ["match"] * len(chosen), results


def test_argument_update_programs_draw_views_of_arguments():
    # The argument views block: intermediates that are views of an argument's buffer,
    # changed by the caller before the backward.
    progs = fuzz.generate(12, seed=3, generator="argument_updates")
    with_views = [p for p in progs if "argument_view" in p.features]
    assert with_views and len(with_views) < len(progs)
    assert any("F.transpose(x" in p.source or "F.reshape(x" in p.source for p in with_views)
    for p in progs:
        compile(p.source, "<program>", "exec")


def test_the_views_and_state_focus_draw_views_of_grads():
    # Views of a .grad the call sets (a seed passed through, one seed shared by two
    # .grads, a retained one, a computed one), returned with or without the .grad.
    progs = fuzz.generate(40, seed=3, focus="views")
    features = set().union(*(p.features for p in progs))
    for f in ("seed", "shared_seed", "retained", "computed"):
        assert f"returned_view_of_{f}_grad" in features, features
    progs += fuzz.generate(20, seed=3, focus="state")
    features = set().union(*(p.features for p in progs))
    assert "returned_view_of_seed_through" in features, features
    for p in progs:
        compile(p.source, "<program>", "exec")


def test_the_compared_aliases_include_grads_and_a_views_index_map():
    import numpy as np

    from tracejit import Variable
    from tracejit.testing.fuzz.harness import _aliases
    x = Variable(np.ones((2, 3)))
    x.grad = Variable(np.arange(6.0).reshape(2, 3))
    before = x.grad.data.copy()
    assert _aliases(x.grad.data.T, [x], {}, []) == (
        "argument 0's .grad", "as argument 0's .grad: (3, 2) [0, 3, 1, 4, 2, 5]")
    np.testing.assert_array_equal(x.grad.data, before)     # the probe puts it back
    assert _aliases(x.grad.data.T.copy(), [x], {}, []) == ()


def test_the_alias_index_map_tells_a_wrong_view_but_not_a_layout():
    import numpy as np

    from tracejit.testing.fuzz.harness import _aliases
    c = np.arange(6.0).reshape(2, 3)
    f = np.asfortranarray(c)
    # A result returned twice: the same elements, whatever its memory order.
    assert _aliases(c, [], {}, [c]) == _aliases(f, [], {}, [f])
    # A view of it: the same index map in C and in Fortran order...
    assert _aliases(c.T, [], {}, [c]) == _aliases(f.T, [], {}, [f])
    assert _aliases(c[:, 1:], [], {}, [c]) == _aliases(f[:, 1:], [], {}, [f])
    # ... but another view is another map.
    assert _aliases(c[:, 1:], [], {}, [c]) != _aliases(c[:, :2], [], {}, [c])
    assert _aliases(c.T, [], {}, [c]) != _aliases(c.reshape(3, 2), [], {}, [c])
    np.testing.assert_array_equal(c, np.arange(6.0).reshape(2, 3))


def test_the_mixed_dtypes_focus_draws_float64_cotangents_beside_a_dead_state():
    # The mixed-dtype cotangents block (programs.MIXED_DTYPE_STEPS): a float32 result,
    # itself or a view of it, beside a float64 one and a float64 state threaded
    # between calls; the general generator draws it too.
    progs = fuzz.generate(20, seed=3, focus="mixed_dtypes")
    features = set().union(*(p.features for p in progs))
    for form in ("itself", "transpose", "reshape"):
        assert f"mixed_dtype_cotangent_{form}" in features, features
    for p in progs:
        compile(p.source, "<program>", "exec")
    general = fuzz.generate(60, seed=7)
    assert any(f.startswith("mixed_dtype_cotangent_") for p in general for f in p.features)


def test_argument_views_draw_a_flattened_slice_of_an_argument_whose_layout_flips():
    # Variable(x.data.reshape(-1)[0:2]): a view of a C-contiguous x and of a strided
    # one whose dimensions merge, a copy of a Fortran-ordered one; args() varies x's
    # layout between calls (one signature key for all three).
    progs = fuzz.generate(200, seed=1, focus="argument_views")
    flips = [p for p in progs if "argument_layout_flip" in p.features]
    assert flips and any("argument_layout_flip_returned" in p.features for p in flips)
    for p in flips:
        assert "reshape(-1)[0:2])" in p.source and "np.asfortranarray(" in p.source
        assert "np.stack([" in p.source
        compile(p.source, "<program>", "exec")


def test_argument_updates_are_drawn_per_argument_kind():
    # A float update of an int index array raises in eager (an invalid program): the
    # table only holds updates the argument's kind has.
    from tracejit.testing.fuzz.programs import ARG_UPDATES
    progs = fuzz.generate(40, seed=0, generator="argument_updates")
    assert any("int_array" in p.arg_kinds for p in progs)
    for p in progs:
        ns = {}
        table_line = next(line for line in p.source.splitlines()
                          if line.startswith("ARG_UPDATES = "))
        exec(table_line.split("#")[0], ns)
        for row in ns["ARG_UPDATES"]:
            for j, kind in enumerate(row):
                arg = p.arg_kinds[j] if j < len(p.arg_kinds) else "other"
                assert kind == "none" or arg in ARG_UPDATES[kind], (kind, arg)


def test_invalid_programs_are_listed_by_cause():
    results = [dict(cls="invalid", detail="call 1: eager raises UFuncTypeError in the "
                    "update between the call and the backward: Cannot cast ufunc 'add'",
                    warnings=[], cache_info=None),
               dict(cls="invalid", detail="call 4: eager raises UFuncTypeError in the "
                    "update between the call and the backward: Cannot cast ufunc 'multiply'",
                    warnings=[], cache_info=None),
               dict(cls="match", detail=None, warnings=[], cache_info=None)]
    text = fuzz.format_summary(results)
    assert "invalid programs by cause" in text
    assert "    2  eager raises UFuncTypeError in the update between" in text


def test_the_views_focus_draws_merged_values_and_the_general_generator_too():
    # The merged values block (programs._merged_views): equal computations CSE makes
    # one value of, one value returned twice, results a pass may simplify into an
    # input and a result equal to the stored state, returned through views.
    progs = fuzz.generate(60, seed=3, focus="views")
    features = set().union(*(p.features for p in progs))
    for kind in ("cse", "twice", "simplifiable", "stored"):
        assert f"merged_{kind}" in features, features
    for p in progs:
        compile(p.source, "<program>", "exec")
    general = fuzz.generate(60, seed=7)
    assert any(f.startswith("merged_") for p in general for f in p.features)


def test_the_stored_states_aliases_with_the_results_are_compared():
    import numpy as np

    import tracejit.functions as F
    from tracejit import Variable
    from tracejit.testing.fuzz.harness import observe

    class H:
        pass
    h = H()

    def f(x):
        y = F.sin(x)
        h.a = F.transpose(y)
        return y
    rec = observe(f, [Variable(np.ones((2, 3)))], {}, None, 0, state=lambda: {"h.a": h.a})
    assert rec["state"]["state h.a"]["alias"] == (
        "result leaf 0", "as result leaf 0: (3, 2) [0, 3, 1, 4, 2, 5]")


def test_the_made_leaves_focus_draws_each_kind_and_escape():
    # Leaves made in f that outlive it (programs.MADE_LEAF_STEPS), each kind and each
    # way out; the harness compares the .grad of every result and state Variable.
    from tracejit.testing.fuzz.programs import MADE_LEAF_ESCAPES, MADE_LEAF_KINDS
    progs = fuzz.generate(30, seed=3, focus="made_leaves")
    features = set().union(*(p.features for p in progs))
    for k in MADE_LEAF_KINDS + MADE_LEAF_ESCAPES:
        assert f"made_leaf_{k}" in features, features
    # and several of one array (`Variable(h.data)` twice, `Variable(c.data)` of one)
    assert "made_leaves_sharing" in features, features
    for p in progs:
        compile(p.source, "<program>", "exec")


def test_the_dropped_state_focus_draws_each_action_and_runs_it_before_the_backward():
    # programs.DROPPED_STATE_STEPS: each thing the caller does to the stored state, with
    # and without a retained .grad; the harness's BETWEEN is DROP_STATE.
    from tracejit.testing.fuzz.programs import DROP_ACTIONS
    progs = fuzz.generate(40, seed=1, focus="dropped_state")
    features = set().union(*(p.features for p in progs))
    for a in DROP_ACTIONS:
        assert f"dropped_state_{a}" in features, features
    assert "dropped_state_retained" in features, features
    for p in progs:
        compile(p.source, "<program>", "exec")
        if "def DROP_STATE(" in p.source:
            assert "BETWEEN = DROP_STATE" in p.source


def test_the_retain_grad_focus_draws_programs_with_no_variable_input():
    # NO_VAR: every argument an ndarray (or the float), captures drawn as arrays, the
    # focus's results computed from one another; some with no captured Parameter at
    # all (nothing differentiable from outside the call).
    progs = [p for p in fuzz.generate(40, seed=3, focus="retain_grad")
             if "no_variable_input" in p.features]
    assert len(progs) >= 5, len(progs)
    assert all("var" not in p.arg_kinds for p in progs)
    assert any("return_intermediate" in p.features and not any(
        f.startswith("capture_param") for f in p.features) for p in progs)
    for p in progs:
        compile(p.source, "<program>", "exec")


def test_the_gradients_of_result_variables_are_compared():
    # How compiled calls hid a made leaf given no gradient: it is neither an argument
    # nor a capture, so only the result Variables' .grad show it.
    import numpy as np

    import tracejit as tj
    from tracejit.testing.fuzz import harness

    def f(x0):
        c = tj.Variable(np.full(3, 0.5))
        return x0 * c, c

    def without_grad(x0):
        y, c = f(x0)
        return y, tj.Variable(c.data)      # the same value, no gradient from y
    recs = [harness.observe(g, [tj.Variable(np.ones(3))], {}, "plain", 0)
            for g in (f, without_grad)]
    assert recs[0]["grads"]["result leaf 1"] is not None
    diffs = harness.compare_call(recs[1], recs[0], (1e-7, 0.0))
    assert any("gradient of result leaf 1" in msg for _, msg in diffs), diffs


def test_the_made_arrays_focus_draws_each_form():
    progs = fuzz.generate(40, seed=3, focus="made_arrays")
    features = set().union(*(p.features for p in progs))
    for f in ("made_branch_", "made_operand_", "made_variable_first", "made_temp_mask",
              "made_mask", "made_input_write", "made_slice_write",
              "made_variable_used_first", "made_via_dict", "made_branch_flat",
              "made_operand_put"):
        assert any(g.startswith(f) for g in features), (f, features)
    for p in progs:
        compile(p.source, "<program>", "exec")


def test_captures_are_held_as_defaults_keyword_defaults_and_tuple_items():
    progs = fuzz.generate(60, seed=4)
    features = set().union(*(p.features for p in progs))
    for where in ("default", "kwdefault", "tuple"):
        assert any(f.startswith("capture_") and f.endswith("_" + where)
                   for f in features), (where, features)
    for p in progs:
        compile(p.source, "<program>", "exec")


def test_skip_runs_the_rest_of_a_run_numbered_as_in_the_whole(tmp_path):
    import json
    from tracejit.testing.fuzz.cli import main
    out = tmp_path / "out"
    main(["--programs", "3", "--skip", "2", "--seed", "0", "--quiet", "--out", str(out)])
    ran = json.loads((out / "results.json").read_text())
    assert [r["program"] for r in ran] == [2]
    assert ran[0]["features"] == fuzz.generate(3, seed=0)[2].features


def test_the_broadcast_views_focus_draws_each_view_and_the_second_backward():
    progs = fuzz.generate(40, seed=3, focus="broadcast_views")
    features = set().union(*(p.features for p in progs))
    for f in ("broadcast_view_transpose2", "broadcast_view_reshape2",
              "broadcast_view_reversed", "broadcast_view_second_backward"):
        assert f in features, features
    for p in progs:
        compile(p.source, "<program>", "exec")


def test_the_rounding_focus_draws_each_rounding_source_and_use():
    progs = fuzz.generate(40, seed=3, focus="rounding")
    features = set().union(*(p.features for p in progs))
    for f in ("rounding_floor", "rounding_ceil", "rounding_trunc", "rounding_round",
              "rounding_int", "rounding_float", "rounding_uint64", "rounding_uint32",
              "rounding_operand", "rounding_branch", "rounding_loop"):
        assert f in features, features
    for p in progs:
        compile(p.source, "<program>", "exec")


@pytest.mark.parametrize("focus, n", [("made_leaves", 40), ("argument_views", 150),
                                      ("rounding", 40), ("made_arrays", 40),
                                      ("broadcast_views", 40)])
def test_generated_programs_are_valid_in_eager(focus, n, tmp_path):
    # An invalid program tests nothing: eager must run every call. Found as invalid:
    # `tj.Variable(h.data * 0.5)` of a 0-d h (a NumPy scalar, which Variable rejects),
    # and struct.unpack_from on an argument whose layout args() flips (not C-contiguous).
    from tracejit.testing.fuzz.harness import run_side
    for k, p in enumerate(fuzz.generate(n, seed=3, focus=focus)):
        records, _, _ = run_side(p.source, str(tmp_path / f"p{k}.py"), jit=False)
        raised = [r["raised"][:2] for r in records if r["raised"]]
        assert not raised, (raised, p.source)
