"""Self-supervised pretraining with LightlyTrain on several nodes, as its multi-node guide writes it: the script is
started once per node with MASTER_ADDR, MASTER_PORT and NODE_RANK set (nodekit's launcher = "env" does that), and
LightlyTrain (PyTorch Lightning underneath) starts ``devices`` processes per node itself.

    MASTER_ADDR=A MASTER_PORT=P NODE_RANK=R python pretrain.py --data /data --num-nodes 2 --devices 1

``lightly_train.pretrain`` is LightlyTrain 0.18's name for what earlier releases called ``lightly_train.train``
(still there, deprecated). SimCLR on a torchvision ResNet-18 needs no pretrained weights, so nothing is downloaded.
Node 0 writes ``result.json`` to $NODEKIT_OUTPUT_DIR: versions, the exported model's path and checksum.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
from pathlib import Path

import lightly_train


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--data", default="/data")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=16, help="global, across all processes")
    p.add_argument("--num-nodes", type=int, default=2)
    p.add_argument("--devices", type=int, default=1)
    p.add_argument("--accelerator", default="auto")
    p.add_argument("--output-dir", default=os.environ.get("NODEKIT_OUTPUT_DIR", "outputs"))
    args = p.parse_args()
    out = Path(args.output_dir) / "lightly"
    lightly_train.pretrain(
        out=str(out),
        data=args.data,
        model="torchvision/resnet18",
        method="simclr",
        epochs=args.epochs,
        batch_size=args.batch_size,
        num_workers=0,
        num_nodes=args.num_nodes,
        devices=args.devices,
        accelerator=args.accelerator,
        strategy="ddp",
        overwrite=True,
        seed=0,
    )
    if os.environ.get("NODE_RANK", "0") == "0":
        exported = out / "exported_models" / "exported_last.pt"
        result = {
            "lightly_train": lightly_train.__version__,
            "num_nodes": args.num_nodes,
            "devices": args.devices,
            "images": len([f for f in Path(args.data).iterdir() if f.is_file()]),
            "exported": str(exported),
            "exported_sha256": hashlib.sha256(exported.read_bytes()).hexdigest() if exported.is_file() else None,
        }
        (Path(args.output_dir) / "result.json").write_text(json.dumps(result, indent=2) + "\n")
        print(f"lightlytrain-demo: pretrained on {args.num_nodes} nodes, exported {exported}", flush=True)


if __name__ == "__main__":
    main()
