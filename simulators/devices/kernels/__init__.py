"""Kernels and rules of the mock devices that differ from the CPU's: what a GPU computes, keeps or refuses.

Fused attention and FlashAttention's ops (``attention``, ``flash_attention``), bf16/fp16 matrix products accumulated
in fp32 (``lowp_matmul``), torch's autocast rules applied from Python (``autocast``), and the rules of N-D parallelism
a GPU breaks obscurely (``nd_rules``).
"""
