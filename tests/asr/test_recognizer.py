"""The LightningModule on a hand-made toy task: it overfits, decodes, scores, and its checkpoint stands alone.

Toy speech: every phone is a fixed random 12-dim "spectrum" held for 3 frames, plus noise; the words
are the phone names glued together. Independent of the data module and the corpus generator.
"""
import lightning as L
import pytest
import torch

from asr.data.splits.tokenizers import build_tokenizer
from asr.text.metrics import phone_error_rate
from asr.model.evaluation_tally import EvaluationTally
from asr.model.recognizer import SpeechRecognizer, warmup_factor
from attention_ext import validate_attention

FEATURES = 12
PHONE_SPECTRA = torch.Generator().manual_seed(1)
SPECTRA = {phone: torch.randn(FEATURES, generator=PHONE_SPECTRA) * 2
           for phone in ("AA", "B", "K", "S", "IY", "T", "M", "OW")}
UTTERANCES = ["AA B K", "S IY T", "M OW B AA", "K AA T S", "IY M", "OW S K B"]
TOKENIZERS = {"phones": build_tokenizer("phones"), "chars": build_tokenizer("chars")}


def toy_batch(utterances, noise=0.1, seed=0):
    generator = torch.Generator().manual_seed(seed)
    frames = [torch.stack([SPECTRA[p] for p in u.split() for _ in range(3)]) for u in utterances]
    lengths = torch.tensor([len(f) for f in frames])
    features = torch.zeros(len(frames), int(lengths.max()), FEATURES)
    for b, f in enumerate(frames):
        features[b, :len(f)] = f + noise * torch.randn(f.shape, generator=generator)
    texts = [u.lower().replace(" ", "") for u in utterances]
    batch = {"features": features, "feature_lengths": lengths, "ids": [f"u{i}" for i in range(len(frames))],
             "texts": texts, "phones": list(utterances), "targets": {}, "target_lengths": {}}
    for kind, field in (("phones", utterances), ("chars", texts)):
        ids = [TOKENIZERS[kind].encode(s) for s in field]
        padded = torch.zeros(len(ids), max(map(len, ids)), dtype=torch.long)
        for b, row in enumerate(ids):
            padded[b, :len(row)] = torch.tensor(row)
        batch["targets"][kind] = padded
        batch["target_lengths"][kind] = torch.tensor([len(row) for row in ids])
    return batch


def toy_recognizer(attention=None, norm=None, input_norm=None, **optim):
    """A small recognizer whose model settings lack the keys added later (positions; norm and
    input_norm unless given), as in a checkpoint written before they existed."""
    model = dict(layers=2, heads=2, head_dim=16, ff_dim=64, dropout=0.0, subsampling=1,
                 subsampling_channels=4, shared_qk=False, loss_weights={"chars": 0.5},
                 **({} if norm is None else {"norm": norm}),
                 **({} if input_norm is None else {"input_norm": input_norm}))
    settings = dict(lr=3e-3, weight_decay=0.0, clip_norm=10.0, plateau_factor=0.5, plateau_patience=5,
                    min_lr=1e-6, warmup_steps=0)
    settings.update(optim)
    return SpeechRecognizer(model=model, attention=attention or {"name": "full"}, optim=settings, feature_dim=FEATURES,
                            tokenizers={kind: t.state_dict() for kind, t in TOKENIZERS.items()})


class Batches(torch.utils.data.Dataset):
    def __init__(self, batch, repeat):
        self.batch, self.repeat = batch, repeat

    def __len__(self):
        return self.repeat

    def __getitem__(self, index):
        return self.batch


def loader(batch, repeat):
    return torch.utils.data.DataLoader(Batches(batch, repeat), batch_size=None)


def test_loss_is_the_weighted_sum_of_the_heads():
    torch.manual_seed(0)
    recognizer = toy_recognizer().eval()
    total, losses, _, _ = recognizer._losses(toy_batch(UTTERANCES))
    torch.testing.assert_close(total, losses["phones"] + 0.5 * losses["chars"])


