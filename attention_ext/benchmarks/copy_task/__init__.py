"""The masked copy task of 'Fast Transformers with Clustered Attention', supplementary C.2.

A target is 0 w 0 w: a separator token 0, then w, L symbols drawn uniformly from {1, ..., C},
then 0 and w again (N = 2 (L + 1) positions). The input is the target with 20% of the symbol
tokens replaced by a mask token M, never at the same index of both halves, so every masked
token can be read off the other half (Fig. 6). A model solves the task by attending from
each position to the same position of the other half, L + 1 away.

    python -m attention_ext.benchmarks.copy_task               # see __main__.py for the options

This package holds the pieces (data, model, training, accuracy); the command line is in
__main__.py. Nothing here knows about speech.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch
from torch import nn

from ...registry import parse_attention_spec

SEPARATOR = 0


@dataclass(frozen=True)
class CopyTask:
    """The task's sizes: L symbols per half, C symbol values, the fraction of masked tokens."""
    length: int = 31            # L
    symbols: int = 10           # C: symbols are 1..C
    mask_fraction: float = 0.2

    @property
    def mask_token(self) -> int:
        return self.symbols + 1

    @property
    def vocabulary(self) -> int:
        return self.symbols + 2   # separator, symbols, mask

    @property
    def sequence_length(self) -> int:
        return 2 * (self.length + 1)

    @property
    def masked_per_sequence(self) -> int:
        """20% of the 2L symbol tokens, rounded; at most L (each index is masked in one half)."""
        return min(self.length, round(self.mask_fraction * 2 * self.length))


