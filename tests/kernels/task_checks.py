"""Checks shared by the task tests: run candidates (shipped ones and a deliberately wrong one
written to a temporary folder) through the evaluator in one worker, and read the verdicts; and
put a CuPy candidate's CUDA source through NVRTC and ptxas, or a load_inline one's through
nvcc for sm_90a, which needs no GPU."""

from __future__ import annotations

import itertools
import json
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from types import ModuleType

import pytest
import torch

from loop.evaluator import CandidateSpec, Evaluation, evaluate
from loop.tasks import Task
from tests.kernels.candidate_tools import evaluate_on_cpu, mutated
from tests.source_files import import_file


def evaluate_with_wrong(
    task: Task, shipped: list[tuple[str, dict]], wrong_source: str, folder: Path
) -> Evaluation:
    """One CPU evaluation of the shipped candidates (file name, params) and of `wrong_source`,
    labelled by file name and "wrong"."""
    wrong = folder / "wrong.py"
    wrong.write_text(wrong_source)
    specs = [
        CandidateSpec(task.folder / name, params, f"{name}:{i}")
        for i, (name, params) in enumerate(shipped)
    ]
    return evaluate(task, [*specs, CandidateSpec(wrong, {}, "wrong")], "cpu")


def assert_shipped_accepted(ev: Evaluation, tolerance: float = 1e-5) -> None:
    for verdict in ev.verdicts:
        if verdict.label == "wrong":
            continue
        assert verdict.accepted, (verdict.label, verdict.reasons)
        assert verdict.shapes, verdict.label
        assert max(s.rel_err for s in verdict.shapes.values()) < tolerance, verdict.label


def assert_wrong_rejected(ev: Evaluation, code: str = "mismatch") -> None:
    verdict = ev.by_label("wrong")
    assert not verdict.accepted
    assert code in {r.code for r in verdict.reasons}, verdict.reasons


def assert_interpreted_and_mutant_caught(
    task: Task, candidate: str, params: dict, bug: tuple[str, str], folder: Path
) -> None:
    """The shipped Triton `candidate` passes on the CPU under the interpreter, and a copy with
    `bug` (old text, new text) is rejected for its output alone: a mismatch, or NaN/Inf where
    the reference is finite (a mutant that leaves output rows unwritten shows whatever their
    memory held, which may be NaN)."""
    source = task.folder / candidate
    buggy = mutated(source, *bug, folder / "bug.py")
    ev = evaluate_on_cpu(task, {"shipped": (source, params), "bug": (buggy, params)})
    verdict = ev.by_label("shipped")
    assert verdict.accepted, verdict.reasons
    assert max(s.rel_err for s in verdict.shapes.values()) < 1e-5
    bug_reasons = ev.by_label("bug").reasons
    assert [r.code for r in bug_reasons] in (["mismatch"], ["non-finite-output"]), bug_reasons


def gpu_evaluate(task: Task, shipped: list[tuple[str, dict]]) -> Evaluation:
    """The evaluator on the GPU over the shipped files at their parameters, each verdict
    labelled by file name and its place in `shipped`."""
    specs = [
        CandidateSpec(task.folder / name, params, f"{name}:{i}")
        for i, (name, params) in enumerate(shipped)
    ]
    return evaluate(task, specs, "cuda")


def _nvrtc_or_skip():
    """CuPy's NVRTC binding, or a skip where the CUDA wheels are absent or do not load."""
    try:
        from cupy_backends.cuda.libs import nvrtc

        nvrtc.getVersion()
    except Exception as exc:
        pytest.skip(f"NVRTC unavailable: {exc}")
    return nvrtc


def nvcc_with_sm90a(minimum: tuple[int, int] = (12, 0)) -> str | None:
    """An nvcc (on PATH or under CUDA_HOME or /usr/local/cuda) that can build for sm_90a: CUDA
    12.0 or later (its --list-gpu-arch names compute_90, not the `a` variants), or `minimum`."""
    home = os.environ.get("CUDA_HOME", "/usr/local/cuda")
    for nvcc in (shutil.which("nvcc"), str(Path(home) / "bin" / "nvcc")):
        if nvcc and Path(nvcc).exists():
            version = subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout
            release = re.search(r"release (\d+)\.(\d+)", version)
            if release and (int(release.group(1)), int(release.group(2))) >= minimum:
                return nvcc
    return None