def test_features_are_normalised_with_the_stored_stats():
    recognizer = toy_recognizer().eval()
    batch = toy_batch(UTTERANCES[:2])
    mean, std = torch.linspace(-1, 1, FEATURES), torch.linspace(0.5, 2, FEATURES)
    seen = {}
    recognizer.encoder.register_forward_pre_hook(lambda module, args: seen.update(x=args[0]))
    recognizer.set_feature_stats(mean, std)
    recognizer(batch["features"], batch["feature_lengths"])
    length = int(batch["feature_lengths"][1])
    torch.testing.assert_close(seen["x"][1, :length], (batch["features"][1, :length] - mean) / std)
    assert seen["x"][1, length:].abs().sum() == 0          # padding stays 0 after normalisation


def test_tiny_model_overfits_a_handful_of_utterances(tmp_path):
    torch.manual_seed(0)
    batch = toy_batch(UTTERANCES)
    recognizer = toy_recognizer(lr=1e-2)
    recognizer.eval()
    with torch.no_grad():
        initial_loss = recognizer._losses(batch)[0].item()
        initial_per = phone_error_rate(batch["phones"], recognizer.transcribe(
            batch["features"], batch["feature_lengths"])["phones"])
    recognizer.train()
    trainer = L.Trainer(max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, default_root_dir=tmp_path, num_sanity_val_steps=0,
                        gradient_clip_val=10.0)
    trainer.fit(recognizer, train_dataloaders=loader(batch, 100), val_dataloaders=loader(batch, 1))
    rates = trainer.callback_metrics
    assert initial_per > 0.8                              # untrained: nothing recognised
    assert rates["val/loss"].item() < 0.2 * initial_loss
    assert rates["val/per"].item() < 0.1                  # PER from the phone head ...
    assert "val/wer" in rates and "val/cer" in rates      # ... WER and CER from the chars head
    assert rates["val/primary_error"].item() == rates["val/per"].item()   # phones come first
    recognizer.eval()
    with torch.no_grad():
        hypotheses = recognizer.transcribe(batch["features"], batch["feature_lengths"])
    assert phone_error_rate(batch["phones"], hypotheses["phones"]) == pytest.approx(rates["val/per"].item())


def test_checkpoint_alone_rebuilds_the_model(tmp_path):
    torch.manual_seed(0)
    recognizer = toy_recognizer()
    recognizer.set_feature_stats(torch.full((FEATURES,), 0.25), torch.full((FEATURES,), 3.0))
    trainer = L.Trainer(max_steps=2, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, default_root_dir=tmp_path, num_sanity_val_steps=0,
                        limit_val_batches=0)
    batch = toy_batch(UTTERANCES)
    trainer.fit(recognizer, train_dataloaders=loader(batch, 2))
    trainer.save_checkpoint(tmp_path / "model.ckpt")
    restored = SpeechRecognizer.load_from_checkpoint(tmp_path / "model.ckpt", map_location="cpu")
    assert {k: t.state_dict() for k, t in restored.tokenizers.items()} == \
        {k: t.state_dict() for k, t in TOKENIZERS.items()}
    assert torch.all(restored.feature_mean == 0.25) and torch.all(restored.feature_std == 3.0)
    recognizer.eval(), restored.eval()
    with torch.no_grad():
        expected, _ = recognizer(batch["features"], batch["feature_lengths"])
        got, _ = restored(batch["features"], batch["feature_lengths"])
    torch.testing.assert_close(got["phones"], expected["phones"])


@pytest.mark.parametrize("norm, input_norm", [(None, None), ("pre", None), ("post", None), ("post", True)])
def test_a_checkpoint_keeps_its_layer_form_and_one_without_model_norm_loads_as_pre_norm(norm, input_norm, tmp_path):
    """A checkpoint written before model.norm (model.input_norm) existed has no such hyper-parameter:
    its model was pre-norm (had no input norm), and it loads as one, with the same outputs."""
    torch.manual_seed(0)
    recognizer = toy_recognizer(norm=norm, input_norm=input_norm)
    trainer = L.Trainer(max_steps=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, default_root_dir=tmp_path, num_sanity_val_steps=0,
                        limit_val_batches=0)
    batch = toy_batch(UTTERANCES)
    trainer.fit(recognizer, train_dataloaders=loader(batch, 1))
    trainer.save_checkpoint(tmp_path / "model.ckpt")
    stored = torch.load(tmp_path / "model.ckpt", map_location="cpu", weights_only=True)["hyper_parameters"]["model"]
    assert ("norm" in stored) == (norm is not None)
    restored = SpeechRecognizer.load_from_checkpoint(tmp_path / "model.ckpt", map_location="cpu")
    assert {layer.norm for layer in restored.encoder.layers} == {norm or "pre"}
    assert ("input_norm" in stored) == (input_norm is not None)
    assert (restored.encoder.input_norm is not None) == bool(input_norm)
    recognizer.eval(), restored.eval()
    with torch.no_grad():
        expected, _ = recognizer(batch["features"], batch["feature_lengths"])
        got, _ = restored(batch["features"], batch["feature_lengths"])
    assert torch.equal(got["phones"], expected["phones"])


