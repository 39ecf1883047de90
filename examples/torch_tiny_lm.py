"""A small causal transformer language model trained by the parameter server with AdamW.

    tensorwire-ps --workers 2 --steps 150 --optimizer adamw --lr 0.01 --weight-decay 0.01 &
    tensorwire-worker --rank 0 --workers 2 --model examples/torch_tiny_lm.py:make &
    tensorwire-worker --rank 1 --workers 2 --model examples/torch_tiny_lm.py:make

(or ``tensorwire demo --model examples/torch_tiny_lm.py:make --steps 150 --ps-args "--optimizer
adamw --lr 0.01 --weight-decay 0.01"``). The text is made up so that the example needs no
download: sequences that count upwards modulo the vocabulary from a random start, which a model
that attends to the previous token predicts exactly. The factory gives no loss: the worker trains
on the cross-entropy of each token, the logits' last axis being the vocabulary, and counts the
tokens predicted right; the evaluation is that share on sequences no worker trained on.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from tensorwire.client.tasks import JobInfo

VOCABULARY = 16
TOKENS = 12


class TinyLM(nn.Module):
    """Token and position embeddings, two causal self-attention layers, logits per token."""

    def __init__(self, width: int = 32, heads: int = 4, layers: int = 2) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCABULARY, width)
        self.position = nn.Parameter(torch.zeros(TOKENS, width))
        layer = nn.TransformerEncoderLayer(width, heads, 2 * width, dropout=0.0, batch_first=True)
        self.layers = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.logits = nn.Linear(width, VOCABULARY)
        self.register_buffer(
            "causal", nn.Transformer.generate_square_subsequent_mask(TOKENS), persistent=False
        )

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.embed(ids) + self.position
        return self.logits(self.layers(h, mask=self.causal, is_causal=True))


def counting(step: int, rank: int, batch: int) -> torch.Tensor:
    """``batch`` sequences of TOKENS + 1 tokens counting upwards from random starts: a pure
    function of the step and the rank, so a resumed job sees the same batches."""
    generator = torch.Generator().manual_seed(1_000_003 * step + rank)
    start = torch.randint(0, VOCABULARY, (batch, 1), generator=generator)
    return (start + torch.arange(TOKENS + 1)) % VOCABULARY


def make(job: JobInfo) -> tuple[nn.Module, Any, Any]:
    torch.set_num_threads(1)  # a job's processes share the machine's cores
    torch.manual_seed(job.seed)

    def batches(step: int) -> tuple[torch.Tensor, torch.Tensor]:
        tokens = counting(step, job.rank, job.batch)
        return tokens[:, :-1], tokens[:, 1:]  # each token's target is the next one

    held_out = counting(10**9, 0, 256)  # (a step no job reaches)

    def evaluate(model: nn.Module) -> float:
        device = next(model.parameters()).device  # the worker's --device
        with torch.no_grad():
            predicted = model(held_out[:, :-1].to(device)).argmax(dim=-1).cpu()
        return float((predicted == held_out[:, 1:]).float().mean())

    return TinyLM(), batches, evaluate
