"""One-shot all-reduce through peer memory with ONE barrier per call: every rank pushes its input
into a slot of every peer's symmetric buffer, the blocks of all ranks meet once, and every rank
sums the slots of its own buffer (local reads) with its own input, in rank order in float32, so
every rank ends with the same bits. Made for small messages, where latency is all there is.

Layout. Rank r's symmetric buffer holds two halves of WORLD slots of `stride` elements (`stride`
is numel rounded up to 64 elements, so every slot is 128-byte aligned and the loads and stores go
128 bits wide); peer p writes its input into slot p of the half chosen by the call's parity.
Program b of every rank owns the same pieces (the grid is fixed at setup), keeps its own call
counter, the epoch, in ordinary device memory (`epochs[b]`, read and advanced by program b
itself, so it also advances under CUDA-graph replay, where host-side Python state does not), and
owns one flag per peer in every rank's signal pad (`pad[b * WORLD + p]`: the last epoch peer p
raised for block b).

One call, block b, epoch e = epochs[b] + 1, half h = e % 2:
1. push: store x into slot RANK of half h of every peer's buffer (remote, posted stores);
2. barrier: after a CTA barrier, thread p stores e into peer p's flag for (b, RANK) with release
   semantics at system scope (the block's pushes are visible to whoever sees the flag), then
   waits with acquire loads until its own flag for (b, p) is >= e (no reset handshake: flags
   only grow, so a peer that already raised e + 1 still lets this rank through);
3. sum: read slot p of half h of its own buffer for every peer p (and x for itself).

Why a fast rank never overwrites what a peer still reads: rank q reads half h of epoch e only
after its barrier e, i.e. after it raised its own flag e. A peer p writes half h again only at
epoch e + 2. To start epoch e + 2 at all, p must have passed barrier e + 1, which needs q's flag
e + 1, which q raises only in its next call, and a call's kernel starts only after the previous
kernel on the same stream (every program of it, so every read of epoch e) has finished. Epoch
e + 1 goes to the other half, so the one call p may run ahead never touches what q reads. The
same holds per flag slot because all ranks run the same grid every call (same blocks, same
epochs: every rank's epochs[b] counts the calls made with this state, and a different grid is
refused). The sums in step 3 see the pushes of epoch e because each peer's pushes precede its
release of flag e, and the reading block's acquire of that flag precedes its CTA barrier and
reads (the pattern of torch's symmetric-memory kernels: barrier, then one thread's sys-scope
release; one thread's sys-scope acquire, then barrier).

A flag that never comes stops the wait after 20 s (the call's sum is then wrong and verification
rejects the candidate) rather than hanging every rank until the harness's time limit.

Setup zeroes this rank's flags and meets every rank at a process-group barrier before the first
call, so flags and epochs start together at 0 whatever the pad held before. Flags are 32-bit and
compared signed: 2^31 calls per state.
"""

import torch
import torch.distributed as dist
import torch.distributed._symmetric_memory as symm_mem
import triton
import triton.language as tl

LANGUAGE = "triton"

PARAMS = {
    "block": [512, 1024, 2048, 4096],
    "programs": [1, 2, 4, 8, 16, 32, 64],
    "num_warps": [2, 4, 8, 16],
}
DEFAULTS = {"block": 2048, "programs": 32, "num_warps": 8}
_ALIGN = 64  # elements: a slot starts 128 B-aligned for every dtype of 2 bytes or more


@triton.jit
def _thread_id():
    return tl.inline_asm_elementwise(
        "mov.u32 $0, %tid.x;", "=r", [], dtype=tl.int32, is_pure=True, pack=1
    )


@triton.jit
def _put_flag(addrs, epoch):
    # Release at system scope: this block's earlier writes (its pushes to the peer) are visible
    # to the peer once it reads the flag.
    return tl.inline_asm_elementwise(
        """
        {
        st.release.sys.global.b32 [$1], $2;
        mov.u32 $0, 0;
        }
        """,
        "=r, l, r",
        [addrs, epoch],
        dtype=tl.int32,
        is_pure=False,
        pack=1,
    )


@triton.jit
def _wait_flag(addrs, epoch):
    # Spin until the flag is at least `epoch`; acquire at system scope: the peer's writes before
    # its flag are visible from here on. Gives up after 20 s of the global timer (a peer that
    # never comes): the call then returns a wrong sum, which verification rejects, instead of
    # hanging every rank until the harness's time limit.
    return tl.inline_asm_elementwise(
        """
        {
        .reg .s32 %seen;
        .reg .pred %ready;
        .reg .u64 %start, %now;
        mov.u64 %start, %globaltimer;
        WAIT:
        ld.acquire.sys.global.b32 %seen, [$1];
        setp.ge.s32 %ready, %seen, $2;
        @%ready bra DONE;
        mov.u64 %now, %globaltimer;
        sub.u64 %now, %now, %start;
        setp.lt.u64 %ready, %now, 20000000000;
        @%ready bra WAIT;
        DONE:
        mov.u32 $0, %seen;
        }
        """,
        "=r, l, r",
        [addrs, epoch],
        dtype=tl.int32,
        is_pure=False,
        pack=1,
    )


