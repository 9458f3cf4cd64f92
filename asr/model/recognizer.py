"""The LightningModule: features -> normalisation -> encoder -> CTC heads -> loss, decoding, error rates.

    recognizer = SpeechRecognizer(model=dict(layers=9, ...), attention=validate_attention("full"),
                                  optim=dict(lr=1e-4, ...), feature_dim=40,
                                  tokenizers={kind: tokenizer.state_dict()},
                                  frontend=datamodule.filterbank.options)
    recognizer.set_feature_stats(datamodule.feature_mean, datamodule.feature_std)

Everything needed to use a checkpoint alone is inside it: the model, attention and optimiser
configs, the token tables and the feature front-end's options as hyper-parameters, the feature
mean/std as buffers.

Several target kinds (data.targets, e.g. phones and chars) get one CTC head each on the same
encoder; the loss is sum_k w_k * CTC_k with w_k = model.loss_weights[k] (default 1 for every
kind). The first kind is the primary one: its error rate (PER for phones, WER for chars or
sentencepiece) is `<stage>/primary_error`, which selects the best checkpoint.
"""
from __future__ import annotations

import math
import random

import lightning as L
import numpy as np
import torch
from torch import nn

from asr.data.batching.dataset import Batch, batch_references
from asr.data.splits.tokenizers import Tokenizer, tokenizer_from_state_dict
from asr.data.features.features import FilterBank
from asr.model.checkpoint import CHECKPOINT_FORMAT, FORMAT_KEY, feature_frontend
from asr.model.ctc import CTCHeads, ctc_loss, greedy_decode
from asr.model.encoder import TransformerEncoder
from asr.model.evaluation_tally import EvaluationTally
from attention_ext import ValidatedAttention, validate_attention

# The seed of the attention's randomness during validation and test (asr.evaluate's default `seed`).
EVALUATION_SEED = 0


def seed_evaluation_batch(seed: int, batch_index: int) -> None:
    """Seeds torch's generator for evaluation batch `batch_index`: the attention's random draws
    (hash planes, K-Means starts, LSH rotations) then depend on the seed and the batch alone, not
    on what else drew from the generator before (a DataLoader iterator draws once when created)."""
    torch.manual_seed((seed * 1_000_003 + batch_index) % 2**63)
ENCODER_ARGUMENTS = ("layers", "heads", "head_dim", "ff_dim", "dropout", "subsampling",
                     "subsampling_channels", "shared_qk", "positions", "norm", "input_norm")
# Encoder arguments added after checkpoints were written without them: the value those models had.
ENCODER_ARGUMENTS_OF_OLDER_CHECKPOINTS = {"positions": "sinusoidal", "norm": "pre", "input_norm": False}


def encoder_arguments(model: dict) -> dict:
    """The TransformerEncoder arguments of a model config or of a checkpoint's `model`
    hyper-parameters (one written before an argument existed gets the value its model had)."""
    return {key: model[key] if key in model else ENCODER_ARGUMENTS_OF_OLDER_CHECKPOINTS[key]
            for key in ENCODER_ARGUMENTS}


def warmup_factor(step: int, warmup_steps: int) -> float:
    """Linear warm-up: (step + 1) / warmup_steps for the first steps, then 1 (0 steps: always 1)."""
    return 1.0 if warmup_steps <= 0 else min(1.0, (step + 1) / warmup_steps)


class CheckpointMismatchError(RuntimeError):
    """A checkpoint whose tensors do not fit the model built from the current config."""