def candidate_module(task: Task, name: str) -> ModuleType:
    """A shipped candidate file of `task`, imported on its own."""
    return import_file(task.folder / name)


def _nvrtc_compile(source: str, options: list[str]):
    """NVRTC, the program it compiled `source` into with `options`, and its log where it
    refused (else None); a skip without NVRTC."""
    nvrtc = _nvrtc_or_skip()
    program = nvrtc.createProgram(source, "candidate.cu", [], [])
    try:
        nvrtc.compileProgram(program, options)
    except Exception as exc:
        return nvrtc, program, f"{exc}\n{nvrtc.getProgramLog(program)}"
    return nvrtc, program, None


def cuda_compile_error(source: str, options: list[str]) -> str | None:
    """NVRTC's log where it refuses `source` with `options`, None where it gives a cubin (a
    skip without NVRTC)."""
    nvrtc, program, error = _nvrtc_compile(source, options)
    if error is None:
        assert len(nvrtc.getCUBIN(program)) > 0
    return error


def cuda_ptx(source: str, options: list[str]) -> str:
    """NVRTC's PTX of `source` with `options` (a skip without NVRTC)."""
    nvrtc, program, error = _nvrtc_compile(source, options)
    if error is not None:
        pytest.fail(error)
    ptx = nvrtc.getPTX(program)
    return ptx.decode() if isinstance(ptx, bytes) else ptx


def assert_dependents_launch_where_asked(ptx: str, late: bool) -> None:
    """In an sm_90 kernel's PTX, the one trigger that lets the next kernel launch comes after
    the wait for the kernel before; before the first mma.sync by default, after the last one
    with `late` (late_dependents: only once the K loop's products end)."""
    assert "mma.sync" in ptx and ptx.count("griddepcontrol.launch_dependents") == 1
    launch = ptx.index("griddepcontrol.launch_dependents")
    assert ptx.index("griddepcontrol.wait") < launch
    if late:
        assert launch > ptx.rindex("mma.sync")
    else:
        assert launch < ptx.index("mma.sync")


def assert_cuda_compiles(source: str, options: list[str], what: str) -> None:
    """NVRTC and ptxas accept `source` with `options` and give a cubin (a skip without NVRTC)."""
    error = cuda_compile_error(source, options)
    if error is not None:
        pytest.fail(f"{what}: {error}")


def assert_splitk_launches_compile(task: Task, candidate: str) -> None:
    """Every (rows, k_warps, n_per_block, vectors) launch that a split-K GEMV candidate's PARAMS
    give at the GPU shapes of `task` with at most 16 rows compiles for sm_90."""
    module = candidate_module(task, candidate)
    builds = set()
    skinny = [s.dims for s in task.shapes("cuda") if s.dims["m"] <= 16]
    space = module.PARAMS
    for dims, per_lane, n_per_block, rows in itertools.product(
        skinny, space["per_lane"], space["n_per_block"], space["rows"]
    ):
        k_warps, vectors = module.plan(dims["k"], per_lane, n_per_block)
        builds.add((min(rows, dims["m"]), k_warps, n_per_block, vectors))
    assert builds
    for build in sorted(builds):
        assert_cuda_compiles(
            module.SOURCE, ["-arch=sm_90", *module.compile_options(*build)], f"{candidate} {build}"
        )


# The resident candidates' switches compiled beside each plain launch: ANY_LAUNCH's (the warp
# max) at every launch, the cluster exchange's only where a cluster takes the row.
ANY_LAUNCH = {"redux_max": True}
CLUSTER_SWITCH_SETS = (
    {"early_exit": True},
    {"warp_pairs": True},
    {"warp_pairs": True, "async_pairs": True, "redux_max": True},
)


