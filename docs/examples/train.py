"""A small HF-accelerate training loop, the README's quick-start script (runs as it is on mock GPUs)."""

import torch
from accelerate import Accelerator

accelerator = Accelerator(mixed_precision="bf16")
model = torch.nn.Sequential(torch.nn.Linear(512, 2048), torch.nn.GELU(), torch.nn.Linear(2048, 512))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
data = torch.utils.data.TensorDataset(torch.randn(64, 512), torch.randn(64, 512))
loader = torch.utils.data.DataLoader(data, batch_size=8)
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
for inputs, targets in loader:
    loss = torch.nn.functional.mse_loss(model(inputs), targets)
    accelerator.backward(loss)
    optimizer.step()
    optimizer.zero_grad()
accelerator.print(f"done: {accelerator.num_processes} processes, {accelerator.distributed_type}")
