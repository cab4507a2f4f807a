"""What a learner can read of torch's TF32 switches, for the TF32 tests (in-process and in a subprocess)."""

from __future__ import annotations

import torch


def tf32_readings() -> dict[str, object]:
    """Each switch's value, 'raises' where torch >= 2.9 refuses to read it after mixed APIs."""
    matmul, out = torch.backends.cuda.matmul, {}
    cpu = getattr(torch.backends.mkldnn, "matmul", None)
    for name, read in [
        ("allow_tf32", lambda: matmul.allow_tf32),
        ("fp32_precision", lambda: getattr(matmul, "fp32_precision", None)),
        ("float32_matmul_precision", torch.get_float32_matmul_precision),
        ("cpu", lambda: getattr(cpu, "fp32_precision", None)),
    ]:
        try:
            out[name] = read()
        except RuntimeError:
            out[name] = "raises"
    return out
