"""Per-token acceptance of a sampled draft under the rejection rule (sum min(p, q)) and under the
Gumbel-max coupling (draft and target drawn with one position's noise: P[argmax(log p + g) =
argmax(log q + g)], Monte Carlo over 200 draws), at the last 128 teacher-forced positions of the
first 256 tokens of held-out SeqKD rows, T = 0.8, float32.

    zcat ../shared/data/seqkd/seqkd-sample-00.jsonl.gz | grep '"heldout"' | head -6 > /tmp/heldout6.jsonl
    python scripts/coupling_acceptance.py distilled /tmp/heldout6.jsonl
"""

import json
import sys

import torch

from quickdraft import Engine
from quickdraft.config import SamplingConfig
from quickdraft.sampling import logits_to_probs
from quickdraft.settings.options import options_from

torch.set_num_threads(2)
rows = [json.loads(line) for line in open(sys.argv[2])]
texts = [r["prompt_ids"] + r["response_ids"] for r in rows if r.get("split") == "heldout"][:6]
sampling = SamplingConfig(temperature=0.8)
eng = Engine.load(config=options_from({"drafter": sys.argv[1], "draft_tree": 0, "dtype": "float32"}))
tgt, dr = eng.target, eng.drafter.model
mins, gum = [], []
g = torch.Generator().manual_seed(0)
for ids in texts:
    ids = ids[:256]
    tgt.reset()
    dr.reset()
    p = logits_to_probs(tgt.extend(ids), sampling)[-128:]
    q = logits_to_probs(dr.extend(ids), sampling)[-128:]
    mins.append(torch.minimum(p, q).sum(-1))
    agree = torch.zeros(p.shape[0])
    for _ in range(200):
        noise = -torch.log(-torch.log(torch.rand(p.shape, generator=g)))
        agree += ((p.log() + noise).argmax(-1) == (q.log() + noise).argmax(-1)).float()
    gum.append(agree / 200)
mins, gum = torch.cat(mins), torch.cat(gum)
print(f"{sys.argv[1]}: {len(mins)} positions; rejection rule {mins.mean():.3f}; Gumbel coupling {gum.mean():.3f}")
