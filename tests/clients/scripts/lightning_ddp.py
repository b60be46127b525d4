"""PyTorch Lightning, as its users write it: Trainer(strategy="ddp", accelerator="cpu",
devices=2) on a tiny regression model. With --ckpt-dir it saves last.ckpt every epoch
and resumes from it, so a crash costs at most the epoch in progress."""

import argparse
import os

import pytorch_lightning as pl
import torch
from client_common import (
    maybe_crash,
    synthetic_regression,
    training_started,
    weights_digest,
    write_result,
)
from pytorch_lightning.callbacks import ModelCheckpoint


class Regression(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)
        )
        self.last_loss = float("nan")

    def training_step(self, batch, _index):
        training_started()
        maybe_crash(self.global_step)
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        self.last_loss = float(loss.detach())
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01, momentum=0.9)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--ckpt-dir", default=None)
    args = parser.parse_args()
    pl.seed_everything(0, verbose=False)
    model = Regression()
    loader = torch.utils.data.DataLoader(synthetic_regression(512, 32), batch_size=16)
    callbacks = []
    if args.ckpt_dir:
        callbacks.append(ModelCheckpoint(dirpath=args.ckpt_dir, save_last=True, every_n_epochs=1))
    trainer = pl.Trainer(
        strategy="ddp",
        accelerator="cpu",
        devices=2,
        max_epochs=args.epochs,
        deterministic=True,
        logger=False,
        enable_checkpointing=bool(args.ckpt_dir),
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=callbacks,
    )
    last = os.path.join(args.ckpt_dir, "last.ckpt") if args.ckpt_dir else None
    resume = last if last and os.path.exists(last) else None
    trainer.fit(model, loader, ckpt_path=resume)
    write_result(
        args.out,
        trainer.global_step,
        weights=weights_digest(model.state_dict()),
        loss=model.last_loss,
        resumed=resume is not None,
    )


if __name__ == "__main__":
    main()
