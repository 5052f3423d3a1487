"""Red-team suite, CPU part (issue 3): for each REWARD_HACKS.md entry that can exist without a GPU,
candidates that really try the trick against RMSNorm go through the public evaluator and must be
rejected with the reason code that names the trick.

Tricks the evaluator does not yet catch are strict xfails whose reason starts with "HOLE:"; once
the evaluator closes a hole, its xfail turns into a failure and the marker must go (none left).
Candidates are batched into few evaluations, since each one starts a worker process; inside it
each candidate is verified in its own child, so one that kills its process costs only itself.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from loop.evaluator import TRUST_INTERPRETER_ENV, CandidateSpec, Limits, evaluate
from loop.tasks import load_task

HERE = Path(__file__).parent / "candidates"
SHAPES = ["decode-7x256", "long-512x1100"]
TIMED_SHAPES = ["decode-7x256"]
QUICK_RULE = {
    "samples_per_block": 3,
    "min_blocks": 2,
    "max_blocks": 4,
    "max_time_s": 0.5,
    "warmup": 1,
}
HONEST = "honest"

# Rejected before any code runs: entry -> (candidate, expected code).
STATIC = {
    "5-assign-time": ("patches_time.py", "foreign-attribute-assignment"),
    "5-assign-synchronize": ("patches_synchronize.py", "foreign-attribute-assignment"),
    "5-sys-modules": ("patches_sys_modules.py", "forbidden-import"),
    "9-gc": ("walks_gc.py", "forbidden-import"),
    "9-frames": ("walks_frames.py", "forbidden-import"),
    "12-library-op": ("calls_rms_norm.py", "calls-reference"),
    "12-library-op-renamed": ("calls_rms_norm_from_import.py", "calls-reference"),
    "12-language-not-used": ("claims_triton.py", "language-not-used"),
    "15-edit-task-file": ("edits_task.py", "forbidden-call"),
    "18-os-exit": ("exits_worker.py", "forbidden-import"),
    "18-subclasses-walk": ("exits_via_subclasses.py", "forbidden-call"),
    # found by the red team of 2026-11-29 evening: module aliases and re-exported modules
    "5-assign-through-module-alias": ("alias_patch_norm.py", "foreign-attribute-assignment"),
    "5-slow-the-peer-through-alias": ("slows_peer_via_alias.py", "foreign-attribute-assignment"),
    "5-patch-the-cpu-timer": ("patches_cpu_block.py", "forbidden-call"),
    "9-ctypes-via-numpy": ("ctypes_escape.py", "forbidden-call"),
    "15-shell-via-cpp-extension": ("subprocess_escape.py", "forbidden-call"),
    "15-file-io-without-open": ("file_io.py", "forbidden-call"),
    "18-pin-the-worker": ("pins_worker.py", "forbidden-call"),
    "18-threads-for-the-peers": ("threads_peers.py", "forbidden-call"),
    # found by the red team of 2026-11-29 night: doors to builtins and sys through allowed
    # modules, global torch hooks, finalizers, evaluated annotations, a library module class
    "15-import-through-torch-builtins": ("imports_via_torch_builtins.py", "forbidden-call"),
    "18-forge-a-mark-through-torch-builtins": (
        "forges_mark_via_torch_builtins.py",
        "forbidden-call",
    ),
    "3-thread-through-dataclasses": ("threads_via_dataclasses.py", "forbidden-call"),
    "9-profile-hook-through-typing": ("profiles_via_typing_sys.py", "forbidden-call"),
    "15-mock-patch-through-torch": ("mock_patch_via_torch.py", "forbidden-call"),
    "5-function-mode-lies": ("mode_lies_norm.py", "forbidden-import"),
    "5-dispatch-mode-lies": ("dispatch_mode_lies.py", "forbidden-import"),
    "18-mode-taxes-the-peers": ("mode_taxes_peers.py", "forbidden-import"),
    "5-dispatcher-override": ("library_impl_norm.py", "forbidden-call"),
    "18-finalizer-frames-the-next-runner": ("finalizer_frames_next_runner.py", "forbidden-call"),
    "12-library-module-class": ("calls_rmsnorm_module.py", "calls-reference"),
    "15-string-annotation-evaluated": ("evaluates_string_annotation.py", "forbidden-call"),
    "15-type-comment-evaluated": ("evaluates_type_comment.py", "forbidden-call"),
    # the fifth red team: forged results through file writes, exec through private helpers,
    # calls by run-time name, profilers and generators, a module passed as self
    "5-forge-results-through-dump": ("forges_result_via_dump.py", "forbidden-call"),
    "5-forge-verify-through-dump": ("forges_verify_via_dump.py", "forbidden-call"),
    "5-exec-through-dataclasses": ("execs_via_dataclasses_create_fn.py", "forbidden-call"),
    "5-getattr-through-fx": ("getattr_via_fx.py", "forbidden-import"),
    "18-profiler-taxes-rivals": ("profiler_taxes_rivals.py", "forbidden-call"),
    "18-generator-finalizer-hangs-rival": ("gc_generator_hangs_rival.py", "forbidden-call"),
    "5-builtins-dunder": ("reads_builtins_dunder.py", "forbidden-call"),
    "5-module-passed-as-self": ("passes_module_as_self.py", "forbidden-call"),
    # the sixth red team: modules reached through list subscripts and walruses, then patched
    "5-forge-results-through-json": ("forges_result_via_json.py", "foreign-attribute-assignment"),
    "5-patch-the-reference-through-a-subscript": (
        "patches_reference_via_subscript.py",
        "foreign-attribute-assignment",
    ),
    "18-tax-the-rivals-through-a-walrus": (
        "taxes_rivals_via_walrus.py",
        "foreign-attribute-assignment",
    ),
    "18-finalizer-bound-in-a-class-body": ("hangs_rival_via_del_assign.py", "forbidden-call"),
    # the seventh red team, against this session's narrowing of the guard
    "15-self-test-block-run-by-a-match": ("main_block_via_match.py", "forbidden-call"),
    "15-own-field-reaches-os": ("self_os_via_own_field.py", "forbidden-call"),
    "12-module-as-self-calls-the-op": ("self_is_a_module.py", "forbidden-call"),
    "12-method-through-type": ("method_via_type.py", "forbidden-call"),
    "15-shadowed-hasattr-hands-out-a-module": ("shadowed_hasattr_exec.py", "forbidden-call"),
    "15-own-jit-decorator-hides-a-load": ("own_jit_decorator_load.py", "forbidden-call"),
    "18-generator-except-exit-finalizer": ("gc_generator_except_exit.py", "forbidden-call"),
    # the eighth red team: methods called with a foreign self, reaching modules behind objects
    "15-builtins-behind-a-builtins-self": ("builtins_via_self_of_builtin.py", "forbidden-call"),
    "15-sys-behind-a-library-objects-field": (
        "sys_via_private_field_of_library_object.py",
        "forbidden-call",
    ),
    "5-reference-rebound-through-a-foreign-self": (
        "wrong_result_via_reference_rsqrt.py",
        "forbidden-call",
    ),
    "5-torch-c-patched-through-init": ("patches_torch_c_via_self.py", "forbidden-call"),
    "15-method-through-a-class-alias": ("method_via_class_alias.py", "forbidden-call"),
    "15-method-detached-through-func": ("method_detached_via_func.py", "forbidden-call"),
    "5-own-instance-name-rebound": ("rebinds_own_instance_name.py", "forbidden-call"),
    # the ninth red team: more ways to a module as a value and to a foreign self
    "15-method-alias-in-the-class-body": ("class_body_alias_device_module.py", "forbidden-call"),
    "15-cls-calls-a-method-with-a-module": ("classmethod_cls_module_self.py", "forbidden-call"),
    "15-init-subclass-hook": ("init_subclass_owner.py", "forbidden-call"),
    "15-staticmethod-alias": ("staticmethod_alias_instance_call.py", "forbidden-call"),
    "15-method-in-a-class-table": ("staticmethod_table.py", "forbidden-call"),
    "15-type-kept-then-read": ("type_assigned_then_read.py", "forbidden-call"),
    # the tenth red team: writing into modules by name, hooks that run in others' checks
    "5-harness-builtin-shadowed-by-global-enum": (
        "harness_builtin_shadowed_by_global_enum.py",
        "forbidden-call",
    ),
    "5-timings-faked-through-global-enum": (
        "timings_faked_through_global_enum.py",
        "forbidden-call",
    ),
    "18-rival-module-patched-through-global-enum": (
        "rival_module_patched_through_global_enum.py",
        "forbidden-call",
    ),
    "5-json-forged-through-update-wrapper": (
        "json_forged_through_update_wrapper.py",
        "forbidden-call",
    ),
    "7-timed-checks-blinded-through-update-wrapper": (
        "timed_checks_blinded_through_update_wrapper.py",
        "forbidden-call",
    ),
    "18-input-buffer-set-to-require-grad": (
        "input_buffer_set_to_require_grad.py",
        "forbidden-call",
    ),
    "18-subclass-hook-runs-in-peers": ("subclass_hook_runs_in_peers.py", "forbidden-call"),
    "9-file-read-through-formatwarning": ("file_read_through_formatwarning.py", "forbidden-call"),
    "5-attribute-set-by-copy-hook": ("attribute_set_by_copy_hook.py", "forbidden-call"),
    # the eleventh red team: enum's private _convert_ through super(), the compiler's settings
    "11-builtin-shadowed-through-enum-convert": (
        "builtin_shadowed_through_enum_convert.py",
        "forbidden-call",
    ),
    "18-compile-peer-made-to-fail": ("compile_peer_made_to_fail.py", "forbidden-call"),
    "20-compile-peer-forced-eager": ("compile_peer_forced_eager.py", "forbidden-call"),
    "20-compile-peer-default-backend-eager": (
        "compile_peer_default_backend_eager.py",
        "forbidden-call",
    ),
    "18-input-class-swapped": ("input_class_swapped.py", "forbidden-call"),
    # the twelfth red team: raw memory from numpy views, Triton's process-wide launch hooks
    "9-tolerance-loosened-through-a-numpy-raw-view": (
        "tolerance_loosened_through_numpy_raw_view.py",
        "forbidden-call",
    ),
    "18-triton-launch-hook-taxes-rivals": ("triton_launch_hook_taxes_rivals.py", "forbidden-call"),
}

# Rejected by `verify` (one worker for all of them).
VERIFIED = {
    "1-leftover-empty": (
        "leftover_buffer.py",
        {"non-finite-output", "constant-output", "mismatch"},
    ),
    "2-zero-inputs": ("zeroes_inputs.py", {"inputs-modified"}),
    "2-nudge-one-bit": ("nudges_inputs.py", {"inputs-modified"}),
    "4-expanded-view": ("expanded_view.py", {"wrong-output-layout"}),
    "4-tensor-subclass": ("lazy_subclass.py", {"wrong-output-type", "forbidden-call"}),
    "4-lazy-container": ("lazy_container_iter.py", {"wrong-output-type", "forbidden-call"}),
    "4-lazy-container-generator": ("lazy_container.py", {"wrong-output-type", "forbidden-call"}),
    "8-predict-inputs": ("predicts_inputs.py", {"constant-output", "forbidden-import"}),
    "9-traceback-frames": ("walks_traceback.py", {"forbidden-call"}),
    "10-float16-math": ("half_precision.py", {"mismatch"}),
    "10-bfloat16-math": ("bfloat16_precision.py", {"mismatch"}),
    "11-tiny-outputs": ("tiny_outputs.py", {"mismatch"}),
    "13-short-only": ("short_rows_only.py", {"mismatch"}),
    "18-error-filter-spelled-as-str-subclass": (
        "error_filter_spelled_as_str_subclass.py",
        {"forbidden-call"},
    ),
    "18-input-made-to-require-grad": ("input_made_to_require_grad.py", {"inputs-modified"}),
    "13-no-epsilon": ("drops_eps.py", {"non-finite-output", "mismatch"}),
    # raw host memory under Triton's interpreter: untrusted Triton does not run on the CPU
    "9-tolerance-loosened-through-the-triton-interpreter": (
        "tolerance_loosened_through_triton_interpreter.py",
        {"unsupported-device"},
    ),
}

# Rejected only once timed and re-verified (one worker for all of them).
TIMED = {
    "6-cache-by-pointer": ("caches_by_pointer.py", {"reverify-mismatch"}),
    "7-cut-corners-later": ("cuts_corners_later.py", {"reverify-mismatch"}),
    "6-cache-by-fingerprint": ("caches_by_fingerprint.py", {"reverify-mismatch"}),
    "6-cache-by-row-fingerprint": ("caches_by_fingerprint_wide.py", {"reverify-mismatch"}),
    "2-7-rewrite-inputs-when-timed": ("rewrites_inputs_when_timed.py", {"inputs-modified"}),
    "7-skip-timed-samples": ("skips_timed_samples.py", {"reverify-mismatch"}),
}

# Each kills or stalls its own process at run time, past every static check (entry 18).
DEADLY = {
    "18-segfault": ("segfaults.py", {"crash"}),
    "18-system-exit": ("raises_system_exit.py", {"crash"}),
    "18-hang": ("spins.py", {"timeout"}),
    "18-segfault-when-timed": ("segfaults_when_timed.py", {"crash"}),
    "18-raise-when-timed": ("raises_when_timed.py", {"crash"}),
}


@pytest.fixture(scope="module")
def task():
    return load_task("rmsnorm")


def honest(task) -> CandidateSpec:
    return CandidateSpec(task.folder / "torch_rmsnorm.py", {}, HONEST)


def specs(table: dict) -> list[CandidateSpec]:
    return [CandidateSpec(HERE / name, {}, entry) for entry, (name, _) in table.items()]


def codes(verdict) -> set[str]:
    return {r.code for r in verdict.reasons}


@pytest.fixture(scope="module")
def static_ev(task):
    return evaluate(task, specs(STATIC), "cpu", shapes=SHAPES)


@pytest.fixture(scope="module")
def verified_ev(task):
    return evaluate(task, [*specs(VERIFIED), honest(task)], "cpu", shapes=SHAPES)


@pytest.fixture(scope="module")
def timed_ev(task):
    return evaluate(
        task,
        [*specs(TIMED), honest(task)],
        "cpu",
        time_it=True,
        shapes=TIMED_SHAPES,
        rule=QUICK_RULE,
    )


@pytest.mark.parametrize("entry", STATIC)
def test_static_checks_reject_the_trick(static_ev, entry) -> None:
    verdict = static_ev.by_label(entry)
    assert not verdict.accepted
    assert STATIC[entry][1] in codes(verdict), verdict.reasons
    assert not verdict.shapes, "a statically rejected candidate must never run"


@pytest.mark.parametrize("entry", VERIFIED)
def test_verify_rejects_the_trick(verified_ev, entry) -> None:
    verdict = verified_ev.by_label(entry)
    assert not verdict.accepted
    assert codes(verdict) & VERIFIED[entry][1], verdict.reasons


def test_honest_candidate_survives_the_verify_batch(verified_ev) -> None:
    assert verified_ev.by_label(HONEST).accepted, verified_ev.by_label(HONEST).reasons


@pytest.mark.parametrize("entry", TIMED)
def test_reverification_after_timing_rejects_the_trick(timed_ev, entry) -> None:
    verdict = timed_ev.by_label(entry)
    assert not verdict.accepted
    assert codes(verdict) & TIMED[entry][1], verdict.reasons


def test_honest_candidate_survives_the_timed_batch(timed_ev) -> None:
    verdict = timed_ev.by_label(HONEST)
    assert verdict.accepted, verdict.reasons
    assert verdict.shapes[TIMED_SHAPES[0]].blocks_s


def test_out_of_memory_rejects_that_candidate(task) -> None:
    ev = evaluate(
        task,
        [CandidateSpec(HERE / "eats_memory.py", {}, "hog")],
        "cpu",
        shapes=TIMED_SHAPES,
        limits=Limits(timeout_s=60, cpu_memory_bytes=6 * 2**30),
    )
    assert codes(ev.by_label("hog")) == {"out-of-memory"}


def test_exit_through_torch_os_is_banned_statically(task) -> None:
    ev = evaluate(
        task,
        [CandidateSpec(HERE / "exits_via_torch_os.py", {}, "exit"), honest(task)],
        "cpu",
        shapes=TIMED_SHAPES,
    )
    assert "forbidden-call" in codes(ev.by_label("exit"))
    assert ev.by_label(HONEST).accepted, ev.by_label(HONEST).reasons


def test_fingerprint_cache_is_rejected(timed_ev) -> None:
    """Timing rotates values in the same buffers, and re-verification first changes only a few
    elements of the last timed values: a cache keyed on sampled values hits and is stale."""
    for entry in ("6-cache-by-fingerprint", "6-cache-by-row-fingerprint"):
        assert codes(timed_ev.by_label(entry)) == {"reverify-mismatch"}


def test_deaths_cost_only_the_candidate_that_died(task, monkeypatch) -> None:
    """Segfault, SystemExit, hang (in verification) and a segfault in the shared timing process:
    each rejects its own candidate; the honest one and the peer are verified and timed. (The
    segfaults are wild stores under Triton's interpreter, which the user must trust on the CPU:
    the static checks leave a candidate no other way to one.)"""
    monkeypatch.setenv(TRUST_INTERPRETER_ENV, "1")
    ev = evaluate(
        task,
        [*specs(DEADLY), honest(task)],
        "cpu",
        time_it=True,
        peers=["eager"],
        shapes=TIMED_SHAPES,
        rule=QUICK_RULE,
        limits=Limits(timeout_s=10),
    )
    for entry, (_, expected) in DEADLY.items():
        assert codes(ev.by_label(entry)) == expected, (entry, ev.by_label(entry).reasons)
    for label in (HONEST, "eager"):
        verdict = ev.by_label(label)
        assert verdict.accepted, verdict.reasons
        assert verdict.shapes[TIMED_SHAPES[0]].blocks_s


def test_patching_the_bound_timer_is_caught(task) -> None:
    ev = evaluate(
        task,
        [CandidateSpec(HERE / "patches_bound_timer.py", {}, "timer")],
        "cpu",
        time_it=True,
        shapes=TIMED_SHAPES,
        rule=QUICK_RULE,
    )
    assert "forbidden-call" in codes(ev.by_label("timer")), ev.by_label("timer").reasons


def test_patching_the_task_reference_is_caught(task) -> None:
    ev = evaluate(
        task, [CandidateSpec(HERE / "patches_reference.py", {}, "ref")], "cpu", shapes=SHAPES
    )
    assert not ev.by_label("ref").accepted


def test_library_op_by_string_is_rejected(task) -> None:
    ev = evaluate(
        task, [CandidateSpec(HERE / "calls_rms_norm_by_string.py", {}, "op")], "cpu", shapes=SHAPES
    )
    assert "forbidden-import" in codes(ev.by_label("op")), ev.by_label("op").reasons


def test_frame_walk_by_traceback_is_banned_statically(verified_ev) -> None:
    assert "forbidden-call" in codes(verified_ev.by_label("9-traceback-frames"))


def test_imported_library_op_is_calls_reference(static_ev) -> None:
    assert "calls-reference" in codes(static_ev.by_label("12-library-op-renamed"))
