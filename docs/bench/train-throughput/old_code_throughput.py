"""The old train-draft step (commit 91075ec: target recomputed per batch), timed like scripts/train_throughput.py."""

import json
import sys
import time
from pathlib import Path

import torch

from quickdraft.distill.seqkd import read_seqkd, response_mask
from quickdraft.distill.train_heads import HeadTrainingConfig, batch_rows, new_module, target_batch, train_loss
from quickdraft.models.loading import load_model
from quickdraft.models.native import NativeLlama

torch.set_num_threads(2)
target = load_model(None, "bfloat16")
net = NativeLlama(target.model)
rows = read_seqkd(Path("../shared/data/seqkd"), "train")
cfg = HeadTrainingConfig(kinds=("head",), batch_size=8, max_len=256)
embed = net.embed.detach()
head = net.head[:8192].detach()


def run():
    torch.manual_seed(0)
    module = new_module("head", target.model, cfg)
    opt = torch.optim.AdamW(module.parameters(), lr=1e-3)
    pos, t0 = 0, time.perf_counter()
    for step in range(12):
        batch = target_batch(net, batch_rows(rows, step, 8, 0), 256, None)
        pos += int(response_mask(batch.lengths, batch.prompt_lens, max(batch.lengths)).sum())
        with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
            loss, _ = train_loss(module, "head", batch, embed, head, 1.0)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    s = time.perf_counter() - t0
    return {"positions": pos, "seconds": round(s, 2), "positions_per_s": round(pos / s, 1)}


run()
r = run()
print(json.dumps(r))
Path(sys.argv[1]).write_text(json.dumps({"old_commit": "91075ec", **r}, indent=2) + "\n")
