"""What the step benchmark trains: batch shapes of the corpora, the models, and one training step.

A workload is a model config (conf/model/*.yaml's values) with a batch of utterances of a corpus's
typical length. The batches are made here (random log-mel-like features and random targets of the
right shapes and lengths), so no corpus needs to be prepared: a step's cost depends on the shapes,
not on the feature values, except where the clustering adapts to the data (K-Means stops early
once its centroids settle), which random features make slightly pessimistic.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from asr.data.splits.tokenizers import SymbolTokenizer, Tokenizer, build_tokenizer
from asr.model.ctc import ctc_loss
from asr.model.recognizer import SpeechRecognizer
from asr.benchmarks.step.plain_model import PlainRecognizer
from attention_ext import parse_attention_spec

# conf/model: synth.yaml (the synth presets) and paper.yaml (the paper's WSJ model, also the
# LibriSpeech presets'); the schema's defaults (asr.config.schema.ModelConfig) filled in.
MODELS = {
    "synth": dict(layers=6, heads=4, head_dim=32, ff_dim=512, dropout=0.1, subsampling=2, subsampling_channels=32),
    "paper": dict(layers=9, heads=6, head_dim=32, ff_dim=768, dropout=0.1, subsampling=1, subsampling_channels=32),
}
# The optimiser of conf/optim (RAdam, decoupled weight decay 0.01, gradient norm clipped at 10).
OPTIM = dict(lr=1e-4, weight_decay=0.01, clip_norm=10.0, plateau_factor=0.5, plateau_patience=1, min_lr=1e-6,
             warmup_steps=0)
FRAMES_PER_SECOND = 100   # 10 ms frame shift (asr.data.features.features.FilterBank)


@dataclass(frozen=True)
class Workload:
    name: str
    what: str
    model: str                      # a key of MODELS
    feature_dim: int
    heads: tuple[str, ...]          # target kinds: "phones", "chars", or "pieces500" (a 500-class head)
    utterances: int
    seconds: float                  # mean utterance duration; a batch spans +-4 % around it (a length bucket)
    targets_per_second: dict[str, float]

    @property
    def batch_seconds(self) -> float:
        return self.utterances * self.seconds


WORKLOADS = {w.name: w for w in (
    Workload("synth-380", "synth presets: 60 s batches of ~7.6 s utterances, stride-2 front end (~380 positions)",
             "synth", 40, ("phones", "chars"), 8, 7.6, {"phones": 11.0, "chars": 14.0}),
    Workload("synth-740", "synth experiment's paper setting: 60 s batches of ~14.8 s utterances (~740 positions)",
             "synth", 40, ("phones", "chars"), 4, 14.8, {"phones": 11.0, "chars": 14.0}),
    Workload("wsj", "WSJ presets: paper model, 7.8 s utterances (780 positions), 13 per batch (data.max_duration=100)",
             "paper", 40, ("phones", "chars"), 13, 7.8, {"phones": 11.0, "chars": 14.0}),
    Workload("librispeech", "LibriSpeech presets: paper model, 80 bins, 12.3 s utterances (1230 positions), "
             "500-piece head; 5 per batch (the preset's 300 s batches hold 24)",
             "paper", 80, ("pieces500",), 5, 12.3, {"pieces500": 3.5}),
)}


def workload_tokenizers(kinds: tuple[str, ...]) -> dict[str, Tokenizer]:
    """Token tables of the workload's heads: the real phone and character tables; a 500-symbol table
    stands in for LibriSpeech's 500-piece sentencepiece model (only the head's size matters here)."""
    return {kind: SymbolTokenizer("chars", [chr(0x100 + i) for i in range(499)]) if kind == "pieces500"
            else build_tokenizer(kind) for kind in kinds}


def head_sizes(kinds: tuple[str, ...]) -> dict[str, int]:
    """{kind: vocabulary size including blank} of the workload's CTC heads."""
    return {kind: tokenizer.vocab_size for kind, tokenizer in workload_tokenizers(kinds).items()}


@dataclass
class TrainingBatch:
    features: torch.Tensor              # (B, T, F), 0 past each length
    lengths: torch.Tensor               # (B,)
    targets: dict[str, torch.Tensor]    # {kind: (B, S)}
    target_lengths: dict[str, torch.Tensor]
    audio_seconds: float

    def to(self, device: str) -> "TrainingBatch":
        return TrainingBatch(self.features.to(device), self.lengths.to(device),
                             {kind: t.to(device) for kind, t in self.targets.items()},
                             {kind: t.to(device) for kind, t in self.target_lengths.items()}, self.audio_seconds)


