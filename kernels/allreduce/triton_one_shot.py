"""One-shot all-reduce through peer memory (symmetric memory, no NCCL): every rank copies its
input into its own symmetric buffer, the blocks of all ranks meet at a barrier, and every rank
reads every rank's buffer and sums in float32. One read of each peer per element: the fewest
steps, the most bytes over the links; made for small messages.

Each program owns a strided set of BLOCK-element pieces; program b of every rank handles the same
pieces, so a barrier between programs of the same index (a flag per program and rank pair in the
signal pads) is all the synchronisation needed. A second barrier at the end keeps a fast rank's
next call from overwriting its buffer while a peer still reads it.
"""

import torch
import torch.distributed._symmetric_memory as symm_mem
import triton
import triton.language as tl

LANGUAGE = "triton"


@triton.jit
def _thread_id():
    return tl.inline_asm_elementwise(
        "mov.u32 $0, %tid.x;", "=r", [], dtype=tl.int32, is_pure=True, pack=1
    )


@triton.jit
def _raise_flag(addrs):
    # Spin until the peer has taken the last flag (slot back at 0), then set it to 1; release:
    # this block's writes before the flag are visible to the peer that sees it.
    tl.inline_asm_elementwise(
        """
        {
        .reg .u32 %prev;
        .reg .pred %free;
        RAISE:
        atom.global.release.sys.cas.b32 %prev, [$1], 0, 1;
        setp.eq.u32 %free, %prev, 0;
        @!%free bra RAISE;
        mov.u32 $0, %prev;
        }
        """,
        "=r, l",
        [addrs],
        dtype=tl.int32,
        is_pure=False,
        pack=1,
    )


@triton.jit
def _take_flag(addrs):
    # Spin until the peer's flag is 1, then set it back to 0; acquire: the peer's writes before
    # its flag are visible from here on.
    tl.inline_asm_elementwise(
        """
        {
        .reg .u32 %prev;
        .reg .pred %set;
        TAKE:
        atom.global.acquire.sys.cas.b32 %prev, [$1], 1, 0;
        setp.eq.u32 %set, %prev, 1;
        @!%set bra TAKE;
        mov.u32 $0, %prev;
        }
        """,
        "=r, l",
        [addrs],
        dtype=tl.int32,
        is_pure=False,
        pack=1,
    )


@triton.jit
def _block_barrier(pads, slot, RANK: tl.constexpr, WORLD: tl.constexpr):
    """Block `slot` of every rank meets here: thread p < WORLD flags peer p and waits for p."""
    tl.debug_barrier()
    peers = tl.arange(0, WORLD)
    pad_ptrs = pads.to(tl.pointer_type(tl.uint64))
    remote = tl.load(pad_ptrs + peers).to(tl.pointer_type(tl.uint32))
    local = tl.load(pad_ptrs + RANK).to(tl.pointer_type(tl.uint32))
    if _thread_id() < WORLD:
        _raise_flag(remote + slot * WORLD + RANK)
        _take_flag(local + slot * WORLD + peers)
    tl.debug_barrier()


def _setup(comm, numel: int, dtype: torch.dtype):
    world = comm.world_size
    if world & (world - 1):
        raise ValueError(f"world_size {world}: this kernel needs a power of two")
    if comm.backend != "nccl":
        raise ValueError("peer memory needs CUDA ranks (backend nccl)")
    name = comm.group.group_name
    symm_mem.enable_symm_mem_for_group(name)
    buffer = symm_mem.empty(numel, dtype=dtype, device=comm.device)
    handle = symm_mem.rendezvous(buffer, name)
    slots = symm_mem.get_signal_pad_size() // 4
    return {
        "handle": handle,
        "buffer": buffer,
        "rank": comm.rank,
        "world": world,
        "max_programs": max(1, slots // world),
    }


PARAMS = {"block": [1024, 2048, 4096], "programs": [4, 8, 16, 32, 64], "num_warps": [4, 8, 16]}


@triton.jit
def _one_shot(
    x_ptr, out_ptr, buffers, pads, numel,
    RANK: tl.constexpr, WORLD: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    step = tl.num_programs(0) * BLOCK
    dtype = x_ptr.dtype.element_ty
    buffer_ptrs = buffers.to(tl.pointer_type(tl.uint64))
    mine = tl.load(buffer_ptrs + RANK).to(tl.pointer_type(dtype))
    for start in range(pid * BLOCK, numel, step):
        offs = start + tl.arange(0, BLOCK)
        mask = offs < numel
        tl.store(mine + offs, tl.load(x_ptr + offs, mask=mask), mask=mask)
    _block_barrier(pads, pid, RANK, WORLD)
    for start in range(pid * BLOCK, numel, step):
        offs = start + tl.arange(0, BLOCK)
        mask = offs < numel
        acc = tl.zeros([BLOCK], dtype=tl.float32)
        for peer in tl.static_range(WORLD):
            theirs = tl.load(buffer_ptrs + peer).to(tl.pointer_type(dtype))
            acc += tl.load(theirs + offs, mask=mask, other=0.0).to(tl.float32)
        tl.store(out_ptr + offs, acc.to(out_ptr.dtype.element_ty), mask=mask)
    _block_barrier(pads, pid, RANK, WORLD)


def setup(comm, numel: int, dtype: torch.dtype, **params):
    return _setup(comm, numel, dtype)


def kernel(x: torch.Tensor, state, block: int = 2048, programs: int = 16, num_warps: int = 8):
    out = torch.empty_like(x)
    numel = x.numel()
    grid = (max(1, min(triton.cdiv(numel, block), programs, state["max_programs"])),)
    handle = state["handle"]
    _one_shot[grid](
        x, out, handle.buffer_ptrs_dev, handle.signal_pad_ptrs_dev, numel,
        RANK=state["rank"], WORLD=state["world"], BLOCK=block, num_warps=num_warps,
    )  # fmt: skip
    return out
