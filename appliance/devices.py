"""Which device the pipeline runs on, and the sentence that says why."""

from __future__ import annotations

from appliance.output import UsageFailure


def resolve_device(choice: str) -> tuple[str, str]:
    """'auto', 'cuda' or 'cpu' -> (device, note)."""
    import torch

    has_gpu = torch.cuda.is_available()
    if choice == "cuda" and not has_gpu:
        raise UsageFailure("--device cuda was asked for, but no CUDA GPU is visible to torch")
    if choice == "cpu" or (choice == "auto" and not has_gpu):
        note = (
            "no GPU found: running the CPU pipeline (CPU variants of the tasks, host clock timing)"
            if not has_gpu
            else "running on the CPU as asked"
        )
        return "cpu", note
    return "cuda", f"GPU: {torch.cuda.get_device_name(0)}"