def make_batch(workload: Workload, seed: int) -> TrainingBatch:
    """A padded batch of the workload's shape: lengths spread over +-4 % of the mean (as a length
    bucket gives), log-mel-like features (mean -5, std 3), random targets of the corpus's rate."""
    generator = torch.Generator().manual_seed(seed)
    frames = (workload.seconds * FRAMES_PER_SECOND
              * (0.96 + 0.08 * torch.rand(workload.utterances, generator=generator))).long()
    frames[0] = int(workload.seconds * FRAMES_PER_SECOND * 1.04)   # the longest sets the padded length
    features = torch.randn(workload.utterances, int(frames.max()), workload.feature_dim, generator=generator) * 3 - 5
    features *= (torch.arange(features.shape[1])[None, :] < frames[:, None])[..., None]
    vocab = head_sizes(workload.heads)
    targets, target_lengths = {}, {}
    for kind, rate in workload.targets_per_second.items():
        counts = (frames.float() / FRAMES_PER_SECOND * rate).long()
        targets[kind] = torch.randint(1, vocab[kind], (workload.utterances, int(counts.max())), generator=generator)
        target_lengths[kind] = counts
    return TrainingBatch(features, frames, targets, target_lengths, float(frames.sum()) / FRAMES_PER_SECOND)


# ---- the models -------------------------------------------------------------------------------

PLAIN = "plain"


@dataclass
class TrainedModel:
    """A model with its optimiser: the toolkit's SpeechRecognizer with one attention, or the plain one."""
    label: str
    module: torch.nn.Module
    optimizer: torch.optim.Optimizer
    loss_weights: dict[str, float]
    precision: str = "32-true"      # or "bf16-mixed": the forward and the loss under bfloat16 autocast, as Lightning runs it

    def forward_loss(self, batch: TrainingBatch) -> torch.Tensor:
        with torch.autocast(batch.features.device.type, dtype=torch.bfloat16, enabled=self.precision == "bf16-mixed"):
            log_probs, lengths = self.module(batch.features, batch.lengths)
            return sum(self.loss_weights[kind] * ctc_loss(lp, lengths, batch.targets[kind], batch.target_lengths[kind])
                       for kind, lp in log_probs.items())

    def step(self, batch: TrainingBatch) -> float:
        """One training step as Lightning runs it: forward, CTC, backward, clip, RAdam; the loss."""
        self.optimizer.zero_grad(set_to_none=True)
        loss = self.forward_loss(batch)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.module.parameters(), OPTIM["clip_norm"])
        self.optimizer.step()
        return float(loss.detach())


def toolkit_recognizer(workload: Workload, spec: str) -> SpeechRecognizer:
    """The toolkit's model for `spec` (an attention spec, e.g. "i-clustered-100"); attentions that need
    shared query/key projections (lsh) get model.shared_qk=true, as their presets do."""
    attention = parse_attention_spec(spec)
    model = dict(MODELS[workload.model], shared_qk=attention.needs_shared_qk)
    return SpeechRecognizer(model=model, attention=attention, optim=dict(OPTIM), feature_dim=workload.feature_dim,
                            tokenizers={kind: tokenizer.state_dict()
                                        for kind, tokenizer in workload_tokenizers(workload.heads).items()})


def plain_recognizer(workload: Workload) -> PlainRecognizer:
    return PlainRecognizer(workload.feature_dim, head_sizes(workload.heads), **MODELS[workload.model])


def build_model(workload: Workload, label: str, device: str = "cpu", precision: str = "32-true") -> TrainedModel:
    """`label` is an attention spec (the toolkit model) or PLAIN; the toolkit's own optimiser
    (SpeechRecognizer.configure_optimizers: RAdam, decoupled weight decay) for both."""
    if label == PLAIN:
        module = plain_recognizer(workload).to(device)
        optimizer = torch.optim.RAdam(module.parameters(), lr=OPTIM["lr"], weight_decay=OPTIM["weight_decay"],
                                      decoupled_weight_decay=True)
        weights = {kind: 1.0 for kind in workload.heads}
    else:
        module = toolkit_recognizer(workload, label).to(device)
        optimizer = module.configure_optimizers()
        weights = module.loss_weights
    module.train()
    return TrainedModel(label, module, optimizer, weights, precision)


def with_batch_seconds(workload: Workload, seconds: float | None) -> Workload:
    """The workload with batches of about `seconds` of audio (its utterance length kept); None: as it is."""
    if seconds is None:
        return workload
    return replace(workload, utterances=max(1, round(seconds / workload.seconds)))


def parameter_count(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())
