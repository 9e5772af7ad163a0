"""Broken: `clip_grad_norm_` returns the total norm but leaves the gradients unclipped.

Rule: ``clip_grad_norm_`` clips like ``torch.nn.utils.clip_grad_norm_``.
Caught at world 2 by ``clip.grad_norm``.
"""

import torch
from broken_impls._wrap import BrokenCopy

ref = BrokenCopy(__name__)


def clip_grad_norm_(self, parameters, max_norm, norm_type=2):
    self.unscale_gradients()
    grads = [p.grad for p in parameters if p.grad is not None]
    return torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g, norm_type) for g in grads]), norm_type)


ref.replace("accelerator.Accelerator.clip_grad_norm_", clip_grad_norm_)
ref.export(globals())