def check_state_dict_fits(model: nn.Module, state_dict: dict[str, torch.Tensor], source: str) -> None:
    """Raises CheckpointMismatchError naming every tensor whose shape differs, is missing or is extra."""
    own = model.state_dict()
    differing = [f"  {name}: {tuple(state_dict[name].shape)} in the checkpoint, {tuple(tensor.shape)} here"
                 for name, tensor in own.items() if name in state_dict and state_dict[name].shape != tensor.shape]
    missing = [name for name in own if name not in state_dict]
    extra = [name for name in state_dict if name not in own]
    if not (differing or missing or extra):
        return
    lines = [f"{source} holds a model of another shape than the one this config builds:"]
    if differing:
        lines += ["shapes that differ:"] + differing[:20] + ([f"  ... and {len(differing) - 20} more"]
                                                              if len(differing) > 20 else [])
    if missing:
        lines.append(f"not in the checkpoint ({len(missing)}): {', '.join(missing[:8])}"
                     + (" ..." if len(missing) > 8 else ""))
    if extra:
        lines.append(f"only in the checkpoint ({len(extra)}): {', '.join(extra[:8])}"
                     + (" ..." if len(extra) > 8 else ""))
    lines.append("Use the preset/model/data settings the checkpoint was trained with (its run folder "
                 "holds config.yaml), or start a new run without ckpt_path.")
    raise CheckpointMismatchError("\n".join(lines))