def assert_resident_launches_compile(task: Task, candidate: str) -> None:
    """Every (threads, slice_kb[, stages][, exchange]) of a row-resident CuPy candidate's PARAMS
    that its plan takes, at every GPU vocabulary of `task`, compiles for sm_90 (and sm_80 where
    no cluster takes the row and nothing is prefetched)."""
    module = candidate_module(task, candidate)
    builds = set()
    vocabs = {shape.dims["vocab"] for shape in task.shapes("cuda")}
    space = module.PARAMS
    # plan's own launch parameters beyond (threads, slice_kb), where the candidate has them
    extra = [name for name in ("stages", "exchange") if name in space]
    for vocab, threads, slice_kb, *values in itertools.product(
        vocabs, space["threads"], space["slice_kb"], *(space[name] for name in extra)
    ):
        try:
            launch = module.plan(
                vocab // 8, threads, slice_kb, **dict(zip(extra, values, strict=True))
            )
        except ValueError:  # too long a slice for so few threads: refused at launch
            continue
        builds.add(("sm_90", threads, launch))
        if launch.cluster == 1 and not getattr(launch, "stages", 0):
            builds.add(("sm_80", threads, launch))
    for arch, threads, launch in sorted(builds, key=repr):
        assert_cuda_compiles(
            module.SOURCE,
            [f"-arch={arch}", *module.compile_options(threads, launch)],
            f"{candidate} {arch} threads={threads} {launch}",
        )
        switch_sets = (ANY_LAUNCH, *CLUSTER_SWITCH_SETS) if launch.cluster > 1 else (ANY_LAUNCH,)
        for switches in switch_sets:
            if set(switches) <= set(space):
                assert_cuda_compiles(
                    module.SOURCE,
                    [f"-arch={arch}", *module.compile_options(threads, launch, **switches)],
                    f"{candidate} {arch} threads={threads} {launch} {switches}",
                )


def assert_resident_plan(module: ModuleType) -> None:
    """A row-resident candidate's launch plan: the smallest cluster whose slices fit slice_kb,
    at most MAX_CLUSTER blocks, every vector some thread's, and too long a slice refused."""
    # 32000 columns are 4000 vectors (62.5 KiB): one block under 64 KiB, two under 32 KiB.
    assert module.plan(4000, 512, 64) == module.Launch(1, 4000, 8)
    assert module.plan(4000, 512, 32) == module.Launch(2, 2000, 4)
    # 128256 columns (250.5 KiB): four blocks of 64 KiB slices; 16 KiB would need 16 blocks,
    # so the cluster stops at its portable maximum of 8.
    assert module.plan(16032, 512, 64) == module.Launch(4, 4008, 8)
    assert module.plan(16032, 1024, 16) == module.Launch(module.MAX_CLUSTER, 2004, 2)
    # 151936 columns (18992 vectors) over 8 blocks: a slice of 2374 rounds up, 5 vectors each
    # for 512 threads.
    assert module.plan(18992, 512, 16) == module.Launch(8, 2374, 5)
    with pytest.raises(ValueError, match="vectors per thread"):
        module.plan(16032 * 8, 256, 16)


# Vocabularies for the edge rows: 151936 leaves the last block of a row a short slice.
EDGE_COLUMNS = (32000, 128256, 151936)