def test_warmup_factor_is_linear_then_flat():
    assert [warmup_factor(step, 4) for step in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]
    assert warmup_factor(0, 0) == 1.0


def test_warmup_scales_the_learning_rate_only_during_the_step():
    recognizer = toy_recognizer(warmup_steps=4, lr=1.0)
    seen = []

    class Recording:
        param_groups = [{"lr": 1.0}]

        def step(self, closure=None):
            seen.append(self.param_groups[0]["lr"])

    optimizer = Recording()
    for step in range(6):
        recognizer._warmup_factor = (lambda s=step: warmup_factor(s, 4))
        recognizer.optimizer_step(0, step, optimizer)
    assert seen == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]
    assert optimizer.param_groups[0]["lr"] == 1.0          # what the plateau schedule sees is unchanged


def test_attention_is_built_as_validated_and_kept_as_a_plain_hyper_parameter():
    """train hands over a ValidatedAttention; the checkpoint keeps {"name", **options}, which a
    model rebuilt from the hyper-parameters validates (and completes) again."""
    recognizer = toy_recognizer(validate_attention("clustered", clusters=7))
    expected = {"name": "clustered", "clusters": 7, "bits": 63, "iterations": 10}
    assert recognizer.hparams.attention == expected
    assert repr(recognizer.encoder.layers[0].attention) == "ClusteredAttention(clusters=7, bits=63, iterations=10)"
    assert toy_recognizer({"name": "clustered", "clusters": 7}).hparams.attention == expected


def test_the_evaluation_tally_adds_batches_up():
    tally = EvaluationTally()
    tally.add({"phones": ["AH", "B"], "chars": ["a", "b"]}, {"phones": ["AH", "B C"]}, torch.tensor([3, 4]))
    tally.add({"phones": ["D"], "chars": ["d"]}, {"phones": ["D"]}, torch.tensor([5]))
    assert tally.references == {"phones": ["AH", "B C", "D"]}      # only the scored head
    assert tally.hypotheses == {"phones": ["AH", "B", "D"]}
    assert (tally.utterances, tally.encoder_frames) == (3, 12)


@pytest.mark.parametrize("plateau_target, lrs", [(None, [1.0, 1.0, 1.0, 1.0]), ("phones", [1.0, 1.0, 0.5, 0.5])])
def test_the_plateau_schedule_watches_the_named_heads_loss(plateau_target, lrs):
    """Dev losses where the chars head keeps improving and the phones head stalls (what the paper
    encoder's runs showed): the sum never plateaus, so only plateau_target=phones lowers the lr, after
    plateau_patience + 1 validations without a lower phones loss."""
    recognizer = toy_recognizer(lr=1.0, plateau_patience=1,
                                **({} if plateau_target is None else {"plateau_target": plateau_target}))
    optimizer = recognizer.configure_optimizers()
    seen = []
    for phones, chars in [(0.50, 3.0), (0.50, 2.9), (0.51, 2.8), (0.50, 2.7)]:
        tally = EvaluationTally()
        tally.utterances = 10
        tally.head_loss_sums = {"phones": phones * 10, "chars": chars * 10}
        tally.loss_sum = (phones + 0.5 * chars) * 10
        recognizer.plateau.step(recognizer._plateau_loss(tally))
        seen.append(optimizer.param_groups[0]["lr"])
    assert seen == lrs
