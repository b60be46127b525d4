"""The transformers Trainer on a tiny GPT-2 built from a config (nothing downloaded),
trained on random tokens; its own steps/s go into the result."""

import argparse
import os

import torch
from client_common import weights_digest, write_result
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments, set_seed


class RandomTokens(torch.utils.data.Dataset):
    def __init__(self, samples: int, length: int, vocab: int) -> None:
        generator = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, vocab, (samples, length), generator=generator)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, index: int) -> dict:
        return {"input_ids": self.ids[index], "labels": self.ids[index]}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps", type=int, default=60)
    args = parser.parse_args()
    set_seed(0)
    config = GPT2Config(vocab_size=256, n_positions=64, n_embd=64, n_layer=2, n_head=2)
    model = GPT2LMHeadModel(config)
    training = TrainingArguments(
        output_dir=os.path.join(args.out, "trainer"),
        max_steps=args.steps,
        per_device_train_batch_size=8,
        learning_rate=1e-3,
        use_cpu=True,
        ddp_backend="gloo",
        report_to=[],
        save_strategy="no",
        logging_strategy="no",
        dataloader_num_workers=0,
        seed=0,
        disable_tqdm=True,
    )
    trainer = Trainer(model=model, args=training, train_dataset=RandomTokens(1024, 32, 256))
    metrics = trainer.train().metrics
    write_result(
        args.out,
        args.steps,
        weights=weights_digest(model.state_dict()),
        loss=float(metrics["train_loss"]),
        trainer_steps_per_s=float(metrics["train_steps_per_second"]),
    )


if __name__ == "__main__":
    main()
