"""A PyTorch Lightning Trainer script as the on-prem cluster guides write it: the Trainer is told the number of
nodes and devices, and Lightning starts the per-device processes itself (nodekit's launcher = "env" only provides
MASTER_ADDR, MASTER_PORT and NODE_RANK, as a cluster's own launch script would).

    MASTER_ADDR=A MASTER_PORT=P NODE_RANK=R python train.py --num-nodes 2 --devices 1

When training ends, every rank compares a checksum of its parameters with everyone else's.
"""

import argparse
import hashlib

import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Regressor(L.LightningModule):
    def __init__(self, lr: float = 0.05) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        self.log("loss", loss, prog_bar=True)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)

    def on_train_end(self) -> None:
        h = hashlib.sha256()
        for name, p in sorted(self.state_dict().items()):
            h.update(name.encode())
            h.update(bytes(p.detach().cpu().contiguous().view(-1).view(torch.uint8).tolist()))
        mine = torch.tensor([int.from_bytes(h.digest()[:8], "big", signed=True)], device=self.device)
        sums = self.all_gather(mine)
        equal = len(set(sums.view(-1).tolist())) == 1
        if self.global_rank == 0:
            print(
                f"lightning: {self.global_step} steps, parameters {'equal' if equal else 'DIFFERENT'} "
                f"on {self.trainer.world_size} ranks",
                flush=True,
            )
        if not equal:
            raise RuntimeError("parameters differ between ranks")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--num-nodes", type=int, default=2)
    parser.add_argument("--devices", type=int, default=1)
    parser.add_argument("--accelerator", default="auto")
    parser.add_argument("--max-steps", type=int, default=5)
    args = parser.parse_args()

    L.seed_everything(0)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(512, 16, generator=g)
    y = x.sum(dim=1, keepdim=True).sin()
    train = DataLoader(TensorDataset(x, y), batch_size=32, shuffle=True)

    trainer = L.Trainer(
        accelerator=args.accelerator,
        devices=args.devices,
        num_nodes=args.num_nodes,
        strategy="ddp",
        max_steps=args.max_steps,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(Regressor(), train)


if __name__ == "__main__":
    main()