@triton.jit
def _epoch_barrier(pads, slot, epoch, RANK: tl.constexpr, WORLD: tl.constexpr):
    """Block `slot` of every rank meets here at `epoch`: thread p < WORLD raises this rank's
    flag at peer p, then waits for peer p's flag here."""
    tl.debug_barrier()
    peers = tl.arange(0, WORLD)
    pad_ptrs = pads.to(tl.pointer_type(tl.uint64))
    remote = tl.load(pad_ptrs + peers).to(tl.pointer_type(tl.int32))
    local = tl.load(pad_ptrs + RANK).to(tl.pointer_type(tl.int32))
    if _thread_id() < WORLD:
        _put_flag(remote + slot * WORLD + RANK, epoch)
        _wait_flag(local + slot * WORLD + peers, epoch)
    tl.debug_barrier()


@triton.jit
def _slot_base(buffers, rank, dtype: tl.constexpr):
    """Rank `rank`'s symmetric buffer (16-byte aligned: symmetric allocations are page aligned)."""
    ptr = tl.load(buffers.to(tl.pointer_type(tl.uint64)) + rank).to(tl.pointer_type(dtype))
    return tl.multiple_of(ptr, 16)


@triton.jit
def _one_shot_epoch(
    x_ptr, out_ptr, buffers, pads, epochs, numel, stride,
    RANK: tl.constexpr, WORLD: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    step = tl.num_programs(0) * BLOCK
    dtype = x_ptr.dtype.element_ty
    epoch = tl.load(epochs + pid) + 1
    tl.store(epochs + pid, epoch)  # read again by this program only, in the next call
    half = (epoch & 1).to(tl.int64) * (WORLD * stride)
    for start in range(pid * BLOCK, numel, step):
        offs = start + tl.arange(0, BLOCK)
        mask = offs < numel
        x = tl.load(x_ptr + offs, mask=mask)
        for peer in tl.static_range(WORLD):
            if peer != RANK:
                theirs = _slot_base(buffers, peer, dtype) + half + RANK * stride
                tl.store(theirs + offs, x, mask=mask)
    _epoch_barrier(pads, pid, epoch, RANK, WORLD)
    mine = _slot_base(buffers, RANK, dtype) + half
    for start in range(pid * BLOCK, numel, step):
        offs = start + tl.arange(0, BLOCK)
        mask = offs < numel
        acc = tl.zeros([BLOCK], dtype=tl.float32)
        for peer in tl.static_range(WORLD):
            if peer == RANK:
                acc += tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
            else:
                slot = mine + peer * stride + offs
                acc += tl.load(slot, mask=mask, other=0.0, cache_modifier=".cg").to(tl.float32)
        tl.store(out_ptr + offs, acc.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _zero_flags(pads, slots, RANK: tl.constexpr, BLOCK: tl.constexpr):
    local = tl.load(pads.to(tl.pointer_type(tl.uint64)) + RANK).to(tl.pointer_type(tl.int32))
    for start in range(0, slots, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        tl.store(local + offs, tl.zeros([BLOCK], dtype=tl.int32), mask=offs < slots)


def _grid(numel: int, block: int, programs: int, max_programs: int) -> int:
    return max(1, min(triton.cdiv(numel, block), programs, max_programs))


def setup(comm, numel: int, dtype: torch.dtype, **params):
    """Collective, outside capture: the double-buffered symmetric buffer, zeroed flags, the
    per-program epochs, and the grid every call of this state uses."""
    unknown = sorted(set(params) - set(DEFAULTS))
    if unknown:
        raise ValueError(f"params: unknown {unknown}; known {sorted(DEFAULTS)}")
    world = comm.world_size
    if world < 1 or world & (world - 1):
        raise ValueError(f"world_size {world}: this kernel needs a power of two")
    if comm.backend != "nccl":
        raise ValueError("peer memory needs CUDA ranks (backend nccl)")
    chosen = {**DEFAULTS, **params}
    name = comm.group.group_name
    symm_mem.enable_symm_mem_for_group(name)
    stride = triton.cdiv(numel, _ALIGN) * _ALIGN
    buffer = symm_mem.empty(2 * world * stride, dtype=dtype, device=comm.device)
    handle = symm_mem.rendezvous(buffer, name)
    slots = symm_mem.get_signal_pad_size() // 4
    max_programs = max(1, slots // world)
    _zero_flags[(1,)](handle.signal_pad_ptrs_dev, slots, RANK=comm.rank, BLOCK=1024)
    dist.barrier(group=comm.group)  # every rank's flags are zero before any rank's first call
    return {
        "handle": handle,
        "buffer": buffer,
        "rank": comm.rank,
        "world": world,
        "stride": stride,
        "epochs": torch.zeros(max_programs, dtype=torch.int32, device=comm.device),
        "grid": _grid(numel, chosen["block"], chosen["programs"], max_programs),
        "params": chosen,
    }


def kernel(x: torch.Tensor, state, **params) -> torch.Tensor:
    chosen = {**DEFAULTS, **params}
    if chosen != state["params"]:
        raise ValueError(f"params {chosen} differ from setup's {state['params']} (fixed grid)")
    if x.numel() > state["stride"]:
        raise ValueError(f"x has {x.numel()} elements, setup was for at most {state['stride']}")
    out = torch.empty_like(x)
    handle = state["handle"]
    _one_shot_epoch[(state["grid"],)](
        x, out, handle.buffer_ptrs_dev, handle.signal_pad_ptrs_dev, state["epochs"], x.numel(),
        state["stride"], RANK=state["rank"], WORLD=state["world"], BLOCK=chosen["block"],
        num_warps=chosen["num_warps"],
    )  # fmt: skip
    return out
