"""HuggingFace accelerate in a plain loop: Accelerator(), prepare(), backward()."""

import argparse

import torch
from accelerate import Accelerator
from accelerate.utils import set_seed
from client_common import (
    step_done,
    synthetic_regression,
    training_started,
    weights_digest,
    write_result,
)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--epochs", type=int, default=3)
    args = parser.parse_args()
    accelerator = Accelerator(cpu=True)
    set_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loader = torch.utils.data.DataLoader(synthetic_regression(512, 32), batch_size=16)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    steps, loss = 0, torch.zeros(())
    training_started()
    for _ in range(args.epochs):
        for x, y in loader:
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), y)
            accelerator.backward(loss)
            optimizer.step()
            steps += 1
            step_done()
    accelerator.wait_for_everyone()
    state = accelerator.unwrap_model(model).state_dict()
    write_result(
        args.out,
        steps,
        weights=weights_digest(state),
        loss=float(loss.detach()),
        distributed_type=str(accelerator.distributed_type),
        num_processes=accelerator.num_processes,
    )
    accelerator.end_training()


if __name__ == "__main__":
    main()