def copy_task_batch(task: CopyTask, batch: int, generator: torch.Generator
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(inputs, targets, masked), each (batch, N): targets 0 w 0 w, inputs with the masked
    tokens replaced by the mask token, masked True where a token was replaced.

    Per sequence, `masked_per_sequence` distinct indices j of w are masked, each in one half
    chosen at random, so the other half always shows the token.
    """
    half = task.length + 1
    words = torch.randint(1, task.symbols + 1, (batch, task.length), generator=generator)
    separator = torch.full((batch, 1), SEPARATOR, dtype=torch.long)
    targets = torch.cat([separator, words, separator, words], dim=1)
    indices = torch.rand(batch, task.length, generator=generator).argsort(dim=1)[:, :task.masked_per_sequence]
    in_second_half = torch.randint(0, 2, indices.shape, generator=generator)
    positions = 1 + indices + half * in_second_half
    masked = torch.zeros_like(targets, dtype=torch.bool).scatter_(1, positions, True)
    inputs = targets.masked_fill(masked, task.mask_token)
    return inputs, targets, masked


def masked_accuracy(logits: torch.Tensor, targets: torch.Tensor, masked: torch.Tensor) -> float:
    """The fraction of masked tokens whose most likely prediction is the target token."""
    correct = (logits.argmax(dim=-1) == targets) & masked
    return float(correct.sum()) / max(1, int(masked.sum()))


def sinusoidal_positions(length: int, width: int) -> torch.Tensor:
    """(length, width) sine/cosine positions: a fixed offset between two positions is a fixed
    rotation of these, so 'attend L + 1 away' is a linear function of them."""
    position = torch.arange(length, dtype=torch.float32)[:, None]
    frequency = torch.exp(torch.arange(0, width, 2, dtype=torch.float32) * (-math.log(10000.0) / width))
    table = torch.zeros(length, width)
    table[:, 0::2] = torch.sin(position * frequency)
    table[:, 1::2] = torch.cos(position * frequency)
    return table


class CopyLayer(nn.Module):
    """A pre-norm transformer encoder layer around an attention_ext attention module."""

    def __init__(self, width: int, heads: int, attention: nn.Module, shared_qk: bool):
        super().__init__()
        self.heads = heads
        self.attention = attention
        self.attention_norm = nn.LayerNorm(width)
        self.query = nn.Linear(width, width)
        self.key = None if shared_qk else nn.Linear(width, width)   # Reformer: keys = queries
        self.value = nn.Linear(width, width)
        self.output = nn.Linear(width, width)
        self.feed_forward = nn.Sequential(nn.LayerNorm(width), nn.Linear(width, 4 * width), nn.ReLU(),
                                          nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, width = x.shape
        h = self.attention_norm(x)

        def split(t):
            return t.view(batch, length, self.heads, width // self.heads).transpose(1, 2)
        q = split(self.query(h))
        k = q if self.key is None else split(self.key(h))
        attended = self.attention(q, k, split(self.value(h)), None)
        x = x + self.output(attended.transpose(1, 2).reshape(batch, length, width))
        return x + self.feed_forward(x)


class CopyTransformer(nn.Module):
    """Token embedding + sinusoidal positions, `layers` encoder layers, a linear read-out."""

    def __init__(self, task: CopyTask, spec: str, layers: int = 2, heads: int = 4, width: int = 64):
        super().__init__()
        attention = parse_attention_spec(spec)
        attention.check_head_dim(width // heads)
        self.embedding = nn.Embedding(task.vocabulary, width)
        self.register_buffer("positions", sinusoidal_positions(task.sequence_length, width), persistent=False)
        self.layers = nn.ModuleList(CopyLayer(width, heads, attention.build(), attention.needs_shared_qk)
                                    for _ in range(layers))
        self.final_norm = nn.LayerNorm(width)
        self.read_out = nn.Linear(width, task.vocabulary)
        self.width = width

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        # no sqrt(width) on the embedding: the positions must not be drowned by the tokens, the
        # task is positional (attend L + 1 away)
        x = self.embedding(tokens) + self.positions[:tokens.shape[1]]
        for layer in self.layers:
            x = layer(x)
        return self.read_out(self.final_norm(x))


@dataclass
class TrainSettings:
    steps: int = 800
    batch: int = 32
    learning_rate: float = 3e-3
    warmup_steps: int = 100
    layers: int = 2
    heads: int = 4
    width: int = 64
    evaluation_batches: int = 8
    seed: int = 0


@dataclass
class CopyResult:
    spec: str
    length: int
    accuracy: float        # on the masked tokens of fresh evaluation batches
    loss: float            # cross entropy on those masked tokens
    train_loss: float      # the mean of the last 10% of the training steps
    seconds: float         # wall clock
    cpu_seconds: float     # CPU time of this process: the wall clock a quiet core would take


def masked_loss(logits: torch.Tensor, targets: torch.Tensor, masked: torch.Tensor) -> torch.Tensor:
    """Cross entropy on the masked tokens only: the other tokens are in the input as they are."""
    return nn.functional.cross_entropy(logits[masked], targets[masked])


def train_copy_task(task: CopyTask, spec: str, settings: TrainSettings, on_step=None) -> CopyResult:
    """Trains a fresh CopyTransformer with attention `spec` for `settings.steps` Adam steps
    (linear warm-up) on fresh random batches, then evaluates it on fresh batches.

    Model initialisation, data and the attention's randomness all follow settings.seed, so
    every attention sees the same batches from the same initial embedding and read-out.
    """
    started, cpu_started = time.perf_counter(), time.process_time()
    torch.manual_seed(settings.seed)
    model = CopyTransformer(task, spec, settings.layers, settings.heads, settings.width)
    optimizer = torch.optim.Adam(model.parameters(), lr=settings.learning_rate)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: min(1.0, (step + 1) / max(1, settings.warmup_steps)))
    data = torch.Generator().manual_seed(settings.seed)
    losses = []
    model.train()
    for step in range(settings.steps):
        inputs, targets, masked = copy_task_batch(task, settings.batch, data)
        loss = masked_loss(model(inputs), targets, masked)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        losses.append(loss.item())
        if on_step is not None:
            on_step(step, losses[-1])
    model.eval()
    evaluation = torch.Generator().manual_seed(settings.seed + 1)
    correct = total = 0
    loss_sum = 0.0
    with torch.no_grad():
        for _ in range(settings.evaluation_batches):
            inputs, targets, masked = copy_task_batch(task, settings.batch, evaluation)
            logits = model(inputs)
            count = int(masked.sum())
            correct += round(masked_accuracy(logits, targets, masked) * count)
            loss_sum += float(masked_loss(logits, targets, masked)) * count
            total += count
    tail = losses[-max(1, len(losses) // 10):] if losses else [float("nan")]
    return CopyResult(spec, task.length, correct / max(1, total), loss_sum / max(1, total),
                      sum(tail) / len(tail), time.perf_counter() - started, time.process_time() - cpu_started)


REPORT_EVERY = 10   # steps between a worker's progress reports


def train_in_worker(job: tuple, progress_queue, threads: int) -> CopyResult:
    """train_copy_task for job = (index, task, spec, settings) in a worker process of the command
    line (importable there, unlike a function of __main__); reports (index, steps done) through
    progress_queue every REPORT_EVERY steps."""
    torch.set_num_threads(threads)
    index, task, spec, settings = job

    def report(step: int, _loss: float) -> None:
        if (step + 1) % REPORT_EVERY == 0 or step + 1 == settings.steps:
            progress_queue.put((index, step + 1))
    return train_copy_task(task, spec, settings, on_step=report)
