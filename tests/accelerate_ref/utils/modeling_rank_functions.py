"""Functions the ranks of tests/accelerate_ref/utils/test_modeling.py call. Holds no tests."""

from __future__ import annotations


def load_broadcast_from_rank0(path: str, partial_path: str) -> tuple[dict[str, list[float]], str]:
    """Load ``path``, then ``partial_path`` with ``strict=True``, both with ``broadcast_from_rank0=True``.

    Every rank names the files (HF resolves them on each rank) but only
    rank 0 reads them; each rank starts from different weights (seeded by
    its rank). Returns what the model holds after the first load and the
    error the strict load of the partial file raised.
    """
    import torch.distributed as dist

    from accelerate_ref.utils.modeling import load_checkpoint_in_model
    from conformance.support.models import built

    dist.init_process_group("gloo")
    try:
        rank = dist.get_rank()
        model = built(seed=10 + rank, width=4, depth=1)
        load_checkpoint_in_model(model, path, broadcast_from_rank0=True)
        loaded = {name: tensor.flatten().tolist() for name, tensor in model.state_dict().items()}
        try:
            load_checkpoint_in_model(model, partial_path, strict=True, broadcast_from_rank0=True)
        except RuntimeError as error:
            return loaded, str(error)
        return loaded, ""
    finally:
        dist.destroy_process_group()