def edge_rows(cols: int) -> torch.Tensor:
    """bf16 rows that take the resident kernels' special paths: a max in the first vector only,
    a max in the last vector only, -inf columns among finite ones (and a run of them as long as
    a whole slice), and large negative values (2^(0 - max) would overflow)."""
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(6, cols, generator=gen)
    x[0, 0] = 30.0
    x[1] = torch.linspace(-20.0, 20.0, cols)
    x[2, ::3] = float("-inf")
    x[3, : cols // 2] = float("-inf")
    x[4] = x[4] * 3.0 - 1.0e3
    x[5] = torch.linspace(20.0, -20.0, cols)
    return x.to(torch.bfloat16)


def hopper_ptx(*args, **kwargs) -> str:
    """The PTX of hopper_build, which takes the same arguments (a skip where Triton is
    missing)."""
    pytest.importorskip("triton")
    return hopper_build(*args, **kwargs).asm["ptx"]


def _cuobjdump(compiled, flag: str) -> str:
    """cuobjdump's `flag` report of a hopper_build result's cubin."""
    import triton

    cuobjdump = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as cubin:
        cubin.write(compiled.asm["cubin"])
        cubin.flush()
        return subprocess.run(
            [str(cuobjdump), flag, cubin.name], capture_output=True, text=True, check=True
        ).stdout


def fit_an_sm(programs: int, shared_bytes: int) -> bool:
    """Whether `programs` blocks of `shared_bytes` each fit an sm_90 SM's 228 KiB of shared
    memory, 1 KiB of it reserved for each block."""
    return programs * (shared_bytes + 1024) <= 233472


def registers_fit_an_sm(programs: int, registers: int) -> bool:
    """Whether `programs` blocks of two warpgroups (256 threads, as a warp-specialized Gluon
    kernel's) at `registers` a thread fit an SM's 64K registers."""
    return programs * 256 * registers <= 65536


def sm90_resources(compiled) -> dict[str, int]:
    """Registers a thread takes, its stack frame in bytes (where spilled registers go:
    `spill_bytes`), and the shared memory a block takes, of a hopper_build result (cuobjdump of
    its cubin)."""
    dump = _cuobjdump(compiled, "--dump-resource-usage")
    usage = next(line for line in dump.splitlines() if "REG:" in line)
    fields = dict(item.split(":", 1) for item in usage.split() if ":" in item)
    return {
        "registers": int(fields["REG"]),
        "spill_bytes": int(fields["STACK"]),
        "shared_bytes": compiled.metadata.shared,
    }


def sm90_sass(compiled) -> str:
    """The machine code (SASS) ptxas made of a hopper_build result: where it put its waits."""
    return _cuobjdump(compiled, "-sass")


def _count(lines, commit, wait, ex2) -> tuple[int, int]:
    """(exponentials while a wgmma group is in flight, exponentials) over `lines` in program
    order; `wait(line)` is the groups a wait leaves in flight, None where the line is no wait."""
    in_flight = overlapped = total = 0
    for line in lines:
        left = wait(line)
        if commit(line):
            in_flight += 1
        elif left is not None:
            in_flight = min(in_flight, left)
        elif ex2(line):
            total += 1
            overlapped += in_flight > 0
    return overlapped, total


def ex2_in_flight(ptx: str) -> tuple[int, int]:
    """(exponentials issued while a wgmma group is in flight, exponentials) in Triton's PTX, in
    program order: a `wgmma.commit_group` adds a group, a `wgmma.wait_group N` leaves at most N
    (a loop's back edge is not followed)."""
    ops = [line.strip().rstrip(";").split() or [""] for line in ptx.splitlines()]
    return _count(
        ops,
        commit=lambda op: op[0].startswith("wgmma.commit_group"),
        wait=lambda op: int(op[-1]) if op[0].startswith("wgmma.wait_group") else None,
        ex2=lambda op: op[0].startswith("ex2."),
    )


def ex2_in_flight_sass(sass: str) -> tuple[int, int]:
    """The same count in ptxas's machine code: an HGMMA marked `gsb0` adds a group, a
    `WARPGROUP.DEPBAR.LE gsb0, N` leaves at most N. ptxas may wait earlier than the PTX does."""
    lines = [line.split("*/", 1)[-1] for line in sass.splitlines()]  # past the address
    return _count(
        lines,
        commit=lambda line: "HGMMA" in line and "gsb0" in line,
        wait=lambda line: (
            int(line.split("gsb0,")[1].split(";")[0], 16)
            if "WARPGROUP.DEPBAR.LE gsb0," in line
            else None
        ),
        ex2=lambda line: "MUFU.EX2" in line,
    )


def hgmma_groups(sass: str) -> tuple[int, int]:
    """(wgmma instructions, the groups they form) in ptxas's machine code. A product of K = 128
    is 8 instructions in one group; as many groups as instructions means ptxas serialised them
    (each waited for before the next), which it does silently, e.g. where the PTX copies the
    registers of a product still in flight."""
    steps = [line for line in sass.splitlines() if "HGMMA" in line]
    return len(steps), sum("gsb0" in line for line in steps)


def setmaxnreg_budgets(ptx: str) -> set[int]:
    """The register budgets a warp-specialized kernel's partitions ask for (`setmaxnreg`)."""
    return {int(n) for n in re.findall(r"setmaxnreg\.dec\.sync\.aligned\.u32\s+(\d+);", ptx)}


def hopper_build(
    fn,
    types: dict[str, str],
    constexprs: dict,
    num_warps: int,
    num_stages: int = 3,
    multiples_of_16: tuple[str, ...] = (),
    max_registers: int | None = None,
):
    """What Triton builds of the JIT function `fn` (Triton or Gluon) for an H100/H200 (sm_90),
    compiled here with no GPU (its `asm` holds the PTX and the cubin). `types` maps each runtime
    argument to its Triton type ("*bf16", "i32", "fp32"); every other argument is one of
    `constexprs`. Pointers are taken as 16-byte aligned, as torch allocates them, and the
    integers named in `multiples_of_16` as multiples of 16, as Triton specialises them at a
    launch where they are (K = 4096, say). `max_registers` caps a thread's registers (Triton's
    maxnreg)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.experimental.gluon._runtime import GluonASTSource

    names = fn.arg_names
    signature = {name: types.get(name, "constexpr") for name in names}
    aligned = {
        (i,): [["tt.divisibility", 16]]
        for i, name in enumerate(names)
        if signature[name].startswith("*") or name in multiples_of_16
    }
    source_type = GluonASTSource if fn.is_gluon() else ASTSource
    source = source_type(fn=fn, signature=signature, constexprs=constexprs, attrs=aligned)
    return triton.compile(
        source,
        target=GPUTarget("cuda", 90, 32),
        options={"num_warps": num_warps, "num_stages": num_stages, "maxnreg": max_registers},
    )


GLOBAL_OPS = ("tt.load", "tt.store", "async_tma_copy_global_to_local", "tt.atomic")


def ttgir_partitions(ttgir: str) -> list[list[str]]:
    """A warp-specialized Gluon kernel's TTGIR cut into its partitions' lines (the default one
    first, then each worker's in order; the last runs to the end of the text)."""
    lines = ttgir.splitlines()
    starts = [
        i for i, line in enumerate(lines) if line.strip().startswith(("default {", "partition"))
    ]
    return [lines[a:b] for a, b in zip(starts, [*starts[1:], len(lines)], strict=True)]


def assert_partitions_wait_before_memory(
    ttgir: str, partitions: int, early_copies: int = 0
) -> None:
    """Programmatic dependent launch done safely by a warp-specialized Gluon kernel, read in its
    TTGIR (each partition's ops in source order, unlike the PTX, whose blocks the compiler may
    reorder): it has `partitions` partitions (the default one first, the loader warp last); in
    each, griddepcontrol.wait comes before its first global load, store, atomic or TMA copy, but
    for the loader's first `early_copies` TMA copies (data the kernel before does not write);
    the one launch_dependents is the loader's, after its wait and before its next TMA copy."""
    regions = ttgir_partitions(ttgir)
    assert len(regions) == partitions, f"expected {partitions} partitions, found {len(regions)}"

    def first(region: list[str], *needles: str) -> int:
        return next((i for i, s in enumerate(region) if any(n in s for n in needles)), len(region))

    copy = "async_tma_copy_global_to_local"
    for n, region in enumerate(regions):
        wait = first(region, "griddepcontrol.wait")
        assert wait < len(region), "a partition without a wait"
        early = region[:wait]
        if n == partitions - 1:
            assert sum(copy in s for s in early) == early_copies, (
                "the loader's copies before its wait"
            )
            early = [s for s in early if copy not in s]
        assert first(early, *GLOBAL_OPS) == len(early), early[first(early, *GLOBAL_OPS)]
    triggers = [first(r, "griddepcontrol.launch_dependents") < len(r) for r in regions]
    assert triggers == [False] * (partitions - 1) + [True]
    loader = regions[-1]
    wait, trigger = first(loader, "griddepcontrol.wait"), first(loader, "launch_dependents")
    assert wait < trigger < wait + 1 + first(loader[wait + 1 :], copy)


def assert_weights_stream_before_the_wait(
    ptx: str,
    weight_vectors: int,
    other_early: int = 0,
    triggers: bool = True,
    later_weights: bool = False,
):
    """Programmatic dependent launch done safely: the kernel issues its `weight_vectors` 16-byte
    weight loads a thread (the evict-first ones) and `other_early` other loads of data nothing
    earlier writes before `griddepcontrol.wait`, reads everything else, and writes, only after
    it. With `triggers` it lets its dependents launch only after the wait (so they may rely on
    everything before this kernel being done, as torch.compile's PDL kernels do); without, not
    at all. `later_weights`: more weight tiles are loaded after the wait (a loop over k)."""
    before, wait, after = ptx.partition("griddepcontrol.wait")
    assert wait, "no griddepcontrol.wait"
    if triggers:
        assert "griddepcontrol.launch_dependents" in after
        assert "griddepcontrol.launch_dependents" not in before
    else:
        assert "griddepcontrol.launch_dependents" not in ptx

    def loads(text: str) -> list[str]:
        return [line for line in text.splitlines() if "ld.global" in line or "cp.async" in line]

    early = loads(before)
    weights = [line for line in early if "evict_first" in line]
    assert len(weights) == weight_vectors and all(".v4." in line for line in weights), weights
    assert len(early) == weight_vectors + other_early, early
    assert "st.global" not in before and "atom." not in before
    assert [line for line in loads(after) if "evict_first" not in line], "nothing read after"
    assert "st.global" in after
    if not later_weights:
        assert not [line for line in loads(after) if "evict_first" in line]


def assert_streaming_gemv_ptx(
    fn, types: dict[str, str], k: int, block_k: int, early_kib: int, tail: int, line: int
) -> None:
    """A persistent streaming GEMV's PDL done safely, in its sm_90 build (bfloat16 W, one row a
    tile, 3 stages, 8 warps, no GPU needed): before `griddepcontrol.wait` nothing but the L2
    prefetches of `early_kib` KiB of W, one `line`-byte line a lane (no load, copy or store);
    after it, W's tiles as 16-byte cp.async copies into shared memory, the stores, and the
    dependents' launch once, after the streaming loop or, with a `tail`, inside it."""
    lanes = early_kib * 1024 // line
    constexprs = {"K": k, "BLOCK_N": 1, "BLOCK_K": block_k, "STAGES": 3, "PDL": True}
    constexprs |= {"EARLY_LANES": lanes, "LINE_ELEMS": line // 2, "TAIL": tail}
    ptx = hopper_ptx(fn, types, constexprs, 8, num_stages=3)
    prefetches = max(1, lanes // 256) if early_kib else 0
    in_loop = tail > 0
    before, wait, after = ptx.partition("griddepcontrol.wait")
    assert wait, "no griddepcontrol.wait"
    assert "ld.global" not in before and "cp.async" not in before and "st.global" not in before
    assert before.count("prefetch.global.L2") == prefetches
    copies = [text for text in after.splitlines() if text.strip().startswith("cp.async.cg")]
    assert copies and all("0x10" in text for text in copies)
    assert "st.global" in after
    assert after.count("griddepcontrol.launch_dependents") == 1
    trigger = after.index("griddepcontrol.launch_dependents")
    # where the streaming loop (the one that waits for its copies) starts and ends, by LLVM's
    # block comments: a loop before it (the norm's pass over x) is not it
    waits = after.index("cp.async.wait_group")
    header, exit_ = after.rindex("Loop Header", 0, waits), after.index("_crit_edge", waits)
    if in_loop:
        assert header < trigger < exit_
    else:  # once the program's run is done: after the loop, its last copy and store
        assert exit_ < trigger
        assert after.rindex("st.global") < trigger and after.rindex("cp.async.cg") < trigger


def _python(script: str, *args: str, timeout: float) -> subprocess.CompletedProcess:
    """`script` run with `args` in a fresh Python from the checkout's root, its output kept."""
    import sys

    root = Path(__file__).resolve().parents[2]
    return subprocess.run(
        [sys.executable, "-c", script, *args],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def run_interpreted(script: str, *args: str) -> str:
    """`script`'s stdout, run with `args` in a fresh Python with the Triton interpreter on and
    the checkout on its path (the interpreter must be chosen before Triton loads, so not in this
    process)."""
    root = Path(__file__).resolve().parents[2]
    prelude = (
        f"import os, sys\nos.environ['TRITON_INTERPRET'] = '1'\nsys.path.insert(0, {str(root)!r})\n"
    )
    done = _python(prelude + script, *args, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def assert_within_tolerance(
    task: Task, got: torch.Tensor, want: torch.Tensor, dtype, *case
) -> None:
    """`got` within the task's relative tolerance for `dtype` of the reference `want` (the norm of
    the difference over the reference's), as the GPU child scripts check their cases; prints
    the case and its error first (their progress)."""
    err = float(torch.linalg.vector_norm(got - want) / torch.linalg.vector_norm(want))
    tol = task.tolerance(str(dtype).removeprefix("torch."))
    print(*case, f"{err:.2e}", flush=True)
    assert err < tol, (err, tol)


def run_in_child(script: str, timeout: float = 240) -> None:
    """Run `script` in a fresh Python from the checkout's root, failing the test where it exits
    non-zero or outlives `timeout` seconds (a GPU kernel that hangs fails, not the whole run)."""
    run = _python(script, timeout=timeout)
    assert run.returncode == 0, run.stdout + run.stderr


def assert_streaming_gemv_covers_ragged_runs(task: Task, candidate: str) -> None:
    """A streaming GEMV (`trigger_tile`, `kernel(..., block_n, block_k, num_stages,
    programs_per_sm)`) under the interpreter, in a fresh process: 42 rows of W in blocks of 4
    (11 blocks, the last half empty) over 4 programs (runs of 2, 3, 3 and 3 blocks), K of 72 in
    two 64-wide chunks and of 40 in one, 1 and 3 rows of x, each matches the task's reference;
    and the next kernel's trigger tile of a run shorter than, as long as and longer than the tail
    lies in the run, the tail from its end or at its first tile."""
    runs = [(0, 2), (5, 9), (10, 30), (7, 8)]
    script = f"""
import json
import torch
import triton
import triton.language as tl
from pathlib import Path
from tests.source_files import import_file
m = import_file(Path({str(task.folder / candidate)!r}))
task = import_file(Path({str(task.folder / "task.py")!r}))
errors = []
for k in (72, 40):
    for rows in (1, 3):
        shape = {{"m": rows, "n": 42, "k": k, "dtype": "float32"}}
        inputs = task.make_inputs(shape, 5, "cpu")
        got = m.kernel(*inputs, block_n=4, block_k=64, num_stages=3, programs_per_sm=1)
        want = task.reference(*(t.double() for t in inputs))
        errors.append(float((got.double() - want).norm() / want.norm()))
trigger_tile = m.trigger_tile

@triton.jit
def probe(begin_ptr, end_ptr, out_ptr, TAIL: tl.constexpr):
    i = tl.program_id(0)
    tl.store(out_ptr + i, trigger_tile(tl.load(begin_ptr + i), tl.load(end_ptr + i), TAIL))

begin = torch.tensor({[b for b, _ in runs]}, dtype=torch.int32)
end = torch.tensor({[e for _, e in runs]}, dtype=torch.int32)
tiles = torch.empty_like(begin)
probe[(len(begin),)](begin, end, tiles, TAIL=4)
print(json.dumps({{"errors": errors, "tiles": tiles.tolist()}}))
"""
    done = json.loads(run_interpreted(script))
    assert max(done["errors"]) < 1e-5, done["errors"]
    for (begin, end), tile in zip(runs, done["tiles"], strict=True):
        assert begin <= tile < end
        assert tile == (end - 4 if end - begin >= 4 else begin), (begin, end, tile)


def kept_counts_after_interpreted_calls(task: Task, candidate: str, calls: str) -> list[int]:
    """Under the interpreter, in a fresh process: run `calls` (Python in which `m` is the
    candidate module, `task` the task module and `gen` a seeded torch generator), then sum each
    of the candidate's kept arrival-count buffers (`m._COUNTS`) on the CPU, oldest first."""
    script = f"""
import json
import torch
from pathlib import Path
from tests.source_files import import_file
m = import_file(Path({str(task.folder / candidate)!r}))
task = import_file(Path({str(task.folder / "task.py")!r}))
gen = torch.Generator().manual_seed(0)
{calls}
print(json.dumps([int(c.abs().sum()) for c in m._COUNTS[torch.device("cpu")]]))
"""
    return json.loads(run_interpreted(script))


def assert_gluon_waits_after_the_weights_and_g(ptx: str) -> None:
    """The Gluon x g kernels' two griddepcontrol.waits in their places: the warpgroup's (first in
    the PTX) after its load of g, the warpgroup issuing no TMA at all; the loader warp's (from its
    register budget's setmaxnreg.dec on) after W's first TMAs, with more TMAs (x's, W's) after
    it."""
    first, second = (m.start() for m in re.finditer(r"griddepcontrol\.wait", ptx))
    loader_start = ptx.rindex("setmaxnreg.dec", 0, second)
    assert "ld.global" in ptx[:first]
    assert "cp.async.bulk.tensor" not in ptx[:loader_start]
    assert "cp.async.bulk.tensor" in ptx[loader_start:second]
    assert "cp.async.bulk.tensor" in ptx[second:]


# The Gluon x g kernels' configurations that their GPU tests evaluate at every task shape: the
# defaults (4 slices of 64-column steps), 2 slices of 128, and 8 slices launching the next kernel
# only once the products end. Each fits shared memory at every task's K
# (tests/kernels/test_bench_plans.py).
GLUON_X_G_EVALUATED = [
    {},
    {"split_k": 2, "block_k": 128, "num_stages": 2},
    {"split_k": 8, "late_dependents": True},
    {"split_k": 8, "block_k": 64, "num_stages": 3, "programs_per_sm": 2},
]


# (k, block_k, stages, split_k, late_dependents) at which the Gluon x g kernels (the qkv and the
# SwiGLU ones) are built: Llama-3-8B's K, and K that leave slices of 28 and of 22 chunks (the
# last one 21).
GLUON_X_G_BUILDS = [
    (4096, 64, 4, 4, False),
    (4096, 128, 4, 2, True),
    (4096, 64, 3, 1, False),
    (7168, 64, 4, 4, False),
    (4104, 64, 4, 3, False),
]
# (build, programs an SM) of GLUON_X_G_BUILDS and the builds under a register cap
# (`programs_per_sm`): eight splits of K 4096 at two and three programs an SM, four of K 7168 at
# two.
GLUON_X_G_REGISTER_BUILDS = [(build, 1) for build in GLUON_X_G_BUILDS] + [
    ((4096, 64, 3, 8, False), 2),
    ((4096, 64, 3, 8, False), 3),
    ((7168, 64, 4, 4, False), 2),
]


def assert_gluon_x_g_kernel_builds(
    module: ModuleType,
    fn,
    w_names: tuple[str, ...],
    types: dict[str, str],
    constexprs: dict,
    build: tuple[int, int, int, int, bool],
    programs_per_sm: int = 1,
) -> None:
    """A Gluon x g kernel (`fn` of the candidate `module`; its W descriptors named `w_names`,
    its other arguments in `types` and `constexprs`) built for sm_90 at one of
    GLUON_X_G_BUILDS, under the register cap that lets `programs_per_sm` programs share an SM:
    no spill, within the cap, shared memory within the module's `shared_bytes` and an SM's, the
    loader warp on its own budget (40 registers uncapped), the products by wgmma 16 wide, each
    partition's wait for the kernel before it in its place, the count only with slices."""
    import triton
    from triton.runtime.jit import mangle_type

    k, block_k, stages, split_k, late = build
    steps, slices = module.slice_steps(k, block_k, split_k)
    w_type = mangle_type(module._descriptor(torch.empty(64, 64, dtype=torch.bfloat16)))
    x_type = mangle_type(module._descriptor(torch.empty(16, 64, dtype=torch.bfloat16), 16))
    types = types | dict.fromkeys(w_names, w_type) | {"x_desc": x_type, "g_ptr": "*bf16"}
    types |= {"part_ptr": "*fp32", "squares_ptr": "*fp32", "count_ptr": "*i32", "eps": "fp32"}
    types |= {"M": "i32", "K": "i32"}
    constexprs = constexprs | {"BLOCK_K": block_k, "STEPS": steps, "STAGES": stages}
    constexprs |= {"G_SPAN": triton.next_power_of_2(steps * block_k), "SPLITS": slices}
    cap = module.REGISTER_CAPS[programs_per_sm]
    compiled = hopper_build(
        fn, types, constexprs | {"LATE_DEPENDENTS": late}, num_warps=4, max_registers=cap
    )
    used = sm90_resources(compiled)
    assert used["spill_bytes"] == 0
    assert registers_fit_an_sm(programs_per_sm, used["registers"])
    need = module.shared_bytes(k, block_k, split_k, stages)
    assert 0 < used["shared_bytes"] <= need <= module.SHARED_BYTES
    ptx = compiled.asm["ptx"]
    assert (24 if cap else 40) in setmaxnreg_budgets(ptx)
    assert "wgmma.mma_async.sync.aligned.m64n16k16" in ptx
    assert_gluon_waits_after_the_weights_and_g(ptx)
    assert ("atom" in ptx) == (slices > 1)