class SpeechRecognizer(L.LightningModule):
    def __init__(self, model: dict, attention: ValidatedAttention | dict, optim: dict, feature_dim: int,
                 tokenizers: dict[str, dict], frontend: dict | None = None):
        super().__init__()
        # frontend: FilterBank.options of the features the model is trained on (None: FilterBank's
        # defaults with feature_dim bins), stored so that a checkpoint says how to compute them
        frontend = feature_frontend({"feature_dim": feature_dim, "frontend": frontend}).options
        # The attention comes validated from the config (asr.config.schema.attention_settings), or as the
        # plain {"name": ..., **options} that Lightning passes back from a checkpoint's
        # hyper-parameters: a file, checked here like a config.
        validated = attention if isinstance(attention, ValidatedAttention) else validate_attention(**attention)
        # The hyper-parameters hold the plain form; save_hyperparameters reads the arguments'
        # values as they are when it is called.
        attention = validated.as_config()
        self.save_hyperparameters()
        self.tokenizers: dict[str, Tokenizer] = {kind: tokenizer_from_state_dict(state)
                                                 for kind, state in tokenizers.items()}
        self.encoder = TransformerEncoder(feature_dim, **encoder_arguments(model),
                                          attention=validated)
        self.heads = CTCHeads(self.encoder.d_model, {kind: t.vocab_size for kind, t in self.tokenizers.items()})
        # model.loss_weights is checked against data.targets where the config is read (asr.config.schema)
        self.loss_weights = {kind: float((model.get("loss_weights") or {}).get(kind, 1.0))
                             for kind in self.tokenizers}
        self.register_buffer("feature_mean", torch.zeros(feature_dim))
        self.register_buffer("feature_std", torch.ones(feature_dim))
        self._tallies: dict[str, EvaluationTally] = {}
        self._restored_plateau: dict | None = None
        self.last_error_rates: dict[str, dict[str, float]] = {}
        self.last_word_references: list[str] = []   # of the last test pass with word decoding (all processes)
        # asr.train's test pass sets it (asr.evaluation.decoding.evaluation.BatchWordDecoding): each test batch's
        # log-probabilities also go to the lexicon + LM decoder, so one pass gives both PER and words
        self.test_word_decoding = None

    # ---- model -------------------------------------------------------------------------------
    @property
    def frontend(self) -> FilterBank:
        """The filter bank that computes this model's input features (as in training)."""
        return feature_frontend(self.hparams)

    def set_feature_stats(self, mean: torch.Tensor, std: torch.Tensor) -> None:
        """Global per-bin mean/std of the training features (stored with the weights)."""
        self.feature_mean.copy_(torch.as_tensor(mean, dtype=torch.float32))
        self.feature_std.copy_(torch.as_tensor(std, dtype=torch.float32).clamp(min=1e-5))

    def set_attention(self, attention: ValidatedAttention, reformer_keys: bool = False,
                      layers: list[int] | None = None) -> None:
        """Runs the same weights under another attention, in every layer or in `layers` only (see
        TransformerEncoder.set_attention)."""
        self.encoder.set_attention(attention, reformer_keys, layers)

    def forward(self, features: torch.Tensor, lengths: torch.Tensor
                ) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """Raw fbank (B, T, F), (B,) -> {kind: (B, T', V) log-probs}, (B,) lengths T'."""
        features = (features - self.feature_mean) / self.feature_std
        features = features * (torch.arange(features.shape[1], device=features.device)
                               < lengths[:, None])[..., None]   # padding stays exactly 0
        states, lengths = self.encoder(features, lengths)
        return self.heads(states), lengths

    def transcribe(self, features: torch.Tensor, lengths: torch.Tensor) -> dict[str, list[str]]:
        """Greedy CTC transcripts per target kind."""
        log_probs, out_lengths = self(features, lengths)
        return {kind: [self.tokenizers[kind].decode(ids) for ids in greedy_decode(lp, out_lengths)]
                for kind, lp in log_probs.items()}

    # ---- training ----------------------------------------------------------------------------
    def _losses(self, batch: Batch) -> tuple[torch.Tensor, dict[str, torch.Tensor], dict, torch.Tensor]:
        log_probs, lengths = self(batch["features"], batch["feature_lengths"])
        # rows past the batch's utterances pad it to a fixed shape (data.fixed_batch_shapes): left out
        rows = len(batch["ids"])
        log_probs, lengths = {kind: lp[:rows] for kind, lp in log_probs.items()}, lengths[:rows]
        losses = {kind: ctc_loss(lp, lengths, batch["targets"][kind], batch["target_lengths"][kind])
                  for kind, lp in log_probs.items()}
        total = sum(self.loss_weights[kind] * loss for kind, loss in losses.items())
        return total, losses, log_probs, lengths

    def training_step(self, batch: Batch, batch_index: int) -> torch.Tensor:
        total, losses, _, _ = self._losses(batch)
        if batch.get("padding"):
            # a DDP rank's stand-in batch (asr.data.batching.duration_buckets): it must take the step with the other
            # ranks, so it returns a loss connected to every parameter, but contributes no gradient
            return total * 0.0
        size = len(batch["ids"])
        self.log("train/loss", total, prog_bar=True, batch_size=size)
        for kind, loss in losses.items():
            self.log(f"train/loss_{kind}", loss, batch_size=size)
        return total

    def on_train_batch_start(self, batch: Batch, batch_index: int) -> None:
        # the lr this step uses (outside optimizer_step, where the warm-up scaling is applied)
        self.log("train/lr", self.optimizers().param_groups[0]["lr"] * self._warmup_factor(),
                 batch_size=len(batch["ids"]))

    def _evaluation_step(self, batch: Batch, batch_index: int, stage: str) -> None:
        """Adds the batch to the stage's tally; the losses and error rates are logged at the end of
        the stage from the tallies of all processes (_evaluation_epoch_end), so they are exact sums
        over the utterances, whatever the batches and however many processes."""
        seed_evaluation_batch(EVALUATION_SEED, batch_index)
        total, losses, log_probs, lengths = self._losses(batch)
        if batch.get("padding"):
            return   # a DDP rank's stand-in batch: run (above) to stay in step with the others, not counted
        size = len(batch["ids"])
        tally = self._tallies.setdefault(stage, EvaluationTally())
        hypotheses = {kind: [self.tokenizers[kind].decode(ids) for ids in greedy_decode(lp, lengths)]
                      for kind, lp in log_probs.items()}
        tally.add(hypotheses, batch_references(batch, {kind: t.field for kind, t in self.tokenizers.items()}),
                  lengths)
        if stage == "test" and self.test_word_decoding is not None:
            self.test_word_decoding.submit(log_probs, lengths, batch["texts"])
        tally.loss_sum += float(total) * size     # the losses are batch means
        for kind, loss in losses.items():
            tally.head_loss_sums[kind] = tally.head_loss_sums.get(kind, 0.0) + float(loss) * size

    def validation_step(self, batch: Batch, batch_index: int) -> None:
        self._evaluation_step(batch, batch_index, "val")

    def test_step(self, batch: Batch, batch_index: int) -> None:
        self._evaluation_step(batch, batch_index, "test")

    def _gathered(self, stage: str) -> EvaluationTally:
        """This stage's tally, merged over all processes when training runs on several devices."""
        tally = self._tallies.get(stage, EvaluationTally())
        if self.trainer.world_size == 1:
            return tally
        parts = [None] * self.trainer.world_size
        torch.distributed.all_gather_object(parts, tally)
        merged = EvaluationTally()
        for part in parts:
            for kind in part.references:
                merged.references.setdefault(kind, []).extend(part.references[kind])
                merged.hypotheses.setdefault(kind, []).extend(part.hypotheses[kind])
            merged.word_references.extend(part.word_references)
            merged.word_hypotheses.extend(part.word_hypotheses)
            merged.encoder_frames += part.encoder_frames
            merged.utterances += part.utterances
            merged.loss_sum += part.loss_sum
            for kind, loss_sum in part.head_loss_sums.items():
                merged.head_loss_sums[kind] = merged.head_loss_sums.get(kind, 0.0) + loss_sum
        return merged

    def _evaluation_epoch_end(self, stage: str) -> None:
        if self.trainer.sanity_checking:
            self._tallies.pop(stage, None)
            return
        if stage == "test" and self.test_word_decoding is not None:   # this process's words, before gathering
            local = self._tallies.setdefault(stage, EvaluationTally())
            local.word_references, local.word_hypotheses = self.test_word_decoding.words()
        tally = self._gathered(stage)
        self._tallies.pop(stage, None)
        if not tally.utterances:
            return
        rates = tally.error_rates(self.tokenizers)
        # every process has the same gathered tally, so nothing is left to synchronise (sync_dist)
        self.log(f"{stage}/loss", tally.loss_sum / tally.utterances)
        for kind, loss_sum in tally.head_loss_sums.items():
            self.log(f"{stage}/loss_{kind}", loss_sum / tally.utterances)
        for name, value in rates.items():
            self.log(f"{stage}/{name}", value, prog_bar=name in ("per", "wer"))
        self.last_error_rates[stage] = rates
        if tally.word_references:
            self.last_word_references = tally.word_references
        if stage == "val":
            self._step_plateau(self._plateau_loss(tally))

    # Validation and test batches draw the attention's randomness from torch's generator seeded by
    # (EVALUATION_SEED, batch index), as asr.evaluate does with its default seed, so the test rates
    # asr.train prints equal what asr.evaluate gives for the same checkpoint whatever the attention;
    # the training stream is put back afterwards, so evaluating does not change what training draws.
    def _save_training_rng(self) -> None:
        self._training_rng_state = torch.get_rng_state()

    def _restore_training_rng(self) -> None:
        if getattr(self, "_training_rng_state", None) is not None:
            torch.set_rng_state(self._training_rng_state)
            self._training_rng_state = None

    def on_validation_epoch_start(self) -> None:
        self._tallies.pop("val", None)
        self._save_training_rng()

    def on_test_epoch_start(self) -> None:
        self._tallies.pop("test", None)
        self._save_training_rng()

    def on_validation_epoch_end(self) -> None:
        self._restore_training_rng()
        self._evaluation_epoch_end("val")

    def on_test_epoch_end(self) -> None:
        self._restore_training_rng()
        self._evaluation_epoch_end("test")

    # ---- optimisation ------------------------------------------------------------------------
    def configure_optimizers(self) -> torch.optim.Optimizer:
        """RAdam with decoupled weight decay (as in the RAdam authors' code the paper used).

        The plateau schedule (lr *= plateau_factor when the validation loss, or optim.plateau_target's
        head's, has not improved for more than plateau_patience validations) is stepped here in
        on_validation_epoch_end, not by Lightning: Lightning steps it after the checkpoint of that epoch
        is written and skips that step on resume, so a resumed run would follow another schedule than an
        uninterrupted one.
        """
        optim = self.hparams.optim
        optimizer = torch.optim.RAdam(self.parameters(), lr=optim["lr"], weight_decay=optim["weight_decay"],
                                      decoupled_weight_decay=True)
        self.plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(
            optimizer, mode="min", factor=optim["plateau_factor"], patience=optim["plateau_patience"],
            min_lr=optim["min_lr"])
        if self._restored_plateau is not None:
            self.plateau.load_state_dict(self._restored_plateau)
        return optimizer

    def _plateau_loss(self, tally: EvaluationTally) -> float:
        """The validation loss the plateau schedule watches: optim.plateau_target's head alone, or
        (null, and in checkpoints from before the option) the weighted sum of every head's."""
        target = self.hparams.optim.get("plateau_target")
        if target is None:
            return tally.loss_sum / tally.utterances
        return tally.head_loss_sums[target] / tally.utterances

    def _step_plateau(self, validation_loss: float) -> None:
        if getattr(self, "plateau", None) is not None and self.trainer.state.fn == "fit":
            self.plateau.step(validation_loss)

    def _warmup_factor(self) -> float:
        return warmup_factor(self.global_step, self.hparams.optim.get("warmup_steps", 0))

    def optimizer_step(self, epoch, batch_index, optimizer, optimizer_closure=None) -> None:
        """Linear warm-up over `optim.warmup_steps`, applied on top of the plateau schedule:
        the group's lr (what the plateau schedule lowers and the checkpoint stores) is scaled only
        for the duration of this step."""
        factor = self._warmup_factor()
        if factor >= 1.0:
            optimizer.step(closure=optimizer_closure)
            return
        saved = [group["lr"] for group in optimizer.param_groups]
        for group in optimizer.param_groups:
            group["lr"] *= factor
        optimizer.step(closure=optimizer_closure)
        for group, lr in zip(optimizer.param_groups, saved):
            group["lr"] = lr

    def on_train_epoch_start(self) -> None:
        """The training sampler shuffles epoch e with seed + e, e = the epochs finished. Lightning sets
        the sampler's epoch from its own counter, which runs one ahead after resuming a
        trainer.max_steps run from a checkpoint written at an epoch's end (Lightning 2.6 finishes
        that epoch a second time); the data would then follow another order than an uninterrupted
        run's. The epoch is set here, before the epoch's iterator is made."""
        sampler = getattr(self.trainer.train_dataloader, "sampler", None)
        if hasattr(sampler, "set_epoch") and getattr(sampler, "epoch", None) != self.current_epoch:
            sampler.set_epoch(self.current_epoch)

    def on_train_batch_end(self, outputs, batch, batch_index) -> None:
        loss = outputs["loss"] if isinstance(outputs, dict) else outputs
        if loss is not None and not math.isfinite(float(loss)):
            raise FloatingPointError(
                f"training loss became {float(loss)} at step {self.global_step}; lower optim.lr or "
                "raise optim.warmup_steps")

    # ---- checkpoints: the schedule and the random state travel with the weights ---------------
    def on_save_checkpoint(self, checkpoint: dict) -> None:
        checkpoint[FORMAT_KEY] = CHECKPOINT_FORMAT   # what asr.model.checkpoint.read_checkpoint checks
        if "val" in self.last_error_rates:   # the latest validation's rates (asr.average best_k= ranks by them)
            checkpoint["val_error_rates"] = dict(self.last_error_rates["val"])
        if getattr(self, "plateau", None) is not None:
            checkpoint["plateau"] = self.plateau.state_dict()
        name, keys, position, has_gauss, cached = np.random.get_state()
        # plain tensors and numbers only, so torch.load(weights_only=True) can read the checkpoint
        checkpoint["rng_states"] = {"torch": torch.get_rng_state(), "python": random.getstate(),
                                    "numpy": [name, torch.from_numpy(keys.copy()), position, has_gauss, cached]}
        if torch.cuda.is_available():
            checkpoint["rng_states"]["cuda"] = torch.cuda.get_rng_state_all()

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        """Resuming continues the plateau schedule and the random streams (dropout, hashing)
        exactly where the checkpoint left them."""
        self._restored_plateau = checkpoint.get("plateau")
        states = checkpoint.get("rng_states")
        if states:
            # RNG states must be CPU tensors; load_from_checkpoint(map_location="cuda") moves them
            torch.set_rng_state(states["torch"].cpu())
            random.setstate(states["python"])
            name, keys, position, has_gauss, cached = states["numpy"]
            np.random.set_state((name, keys.cpu().numpy(), position, has_gauss, cached))
            if "cuda" in states and torch.cuda.is_available() and len(states["cuda"]) == torch.cuda.device_count():
                torch.cuda.set_rng_state_all([state.cpu() for state in states["cuda"]])
